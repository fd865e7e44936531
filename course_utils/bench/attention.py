r"""Lessons 6-7 benchmark: the Triton FlashAttention-2 kernels against SDPA's backends.

``python -m course_utils.bench attention`` measures, in one run, TFLOPS of the forward
and of forward+backward, causal and not, for head dims 64 and 128, N = 1k .. 16k,
B = 4, H = 32, float16 and bfloat16, for

* ``triton``: :func:`course_utils.triton_attention.triton_attention` (autotuned; the
  record of :mod:`course_utils.contract` with a Triton backward decides which dtypes,
  head dims, modes and causal settings may be asked for);
* ``triton_atomic_dq`` (forward+backward only, with ``--bwd three_kernels,atomic_dq``):
  the same forward, the fused backward with atomic dQ (``bwd="atomic_dq"``);
* ``flash``: ``scaled_dot_product_attention`` restricted to ``SDPBackend.FLASH_ATTENTION``;
* ``cudnn``: the same restricted to ``SDPBackend.CUDNN_ATTENTION``.

The two backward designs of lesson 7 in one run against SDPA (the rows go to
``benchmarks/<device>/bwd_designs.json``)::

    python -m course_utils.bench attention --modes fwd+bwd --n 4096,16384 \
        --bwd three_kernels,atomic_dq --rep 50 --name bwd_designs

``x_flash``/``x_cudnn`` are ``triton`` over SDPA, ``atomic_dq_x_flash``/``_x_cudnn`` the
same for ``triton_atomic_dq``, and ``atomic_dq_x_three`` the fused design over the three
launches (above 1: the atomics win).

FLOPs are counted as the FlashAttention papers do (:func:`common.attention_flops`:
``4 B H N^2 D`` for the forward, halved when causal, 3.5x that for forward+backward).
Each point also records the largest relative error of our output against the flash
backend's, so a fast wrong kernel cannot hide. Options restrict the grid
(``--dtype fp16 --d 128 --n 4096,8192``); ``--plot`` redraws the figures from a saved
JSON (no GPU needed).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from course_utils import device
from course_utils.bench import common
from course_utils.contract import cases, implementations

# the kernel timed: the Triton kernel of SDPA's contract with a backward (lessons 6-7)
KERNEL = implementations(kind="sdpa", devices="triton", backward=True)[0]
# SDPA's flash and cuDNN back ends (the baselines) take 16-bit inputs: the dtypes on
# offer are those the kernel declares among them
DTYPES = {name: t for name, t in (("fp16", torch.float16), ("bf16", torch.bfloat16))
          if t in KERNEL.dtypes}
BACKENDS = (KERNEL.name, "triton_atomic_dq", "flash", "cudnn")
COLORS = {"triton": "tab:red", "triton_atomic_dq": "tab:orange", "flash": "tab:blue",
          "cudnn": "tab:green"}
# the provider name of each backward design of triton_attention (bwd=...)
BWD_PROVIDERS = {"three_kernels": KERNEL.name, "atomic_dq": "triton_atomic_dq"}


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m course_utils.bench attention",
                                 description="TFLOPS of the Triton attention vs SDPA backends")
    ap.add_argument("--modes", default="fwd,fwd+bwd", help="comma list of fwd, fwd+bwd")
    ap.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    ap.add_argument("--d", default="64,128", type=_ints, help="head dims, e.g. 64,128")
    ap.add_argument("--n", default="1024,2048,4096,8192,16384", type=_ints,
                    help="sequence lengths (Nq = Nk)")
    ap.add_argument("--dtype", default="fp16,bf16", help="comma list of fp16, bf16")
    ap.add_argument("--bwd", default="three_kernels",
                    help="comma list of backward designs timed in fwd+bwd: "
                         + ", ".join(BWD_PROVIDERS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rep", type=int, default=100, help="milliseconds of timed repeats")
    common.add_settle_option(ap)
    ap.add_argument("--name", default="attention", help="results file stem")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of an existing results file that this run does not redo")
    ap.add_argument("--plot", nargs="?", const="", default=None, metavar="JSON",
                    help="only draw the figures from a saved JSON (default: this device's)")
    args = ap.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    args.dtype = [d for d in args.dtype.split(",") if d]
    for m in args.modes:
        if m not in ("fwd", "fwd+bwd"):
            ap.error(f"--modes takes fwd and/or fwd+bwd, got {m!r}")
        if m == "fwd+bwd" and not KERNEL.backward:
            ap.error(f"{KERNEL.function} declares no backward: --modes fwd")
    for d in args.dtype:
        if d not in DTYPES:
            ap.error(f"--dtype takes {' and/or '.join(DTYPES)}, got {d!r}")
    for d in args.d:
        if not KERNEL.takes_head_dim(d):
            ap.error(f"--d {d} is not a head dim {KERNEL.function} declares")
    args.bwd = [b for b in args.bwd.split(",") if b]
    for b in args.bwd:
        if b not in BWD_PROVIDERS:
            ap.error(f"--bwd takes {' and/or '.join(BWD_PROVIDERS)}, got {b!r}")
    if not args.bwd:
        ap.error("--bwd needs at least one backward design")
    args.causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    if True in args.causal and not KERNEL.alignments:
        ap.error(f"{KERNEL.function} declares no causal mask: --causal no")
    return args


def grid(args):
    """The points to measure, ``(mode, causal, d, n, dtype_name)`` in the order they run
    and are saved: the cases the kernel's record declares at ``N = Nq = Nk`` in
    ``args.n`` (B and H from ``args``), narrowed to the dtypes, head dims and causal
    settings asked for."""
    causal_setting = (KERNEL.default_alignment if KERNEL.default_alignment in KERNEL.alignments
                      else (KERNEL.alignments or (None,))[0])
    declared = {(c.is_causal, c.D, c.Nq, c.dtype) for c in cases(
        KERNEL, [(args.batch, args.heads, args.heads, n, n) for n in args.n],
        dtypes=[DTYPES[x] for x in args.dtype], head_dims=args.d,
        settings=[causal_setting if c else None for c in args.causal], layouts=["bhnd"],
        cover="all", interpreter=False)}
    return [(mode, causal, d, n, dtype_name)
            for dtype_name in args.dtype for mode in args.modes for causal in args.causal
            for d in args.d for n in args.n
            if (causal, d, n, DTYPES[dtype_name]) in declared]


def providers(mode, args):
    """The columns timed for ``mode``: our kernel (one per backward design in
    forward+backward), then SDPA's flash and cuDNN back ends."""
    ours = ["triton"] if mode == "fwd" else [BWD_PROVIDERS[b] for b in args.bwd]
    return ours + ["flash", "cudnn"]


def columns(args):
    """The printed table's columns for the designs in ``args.bwd``."""
    cols = ["mode", "causal", "d", "n", "dtype", "triton"]
    atomic = "atomic_dq" in args.bwd
    if atomic:
        cols.append("triton_atomic_dq")
    cols += ["flash", "cudnn", "x_flash", "x_cudnn"]
    if atomic:
        cols += ["atomic_dq_x_flash", "atomic_dq_x_cudnn", "atomic_dq_x_three"]
    cols.append("err_vs_flash")
    if atomic:
        cols.append("atomic_dq_err_vs_flash")
    return cols


def _backend_fn(name, q, k, v, causal):
    if name == KERNEL.name:
        fn = KERNEL.load()
        return lambda: fn(q, k, v, is_causal=causal, enable_gqa=True)
    if name == "triton_atomic_dq":
        from course_utils.triton_attention import triton_attention
        return lambda: triton_attention(q, k, v, is_causal=causal, enable_gqa=True,
                                        bwd="atomic_dq")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]

    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fn


def measure(mode, causal, d, n, dtype_name, args):
    """One grid point: a row with TFLOPS per backend, ratios and our error."""
    dtype = DTYPES[dtype_name]
    b, h = args.batch, args.heads
    gen = torch.Generator(device=device.DEVICE).manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device.DEVICE, dtype=dtype, generator=gen)
               .requires_grad_(mode != "fwd") for _ in range(3))
    do = torch.randn(b, h, n, d, device=device.DEVICE, dtype=dtype, generator=gen)
    flops = common.attention_flops(b, h, n, n, d, causal, mode)
    row = {"mode": mode, "causal": causal, "d": d, "n": n, "dtype": dtype_name,
           "batch": b, "heads": h, "settle_ms": args.settle}
    outs = {}
    for name in providers(mode, args):
        fwd = _backend_fn(name, q, k, v, causal)
        try:
            if mode == "fwd":
                with torch.no_grad():
                    outs[name] = fwd()
                    ms = common.time_ms(fwd, warmup=25, rep=args.rep,
                                        settle_ms=args.settle)
            else:
                def step():
                    return torch.autograd.grad(fwd(), (q, k, v), do)
                outs[name] = torch.cat([g.flatten() for g in step()])
                ms = common.time_ms(step, warmup=25, rep=args.rep, settle_ms=args.settle)
            row[name] = flops / ms * 1e-9
            row[f"{name}_ms"] = ms
        except RuntimeError as err:          # a backend that refuses this shape
            row[name] = None
            row[f"{name}_error"] = str(err).splitlines()[0][:160]
        torch.cuda.empty_cache()
    # our providers' names in the ratio columns: "" for triton, "atomic_dq_" for the other
    for name, prefix in (("triton", ""), ("triton_atomic_dq", "atomic_dq_")):
        if outs.get(name) is not None and outs.get("flash") is not None:
            a, r = outs[name].float(), outs["flash"].float()
            row[f"{prefix}err_vs_flash"] = float((a - r).norm() / r.norm())
        for base in ("flash", "cudnn"):
            if row.get(name) and row.get(base):
                row[f"{prefix}x_{base}"] = row[name] / row[base]
    if row.get("triton_atomic_dq") and row.get("triton"):
        row["atomic_dq_x_three"] = row["triton_atomic_dq"] / row["triton"]
    return row


def plot(path, out_dir=None):
    """Draw one figure per dtype: TFLOPS against N, a panel per (mode, causal, d)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    path = Path(path)
    rec = json.loads(path.read_text())
    rows, env = rec["rows"], rec["environment"]
    out_dir = Path(out_dir) if out_dir else path.parent
    written = []
    for dtype_name in sorted({r["dtype"] for r in rows}):
        sub = [r for r in rows if r["dtype"] == dtype_name]
        panels = sorted({(r["mode"], r["causal"], r["d"]) for r in sub},
                        key=lambda p: (p[0] != "fwd", p[1], p[2]))
        ncol = min(4, len(panels))
        nrow = -(-len(panels) // ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow), squeeze=False,
                                 sharey=True)
        for ax, (mode, causal, d) in zip(axes.flat, panels):
            pts = sorted((r for r in sub if (r["mode"], r["causal"], r["d"]) == (mode, causal, d)),
                         key=lambda r: r["n"])
            for name in BACKENDS:
                xs = [r["n"] for r in pts if r.get(name)]
                ys = [r[name] for r in pts if r.get(name)]
                if xs:
                    ax.plot(xs, ys, "o-", color=COLORS[name], label=name)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{mode}, {'causal' if causal else 'non-causal'}, d={d}", fontsize=10)
            ax.set_xlabel("sequence length N")
            ax.grid(alpha=0.3)
        for ax in axes[:, 0]:
            ax.set_ylabel("TFLOPS")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize=9)
        fig.suptitle(f"Attention {dtype_name}, B={sub[0]['batch']}, H={sub[0]['heads']} on "
                     f"{env['device']} (torch {env['torch']}, triton {env['triton']})",
                     fontsize=11)
        fig.tight_layout()
        png = out_dir / f"{path.stem}_{dtype_name}.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        written.append(png)
    return written


def _point(r):
    return (r["mode"], r["causal"], r["d"], r["n"], r["dtype"])


def _save(args, rows, kept, cols):
    done = {_point(r) for r in rows}
    merged = [r for r in kept if _point(r) not in done] + rows
    commands = [c for c in kept_commands(args) if c != common.environment()["command"]]
    commands.append(common.environment()["command"])
    return common.save(args.name, merged, extra={"columns": cols, "commands": commands,
                                                 "bwd_designs": args.bwd})


def kept_commands(args):
    """The commands whose rows a merged results file already holds."""
    old = common.RESULTS / common.device_slug() / f"{args.name}.json"
    if args.merge and old.exists():
        return json.loads(old.read_text()).get("commands", [])
    return []


def main(argv):
    args = parse(argv)
    if args.plot is not None:
        path = Path(args.plot) if args.plot else common.RESULTS / common.device_slug() / \
            f"{args.name}.json"
        for png in plot(path):
            print(f"wrote {png}")
        return 0
    if not device.HAS_GPU:
        print("This benchmark needs a CUDA GPU; on a CPU use --plot to draw saved results.")
        return 0
    rows, kept = [], []
    old = common.RESULTS / common.device_slug() / f"{args.name}.json"
    if args.merge and old.exists():
        kept = json.loads(old.read_text())["rows"]
    cols = columns(args)
    for mode, causal, d, n, dtype_name in grid(args):
        row = measure(mode, causal, d, n, dtype_name, args)
        rows.append(row)
        print(common.table([row], cols).splitlines()[-1], flush=True)
        path = _save(args, rows, kept, cols)   # a cut-off run keeps its rows
    print()
    print(common.table(rows, cols))
    print(f"saved {path}")
    for png in plot(path):
        print(f"wrote {png}")
    return 0
