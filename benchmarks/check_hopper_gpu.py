"""Lesson 8 on a real H100: are the Hopper kernels right at real sizes?

Run from the repository root with plain ``python3 benchmarks/check_hopper_gpu.py`` on
an sm90 GPU. It prints which Gluon API the installed Triton has, then runs every kernel
of ``course_utils.hopper`` (the TMA forward, the Gluon forward, the FP8 forward) on the
cases its record in :mod:`course_utils.contract` declares (dtypes, head dims, causal
settings, GQA, strided layouts, crossed pairwise with the real sizes below) and with
each of its schedule options (warp specialisation; serial, pipelined and ping-pong
consumers with 2 or 3 K/V slots; FP8 with and without the Hadamard rotation, in the
Gluon kernel where it applies and in the plain Triton one). Each
output is compared with the float32 reference (relative error of ``o``, largest error
of the log-sum-exp); the script exits non-zero if anything is wrong. ``--list`` prints
the cases without running them (no GPU needed).
"""
import argparse
import inspect
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.attention import naive_attention  # noqa: E402
from course_utils.contract import cases, implementations  # noqa: E402

# the kernels of lesson 8: every record whose module lives in course_utils.hopper
KERNELS = implementations(package="course_utils.hopper")
# (B, Hq, Hkv, Nq, Nk): square and ragged lengths, GQA and MQA; a record takes those it
# declares (the Gluon kernel only lengths that are multiples of 128)
SIZES = [(2, 4, 4, 1024, 1024), (1, 4, 2, 777, 1000), (1, 2, 1, 300, 129),
         (1, 2, 2, 513, 513), (1, 4, 2, 640, 640), (1, 2, 2, 256, 256),
         # Nq != Nk in multiples of 128: the two causal alignments differ, and a
         # lower-right mask with Nq > Nk leaves rows (and whole tiles) that see no key
         (1, 4, 2, 256, 640), (1, 2, 2, 640, 256)]
# the schedule options of each kernel (not part of the contract: the same function and
# answer, another schedule); every case of a kernel runs with each of them
VARIANTS = {
    "tma": [dict(warp_specialize=False), dict(warp_specialize=True)],
    "gluon": [dict(pipeline=p, stages=s) for p in (False, True) for s in (2, 3)]
    + [dict(pingpong=True, stages=s) for s in (2, 3)],
    # FP8: the default kernel (on sm90 the Gluon ping-pong kernel where it applies), with
    # and without the rotation, and the plain Triton kernel
    "fp8": [dict(hadamard=False), dict(hadamard=True), dict(hadamard=False, kernel="triton")],
}
# relative error of o, largest |lse error|: 16-bit kernels by dtype; FP8 by its e4m3
# rounding (3 mantissa bits: about 5.4e-2 measured at N >= 4096 on the H100, up to 8e-2
# with a few dozen keys, where the output averages fewer rounded values)
TOL = {torch.float16: (4e-3, 1e-2), torch.bfloat16: (2.5e-2, 1e-2)}
FP8_TOL = (0.1, 0.15)


def plan(sizes=SIZES, kernels=None, pingpong=True, interpreter=False):
    """``(case, options)`` pairs to run: each kernel's declared cases at ``sizes`` (as
    declared for a GPU; ``interpreter=None``: for this machine), each with every
    schedule option of :data:`VARIANTS` (``pingpong=False`` leaves the ping-pong
    consumers out)."""
    out = []
    for rec in KERNELS if kernels is None else kernels:
        for case in cases(rec, sizes, interpreter=interpreter):
            for opts in VARIANTS.get(rec.name, [{}]):
                if pingpong or not opts.get("pingpong"):
                    out.append((case, opts))
    return out


def label(case, opts):
    return case.id + "".join(f" {k}={v}" for k, v in opts.items())


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def check(case, opts, seed=0):
    """Run one case; returns ``(ok, errors)``. Outputs are compared on rows that see at
    least one key (a causal row of Nq > Nk may see none)."""
    from course_utils.contract import implementation
    rec = implementation(case.impl)
    q, k, v = case.inputs(seed=seed, device=device.DEVICE)
    o, lse = rec.load()(q, k, v, return_lse=True, **case.options(), **opts)
    ref, ref_lse = naive_attention(q.float(), k.float(), v.float(), return_lse=True,
                                   **case.options())
    seen = torch.isfinite(ref_lse)
    tol, lse_tol = FP8_TOL if rec.name == "fp8" else TOL[case.dtype]
    errs = {"o": rel_err(o.float()[seen], ref[seen]),
            "lse": float((lse[seen] - ref_lse[seen]).abs().max())}
    ok = (errs["o"] < tol and errs["lse"] < lse_tol and bool(torch.isfinite(o[seen]).all())
          and o.dtype == case.dtype and tuple(o.shape) == (case.B, case.Hq, case.Nq, case.D))
    return ok, errs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    # COURSE_SKIP_PINGPONG=1 leaves the ping-pong kernel out (if it hangs, the rest still runs)
    todo = plan(pingpong=os.environ.get("COURSE_SKIP_PINGPONG") != "1")
    if args.list:
        for case, opts in todo:
            print(label(case, opts))
        print(f"{len(todo)} cases")
        return 0
    if not device.needs("hopper"):
        return 0
    import triton
    from triton.experimental.gluon import language as gl
    print("triton", triton.__version__, "torch", torch.__version__)
    print("gl.warp_specialize", inspect.signature(gl.warp_specialize))
    print("gl has thread_barrier:", hasattr(gl, "thread_barrier"), "barrier:", hasattr(gl, "barrier"))

    failures = []
    for i, (case, opts) in enumerate(todo):
        name = label(case, opts)
        try:
            ok, errs = check(case, opts, seed=i)
            print(f"{'ok  ' if ok else 'FAIL'} {name}: rel err {errs['o']:.2e}, "
                  f"lse max err {errs['lse']:.2e}", flush=True)
        except Exception as ex:  # keep going: report every failure
            ok = False
            print(f"FAIL {name}: {type(ex).__name__}: {str(ex)[:400]}", flush=True)
            traceback.print_exc(limit=3)
        if not ok:
            failures.append(name)

    from course_utils.hopper.fp8 import fp8_error_report
    for causal in (False, True):
        try:
            g = torch.Generator(device=device.DEVICE).manual_seed(0)
            q, k, v = (torch.randn(2, 4, 1024, 128, device=device.DEVICE, dtype=torch.float16,
                                   generator=g) for _ in range(3))
            k_out = k.clone()
            k_out[..., 5] *= 30  # an outlier channel, as in the FA3 paper's test
            print(f"fp8 RMSE report causal={causal} (outlier channel):",
                  fp8_error_report(q, k_out, v, is_causal=causal, enable_gqa=True))
            print(f"fp8 RMSE report causal={causal} (gaussian):",
                  fp8_error_report(q, k, v, is_causal=causal, enable_gqa=True))
        except Exception as ex:
            print("FAIL fp8 report", ex)
            failures.append("fp8 report")
    print(f"{len(todo) + 2 - len(failures)} of {len(todo) + 2} checks passed;",
          "failures:", failures if failures else "none")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
