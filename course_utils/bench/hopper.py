"""Lesson 8 benchmark: our Hopper forwards against SDPA (cuDNN and flash back ends)
in the same run, plus the ablation table (which ingredient gives what).

    python -m course_utils.bench hopper [--n 4096 8192 16384] [--dtype fp16 bf16]
                                        [--tokens 16384] [--heads 16] [--runs 3]

Shapes follow the FlashAttention-3 paper's forward benchmark: head dim 128, a fixed
16k tokens per batch (``B = tokens // N``), 16 heads, non-causal. Each of our providers
runs one kernel of ``course_utils.hopper`` whose record in :mod:`course_utils.contract`
decides the dtypes on offer and the points it is timed at (a point its record does not
declare is listed with the record's reason). Every provider's output is compared with SDPA before it is timed; a provider
that fails to compile or to match is listed with its error instead of a speed. Results:
``benchmarks/<device>/hopper.json`` and ``hopper.png``.

The whole sweep runs ``--runs`` times in a row (default 3); each row keeps every run's
speed (``tflops_runs``) and reports their median, so a lesson's statement about two
providers can be checked against the spread between runs, not against one run.
"""
from __future__ import annotations

import argparse
import math
import statistics
import traceback

import torch

from course_utils import device
from course_utils.bench import common
from course_utils.contract import Case, implementation, implementations

D = 128
KERNELS = implementations(package="course_utils.hopper")
# 16-bit dtypes every kernel of lesson 8 declares (SDPA's baselines take 16-bit only)
DTYPES = {name: t for name, t in (("fp16", torch.float16), ("bf16", torch.bfloat16))
          if all(t in r.dtypes for r in KERNELS)}
# which record's kernel each of our providers runs (the SDPA baselines have none)
_KERNEL_OF = (("triton_tma", "tma"), ("gluon", "gluon"), ("fp8", "fp8"))


def record_of(provider):
    """The contract record of the kernel ``provider`` times, or ``None`` for SDPA."""
    return next((implementation(r) for prefix, r in _KERNEL_OF if provider.startswith(prefix)),
                None)


def undeclared(provider, n, dtype, heads, b=1):
    """Why ``provider``'s kernel does not declare this benchmark point (non-causal,
    ``Nq = Nk = n``, head dim :data:`D`, ``heads`` heads), or ``None`` when it does."""
    rec = record_of(provider)
    if rec is None:
        return None
    err = rec.refusal(dtype=dtype, D=D, Nq=n, Nk=n, Hq=heads, Hkv=heads, interpreter=False)
    if err is None and not rec.declares(Case(rec.name, b, heads, heads, n, n, D, dtype),
                                        interpreter=False):
        return f"{rec.function} does not declare N={n}"
    return None if err is None else str(err)


def _sdpa(backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v):
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return run


def providers():
    """name -> (callable(q, k, v) or a factory for FP8, what it shows)."""
    from course_utils.hopper.gluon_fwd import attention_gluon
    from course_utils.hopper.triton_fwd import attention_tma
    return {
        "sdpa_cudnn": (_sdpa("CUDNN_ATTENTION"), "baseline: cuDNN's Hopper attention"),
        "sdpa_flash": (_sdpa("FLASH_ATTENTION"), "FlashAttention-2 inside PyTorch"),
        "triton_tma_s1": (lambda q, k, v: attention_tma(q, k, v, num_stages=1, enable_gqa=True),
                          "Triton + TMA descriptors, no pipelining"),
        "triton_tma_s2": (lambda q, k, v: attention_tma(q, k, v, num_stages=2, enable_gqa=True),
                          "+ 2-stage software pipeline"),
        "triton_tma_s3": (lambda q, k, v: attention_tma(q, k, v, num_stages=3, enable_gqa=True),
                          "+ 3-stage software pipeline"),
        "triton_tma_ws": (lambda q, k, v: attention_tma(q, k, v, num_stages=2,
                                                        warp_specialize=True, enable_gqa=True),
                          "+ compiler warp specialisation"),
        "gluon_ws_serial": (lambda q, k, v: attention_gluon(q, k, v, pipeline=False, enable_gqa=True),
                            "Gluon: producer warp + consumer warpgroups, serial softmax"),
        "gluon_ws_pipe": (lambda q, k, v: attention_gluon(q, k, v, pipeline=True, enable_gqa=True),
                          "Gluon: + intra-warpgroup overlap of softmax and P V"),
        "gluon_ws_pipe_s3": (lambda q, k, v: attention_gluon(q, k, v, pipeline=True, stages=3, enable_gqa=True),
                             "Gluon: + 3 K/V slots"),
        "gluon_pingpong": (lambda q, k, v: attention_gluon(q, k, v, pingpong=True, enable_gqa=True),
                           "Gluon: two consumer warpgroups in ping-pong, each pipelined"),
        "gluon_pingpong_s3": (lambda q, k, v: attention_gluon(q, k, v, pingpong=True, stages=3, enable_gqa=True),
                              "Gluon: ping-pong + 3 K/V slots"),
    }


def _fp8_runner(q, k, v):
    """The FP8 forward on prepared tensors (on sm90 the Gluon kernel on e4m3 tiles, in
    ``fp8.GLUON_FP8_SCHEDULE``) and the kernel's name."""
    from course_utils.hopper.fp8 import attention_fp8_prepared, prepare_fp8
    prep = prepare_fp8(q, k, v, hadamard=True)
    return (lambda: attention_fp8_prepared(prep, out_dtype=q.dtype)), prep["kernel"]


def run_config(n, dtype, tokens, heads, names, settle_ms=0.0):
    """Time ``names`` at one length; ``settle_ms``: each runs back to back that long first
    (:func:`common.settle`)."""
    b = max(1, tokens // n)
    g = torch.Generator(device=device.DEVICE).manual_seed(0)
    q, k, v = (torch.randn(b, heads, n, D, device=device.DEVICE, dtype=dtype, generator=g)
               for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    flops = common.attention_flops(b, heads, n, n, D, False)
    rows = []
    table = providers()
    for name in names + ["fp8_hadamard"]:
        row = {"provider": name, "N": n, "B": b, "H": heads, "D": D,
               "dtype": str(dtype).replace("torch.", "")}
        try:
            why = undeclared(name, n, dtype, heads, b)
            if why:
                raise ValueError(why)
            if name == "fp8_hadamard":
                fn, kernel = _fp8_runner(q, k, v)
                row["what"] = (f"FP8 e4m3 ({kernel} kernel), per-block scales, Hadamard "
                               "(kernel time only)")
            else:
                f, row["what"] = table[name]
                fn = (lambda f=f: f(q, k, v))
            out = fn()
            torch.cuda.synchronize()
            row["rel_err"] = float((out.float() - ref).norm() / ref.norm())
            limit = 0.08 if name.startswith("fp8") else 1e-2
            if not math.isfinite(row["rel_err"]) or row["rel_err"] > limit:
                raise RuntimeError(f"wrong output: relative error {row['rel_err']:.3g} > {limit}")
            ms = common.time_ms(fn, settle_ms=settle_ms)
            row["ms"] = ms
            row["tflops"] = flops / ms / 1e9
        except Exception as e:  # report, keep measuring the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            traceback.print_exc(limit=2)
        rows.append(row)
        print(f"N={n:6d} {row['dtype']:9s} {name:18s} "
              + (f"{row['tflops']:7.1f} TFLOPS" if "tflops" in row else row.get("error", "")),
              flush=True)
    base = next((r["tflops"] for r in rows if r["provider"] == "sdpa_cudnn" and "tflops" in r),
                None)
    for r in rows:
        if base and "tflops" in r:
            r["x_cudnn"] = r["tflops"] / base
    return rows


def merge_runs(runs):
    """One row per (provider, N, dtype) from several sweeps ``runs`` (lists of rows as
    :func:`run_config` makes them): ``tflops`` and ``ms`` are the medians over the runs,
    ``tflops_runs`` lists each run's speed, ``x_cudnn`` divides medians. A provider that
    failed in any run keeps that run's error and gets no speed."""
    def key(r):
        return r["provider"], r["N"], r["dtype"]

    merged = {}
    for rows in runs:
        for r in rows:
            merged.setdefault(key(r), []).append(r)
    out = []
    for rs in merged.values():
        row = {k: v for k, v in rs[0].items() if k not in ("tflops", "ms", "x_cudnn", "error")}
        row["runs"] = len(rs)
        err = next((r["error"] for r in rs if "error" in r), None)
        if err is not None or len(rs) != len(runs):
            row["error"] = err or f"measured in {len(rs)} of {len(runs)} runs"
        else:
            row["tflops_runs"] = [r["tflops"] for r in rs]
            row["tflops"] = statistics.median(row["tflops_runs"])
            row["ms"] = statistics.median(r["ms"] for r in rs)
            row["rel_err"] = max(r["rel_err"] for r in rs)
        out.append(row)
    for r in out:
        base = next((b.get("tflops") for b in out if b["provider"] == "sdpa_cudnn"
                     and b["N"] == r["N"] and b["dtype"] == r["dtype"]), None)
        if base and r.get("tflops"):
            r["x_cudnn"] = r["tflops"] / base
    return out


def ablation(rows, n):
    """The ingredient-by-ingredient table at one sequence length (fp16), with the
    schedule simulator's prediction for the schedule each kernel follows."""
    from course_utils.hopper import schedule_sim as sim
    pred = {name: sim.simulate(sim.build_schedule(name)).tflops for name in sim.SCHEDULE_NAMES}
    model = {"triton_tma_s1": "fa2_serial", "triton_tma_s2": "fa2_serial",
             "triton_tma_s3": "fa2_serial", "triton_tma_ws": "warp_specialized",
             "gluon_ws_serial": "warp_specialized", "gluon_ws_pipe": "intra_pipeline",
             "gluon_ws_pipe_s3": "intra_pipeline", "gluon_pingpong": "fa3",
             "gluon_pingpong_s3": "fa3"}
    out = []
    for r in rows:
        if r["N"] != n or r["dtype"] != "float16":
            continue
        sched = model.get(r["provider"])
        out.append({"provider": r["provider"], "what": r.get("what"),
                    "tflops": r.get("tflops"), "x_cudnn": r.get("x_cudnn"),
                    "schedule": sched, "sim_tflops": pred.get(sched) if sched else None,
                    "error": r.get("error")})
    return out


def plot(rows, path, device_name=None):
    """Bar chart of TFLOPS per provider, one panel per dtype (``device_name`` for the
    title: the GPU that produced ``rows``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7 * len(dtypes), 4.5), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        sub = [r for r in rows if r["dtype"] == dt]
        ns = sorted({r["N"] for r in sub})
        names = list(dict.fromkeys(r["provider"] for r in sub))
        width = 0.8 / len(names)
        colors = plt.get_cmap("tab20")
        for i, name in enumerate(names):
            ys = [next((r.get("tflops") or 0 for r in sub if r["N"] == n and r["provider"] == name), 0)
                  for n in ns]
            ax.bar([x + i * width for x in range(len(ns))], ys, width, label=name,
                   color=colors(i % 20))
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(ns))])
        ax.set_xticklabels([f"N={n}" for n in ns])
        ax.set_ylabel("TFLOPS (forward, non-causal)")
        ax.set_title(f"Attention forward, D={D}, {dt}, {device_name or device.describe()['name']}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m course_utils.bench hopper",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--providers", nargs="+", default=None,
                    help="subset of providers (default: all)")
    ap.add_argument("--runs", type=int, default=3,
                    help="sweeps in a row; each row reports the median (default 3)")
    common.add_settle_option(ap)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if not device.needs("hopper"):
        return 0
    names = args.providers or list(providers())
    runs = []
    for i in range(args.runs):
        print(f"--- run {i + 1} of {args.runs}", flush=True)
        rows = []
        for dt in args.dtype:
            for n in args.n:
                rows += run_config(n, DTYPES[dt], args.tokens, args.heads, names,
                                   settle_ms=args.settle)
        runs.append(rows)
    rows = merge_runs(runs)
    n_ab = 8192 if 8192 in args.n else args.n[-1]
    try:
        abl = ablation(rows, n_ab)
    except Exception as e:  # the table of measurements still counts
        print(f"ablation predictions unavailable: {type(e).__name__}: {e}")
        abl = []
    path = common.save("hopper", rows, {"ablation_N": n_ab, "ablation": abl, "runs": args.runs,
                                        "settle_ms": args.settle})
    plot(rows, path.with_suffix(".png"))
    print(common.table(rows, ["provider", "dtype", "N", "tflops", "x_cudnn", "rel_err", "error"]))
    print(f"\nablation at N={n_ab}, fp16:")
    print(common.table(abl, ["provider", "tflops", "x_cudnn", "schedule", "sim_tflops"]))
    print(f"saved {path}")
    return 0
