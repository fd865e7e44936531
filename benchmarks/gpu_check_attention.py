"""Correctness of the Triton attention kernels (lessons 6-7) at real sizes on a GPU.

    python benchmarks/gpu_check_attention.py            # every case, one fixed config
    COURSE_TRITON_AUTOTUNE=1 python benchmarks/gpu_check_attention.py --quick
    python benchmarks/gpu_check_attention.py --list     # the cases (no GPU needed)
    python benchmarks/gpu_check_attention.py --bwd atomic_dq   # the fused backward

The kernels are those whose record in ``course_utils.contract`` says they compile with
Triton, follow SDPA's contract and have a backward (``triton_attention``); the cases are
what each record declares (dtypes, head dims, causal alignments, GQA, strided layouts),
crossed pairwise with the sizes below (lengths 1, 7, 129, Nq != Nk both ways, GQA 1/2/4
and MQA) at sizes the interpreter cannot reach. Reference: ``naive_attention`` and
autograd through it, in float32 on upcast inputs. Error measure: ``||x - ref|| /
||ref||`` per tensor. Plain python: no pytest needed.
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
from course_utils.contract import (CAUSAL_LOWER_RIGHT, cases, implementation,  # noqa: E402
                                   implementations)

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
KERNELS = implementations(kind="sdpa", devices="triton", backward=True)
# (B, Hq, Hkv, Nq, Nk)
SIZES = [
    (1, 2, 2, 1, 1), (2, 4, 2, 7, 7), (2, 4, 4, 129, 129), (2, 8, 2, 1000, 1000),
    (2, 8, 8, 1000, 1537), (2, 8, 4, 1537, 1000), (1, 8, 1, 777, 2048),
    (4, 16, 16, 2048, 2048), (1, 4, 4, 4096, 4096), (2, 4, 2, 513, 513),
    (2, 4, 2, 513, 700), (1, 4, 4, 1024, 1024), (1, 4, 2, 600, 900), (2, 4, 4, 300, 300),
    (2, 4, 2, 300, 257), (2, 4, 2, 1024, 1024), (2, 4, 2, 700, 1300),
]


def every_row_sees_a_key(case):
    """Lower-right with Nq > Nk leaves the first rows without a key: the relative error
    of this script needs every row defined (the CPU tests cover those rows)."""
    return not (case.alignment == CAUSAL_LOWER_RIGHT and case.Nq > case.Nk)


def plan(sizes=SIZES, kernels=None, interpreter=False):
    """The cases to run: each kernel's declared cases (for a GPU; ``interpreter=None``:
    for this machine) at ``sizes``."""
    return [c for rec in (KERNELS if kernels is None else kernels)
            for c in cases(rec, sizes, keep=every_row_sees_a_key, interpreter=interpreter)]


CASES = plan()
QUICK = [c for c in CASES if c.Nq >= 1000]
TOL = {F16: 5e-3, BF16: 2e-2, F32: 5e-3}


def rel(x, ref):
    x, ref = x.detach().float(), ref.detach().float()
    if not torch.isfinite(x).all():
        return float("inf")
    # relative error, with a floor of 1e-2 RMS on the norm: a gradient that is zero in
    # exact arithmetic (N = 1 with a causal mask) is compared by its absolute rounding
    return float((x - ref).norm() / ref.norm().clamp_min(1e-2 * ref.numel() ** 0.5))


def run_case(case, seed=0, bwd="three_kernels"):
    """Forward and backward of one :class:`~course_utils.contract.Case`; returns
    ``(ok, errors)``. ``bwd``: the backward design of ``triton_attention``."""
    fn = implementation(case.impl).load()
    opts = case.options()
    q, k, v = case.inputs(seed=seed, device=device.DEVICE, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(case.B, case.Hq, case.Nq, case.D, generator=g).to(device.DEVICE, case.dtype)
    extra = {} if bwd == "three_kernels" else {"bwd": bwd}
    o, lse = fn(q, k, v, return_lse=True, **opts, **extra)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    o_ref, lse_ref = naive_attention(q32, k32, v32, return_lse=True, **opts)
    g_ref = torch.autograd.grad(o_ref, (q32, k32, v32), do.float())
    errs = {"o": rel(o, o_ref), "lse": rel(lse, lse_ref), "dq": rel(dq, g_ref[0]),
            "dk": rel(dk, g_ref[1]), "dv": rel(dv, g_ref[2])}
    dtypes_ok = o.dtype == case.dtype and dq.dtype == case.dtype and lse.dtype == torch.float32
    ok = dtypes_ok and all(e <= TOL[case.dtype] for e in errs.values())
    return ok, errs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the cases with Nq >= 1000")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--bwd", default="three_kernels", choices=("three_kernels", "atomic_dq"),
                    help="the backward design checked")
    args = ap.parse_args(argv)
    cases_ = QUICK if args.quick else CASES
    if args.list:
        for case in cases_:
            print(case.id)
        print(f"{len(cases_)} cases")
        return 0
    if not device.HAS_GPU:
        print("no GPU: the CPU tests in tests/test_triton_attention.py cover the interpreter")
        return 0
    print(f"{device.describe()['device']}, torch {torch.__version__}, backward {args.bwd}")
    failed = 0
    for i, case in enumerate(cases_):
        t = time.time()
        ok, errs = run_case(case, seed=i, bwd=args.bwd)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case.id} "
              + " ".join(f"{n}={e:.1e}" for n, e in errs.items())
              + f" (tol {TOL[case.dtype]:.0e}, {time.time() - t:.1f} s)", flush=True)
    # errors must be raised before any launch: a head dim past every record's maximum
    for rec in KERNELS:
        bad = (rec.max_head_dim or max(rec.example_head_dims())) * 2
        q = torch.randn(1, 2, 8, bad, device=device.DEVICE, dtype=rec.dtypes[0])
        try:
            rec.load()(q, q, q, enable_gqa=True)
            print(f"FAIL {rec.name}: head dim {bad} was accepted")
            failed += 1
        except ValueError as e:
            print(f"ok   {rec.name}: head dim {bad} rejected: {e}")
    print(f"{len(cases_) - failed} of {len(cases_)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
