"""Compile lesson 8's Gluon kernels for sm90 on a machine without a GPU.

Gluon is not interpreted, so on a CPU nothing runs these kernels; but Triton compiles for
a GPU it does not have (its wheel carries ptxas). This script calls the course's Hopper
functions with small CPU tensors and a stand-in for every launch: each ``kernel[grid](...)``
is compiled for ``cuda:90`` instead of run, from the same arguments. It prints one line per
call: the kernels compiled, their shared memory, or the error. A call whose kernel uses a
name the installed Triton does not have, or does not type-check, fails here, before anyone
takes it to a GPU. So does one whose tensor-core products ptxas had to serialize: when
instructions other than the products read or write an accumulator's registers while its
product is in flight (a value merged across a runtime branch, for one), or registers run
short, ptxas makes every ``wgmma`` wait for the one before it; the kernel still computes
the right values, only slower. ptxas says so in its report, a "Potential Performance
Loss: wgmma.mma_async instructions are serialized due to ..." line (``ptxas info``, code
C75xx); any such line fails the call (ptxas also names a ``setmaxnreg`` it had to ignore
that way). Each kernel is compiled afresh with Triton printing that report, so it is the
report on the machine code Triton builds, with its own ptxas options; the script also
prints the stack and spill-store bytes a thread.

    python tests/gluon_compile_check.py        (exit status 1 if any call failed)
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import traceback
import warnings
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402  (compiled, not interpreted: imported before course_utils)
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.simplefilter("ignore")
from course_utils import device  # noqa: E402

os.environ.pop("TRITON_INTERPRET", None)        # course_utils sets it on a CPU machine
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from course_utils.hopper import fp8, gluon_bwd, gluon_fwd  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SM90_SHARED = 232448                             # bytes of shared memory an sm90 block may use
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
           torch.int32: "i32", torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv"}
compiled = []


def _mangle(desc):
    if hasattr(desc, "__mangle__"):
        return desc.__mangle__()
    from triton.runtime.jit import mangle_type    # Triton 3.6
    return mangle_type(desc)


def _source(fn, args, kwargs):
    """The signature and constants a launch of ``fn`` with these arguments compiles."""
    bound = dict(zip(fn.arg_names, args))
    bound.update(kwargs)
    sig, consts = {}, {}
    for i, p in enumerate(fn.params):
        v = bound[p.name] if p.name in bound else p.default
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            consts[(i,)] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _DTYPES[v.dtype]
        elif hasattr(v, "block_shape"):
            sig[p.name] = _mangle(v)
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: no signature type for {p.name}={v!r}")
    if "Gluon" in type(fn).__name__:
        from triton.experimental.gluon._runtime import GluonASTSource
        return GluonASTSource(fn=fn, signature=sig, constexprs=consts)
    return ASTSource(fn=fn, signature=sig, constexprs=consts)


def ptxas_report(log):
    """What ptxas's report (``-v``, as Triton prints it) says of a kernel: the stack bytes
    and spill-store bytes a thread, and every "Potential Performance Loss" it names (wgmma
    products serialized, ``setmaxnreg`` ignored, ...), each without the function's name; an
    empty list if none."""
    if "bytes stack frame" not in log:
        raise RuntimeError("no ptxas report in Triton's output (its TRITON_DUMP_PTXAS_LOG "
                           f"knob did not print one): {log[-500:]!r}")

    def total(what):
        return sum(int(x) for x in re.findall(rf"(\d+) bytes {what}", log))
    losses = re.findall(r"Potential Performance Loss: (.*?)(?: (?:in|for) the function|$)",
                        log, re.M)
    return total("stack frame"), total("spill stores"), [" ".join(w.split()) for w in losses]


def compile_reported(src, options):
    """``triton.compile(src)`` for sm90, afresh (not taken from Triton's cache) with ptxas's
    report printed, so that the report read is that of the machine code Triton builds, with
    its own options; returns the kernel and :func:`ptxas_report` of that report."""
    log = io.StringIO()
    knobs = triton.knobs
    with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        knobs.compilation.always_compile = True
        knobs.nvidia.dump_ptxas_log = True
        kernel = triton.compile(src, target=TARGET, options=options)
    return kernel, ptxas_report(log.getvalue())


def _compile_instead(self, grid):
    def launch(*args, **kwargs):
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "num_ctas")
                   if k in kwargs}
        kernel, report = compile_reported(_source(self, args, kwargs), options)
        # bfloat16 roundings of two values at once in the PTX (gluon_bwd._round_16)
        compiled.append((self.__name__, kernel.metadata.shared,
                         kernel.asm["ptx"].count("cvt.rn.bf16x2.f32"), *report))
    return launch


class _Props:
    multi_processor_count = 132                  # an H100 SXM


def main():
    JITFunction.__getitem__ = _compile_instead    # every launch below compiles instead
    torch.cuda.get_device_properties = lambda *_: _Props()
    device.IS_HOPPER = True
    if not gluon_fwd.GLUON_AVAILABLE:
        print(f"# Triton {triton.__version__} has no Gluon warp_specialize of the form the "
              "kernels use: nothing to compile")
        return 0

    # on the course's device: the wrappers refuse CPU tensors where a GPU is present (a
    # GPU machine compiles here too, for sm90, whatever its own GPU)
    def qkv(d, dtype=torch.float16, nq=300, nk=260, hq=4, hkv=2):
        g = torch.Generator().manual_seed(d)
        return (torch.randn(1, hq, nq, d, generator=g).to(device.DEVICE, dtype),
                torch.randn(1, hkv, nk, d, generator=g).to(device.DEVICE, dtype),
                torch.randn(1, hkv, nk, d, generator=g).to(device.DEVICE, dtype))

    calls = []
    for d in (64, 128):
        for name, opts in (("fastest", gluon_fwd.FASTEST[d]), ("one-consumer", dict()),
                           ("serial", dict(pipeline=False)),
                           ("pingpong-persistent", dict(pingpong=True, persistent=True)),
                           ("block-n-64", dict(pingpong=True, block_n=64))):
            for causal in (False, True):
                calls.append((f"attention_gluon D={d} {name} causal={causal}",
                              lambda d=d, opts=opts, causal=causal: gluon_fwd.attention_gluon(
                                  *qkv(d), is_causal=causal, enable_gqa=True, **opts)))
        calls.append((f"attention_gluon D={d} bf16 three interleaved 1 stage",
                      lambda d=d: gluon_fwd.attention_gluon(
                          *qkv(d, torch.bfloat16), enable_gqa=True, pingpong=True, consumers=3,
                          pipeline=False, stages=1)))
        calls.append((f"attention_gluon_fp8 D={d} default schedule",
                      lambda d=d: gluon_fwd.attention_gluon_fp8(
                          fp8.prepare_fp8(*qkv(d), kernel="gluon", block_m=128, block_n=128), is_causal=True,
                          **fp8.GLUON_FP8_SCHEDULE)))
        calls.append((f"attention_gluon_fp8 D={d} ping-pong grid",
                      lambda d=d: gluon_fwd.attention_gluon_fp8(
                          fp8.prepare_fp8(*qkv(d), kernel="gluon", block_m=128, block_n=128))))

        def backward(d=d, dtype=torch.float16):
            q, k, v = qkv(d, dtype)
            o, lse = q.clone(), torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device)
            return gluon_bwd.attention_gluon_backward(q, k, v, o, lse, torch.ones_like(o),
                                                      is_causal=True, enable_gqa=True)
        calls.append((f"attention_gluon_backward D={d} causal", backward))
        # bfloat16 rounds P^T and dS^T through inline PTX (gluon_bwd._round_16)
        calls.append((f"attention_gluon_backward D={d} bf16 causal",
                      lambda d=d: backward(d, torch.bfloat16)))
    bad = 0
    for label, call in calls:
        del compiled[:]
        try:
            call()
        except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
            bad += 1
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            print(f"FAIL {label}: {last[:1500]}")
            continue
        # a kernel that asks for more shared memory than an sm90 block has, or in which
        # ptxas saw a performance loss (its tensor-core products serialized, ...), fails
        wrong = [c for c in compiled if c[1] > SM90_SHARED or c[5]]
        bad += bool(wrong) or not compiled
        print(f"{'ok  ' if compiled and not wrong else 'FAIL'} {label}: "
              + ", ".join(f"{n} ({s} bytes shared, {st} bytes stack, {sp} bytes spilled"
                          + (f", {p} packed bf16 roundings" if p else "")
                          + (f", ptxas: {'; '.join(why)}" if why else "") + ")"
                          for n, s, p, st, sp, why in compiled))
    print(f"# triton {triton.__version__}: {len(calls) - bad} of {len(calls)} calls compiled for sm90")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
