"""The lesson checks of the register machine: run a learner's trace on random inputs,
compare the result and the cost with the best known ones, and say what is off."""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass

from ..checks import CheckFailed
from .interpreter import TraceError, TraceResult, _short, matmul_dram, run_trace, softmax_dram

__all__ = ["Problem", "PROBLEMS", "check_trace"]


@dataclass(frozen=True)
class Problem:
    key: str
    title: str
    isa: str
    registers: int
    cycles: int | None          # best known cycles (None: depends on n)
    loads: int | None
    stores: int | None
    shape: str                  # "inner", "outer", "any" (matmul) or "softmax"
    outputs: tuple = ()         # matmul: cells that must be right
    note: str = ""
    reads_per_n: int = 0        # softmax: reads = reads_per_n * n
    step_instructions: int = 0  # softmax online: instructions per steady-state step
    n: int = 2                  # matmul: the matrices are n x n


PROBLEMS = {
    "1": Problem("1", "Problem 1: c[0][0] of a 2x2 matmul", "matmul", 3, 7, 4, 1, "inner",
                 ("c[0][0]",), "4 LOAD + 2 MAC + 1 STORE"),
    "2": Problem("2", "Problem 2: full 2x2 matmul, 3 registers", "matmul", 3, 25, 13, 4, "any",
                 ("c[0][0]", "c[0][1]", "c[1][0]", "c[1][1]"),
                 "13 LOAD + 8 MAC + 4 STORE: order the outputs so that each reuses an operand"),
    "3": Problem("3", "Problem 3: outer-product 2x2 matmul, 6 registers", "matmul", 6, 22, 10, 4,
                 "outer", ("c[0][0]", "c[0][1]", "c[1][0]", "c[1][1]"),
                 "10 LOAD + 8 MAC + 4 STORE with two operand registers and four accumulators"),
    "quiz": Problem("quiz", "Quiz: inner-product 2x2 matmul, 6 registers", "matmul", 6, 20, 8, 4,
                    "inner", ("c[0][0]", "c[0][1]", "c[1][0]", "c[1][1]"),
                    "8 LOAD + 8 MAC + 4 STORE: every input loaded once"),
    "4": Problem("4", "Problem 4: safe softmax, 3 registers", "softmax", 3, None, None, None,
                 "softmax", note="3 passes: 3n reads, n writes", reads_per_n=3),
    "5": Problem("5", "Problem 5: online softmax, 4 registers", "softmax", 4, None, None, None,
                 "softmax", note="2 passes: 2n reads, n writes, 9 instructions per step",
                 reads_per_n=2, step_instructions=9),
}


def _max_live_accumulators(res: TraceResult) -> int:
    """Most unfinished partial sums of *different* outputs held at once."""
    best, stored = 0, set()
    for s in res.steps:
        if s.written:
            stored.add(tuple(re.findall(r"\d+", s.written)))
        live = {_which_c(lb) for lb in s.labels if lb and "·" in lb} - stored
        best = max(best, len(live))
    return best


def _which_c(label: str):
    # a partial sum a[i][k]·b[k][j] + ... belongs to c[i][j]
    m = re.search(r"a\[(\d+)\]\[\d+\]·b\[\d+\]\[(\d+)\]", label)
    return (m.group(1), m.group(2)) if m else label


def _redundant_loads(res: TraceResult) -> list[str]:
    """LOADs of a value that some register already held."""
    out = []
    prev = (None,) * res.num_registers
    for s in res.steps:
        if s.op == "LOAD":
            others = [lb for k, lb in enumerate(prev)]
            if s.read in others:
                r = others.index(s.read)
                out.append(f"line {s.line} loads {s.read} while R{r} still holds it")
        prev = s.labels
    return out


def _reloads(res: TraceResult) -> list[str]:
    seen, out = Counter(), []
    for s in res.steps:
        if s.op == "LOAD":
            seen[s.read] += 1
            if seen[s.read] == 2:
                out.append(s.read)
    return out


def _expected_c(i, j, n):
    return " + ".join(f"a[{i}][{k}]·b[{k}][{j}]" for k in range(n))


def _matmul_trial(trace, prob, seed):
    rng = random.Random(seed)
    n = prob.n
    A = [[round(rng.uniform(-3, 3), 3) for _ in range(n)] for _ in range(n)]
    B = [[round(rng.uniform(-3, 3), 3) for _ in range(n)] for _ in range(n)]
    res = run_trace(trace, matmul_dram(A, B), registers=prob.registers, isa="matmul")
    for addr, value in res.initial_dram.items():
        if value is not None and res.dram[addr] != value:
            raise CheckFailed(f"{prob.title}: your trace overwrote the input {addr}; STORE writes "
                              "only the outputs c[i][j]")
    for cell in prob.outputs:
        i, j = map(int, re.findall(r"\d+", cell))
        want = sum(A[i][k] * B[k][j] for k in range(n))
        got = res.dram[cell]
        if got is None:
            raise CheckFailed(f"{prob.title}: your trace never stores {cell}; "
                              f"it should hold {_expected_c(i, j, n)}\n  hint: end with STORE Rs, {cell}")
        if abs(got - want) > 1e-9 * max(1.0, abs(want)):
            raise CheckFailed(
                f"{prob.title}: {cell} is {got:.6g}, expected {want:.6g}\n"
                f"  your trace stored {res.dram_labels[cell]}\n"
                f"  expected           {_expected_c(i, j, n)}\n"
                "  hint: check which registers the MACs read; MAC_Z starts a sum, MAC adds to one")
    return res


def _softmax_reference(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]


def check_trace(problem, trace, quiet: bool = False, *, sizes=(1, 2, 3, 6),
                scale: float = 1.0, rising: bool = False) -> TraceResult:
    """Check a learner's answer to ``problem`` (a key of :data:`PROBLEMS`).

    Matmul problems take the trace text. Softmax problems take a function
    ``n -> trace text`` (for Problem 5: ``n -> full trace`` built with the
    learner's step, see :func:`online_softmax_trace`). The trace is run on
    random inputs; the check fails, saying what is off, if the result is
    wrong, the trace is illegal, or the cost is above the best known cost.

    ``problem`` may also be a :class:`Problem` (a variant: other outputs, registers or n).
    Softmax problems run for every n in ``sizes``, on inputs spread over
    ``[-4 scale, 4 scale]``; with ``rising`` the inputs climb evenly from ``-4 scale`` to
    ``4 scale``, so the max moves at every element and the last element is the largest.
    """
    if isinstance(problem, Problem):
        prob = problem
    elif problem in PROBLEMS:
        prob = PROBLEMS[problem]
    else:
        raise ValueError(f"problem: expected one of {sorted(PROBLEMS)} or a Problem, got {problem!r}")
    try:
        if prob.isa == "matmul":
            if not isinstance(trace, (str, list, tuple)):
                raise TypeError(f"trace: expected the trace text, got {type(trace).__name__}")
            res = _check_matmul(prob, trace)
        else:
            if not callable(trace):
                raise TypeError("trace: expected a function n -> trace text for the softmax "
                                f"problems, got {type(trace).__name__}")
            res = _check_softmax(prob, trace, sizes, scale, rising)
    except TraceError as e:
        raise CheckFailed(f"{prob.title}: the machine rejects your trace: {e}\n"
                          f"  hint: this machine has R0..R{prob.registers - 1}; "
                          "operands go in the order of the instruction table") from None
    if not quiet:
        print(f"ok: {prob.title}: {res.summary()}")
    return res


def _check_matmul(prob: Problem, trace) -> TraceResult:
    res = _matmul_trial(trace, prob, 1)
    _matmul_trial(trace, prob, 2)
    acc = _max_live_accumulators(res)
    if prob.shape == "outer" and acc < len(prob.outputs):
        raise CheckFailed(f"{prob.title}: at most {acc} partial sums are live at once; an outer "
                          f"product keeps all {len(prob.outputs)} outputs in registers while k runs"
                          "\n  hint: for k = 0 start all four sums with MAC_Z, then add the k = 1 "
                          "terms with MAC")
    if prob.shape == "inner" and acc > 1:
        raise CheckFailed(f"{prob.title}: {acc} partial sums are live at once; an inner-product "
                          "schedule finishes (and stores) one output before starting the next")
    loads = res.counts["LOAD"]
    if res.counts["STORE"] > prob.stores:
        raise CheckFailed(f"{prob.title}: {res.counts['STORE']} STOREs, expected {prob.stores}: "
                          "store each output once, when its sum is complete")
    if res.cycles > prob.cycles:
        why = _redundant_loads(res) or [f"{a} is loaded more than once" for a in _reloads(res)]
        raise CheckFailed(
            f"{prob.title}: correct, but it takes {res.cycles} cycles ({loads} LOADs); the best "
            f"is {prob.cycles} ({prob.note})\n  " + "\n  ".join(why[:4] or ["count your LOADs"]) +
            "\n  hint: a value already in a register can be used again without a LOAD")
    if res.cycles < prob.cycles:
        print(f"note: {res.cycles} cycles beats the {prob.cycles} of the plan in the text "
              f"({prob.note}); the lower bound for a {prob.n}x{prob.n} matmul is "
              f"{2 * prob.n ** 2 + prob.n ** 3 + prob.n ** 2} ({2 * prob.n ** 2} LOAD + "
              f"{prob.n ** 3} MAC + {prob.n ** 2} STORE)")
    return res


def _check_softmax(prob: Problem, fn, sizes=(1, 2, 3, 6), scale=1.0, rising=False) -> TraceResult:
    res = None
    for n in sizes:
        rng = random.Random(100 + n)
        x = [round(rng.uniform(-4, 4) * scale, 3) for _ in range(n)]
        if rising:
            x = [round((-4 + 8 * i / max(n - 1, 1)) * scale, 3) for i in range(n)]
        elif n >= 3:
            x[1] = max(x) + 2.5 * scale  # the max moves after the first element
        text = fn(n)
        if not isinstance(text, str):
            raise TypeError(f"your function returned {type(text).__name__}; expected the trace text")
        r = run_trace(text, softmax_dram(x), registers=prob.registers, isa="softmax")
        want = _softmax_reference(x)
        for i, w in enumerate(want):
            got = r.dram[f"out[{i}]"]
            if got is None:
                raise CheckFailed(f"{prob.title}: for n = {n}, out[{i}] is never stored")
            if not abs(got - w) <= 1e-9 + 1e-9 * abs(w):
                raise CheckFailed(
                    f"{prob.title}: for n = {n}, out[{i}] is {got:.6g}, expected {w:.6g}\n"
                    f"  your trace stored {_short(r.dram_labels[f'out[{i}]'], 160)}\n"
                    "  hint: out[i] = exp(x[i] - m) / S with m the max of all x and S the sum "
                    "of exp(x[j] - m)")
        if r.reads > prob.reads_per_n * n or r.writes > n:
            raise CheckFailed(
                f"{prob.title}: for n = {n}, {r.reads} DRAM reads and {r.writes} writes; the best "
                f"with {prob.registers} registers is {prob.reads_per_n * n} reads and {n} writes "
                f"({prob.note})\n  hint: never store intermediate values; recompute exp(x_i - m) "
                "from x_i instead")
        res = r
    if prob.step_instructions:
        a = run_trace(fn(2), softmax_dram([0.5, 1.5]), registers=4, isa="softmax")
        b = run_trace(fn(3), softmax_dram([0.5, 1.5, 0.25]), registers=4, isa="softmax")
        per_step = b.instructions - a.instructions - 5  # one more step, one more normalise (5)
        if per_step > prob.step_instructions:
            raise CheckFailed(f"{prob.title}: one more element costs {per_step} instructions in "
                              f"the online pass; the best is {prob.step_instructions}\n"
                              "  hint: save old m (MOV), new m (MAX), two SUBs, two EXPs, one MUL, "
                              "one ADD, and the LOAD")
    return res


