"""Correctness of the Triton attention kernels (lessons 6-7) at real sizes on a GPU.

    python benchmarks/gpu_check_attention.py            # every case, one fixed config
    COURSE_TRITON_AUTOTUNE=1 python benchmarks/gpu_check_attention.py --quick
    python benchmarks/gpu_check_attention.py --bwd atomic_dq   # the fused backward

The cases repeat those of tests/test_triton_attention.py (lengths 1, 7, 129, Nq != Nk,
causal both ways, GQA 1/2/4 and MQA, head dims 16..256 and padded ones, float16,
bfloat16, float32, strided inputs) at sizes the interpreter cannot reach. Reference:
``naive_attention`` and autograd through it, in float32 on upcast inputs. Error measure:
``||x - ref|| / ||ref||`` per tensor. Every output is poisoned with NaN first, so an
element the kernel never writes fails the check. Plain python: no pytest needed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.attention import naive_attention  # noqa: E402
from course_utils.contract import IMPLEMENTATIONS  # noqa: E402
from course_utils.triton_attention import triton_attention  # noqa: E402

# (B, Hq, Hkv, Nq, Nk, D, causal, dtype, layout)
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
CASES = [
    (1, 2, 2, 1, 1, 64, True, F16, "bhnd"),
    (2, 4, 2, 7, 7, 64, False, F16, "bhnd"),
    (2, 4, 4, 129, 129, 128, True, BF16, "bhnd"),
    (2, 8, 2, 1000, 1000, 64, True, F16, "bnhd"),
    (2, 8, 8, 1000, 1537, 128, False, BF16, "bhnd"),
    (2, 8, 4, 1537, 1000, 128, True, F16, "bhnd"),
    (1, 8, 1, 777, 2048, 64, True, F16, "bhnd"),
    (4, 16, 16, 2048, 2048, 128, True, F16, "bhnd"),
    (4, 16, 16, 2048, 2048, 128, False, BF16, "bnhd"),
    (1, 4, 4, 4096, 4096, 64, True, BF16, "bhnd"),
    (2, 4, 2, 513, 513, 16, True, F16, "bhnd"),
    (2, 4, 2, 513, 700, 32, False, BF16, "bhnd"),
    (1, 4, 4, 1024, 1024, 256, True, F16, "bhnd"),
    (1, 4, 2, 600, 900, 256, False, BF16, "bhnd"),
    (2, 4, 4, 300, 300, 48, True, F16, "bhnd"),
    (2, 4, 2, 300, 257, 80, False, BF16, "bhnd"),
    (2, 4, 2, 1024, 1024, 64, True, F32, "bhnd"),
]
# every causal alignment the kernel declares (``causal`` may name one), every dtype it
# declares, at real sizes (lower-right with Nq <= Nk: every row sees a key)
_DECLARED = IMPLEMENTATIONS["triton"]
CASES += [(2, 4, 2, nq, nk, 64, a, dt, "bhnd") for a in _DECLARED.alignments
          for dt in _DECLARED.dtypes for nq, nk in ((700, 1300), (1024, 1024))]
QUICK = [c for c in CASES if c[3] >= 1000]
TOL = {F16: 5e-3, BF16: 2e-2, F32: 5e-3}


def make(shape, dtype, layout):
    b, h, n, d = shape
    if layout == "bnhd":   # (B, N, H, D) storage viewed as (B, H, N, D): strided heads
        return torch.randn(b, n, h, d, device=device.DEVICE, dtype=dtype).transpose(1, 2)
    return torch.randn(b, h, n, d, device=device.DEVICE, dtype=dtype)


def rel(x, ref):
    x, ref = x.detach().float(), ref.detach().float()
    if not torch.isfinite(x).all():
        return float("inf")
    # relative error, with a floor of 1e-2 RMS on the norm: a gradient that is zero in
    # exact arithmetic (N = 1 with a causal mask) is compared by its absolute rounding
    return float((x - ref).norm() / ref.norm().clamp_min(1e-2 * ref.numel() ** 0.5))


def run_case(case, bwd="three_kernels"):
    """``(ok, errors)`` of one case; ``bwd``: the backward design of ``triton_attention``."""
    B, Hq, Hkv, Nq, Nk, D, causal, dtype, layout = case
    opts = dict(is_causal=bool(causal), alignment=causal if isinstance(causal, str) else None,
                enable_gqa=True)
    q = make((B, Hq, Nq, D), dtype, layout).requires_grad_()
    k = make((B, Hkv, Nk, D), dtype, layout).requires_grad_()
    v = make((B, Hkv, Nk, D), dtype, layout).requires_grad_()
    do = torch.randn(B, Hq, Nq, D, device=device.DEVICE, dtype=dtype)
    o, lse = triton_attention(q, k, v, return_lse=True, bwd=bwd, **opts)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    o_ref, lse_ref = naive_attention(q32, k32, v32, return_lse=True, **opts)
    g_ref = torch.autograd.grad(o_ref, (q32, k32, v32), do.float())
    errs = {"o": rel(o, o_ref), "lse": rel(lse, lse_ref), "dq": rel(dq, g_ref[0]),
            "dk": rel(dk, g_ref[1]), "dv": rel(dv, g_ref[2])}
    dtypes_ok = o.dtype == dtype and dq.dtype == dtype and lse.dtype == torch.float32
    ok = dtypes_ok and all(e <= TOL[dtype] for e in errs.values())
    return ok, errs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the cases with N >= 1000")
    ap.add_argument("--bwd", default="three_kernels", choices=("three_kernels", "atomic_dq"),
                    help="the backward design checked")
    args = ap.parse_args(argv)
    if not device.HAS_GPU:
        print("no GPU: the CPU tests in tests/test_triton_attention.py cover the interpreter")
        return 0
    torch.manual_seed(0)
    cases = QUICK if args.quick else CASES
    print(f"{device.describe()['device']}, torch {torch.__version__}, backward {args.bwd}")
    failed = 0
    for case in cases:
        t = time.time()
        ok, errs = run_case(case, bwd=args.bwd)
        failed += not ok
        B, Hq, Hkv, Nq, Nk, D, causal, dtype, layout = case
        print(f"{'ok  ' if ok else 'FAIL'} B={B} Hq={Hq} Hkv={Hkv} Nq={Nq} Nk={Nk} D={D} "
              f"causal={causal!s:5} {str(dtype)[6:]:8} {layout} "
              + " ".join(f"{n}={e:.1e}" for n, e in errs.items())
              + f" (tol {TOL[dtype]:.0e}, {time.time() - t:.1f} s)", flush=True)
    # errors must be raised before any launch
    q = torch.randn(1, 2, 8, 512, device=device.DEVICE, dtype=F16)
    try:
        triton_attention(q, q, q, enable_gqa=True)
        print("FAIL head dim 512 was accepted")
        failed += 1
    except ValueError as e:
        print(f"ok   head dim 512 rejected: {e}")
    print(f"{len(cases) - failed} of {len(cases)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
