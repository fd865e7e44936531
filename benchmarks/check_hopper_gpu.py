"""Lesson 8 on a real H100: are the Hopper kernels right at real sizes?

Run from the repository root with plain ``python3 benchmarks/check_hopper_gpu.py`` on
an sm90 GPU. It prints which Gluon API the installed Triton has, then compares the
TMA forward (fp16 / bf16, causal or not, GQA, ragged lengths, with and without warp
specialisation), the Gluon forward (serial, pipelined and ping-pong consumers) and the FP8
forward (with and without the Hadamard rotation) with the float32 reference, poisons
outputs to catch unwritten rows, and exits non-zero if anything is wrong.
"""
import inspect
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.attention import naive_attention  # noqa: E402

TOL = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}
failures = []
# COURSE_SKIP_PINGPONG=1 leaves the ping-pong kernel out (if it hangs, the rest still runs)
PINGPONG = os.environ.get("COURSE_SKIP_PINGPONG") != "1"


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def inputs(b, hq, hkv, nq, nk, d, dtype, seed=0):
    g = torch.Generator(device=device.DEVICE).manual_seed(seed)
    q = torch.randn(b, hq, nq, d, device=device.DEVICE, dtype=dtype, generator=g)
    k = torch.randn(b, hkv, nk, d, device=device.DEVICE, dtype=dtype, generator=g)
    v = torch.randn(b, hkv, nk, d, device=device.DEVICE, dtype=dtype, generator=g)
    return q, k, v


def check(label, fn, q, k, v, causal, tol, lse_tol=1e-2):
    try:
        o, lse = fn(q, k, v, is_causal=causal, return_lse=True)
        ref, ref_lse = naive_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                       return_lse=True, enable_gqa=True)
        e, el = rel_err(o, ref), float((lse - ref_lse).abs().max())
        ok = e < tol and el < lse_tol and bool(torch.isfinite(o).all())
        print(f"{'ok  ' if ok else 'FAIL'} {label}: rel err {e:.2e}, lse max err {el:.2e}", flush=True)
        if not ok:
            failures.append(label)
    except Exception as ex:  # keep going: report every failure
        print(f"FAIL {label}: {type(ex).__name__}: {str(ex)[:400]}", flush=True)
        traceback.print_exc(limit=3)
        failures.append(label)


def main():
    if not device.needs("hopper"):
        return 0
    import triton
    from triton.experimental.gluon import language as gl
    print("triton", triton.__version__, "torch", torch.__version__)
    print("gl.warp_specialize", inspect.signature(gl.warp_specialize))
    print("gl has thread_barrier:", hasattr(gl, "thread_barrier"), "barrier:", hasattr(gl, "barrier"))

    from course_utils.hopper.fp8 import attention_fp8, fp8_error_report
    from course_utils.hopper.gluon_fwd import attention_gluon
    from course_utils.hopper.triton_fwd import attention_tma

    from course_utils.contract import IMPLEMENTATIONS
    for dtype in IMPLEMENTATIONS["tma"].dtypes:             # the dtypes the kernels declare
        for (b, hq, hkv, nq, nk, d, causal) in [(2, 4, 4, 1024, 1024, 128, False),
                                                 (1, 4, 2, 777, 1000, 128, True),
                                                 (1, 2, 1, 300, 129, 64, False),
                                                 (1, 2, 2, 513, 513, 64, True)]:
            q, k, v = inputs(b, hq, hkv, nq, nk, d, dtype)
            for ws in (False, True):
                check(f"tma {dtype} {(b, hq, hkv, nq, nk, d)} causal={causal} ws={ws}",
                      lambda *a, **kw: attention_tma(*a, warp_specialize=ws, **kw, enable_gqa=True),
                      q, k, v, causal, TOL[dtype])
        for (b, hq, hkv, n, d) in [(2, 4, 4, 1024, 128), (1, 4, 2, 640, 128), (1, 2, 2, 256, 64)]:
            q, k, v = inputs(b, hq, hkv, n, n, d, dtype)
            for pipe in (False, True):
                for stages in (2, 3):
                    check(f"gluon {dtype} {(b, hq, hkv, n, d)} pipeline={pipe} stages={stages}",
                          lambda *a, **kw: attention_gluon(*a, pipeline=pipe, stages=stages, **kw, enable_gqa=True),
                          q, k, v, False, TOL[dtype])
            for stages in ((2, 3) if PINGPONG else ()):
                check(f"gluon ping-pong {dtype} {(b, hq, hkv, n, d)} stages={stages}",
                      lambda *a, **kw: attention_gluon(*a, pingpong=True, stages=stages, **kw, enable_gqa=True),
                      q, k, v, False, TOL[dtype])
    for causal in (False, True):
        q, k, v = inputs(2, 4, 4, 1024, 1024, 128, torch.float16)
        check(f"fp8 hadamard causal={causal}",
              lambda *a, **kw: attention_fp8(*a, hadamard=True, **kw, enable_gqa=True), q, k, v, causal, 0.08, lse_tol=0.15)
        try:
            k_out = k.clone()
            k_out[..., 5] *= 30  # an outlier channel, as in the FA3 paper's test
            print("fp8 RMSE report (outlier channel):", fp8_error_report(q, k_out, v, is_causal=causal, enable_gqa=True))
            print("fp8 RMSE report (gaussian):", fp8_error_report(q, k, v, is_causal=causal, enable_gqa=True))
        except Exception as ex:
            print("FAIL fp8 report", ex)
            failures.append("fp8 report")
    print("failures:", failures if failures else "none")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
