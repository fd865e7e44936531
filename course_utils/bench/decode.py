"""Lesson 9 benchmark: one decode step (one new token) against a KV cache.

``python -m course_utils.bench decode`` times, in one run, on fp16 with Hq = 32,
Hkv = 8, D = 128 and B in {1, 8, 64}, cache lengths 1k .. 128k:

* the split-KV Triton kernel of :mod:`course_utils.triton_decode` (its record in
  :mod:`course_utils.contract` must declare the shape: :func:`grid`);
* SDPA's flash, cuDNN, memory-efficient and math backends (each with ``enable_gqa``
  when it takes it, else on K/V expanded to 32 heads ahead of time, marked so);
* a plain PyTorch grouped matmul (queries of a group stacked, K/V read once);
* a device-to-device copy, whose bandwidth (bytes read + written) is the ceiling the
  kernel's achieved bandwidth (K and V bytes read once) is compared with: once as a
  2 GiB copy timed alone (``copy_TBps``, the steady state), and once per row as a copy
  that moves as many bytes as the step reads, timed exactly as the step is
  (``copy_same_ms``: graph replay after the same L2 flush, so it pays the same start-up
  and the same write-back of the flush's dirty lines).

It also sweeps the number of splits at B = 1, 32k to show what the heuristic picks.
``--plot`` redraws the figure from a saved JSON without a GPU.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from course_utils import device
from course_utils.bench import common
from course_utils.contract import cases, implementations

HQ, HKV, D = 32, 8, 128
DTYPE = torch.float16
# the compiled decode kernel (lesson 9)
KERNEL = implementations(kind="decode", devices=("triton", "hopper"))[0]
BATCHES = (1, 8, 64)
LENGTHS = (1024, 4096, 16384, 32768, 65536, 131072)
CACHE_LIMIT = 36e9        # bytes of K+V we allocate at most (80 GB card)
EXPAND_LIMIT = 12e9       # extra bytes we allow for K/V expanded to Hq heads
MATH_LIMIT = 2e9          # the math backend materialises scores: small caches only


def grouped_torch_decode(q, k, v, scale):
    """One decode step with plain matmuls: the ``group`` query heads of a kv head are
    stacked as rows, so each K/V head is read once (no expansion)."""
    b, hq, nq, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(b, hkv, (hq // hkv) * nq, d)
    s = (qg @ k.transpose(-1, -2)).float() * scale
    p = torch.softmax(s, dim=-1).to(v.dtype)
    return (p @ v).reshape(b, hq, nq, d)


def _sdpa_variants():
    from torch.nn.attention import SDPBackend
    names = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"),
             ("efficient", "EFFICIENT_ATTENTION"), ("math", "MATH")]
    return [(n, getattr(SDPBackend, a)) for n, a in names if hasattr(SDPBackend, a)]


def _try_sdpa(backend, q, k, v, kx, vx):
    """Return (fn, how) for an SDPA backend, or (None, reason)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def make(kk, vv, gqa):
        def fn():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=gqa)
        return fn
    errors = []
    for kk, vv, gqa, how in ((k, v, True, "enable_gqa"), (kx, vx, False, "expanded K/V")):
        if kk is None:
            errors.append("expansion skipped (memory)")
            continue
        fn = make(kk, vv, gqa)
        try:
            fn()
            torch.cuda.synchronize()
            return fn, how
        except RuntimeError as err:   # the backend refuses the shape or the flag
            errors.append(str(err).splitlines()[0][:120])
    return None, "; ".join(errors)


def graphed(fn):
    """``fn`` captured in a CUDA graph, returned as its replay (or None if capture fails).

    A serving loop replays each decode step from a graph, so the GPU time of a step is
    what counts; eager calls also pay the Python and launch cost on the host, which for
    a few-microsecond kernel can be larger than the kernel itself."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return g.replay
    except RuntimeError:
        torch.cuda.synchronize()
        return None


def time_both(fn, rep=40):
    """(graph-replay ms, eager ms) of ``fn``; the first is None if it cannot be captured."""
    eager = common.time_ms(fn, rep=rep)
    replay = graphed(fn)
    return (common.time_ms(replay, rep=rep) if replay else None), eager


def copy_bandwidth(nbytes=2 * 1024 ** 3):
    """Bytes moved per second (read + write) by a device-to-device copy."""
    x = torch.empty(nbytes // 2, dtype=torch.float16, device=device.DEVICE).normal_()
    y = torch.empty_like(x)
    ms = common.time_ms(lambda: y.copy_(x), rep=50)
    del x, y
    return 2 * nbytes / (ms * 1e-3)


def grid(batches, lengths):
    """The ``(B, cache length)`` points, in the order they run: the decode record's
    cases for one new token at ``HQ``/``HKV`` heads, head dim ``D``, float16, its
    default causal setting (``ValueError`` if the record does not declare them)."""
    return [(c.B, c.Nk) for c in cases(
        KERNEL, [(b, HQ, HKV, 1, n) for b in batches for n in lengths], dtypes=[DTYPE],
        head_dims=[D], settings=[KERNEL.default_alignment], layouts=["bhnd"], cover="all",
        interpreter=False)]


def run(batches, lengths, sweep=True):
    from course_utils.decoding import kv_bytes_per_step
    from course_utils.triton_decode import choose_num_splits

    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write)")
    rows, notes = [], {}
    scale = 1 / math.sqrt(D)
    for b, n in grid(batches, lengths):
        kv = kv_bytes_per_step(b, HKV, n, D)
        if kv > CACHE_LIMIT:
            print(f"B={b} cache={n}: skipped, K+V would take {kv / 1e9:.0f} GB")
            continue
        torch.manual_seed(0)
        q = torch.randn(b, HQ, 1, D, device=device.DEVICE, dtype=DTYPE)
        k = torch.randn(b, HKV, n, D, device=device.DEVICE, dtype=DTYPE)
        v = torch.randn_like(k)
        kx = vx = None
        if kv * (HQ // HKV - 1) <= EXPAND_LIMIT:
            kx = k.repeat_interleave(HQ // HKV, dim=1)
            vx = v.repeat_interleave(HQ // HKV, dim=1)
        row = {"B": b, "cache": n, "kv_bytes": kv,
               "splits": choose_num_splits(b, HKV, n)}
        try:
            measure_row(row, q, k, v, kx, vx, notes, scale, copy_bw)
        except Exception as err:  # noqa: BLE001 - keep the rest of the table
            notes[f"B={b} cache={n}"] = f"{type(err).__name__}: {str(err)[:200]}"
            print(f"B={b} cache={n}: FAILED {notes[f'B={b} cache={n}']}", flush=True)
            torch.cuda.synchronize()
            continue
        rows.append(row)
        print(common.table([row], ["B", "cache", "splits", "triton_ms", "triton_eager_ms",
                                   "best_sdpa", "best_sdpa_ms", "speedup_vs_best_sdpa",
                                   "bw_fraction_of_copy", "bw_fraction_of_same_copy",
                                   "max_err"]), flush=True)
        del q, k, v, kx, vx
        torch.cuda.empty_cache()
    extra = {"copy_TBps": copy_bw / 1e12, "shape": {"Hq": HQ, "Hkv": HKV, "D": D,
                                                   "new_tokens": 1, "dtype": "float16"},
             "sdpa_notes": notes}
    if sweep:
        extra["split_sweep"] = split_sweep(1, 32768, copy_bw)
    return rows, extra


def measure_row(row, q, k, v, kx, vx, notes, scale, copy_bw):
    """Fill ``row`` with every implementation's time per step (graph replay, and eager)."""
    from course_utils.triton_decode import decode_attention
    b, n, kv = row["B"], row["cache"], row["kv_bytes"]
    out = decode_attention(q, k, v)
    ref = grouped_torch_decode(q, k, v, 1 / math.sqrt(D))
    row["max_err"] = float((out.float() - ref.float()).abs().max())
    del out, ref
    row["triton_ms"], row["triton_eager_ms"] = time_both(lambda: decode_attention(q, k, v))
    # a copy moving the step's bytes (half read, half written), timed the same way
    src = torch.empty(kv // 4, dtype=torch.float16, device=device.DEVICE).normal_()
    dst = torch.empty_like(src)
    row["copy_same_ms"], _ = time_both(lambda: dst.copy_(src))
    del src, dst
    row["torch_grouped_ms"], row["torch_grouped_eager_ms"] = time_both(
        lambda: grouped_torch_decode(q, k, v, scale))
    best = None
    for name, backend in _sdpa_variants():
        if name == "math" and (kx is None or kv > MATH_LIMIT):
            row["math_ms"] = None
            notes[f"math B={b} cache={n}"] = "skipped (memory)"
            continue
        fn, how = _try_sdpa(backend, q, k, v, kx, vx)
        if fn is None:
            row[f"{name}_ms"] = None
            notes[f"{name} B={b} cache={n}"] = how
            continue
        try:
            t, t_eager = time_both(fn)
        except torch.OutOfMemoryError:
            row[f"{name}_ms"] = None
            notes[f"{name} B={b} cache={n}"] = "out of memory while timing"
            continue
        finally:
            fn = None
            torch.cuda.empty_cache()
        if t is None:
            notes[f"{name} B={b} cache={n}"] = "could not be captured in a CUDA graph; eager time"
            t = t_eager
        row[f"{name}_ms"], row[f"{name}_eager_ms"], row[f"{name}_how"] = t, t_eager, how
        if name != "math" and (best is None or t < best[1]):
            best = (name, t)
    row["best_sdpa"] = best[0] if best else None
    row["best_sdpa_ms"] = best[1] if best else None
    row["speedup_vs_best_sdpa"] = best[1] / row["triton_ms"] if best else None
    row["triton_TBps"] = kv / (row["triton_ms"] * 1e-3) / 1e12
    row["bw_fraction_of_copy"] = kv / (row["triton_ms"] * 1e-3) / copy_bw
    row["bw_fraction_of_same_copy"] = row["copy_same_ms"] / row["triton_ms"]


def split_sweep(b, n, copy_bw):
    from course_utils.decoding import kv_bytes_per_step
    from course_utils.triton_decode import choose_num_splits, decode_attention
    torch.manual_seed(0)
    q = torch.randn(b, HQ, 1, D, device=device.DEVICE, dtype=torch.float16)
    k = torch.randn(b, HKV, n, D, device=device.DEVICE, dtype=torch.float16)
    v = torch.randn_like(k)
    kv = kv_bytes_per_step(b, HKV, n, D)
    out = {"B": b, "cache": n, "chosen": choose_num_splits(b, HKV, n), "points": []}
    for s in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        t, _ = time_both(lambda: decode_attention(q, k, v, num_splits=s), rep=30)
        out["points"].append({"num_splits": s, "ms": t,
                              "bw_fraction_of_copy": kv / (t * 1e-3) / copy_bw})
        print(f"split sweep B={b} cache={n} splits={s}: {t * 1e3:.1f} us", flush=True)
    return out


def plot(record: dict, path=None):
    """Time per step and achieved bandwidth against cache length; returns the figure."""
    import matplotlib.pyplot as plt
    rows = record["rows"]
    env = record["environment"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    colors = {1: "tab:blue", 8: "tab:orange", 64: "tab:green"}
    for b in sorted({r["B"] for r in rows}):
        rs = [r for r in rows if r["B"] == b]
        x = [r["cache"] for r in rs]
        c = colors.get(b)
        axes[0].plot(x, [r["triton_ms"] * 1e3 for r in rs], "o-", color=c,
                     label=f"B={b} split-KV Triton")
        pts = [(r["cache"], r["best_sdpa_ms"] * 1e3) for r in rs if r["best_sdpa_ms"]]
        if pts:
            axes[0].plot(*zip(*pts), "s--", color=c, alpha=0.7, label=f"B={b} best SDPA")
        axes[1].plot(x, [100 * r["bw_fraction_of_copy"] for r in rs], "o-", color=c,
                     label=f"B={b}")
    axes[0].set(xscale="log", yscale="log", xlabel="cache length (keys)",
                ylabel="time per decode step (µs)", title="one new token, Hq=32, Hkv=8, d=128, fp16")
    axes[0].legend(fontsize=8)
    axes[1].axhline(70, color="gray", ls=":", label="70% target")
    axes[1].set(xscale="log", ylim=(0, 110), xlabel="cache length (keys)",
                ylabel="% of device-to-device copy bandwidth",
                title=f"achieved K/V bandwidth (copy = {record['copy_TBps']:.2f} TB/s)")
    axes[1].legend(fontsize=8)
    sw = record.get("split_sweep")
    if sw:
        s = [p["num_splits"] for p in sw["points"]]
        axes[2].plot(s, [p["ms"] * 1e3 for p in sw["points"]], "o-", color="tab:purple")
        axes[2].axvline(sw["chosen"], color="gray", ls=":", label=f"heuristic: {sw['chosen']}")
        axes[2].set(xscale="log", xlabel="number of splits", ylabel="time per decode step (µs)",
                    title=f"B={sw['B']}, cache={sw['cache']}: splits vs time")
        axes[2].set_xscale("log", base=2)
        axes[2].legend(fontsize=8)
    else:
        axes[2].axis("off")
    fig.suptitle(f"{env['device']} · torch {env['torch']} · triton {env['triton']}", fontsize=9)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m course_utils.bench decode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    ap.add_argument("--no-sweep", action="store_true", help="skip the num_splits sweep")
    ap.add_argument("--plot", metavar="JSON", help="only redraw the plot from a saved JSON")
    args = ap.parse_args(argv)
    if args.plot:
        src = Path(args.plot)
        fig_path = src.with_suffix(".png")
        plot(json.loads(src.read_text()), fig_path)
        print(f"wrote {fig_path}")
        return 0
    if not device.HAS_GPU:
        print("the decode benchmark needs a CUDA GPU; on CPU use --plot on a saved JSON")
        return 2
    rows, extra = run(args.batches, args.lengths, sweep=not args.no_sweep)
    extra["timing"] = ("ms per decode step: median CUDA-graph replay time (L2 flushed before "
                       "each replay), as a serving loop runs it; *_eager_ms adds the host's "
                       "Python and launch cost of one eager call")
    path = common.save("decode", rows, extra)
    try:
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
    except ImportError:
        pass
    print(common.table(rows, ["B", "cache", "splits", "triton_ms", "triton_eager_ms",
                              "torch_grouped_ms",
                              "flash_ms", "cudnn_ms", "efficient_ms", "math_ms",
                              "speedup_vs_best_sdpa", "triton_TBps", "bw_fraction_of_copy",
                              "copy_same_ms", "bw_fraction_of_same_copy"]))
    print(f"copy bandwidth {extra['copy_TBps']:.2f} TB/s; wrote {path}")
    return 0
