"""The course's whole performance table in one run, every kernel against SDPA's flash
and cuDNN back ends measured in the same process:

    python -m course_utils.bench table [--n 4096,16384] [--d 64,128] [--dtype fp16,bf16]

For every point (B = 4, H = 32, head dim ``d``, ``N = Nq = Nk``, causal and not):

* forward: lesson 6's Triton kernel (``triton``), lesson 8's TMA kernel (``tma``), the
  Gluon kernel in the schedule measured fastest at the head dim (``gluon``,
  ``gluon_fwd.fastest``), FP8 (``fp8``: on sm90 the Gluon kernel on e4m3 tiles in
  ``fp8.GLUON_FP8_SCHEDULE``, elsewhere the plain Triton FP8 kernel, named in
  ``fp8_kernel``; kernel time, its quantisation time is the column ``fp8_quant_ms``), SDPA
  ``flash`` and ``cudnn``;
* forward + backward: those of our kernels whose record declares a backward
  (``triton``: lesson 7's kernels), the Gluon forward paired with the Gluon backward of
  :mod:`course_utils.hopper.gluon_bwd` (``gluon``, the points the Gluon record declares),
  SDPA ``flash`` and ``cudnn``.

Our columns are named after the kernels' records in :mod:`course_utils.contract`; a
point a record does not declare (a head dim or dtype it does not take)
gets the record's reason in ``<provider>_skip`` instead of a speed.

TFLOPS by the FlashAttention papers' count (:func:`common.attention_flops`), the median
of ``triton.testing.do_bench``, each provider first run back to back for ``--settle``
milliseconds (default 1000), so it is timed at the clock it sustains under the GPU's power
cap rather than at the full clock it gets for a moment after the GPU idled
(:func:`common.settle`). Each of our outputs is compared with SDPA's before it is
timed; a provider that fails or disagrees gets its error in the row instead of a speed.
The ratios ``<provider>_x_flash`` and ``<provider>_x_cudnn`` are printed and saved in
``benchmarks/<device>/table.json`` (rows are saved as they come, so a cut-off run keeps
what it measured).
"""
from __future__ import annotations

import argparse
import math
import traceback

import torch

from course_utils import device
from course_utils.bench import common
from course_utils.contract import CAUSAL_UPPER_LEFT, implementation

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
OURS = ("triton", "tma", "gluon", "fp8")          # contract records, by name
FWD = OURS + ("flash", "cudnn")
# the Gluon record is the forward's; its backward (course_utils.hopper.gluon_bwd) takes the
# same points, so the pair is timed under the forward's record
FWD_BWD = tuple(r for r in OURS if implementation(r).backward) + ("gluon", "flash", "cudnn")


def undeclared(name, causal, d, n, dtype, heads=32):
    """Why provider ``name`` (one of :data:`OURS`) does not declare this point
    (``Nq = Nk = n``, SDPA's causal mask), or ``None``."""
    err = implementation(name).refusal(dtype=dtype, D=d, Nq=n, Nk=n, Hq=heads, Hkv=heads,
                                       alignment=CAUSAL_UPPER_LEFT if causal else None,
                                       interpreter=False)
    return None if err is None else str(err)


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def _fwd_fn(name, q, k, v, causal, grad=False):
    """A zero-argument callable for provider ``name``, or a string saying why it does not
    apply to this point. ``grad``: the forward that the backward is timed through (for
    ``gluon``, the differentiable pair of the Gluon forward and backward)."""
    if name in ("flash", "cudnn"):
        return common.sdpa(name, q, k, v, causal)
    why = undeclared(name, causal, q.shape[-1], q.shape[2], q.dtype, q.shape[1])
    if why:
        return why
    if name == "triton":
        from course_utils.triton_attention import triton_attention
        return lambda: triton_attention(q, k, v, is_causal=causal)
    if not device.IS_HOPPER:      # lesson 8's kernels are tuned for (and timed on) sm90
        return "needs an sm90 GPU"
    if name == "tma":
        from course_utils.hopper.triton_fwd import attention_tma
        return lambda: attention_tma(q, k, v, is_causal=causal, num_stages=3)
    if name == "gluon" and grad:
        from course_utils.hopper.gluon_bwd import gluon_attention
        return lambda: gluon_attention(q, k, v, is_causal=causal)
    if name == "gluon":
        from course_utils.hopper.gluon_fwd import attention_gluon, fastest
        return lambda: attention_gluon(q, k, v, is_causal=causal, **fastest(q.shape[-1], causal))
    if name == "fp8":
        from course_utils.hopper.fp8 import attention_fp8_prepared, prepare_fp8
        prep = prepare_fp8(q, k, v, hadamard=True)
        return lambda: attention_fp8_prepared(prep, is_causal=causal, out_dtype=q.dtype)
    raise KeyError(name)


def measure(mode, causal, d, n, dtype_name, args):
    dtype = DTYPES[dtype_name]
    b, h = args.batch, args.heads
    gen = torch.Generator(device=device.DEVICE).manual_seed(n + d)
    grad = mode != "fwd"
    q, k, v = (torch.randn(b, h, n, d, device=device.DEVICE, dtype=dtype, generator=gen)
               .requires_grad_(grad) for _ in range(3))
    do = torch.randn(b, h, n, d, device=device.DEVICE, dtype=dtype, generator=gen)
    flops = common.attention_flops(b, h, n, n, d, causal, mode)
    row = {"mode": mode, "causal": causal, "d": d, "n": n, "dtype": dtype_name, "batch": b,
           "heads": h}
    ref = None
    for name in ("flash",) + tuple(p for p in (FWD if mode == "fwd" else FWD_BWD)
                                   if p != "flash"):
        try:
            fn = _fwd_fn(name, q, k, v, causal, grad)
            if isinstance(fn, str):
                row[f"{name}_skip"] = fn
                continue
            if grad:
                fwd = fn

                def fn(fwd=fwd):
                    return torch.cat([g.flatten() for g in
                                      torch.autograd.grad(fwd(), (q, k, v), do)])
            with torch.set_grad_enabled(grad):
                out = fn()
                torch.cuda.synchronize()
                if ref is None:
                    ref = out.detach().float()
                else:
                    err = float((out.detach().float() - ref).norm() / ref.norm())
                    row[f"{name}_err"] = err
                    limit = 0.08 if name == "fp8" else 2e-2
                    if not (math.isfinite(err) and err < limit):
                        raise RuntimeError(f"relative error {err:.3g} vs SDPA flash > {limit}")
                del out
                ms = common.time_ms(fn, warmup=25, rep=args.rep, settle_ms=args.settle)
            row[name] = flops / ms * 1e-9
            row[f"{name}_ms"] = ms
            if name == "fp8":
                from course_utils.hopper.fp8 import prepare_fp8
                row["fp8_kernel"] = prepare_fp8(q, k, v, hadamard=True)["kernel"]
                row["fp8_quant_ms"] = common.time_ms(
                    lambda: prepare_fp8(q, k, v, hadamard=True), warmup=5, rep=args.rep)
                row["fp8_with_quant"] = flops / (ms + row["fp8_quant_ms"]) * 1e-9
        except Exception as e:  # noqa: BLE001 - report it and measure the others
            row[name] = None
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            traceback.print_exc(limit=2)
        torch.cuda.empty_cache()
    for name in FWD:
        for base in ("flash", "cudnn"):
            if name not in ("flash", "cudnn") and row.get(name) and row.get(base):
                row[f"{name}_x_{base}"] = row[name] / row[base]
    return row


COLUMNS = ["mode", "causal", "d", "n", "dtype", "triton", "tma", "gluon", "fp8", "flash",
           "cudnn", "triton_x_flash", "triton_x_cudnn", "tma_x_cudnn", "gluon_x_cudnn",
           "fp8_x_cudnn", "fp8_with_quant"]


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m course_utils.bench table",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="fwd,fwd+bwd")
    ap.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    ap.add_argument("--d", default="64,128", type=_ints)
    ap.add_argument("--n", default="4096,16384", type=_ints)
    ap.add_argument("--dtype", default="fp16,bf16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rep", type=int, default=100, help="milliseconds of timed repeats")
    common.add_settle_option(ap)
    ap.add_argument("--name", default="table", help="results file stem")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    dtypes = [d for d in args.dtype.split(",") if d]
    for m in modes:
        if m not in ("fwd", "fwd+bwd"):
            ap.error(f"--modes takes fwd and/or fwd+bwd, got {m!r}")
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"--dtype takes fp16 and/or bf16, got {d!r}")
    causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    if not device.HAS_GPU:
        print("This benchmark needs a CUDA GPU.")
        return 0
    rows = []
    path = None
    for dtype_name in dtypes:
        for mode in modes:
            for c in causal:
                for d in args.d:
                    for n in args.n:
                        rows.append(measure(mode, c, d, n, dtype_name, args))
                        print(common.table(rows[-1:], COLUMNS).splitlines()[-1], flush=True)
                        path = common.save(args.name, rows,
                                           extra={"columns": COLUMNS, "settle_ms": args.settle})
    print()
    print(common.table(rows, COLUMNS))
    print(f"saved {path}")
    return 0
