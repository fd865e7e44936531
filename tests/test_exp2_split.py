"""The PTX of lesson 8's exponentials on the FMA units (``gluon_fwd._exp2_split_asm``),
run on the CPU by a small reader of the instructions it uses, so the polynomial, its
constants and its operand numbering are checked here, not only on a GPU; and the probe
that times copies with the split, on its bad arguments."""
from __future__ import annotations

import re

import numpy as np
import pytest

from course_utils.hopper import gluon_fwd
from tests.bench_scripts import load

pytestmark = pytest.mark.skipif(not gluon_fwd.GLUON_AVAILABLE,
                                reason="the installed Triton has no Gluon of the kernels' form")


def _f32(bits):
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def _bits(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def run_ptx(asm, inputs):
    """Run ``asm`` (the subset of PTX _exp2_split_asm writes) on float32 ``inputs`` bound
    to $k..$(2k - 1); returns the float32 values of $0..$(k - 1)."""
    k = len(inputs)
    regs = {f"${k + i}": _bits(x) for i, x in enumerate(inputs)}

    def val(op):
        op = op.strip()
        if op.startswith("0f"):
            return int(op[2:], 16)
        if re.fullmatch(r"-?\d+", op):
            return int(op)
        return regs[op]

    for stmt in asm.replace("{", ";").replace("}", ";").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        opcode, rest = stmt.split(None, 1)
        dst, *src = [s.strip() for s in rest.split(",")]
        a = [val(s) for s in src]
        f = [_f32(x) for x in a]
        with np.errstate(all="ignore"):
            if opcode == "ex2.approx.ftz.f32":
                out = _bits(np.exp2(f[0]))
            elif opcode == "max.ftz.f32":
                out = _bits(np.fmax(f[0], f[1]))
            elif opcode == "add.rn.ftz.f32":
                out = _bits(f[0] + f[1])
            elif opcode == "sub.rn.ftz.f32":
                out = _bits(f[0] - f[1])
            elif opcode == "fma.rn.ftz.f32":
                # the float64 product is exact; the sum rounds in float64, then in float32
                # (double rounding, at most the last bit away from one fused rounding)
                out = _bits(np.float32(np.float64(f[0]) * np.float64(f[1]) + np.float64(f[2])))
            elif opcode == "mov.b32":
                out = a[0]
            elif opcode == "shl.b32":
                out = (a[0] << a[1]) & 0xFFFFFFFF
            elif opcode == "add.s32":
                out = (a[0] + a[1]) & 0xFFFFFFFF
            else:
                raise ValueError(f"instruction this reader does not know: {stmt!r}")
        regs[dst] = out
    # an output the code never wrote is no value at all
    return [_f32(regs[f"${i}"]) if f"${i}" in regs else np.float32("nan") for i in range(k)]


def register_problems(asm, k):
    """What the reader above would not notice: a register used but not declared, an
    integer instruction on a register declared .f32, a write into one of the inputs."""
    declared = {}
    for kind, names in re.findall(r"\.reg \.(\w+) ([^;]+);", asm):
        declared.update({n.strip(): kind for n in names.split(",")})
    problems = []
    for stmt in re.sub(r"\.reg [^;]+;", "", asm).replace("{", ";").replace("}", ";").split(";"):
        if not stmt.strip():
            continue
        opcode, rest = stmt.split(None, 1)
        operands = [s.strip() for s in rest.split(",")]
        for op in operands:
            if not re.fullmatch(r"\$\d+|0f[0-9A-Fa-f]{8}|-?\d+", op) and op not in declared:
                problems.append(f"{op} used in {stmt.strip()!r} but not declared")
            if opcode in ("shl.b32", "add.s32") and declared.get(op) == "f32":
                problems.append(f"integer {opcode} on the .f32 register {op}")
        if re.fullmatch(r"\$(\d+)", operands[0]) and int(operands[0][1:]) >= k:
            problems.append(f"{stmt.strip()!r} writes an input")
    return problems


def exp2_problems(asm, k):
    """What is wrong with ``asm`` as 2^x for the softmax's inputs (x <= 0, -inf where
    masked): values off by more than 1.1e-4 relatively (float16 rounds P to 4.9e-4), a
    masked or underflowing input not exactly 0, a NaN, or a register misused; empty if
    none."""
    problems = register_problems(asm, k)
    rng = np.random.default_rng(0)
    xs = np.concatenate([-rng.random(4000, dtype=np.float32) * 30,
                         -rng.random(1000, dtype=np.float32),
                         np.float32([0.0, -0.5, -1.0, -1e-7, -126.4, -126.6, -127.0])])
    for start in range(0, len(xs) - k + 1, k):
        chunk = xs[start:start + k]
        got = run_ptx(asm, chunk)
        for x, y in zip(chunk, got):
            ref = np.exp2(np.float64(x))
            if not np.isfinite(y) or (ref > 1e-37 and abs(y - ref) / ref > 1.1e-4):
                problems.append(f"2^{x} = {y}, not {ref}")
    for x in (-np.inf, np.float32(-200.0), np.float32(-127.0)):
        got = run_ptx(asm, [np.float32(-1.0)] * (k - 1) + [np.float32(x)])[-1]
        if not got == 0.0:
            problems.append(f"2^{x} = {got}, not 0")
    return problems


@pytest.mark.parametrize("k", [2, 4, 8])
def test_the_split_computes_two_to_the_x_in_every_lane(k):
    asm = gluon_fwd._exp2_split_asm(k)
    assert asm.count("ex2.approx") == k - 1                # the other lanes: the exp unit
    assert exp2_problems(asm, k) == []
    # the polynomial's lane alone, on every input of a pack
    xs = np.float32([-3.25, -0.49, -20.0, -0.0001, -9.75, -100.3, -64.5, -1.5])[:k]
    for i in range(k):
        got = run_ptx(asm, np.roll(xs, i))
        assert np.allclose(got, np.exp2(np.roll(xs, i).astype(np.float64)), rtol=1.1e-4, atol=0)


@pytest.mark.parametrize("wrong, why", [
    (("0f3F800000;", "0f3F7FFB49;"), "a constant term below 1: -127 wraps to a NaN"),
    (("max.ftz.f32 x, $7, 0fC2FE0000;", "mov.b32 x, $7;"), "no clamp: -inf gives a NaN"),
    (("max.ftz.f32 x, $7, 0fC2FE0000;", "max.ftz.f32 x, $7, 0fC3000000;"),
     "clamped at -128: the exponent wraps"),
    (("shl.b32 e, e, 23;", "shl.b32 e, e, 22;"), "the integer part in the wrong bits"),
    (("0f3F317AFD", "0f3F317218"), "ln 2 for c1: the fit's other terms no longer match"),
    (("0f3D61510B, 0f3E780627", "0f3E780627, 0f3D61510B"), "c2 and c3 swapped"),
    (("sub.rn.ftz.f32 f, x, j;", "sub.rn.ftz.f32 f, j, x;"), "the fraction's sign flipped"),
    (("ex2.approx.ftz.f32 $0, $4;", "ex2.approx.ftz.f32 $0, $5;"), "a lane reads its neighbour"),
    (("add.s32 $3, b, e;", "add.s32 $2, b, e;"), "the polynomial overwrites another lane"),
    ((".reg .b32 e, b;", ""), "registers used but never declared"),
    ((".reg .b32 e, b;", ".reg .f32 e, b;"), "integer instructions on float registers"),
    (("add.s32 $3, b, e;", "add.s32 $3, b, e;\nmov.b32 $7, b;"), "a write into an input"),
])
def test_the_check_catches_plausible_mistakes(wrong, why):
    asm = gluon_fwd._exp2_split_asm(4)
    assert wrong[0] in asm
    assert exp2_problems(asm.replace(wrong[0], wrong[1]), 4), why


def test_the_course_keeps_every_exponential_on_the_exp_unit():
    assert gluon_fwd._EXP2_SPLIT.value == 0
    # the strings built for the unused switch: those of K = 2
    assert gluon_fwd._EXP2_SPLIT_ASM.value == gluon_fwd._exp2_split_asm(2)
    assert gluon_fwd._EXP2_SPLIT_CONSTRAINTS.value == gluon_fwd._exp2_split_constraints(2)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_k_outputs_then_k_inputs(k):
    parts = gluon_fwd._exp2_split_constraints(k).split(",")
    assert parts == ["=r"] * k + ["r"] * k
    # every output written once, and the asm names no operand past the inputs
    asm = gluon_fwd._exp2_split_asm(k)
    written = re.findall(r"^\S+ (\$\d+),", asm, re.M)
    assert sorted(written, key=lambda r: int(r[1:])) == [f"${i}" for i in range(k)]
    assert max(int(n) for n in re.findall(r"\$(\d+)", asm)) == 2 * k - 1


@pytest.mark.parametrize("args, message", [
    (["--modules", "no/such/copy.py"], "no such module"),
    (["--modules", "course_utils/hopper/gluon_fwd.py"], "every copy above 0"),
    (["--modules", "course_utils/hopper/gluon_fwd.py", "--d", "96"], "head dims"),
])
def test_the_probe_refuses_bad_arguments_before_any_work(args, message, capsys):
    probe = load("exp2_split_probe")
    with pytest.raises(SystemExit) as e:
        probe.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err
