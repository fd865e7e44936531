"""Lesson 8's Gluon kernels are never interpreted, so a CPU run of the other tests does not
touch them; tests/gluon_compile_check.py compiles them for sm90 instead (Triton ships its
own ptxas), every schedule the course offers, forward, FP8 and backward. A kernel that
uses a name the installed Triton lacks, or that does not type-check, fails here."""
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code_or_script, timeout=900):
    args = [sys.executable, str(code_or_script)] if isinstance(code_or_script, Path) else \
        [sys.executable, "-c", code_or_script]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_every_gluon_kernel_call_compiles_for_sm90():
    pytest.importorskip("triton")
    run = _run(ROOT / "tests" / "gluon_compile_check.py")
    out = run.stdout
    if "nothing to compile" in out:
        pytest.skip(out.strip())
    assert run.returncode == 0, out[-4000:] + run.stderr[-2000:]
    done, total = map(int, re.search(r"(\d+) of (\d+) calls compiled", out).groups())
    assert done == total >= 30, out
    # the backward rounds P^T and dS^T to bfloat16 two values an instruction (a plain
    # .to() gives the compiler one-value roundings, which it may keep): its bfloat16
    # kernel has packed roundings in its PTX, its float16 kernel none
    for d in (64, 128):
        for dt, packed in (("bf16 causal", True), ("causal", False)):
            line = next(x for x in out.splitlines()
                        if f"attention_gluon_backward D={d} {dt}:" in x)
            assert ("packed bf16 roundings" in line.split("_attn_bwd_gluon")[1]) == packed, line
    assert "FAIL" not in out
    # ptxas named no performance loss in any kernel: every kernel's tensor-core products
    # stay in flight (a serialized one fails the script; the test below shows the check
    # catching one)
    assert "ptxas:" not in out and out.count("bytes spilled") >= 30, out
    # every schedule of the forward, FP8 and the backward were among them
    for what in ("fastest causal=True", "pingpong-persistent", "attention_gluon_fp8 D=128",
                 "attention_gluon_backward D=64", "three interleaved 1 stage"):
        assert what in out, what


_PROBE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import tests.gluon_compile_check as cc
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def doubled(x_ptr, N: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = gl.arange(0, N, layout=layout)
        gl.store(x_ptr + offs, gl.load(x_ptr + offs) * 2)

    @gluon.jit
    def misnamed(x_ptr, N: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = gl.arange(0, N, layout=layout)
        gl.store(x_ptr + offs, gl.no_such_operation(gl.load(x_ptr + offs)))

    cc.JITFunction.__getitem__ = cc._compile_instead
    doubled[(1,)](torch.zeros(128), N=128, num_warps=4)
    print("compiled", cc.compiled)
    try:
        misnamed[(1,)](torch.zeros(128), N=128, num_warps=4)
        print("misnamed compiled")
    except Exception as e:
        print("refused", type(e).__name__)
""")


def test_the_compile_check_compiles_a_kernel_and_refuses_a_misnamed_one(tmp_path):
    pytest.importorskip("triton.experimental.gluon")
    probe = tmp_path / "probe.py"          # a jit function needs a file to read its source from
    probe.write_text(_PROBE.format(root=str(ROOT)))
    run = _run(probe)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "compiled [('doubled'," in run.stdout, run.stdout
    assert "refused CompilationError" in run.stdout and "misnamed compiled" not in run.stdout


_SERIAL_PROBE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import torch
    import tests.gluon_compile_check as cc
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)

    @gluon.jit
    def two_products(out_ptr, flag, BRANCH: gl.constexpr):
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 64, 16])
        smem_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)
        a = gl.allocate_shared_memory(gl.float16, [64, 64], smem_l)
        zero = gl.zeros([64, 64], gl.float32, acc_l)
        x = warpgroup_mma(a, a, zero, use_acc=False, is_async=True)
        y = warpgroup_mma_init(zero)
        if BRANCH:
            if flag > 0:      # the second product's accumulator merged across a branch
                y = warpgroup_mma(a, a.permute((1, 0)), zero, use_acc=False, is_async=True)
        else:
            y = warpgroup_mma(a, a.permute((1, 0)), zero, use_acc=False, is_async=True)
        x = warpgroup_mma_wait(1, deps=(x,))
        y = warpgroup_mma_wait(0, deps=(y,))
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, acc_l))
        gl.store(out_ptr + rows[:, None] * 64 + cols[None, :], x + y)

    cc.JITFunction.__getitem__ = cc._compile_instead
    for branch in (False, True):
        two_products[(1,)](torch.zeros(64 * 64), 1, BRANCH=branch, num_warps=4)
        print("branch" if branch else "straight", "losses:", cc.compiled[-1][-1])
""")


def test_the_compile_check_reports_serialized_tensor_core_products(tmp_path):
    # two asynchronous products in flight together: straight, ptxas keeps them in flight;
    # with the second one issued inside a runtime branch (its accumulator merged with the
    # zeros it started from, as a loop that skips a product on some steps writes it),
    # ptxas serializes every product, and the compile check must say so
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    probe = tmp_path / "serial_probe.py"
    probe.write_text(_SERIAL_PROBE.format(root=str(ROOT)))
    run = _run(probe)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    lines = dict(x.split(" losses: ") for x in run.stdout.splitlines() if " losses: " in x)
    assert lines["straight"] == "[]", run.stdout
    assert "wgmma.mma_async instructions are serialized" in lines["branch"], run.stdout
    assert "accumulator registers" in lines["branch"], run.stdout
