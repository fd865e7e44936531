"""The toy register machine of lessons 1 and 2.

DRAM is a set of named cells (``a[0][1]``, ``x[3]``, ``out[3]``, ...). The chip
has a register file of ``R`` registers ``R0 .. R{R-1}`` and one compute unit:

* the **matmul machine** has a multiply-accumulate unit:
  ``LOAD src, Rd`` / ``STORE Rs, dst`` / ``MAC_Z Ra, Rb, Rd`` (Rd = Ra*Rb) /
  ``MAC Ra, Rb, Rc, Rd`` (Rd = Ra*Rb + Rc);
* the **softmax machine** has an ALU: ``MAX/SUB/ADD/MUL/DIV Ra, Rb, Rd``
  (Rd = Ra op Rb), ``EXP Ra, Rd`` and ``MOV Rs, Rd``, plus LOAD and STORE.

A trace is text, one instruction per line; ``#`` or ``//`` starts a comment.
:func:`run_trace` runs it and returns a :class:`TraceResult`: the final DRAM,
the register file after every step, the cycles (1 per instruction unless
``costs`` says otherwise) and the DRAM reads and writes. An illegal trace
raises :class:`TraceError` naming its line.

The lesson checks (:func:`check_trace`) compare a learner's trace with the
best known cost of each problem and say what is off; :func:`matmul_schedule`
writes traces for an n x n matmul with R registers.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from .checks import CheckFailed

__all__ = [
    "ISAS", "TraceError", "Step", "TraceResult", "run_trace", "matmul_dram", "softmax_dram",
    "safe_softmax_trace", "online_softmax_trace", "naive_softmax_trace", "ONLINE_INIT",
    "PROBLEMS", "check_trace", "MatmulSchedule", "matmul_schedule", "matmul_loads",
    "plot_loads_vs_registers", "plot_softmax_traffic", "softmax_traffic",
]

# Operand kinds: "a" = DRAM address, "r" = register read, "w" = register written.
ISAS: dict[str, dict[str, tuple[str, ...]]] = {
    "matmul": {"LOAD": ("a", "w"), "STORE": ("r", "a"), "MAC_Z": ("r", "r", "w"),
               "MAC": ("r", "r", "r", "w")},
    "softmax": {"LOAD": ("a", "w"), "STORE": ("r", "a"), "MAX": ("r", "r", "w"),
                "SUB": ("r", "r", "w"), "EXP": ("r", "w"), "ADD": ("r", "r", "w"),
                "MUL": ("r", "r", "w"), "DIV": ("r", "r", "w"), "MOV": ("r", "w")},
}
_SYNTAX = {
    "LOAD": "LOAD src, Rd  (Rd = DRAM[src])", "STORE": "STORE Rs, dst  (DRAM[dst] = Rs)",
    "MAC_Z": "MAC_Z Ra, Rb, Rd  (Rd = Ra * Rb)", "MAC": "MAC Ra, Rb, Rc, Rd  (Rd = Ra * Rb + Rc)",
    "MAX": "MAX Ra, Rb, Rd  (Rd = max(Ra, Rb))", "SUB": "SUB Ra, Rb, Rd  (Rd = Ra - Rb)",
    "EXP": "EXP Ra, Rd  (Rd = exp(Ra))", "ADD": "ADD Ra, Rb, Rd  (Rd = Ra + Rb)",
    "MUL": "MUL Ra, Rb, Rd  (Rd = Ra * Rb)", "DIV": "DIV Ra, Rb, Rd  (Rd = Ra / Rb)",
    "MOV": "MOV Rs, Rd  (Rd = Rs)",
}
_REG = re.compile(r"^[Rr](\d+)$")
_ADDR = re.compile(r"^([A-Za-z_]\w*)\s*((?:\[\s*\d+\s*\])+)$")


class TraceError(ValueError):
    """An illegal trace. ``line`` is the 1-based line of the trace text,
    ``kind`` one of: syntax, unknown-instruction, operand-count,
    register-range, uninitialised-register, unknown-address,
    uninitialised-address."""

    def __init__(self, line: int, text: str, kind: str, message: str):
        self.line, self.text, self.kind = line, text, kind
        super().__init__(f"line {line}: `{text}`: {message}")


@dataclass(frozen=True)
class _Instr:
    line: int
    text: str
    comment: str
    op: str
    args: tuple  # ints for registers, str for addresses


@dataclass(frozen=True)
class Step:
    """The machine after one instruction."""
    index: int            # 1-based step number
    line: int             # line of the trace text
    text: str             # the instruction, without its comment
    comment: str
    op: str
    registers: tuple      # values after the step (None = never written)
    labels: tuple         # what each register holds, symbolically
    read: str | None      # DRAM cell read by this step
    written: str | None   # DRAM cell written by this step
    value: float | None   # the value loaded or stored (None for ALU steps)
    cycles: int           # totals so far
    reads: int
    writes: int


@dataclass
class TraceResult:
    """What :func:`run_trace` returns."""
    isa: str
    num_registers: int
    initial_dram: dict
    dram: dict
    dram_labels: dict
    steps: list
    cycles: int
    reads: int
    writes: int
    counts: Counter
    costs: dict

    @property
    def instructions(self) -> int:
        return len(self.steps)

    def registers_after(self, step: int) -> tuple:
        """Register values after ``step`` (0 = before the first instruction)."""
        if step == 0:
            return (None,) * self.num_registers
        return self.steps[step - 1].registers

    def array(self, name: str, shape: Sequence[int]):
        """The DRAM cells ``name[...]`` as a nested list (None where unwritten)."""
        def build(prefix, dims):
            if not dims:
                return self.dram.get(prefix)
            return [build(f"{prefix}[{i}]", dims[1:]) for i in range(dims[0])]
        return build(name, list(shape))

    def summary(self) -> str:
        order = ["LOAD"] + [op for op in ISAS[self.isa] if op not in ("LOAD", "STORE")] + ["STORE"]
        parts = " + ".join(f"{self.counts[op]} {op}" for op in order if self.counts[op])
        return (f"{self.cycles} cycles ({parts}); DRAM reads {self.reads}, writes {self.writes}; "
                f"{self.num_registers} registers")

    def table(self, max_label: int = 14) -> str:
        """The trace as a table: one row per step, one column per register."""
        names = [f"R{i}" for i in range(self.num_registers)]
        rows = [["step", "instruction"] + names]
        for s in self.steps:
            rows.append([str(s.index), s.text] +
                        [_short(lb, max_label) if lb is not None else "" for lb in s.labels])
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        out = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(out)

    def __repr__(self):
        return f"TraceResult({self.summary()})"


def _short(label: str, n: int) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def _norm_addr(tok: str):
    m = _ADDR.match(tok.strip())
    if not m:
        return None
    idx = re.findall(r"\d+", m.group(2))
    return m.group(1) + "".join(f"[{int(i)}]" for i in idx)


def _parse(trace, isa: str, R: int) -> list[_Instr]:
    if isinstance(trace, (list, tuple)):
        if not all(isinstance(t, str) for t in trace):
            raise TypeError("trace: expected a string or a list of strings (one instruction each)")
        lines = list(trace)
    elif isinstance(trace, str):
        lines = trace.split("\n")
    else:
        raise TypeError(f"trace: expected text (one instruction per line), got {type(trace).__name__}")
    ops = ISAS[isa]
    out = []
    for ln, raw in enumerate(lines, start=1):
        cut = [p for p in (raw.find("#"), raw.find("//")) if p >= 0]
        code = raw[: min(cut)] if cut else raw
        comment = raw[min(cut):].lstrip("#/ ").rstrip() if cut else ""
        code = code.strip()
        if not code:
            continue
        head, rest = (code.split(None, 1) + [""])[:2]
        op = head.upper()
        text = " ".join(code.split())
        if op not in ops:
            other = [k for k, v in ISAS.items() if op in v and k != isa]
            msg = f"unknown instruction {head!r}; the {isa} machine knows {', '.join(ops)}"
            if other:
                msg = (f"{op} is an instruction of the {other[0]} machine, not of the {isa} "
                       f"machine ({', '.join(ops)})")
            raise TraceError(ln, text, "unknown-instruction", msg)
        # operands are separated by commas and/or spaces; a[ 0 ][1] is one address
        packed = re.sub(r"\s*\[\s*", "[", re.sub(r"\s*\]", "]", rest))
        toks = [t for t in re.split(r"[,\s]+", packed) if t]
        kinds = ops[op]
        if len(toks) != len(kinds):
            raise TraceError(ln, text, "operand-count",
                             f"{op} takes {len(kinds)} operands, got {len(toks)}; "
                             f"write it as {_SYNTAX[op]}")
        args = []
        for pos, (tok, kind) in enumerate(zip(toks, kinds), start=1):
            if kind == "a":
                addr = _norm_addr(tok)
                if addr is None:
                    what = "a register" if _REG.match(tok) else repr(tok)
                    raise TraceError(ln, text, "syntax",
                                     f"operand {pos} of {op} must be a DRAM address such as "
                                     f"x[0] or a[0][1], got {what}; write it as {_SYNTAX[op]}")
                args.append(addr)
            else:
                m = _REG.match(tok)
                if not m:
                    raise TraceError(ln, text, "syntax",
                                     f"operand {pos} of {op} must be a register R0..R{R - 1}, "
                                     f"got {tok!r}; write it as {_SYNTAX[op]}")
                r = int(m.group(1))
                if r >= R:
                    raise TraceError(ln, text, "register-range",
                                     f"register {tok} does not exist: this machine has {R} "
                                     f"registers, R0..R{R - 1}")
                args.append(r)
        out.append(_Instr(ln, text, comment, op, tuple(args)))
    return out


def _validate_dram(dram) -> dict:
    if not isinstance(dram, Mapping):
        raise TypeError("dram: expected a dict of cell name -> number (None for an unwritten "
                        f"output cell), got {type(dram).__name__}")
    clean = {}
    for k, v in dram.items():
        addr = _norm_addr(str(k))
        if addr is None:
            raise ValueError(f"dram: cell name {k!r} is not of the form name[i] or name[i][j]")
        if v is not None:
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise TypeError(f"dram: cell {k!r} holds {v!r}; expected a number or None") from None
        clean[addr] = v
    return clean


def _label(op, a):
    if op == "MAC_Z":
        return f"{a[0]}·{a[1]}"
    if op == "MAC":
        return f"{a[2]} + {a[0]}·{a[1]}"
    if op == "MAX":
        return f"max({a[0]}, {a[1]})"
    if op == "SUB":
        return f"{a[0]} − {_paren(a[1])}"
    if op == "ADD":
        return f"{a[0]} + {a[1]}"
    if op == "MUL":
        return f"{_paren(a[0])}·{_paren(a[1])}"
    if op == "DIV":
        return f"{_paren(a[0])}/{_paren(a[1])}"
    if op == "EXP":
        return f"exp({a[0]})"
    return a[0]


def _paren(s):
    return f"({s})" if (" + " in s or " − " in s) else s


def _compute(op, v):
    if op == "MAC_Z":
        return v[0] * v[1]
    if op == "MAC":
        return v[0] * v[1] + v[2]
    if op == "MAX":
        return max(v[0], v[1])
    if op == "SUB":
        return v[0] - v[1]
    if op == "ADD":
        return v[0] + v[1]
    if op == "MUL":
        return v[0] * v[1]
    if op == "DIV":
        return v[0] / v[1] if v[1] != 0 else (math.copysign(math.inf, v[0]) if v[0] else math.nan)
    if op == "EXP":
        try:
            return math.exp(v[0])
        except OverflowError:
            return math.inf
    return v[0]  # MOV


def run_trace(trace, dram: Mapping, *, registers: int = 3, isa: str = "matmul",
              costs: Mapping[str, float] | None = None) -> TraceResult:
    """Run ``trace`` on the ``isa`` machine ("matmul" or "softmax") with
    ``registers`` registers, starting from ``dram`` (cell name -> number, or
    None for a declared but unwritten cell such as an output).

    ``costs`` overrides the cycles of some instructions, e.g. ``{"LOAD": 100}``.
    Raises :class:`TraceError` (a ValueError) naming the line of the first
    illegal instruction.
    """
    if isa not in ISAS:
        raise ValueError(f"isa: expected one of {sorted(ISAS)}, got {isa!r}")
    if isinstance(registers, bool) or not isinstance(registers, int) or registers < 1:
        raise ValueError(f"registers: expected a positive int (the size R of the register "
                         f"file), got {registers!r}")
    cost = {op: 1 for op in ISAS[isa]}
    for k, v in (costs or {}).items():
        key = str(k).upper()
        if key not in cost:
            raise ValueError(f"costs: {k!r} is not an instruction of the {isa} machine "
                             f"({', '.join(cost)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"costs[{k!r}]: expected a non-negative number of cycles, got {v!r}")
        cost[key] = v
    mem = _validate_dram(dram)
    program = _parse(trace, isa, registers)
    init = dict(mem)
    labels = {a: a for a, v in mem.items() if v is not None}
    regs: list = [None] * registers
    rlab: list = [None] * registers
    steps, counts = [], Counter()
    cycles = reads = writes = 0
    kinds = ISAS[isa]
    for n, ins in enumerate(program, start=1):
        vals, labs, read, written, moved = [], [], None, None, None
        for arg, kind in zip(ins.args, kinds[ins.op]):
            if kind == "r":
                if regs[arg] is None:
                    raise TraceError(ins.line, ins.text, "uninitialised-register",
                                     f"reads R{arg}, which holds no value yet (nothing was "
                                     f"loaded or computed into it before this line)")
                vals.append(regs[arg])
                labs.append(rlab[arg])
        if ins.op == "LOAD":
            addr, rd = ins.args
            if addr not in mem:
                raise TraceError(ins.line, ins.text, "unknown-address",
                                 f"DRAM has no cell {addr}; it holds {_cells(mem)}")
            if mem[addr] is None:
                raise TraceError(ins.line, ins.text, "uninitialised-address",
                                 f"{addr} has not been written yet, so there is nothing to load")
            regs[rd], rlab[rd] = mem[addr], labels[addr]
            read, reads, moved = addr, reads + 1, mem[addr]
        elif ins.op == "STORE":
            rs, addr = ins.args
            if addr not in mem:
                raise TraceError(ins.line, ins.text, "unknown-address",
                                 f"DRAM has no cell {addr}; it holds {_cells(mem)}")
            mem[addr], labels[addr] = regs[rs], rlab[rs]
            written, writes, moved = addr, writes + 1, regs[rs]
        else:
            rd = ins.args[-1]
            regs[rd], rlab[rd] = _compute(ins.op, vals), _label(ins.op, labs)
        counts[ins.op] += 1
        cycles += cost[ins.op]
        steps.append(Step(n, ins.line, ins.text, ins.comment, ins.op, tuple(regs), tuple(rlab),
                          read, written, moved, cycles, reads, writes))
    return TraceResult(isa, registers, init, mem, labels, steps, cycles, reads, writes, counts, cost)


def _cells(mem) -> str:
    names = list(mem)
    return ", ".join(names) if len(names) <= 12 else ", ".join(names[:10]) + f", ... ({len(names)} cells)"


# --------------------------------------------------------------------------- DRAM layouts

def _matrix(m, name):
    try:
        rows = [[float(v) for v in row] for row in (m.tolist() if hasattr(m, "tolist") else m)]
    except TypeError:
        raise TypeError(f"{name}: expected a square matrix (nested list or 2-D tensor)") from None
    n = len(rows)
    if n == 0 or any(len(r) != n for r in rows):
        raise ValueError(f"{name}: expected a square n x n matrix, got rows of lengths "
                         f"{[len(r) for r in rows]}")
    return rows


def matmul_dram(A, B) -> dict:
    """DRAM for C = A B: cells ``a[i][k]``, ``b[k][j]`` and unwritten ``c[i][j]``."""
    A, B = _matrix(A, "A"), _matrix(B, "B")
    if len(A) != len(B):
        raise ValueError(f"A is {len(A)}x{len(A)} but B is {len(B)}x{len(B)}; expected the same n")
    n = len(A)
    d = {f"a[{i}][{k}]": A[i][k] for i in range(n) for k in range(n)}
    d.update({f"b[{k}][{j}]": B[k][j] for k in range(n) for j in range(n)})
    d.update({f"c[{i}][{j}]": None for i in range(n) for j in range(n)})
    return d


def softmax_dram(x) -> dict:
    """DRAM for softmax: cells ``x[i]`` and unwritten ``out[i]``."""
    vals = x.tolist() if hasattr(x, "tolist") else list(x)
    if not vals or any(isinstance(v, (list, tuple)) for v in vals):
        raise ValueError("x: expected a non-empty 1-D sequence of numbers")
    d = {f"x[{i}]": float(v) for i, v in enumerate(vals)}
    d.update({f"out[{i}]": None for i in range(len(vals))})
    return d


# --------------------------------------------------------------------------- softmax traces

def _check_n(n):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected a positive int (the length of x), got {n!r}")


def naive_softmax_trace(n: int) -> str:
    """exp(x_i) / sum_j exp(x_j) without the max, on 2 registers (sum in R1):
    2 passes, 2n reads, n writes -- and overflow for large x."""
    _check_n(n)
    t = ["# pass 1: sum of exponentials into R1"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", f"EXP R0, R{1 if i == 0 else 0}"]
        if i:
            t.append("ADD R1, R0, R1")
    t.append("# pass 2: normalise")
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "EXP R0, R0", "DIV R0, R1, R0", f"STORE R0, out[{i}]"]
    return "\n".join(t)


def safe_softmax_trace(n: int) -> str:
    """The 3-register safe softmax: max pass, sum pass, normalise pass."""
    _check_n(n)
    t = ["# pass 1: m = max(x) into R1", "LOAD x[0], R1"]
    for i in range(1, n):
        t += [f"LOAD x[{i}], R0", "MAX R0, R1, R1"]
    t.append("# pass 2: S = sum exp(x_i - m) into R2")
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R0, R1, R0", f"EXP R0, R{2 if i == 0 else 0}"]
        if i:
            t.append("ADD R2, R0, R2")
    t.append("# pass 3: out[i] = exp(x_i - m) / S")
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R0, R1, R0", "EXP R0, R0", "DIV R0, R2, R0",
              f"STORE R0, out[{i}]"]
    return "\n".join(t)


ONLINE_INIT = "\n".join([
    "LOAD x[0], R0   # first element",
    "MOV R0, R1      # m = x0",
    "SUB R0, R1, R0  # x0 - m = 0",
    "EXP R0, R0      # exp(0) = 1",
    "MOV R0, R2      # s = 1",
])


def _online_step(i: int) -> str:
    return "\n".join([
        f"LOAD x[{i}], R0", "MOV R1, R3", "MAX R1, R0, R1", "SUB R3, R1, R3", "SUB R0, R1, R0",
        "EXP R3, R3", "EXP R0, R0", "MUL R2, R3, R2", "ADD R2, R0, R2"])


def online_softmax_trace(n: int, step: Callable[[int], str] | None = None) -> str:
    """The 4-register online softmax: one online pass for (m, S), one
    normalise pass. ``step(i)`` may supply the steady-state step."""
    _check_n(n)
    step = step or _online_step
    t = ["# pass 1: running (m, s) in (R1, R2)", ONLINE_INIT]
    for i in range(1, n):
        t += [f"# element {i}", step(i)]
    t.append("# pass 2: out[i] = exp(x_i - m) / S")
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R0, R1, R0", "EXP R0, R0", "DIV R0, R2, R0",
              f"STORE R0, out[{i}]"]
    return "\n".join(t)


def softmax_traffic(ns: Sequence[int]) -> dict:
    """DRAM reads/writes measured by running each softmax trace for every n."""
    out = {}
    for name, fn, R in (("naive, 2 registers", naive_softmax_trace, 2),
                        ("safe, 3 registers", safe_softmax_trace, 3),
                        ("online, 4 registers", online_softmax_trace, 4)):
        rows = []
        for n in ns:
            r = run_trace(fn(n), softmax_dram([float(i % 7) for i in range(n)]),
                          registers=R, isa="softmax")
            rows.append((n, r.reads, r.writes, r.cycles))
        out[name] = rows
    return out


def plot_softmax_traffic(ns: Sequence[int] = tuple(range(1, 33)), ax=None):
    """DRAM traffic (reads + writes) against n for the softmax variants."""
    import matplotlib.pyplot as plt
    data = softmax_traffic(ns)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4))
    styles = ({"ls": "--", "lw": 3, "alpha": 0.6, "color": "tab:red"},
              {"marker": "o", "ms": 3, "color": "tab:orange"},
              {"marker": "^", "ms": 3, "lw": 1, "color": "tab:green"})
    for (name, rows), style in zip(data.items(), styles):
        label = name + (" (overflows)" if name.startswith("naive") else "")
        ax.plot([r[0] for r in rows], [r[1] + r[2] for r in rows], label=label, **style)
    ax.set_xlabel("n (elements in the row)")
    ax.set_ylabel("DRAM accesses (reads + writes)")
    ax.set_title("Softmax on the machine: DRAM traffic against n")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig or ax.figure


# --------------------------------------------------------------------------- lesson checks

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
    A = [[round(rng.uniform(-3, 3), 3) for _ in range(2)] for _ in range(2)]
    B = [[round(rng.uniform(-3, 3), 3) for _ in range(2)] for _ in range(2)]
    res = run_trace(trace, matmul_dram(A, B), registers=prob.registers, isa="matmul")
    for cell in prob.outputs:
        i, j = map(int, re.findall(r"\d+", cell))
        want = sum(A[i][k] * B[k][j] for k in range(2))
        got = res.dram[cell]
        if got is None:
            raise CheckFailed(f"{prob.title}: your trace never stores {cell}; "
                              f"it should hold {_expected_c(i, j, 2)}\n  hint: end with STORE Rs, {cell}")
        if abs(got - want) > 1e-9 * max(1.0, abs(want)):
            raise CheckFailed(
                f"{prob.title}: {cell} is {got:.6g}, expected {want:.6g}\n"
                f"  your trace stored {res.dram_labels[cell]}\n"
                f"  expected           {_expected_c(i, j, 2)}\n"
                "  hint: check which registers the MACs read; MAC_Z starts a sum, MAC adds to one")
    return res


def _softmax_reference(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]


def check_trace(problem: str, trace, quiet: bool = False) -> TraceResult:
    """Check a learner's answer to ``problem`` (a key of :data:`PROBLEMS`).

    Matmul problems take the trace text. Softmax problems take a function
    ``n -> trace text`` (for Problem 5: ``n -> full trace`` built with the
    learner's step, see :func:`online_softmax_trace`). The trace is run on
    random inputs; the check fails, saying what is off, if the result is
    wrong, the trace is illegal, or the cost is above the best known cost.
    """
    if problem not in PROBLEMS:
        raise ValueError(f"problem: expected one of {sorted(PROBLEMS)}, got {problem!r}")
    prob = PROBLEMS[problem]
    try:
        if prob.isa == "matmul":
            if not isinstance(trace, (str, list, tuple)):
                raise TypeError(f"trace: expected the trace text, got {type(trace).__name__}")
            res = _check_matmul(prob, trace)
        else:
            if not callable(trace):
                raise TypeError("trace: expected a function n -> trace text for the softmax "
                                f"problems, got {type(trace).__name__}")
            res = _check_softmax(prob, trace)
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
              f"({prob.note}); the lower bound for a 2x2 matmul is 20 (8 LOAD + 8 MAC + 4 STORE)")
    return res


def _check_softmax(prob: Problem, fn) -> TraceResult:
    res = None
    for n in (1, 2, 3, 6):
        rng = random.Random(100 + n)
        x = [round(rng.uniform(-4, 4), 3) for _ in range(n)]
        if n >= 3:
            x[1] = max(x) + 2.5  # the max moves after the first element
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


# --------------------------------------------------------------------------- matmul schedules

@dataclass
class MatmulSchedule:
    """A trace for C = A B (n x n) with R registers, and what it costs."""
    n: int
    registers: int
    order: str
    trace: str
    loads: int
    macs: int
    stores: int

    @property
    def cycles(self) -> int:
        return self.loads + self.macs + self.stores


def _orders(n: int, R: int):
    """Candidate MAC orders: output tiles p x q kept in registers, k inside."""
    tiles = {(1, 1)} | {(p, q) for p in range(1, n + 1) for q in range(1, n + 1)
                        if p * q + 2 <= R}
    for p, q in sorted(tiles):
        for snake_k in (True, False):
            name = "inner product" if (p, q) == (1, 1) else (
                "outer product" if (p, q) == (n, n) else f"{p}x{q} output tiles")
            yield f"{name}{'' if snake_k else ', k forward'}", _tile_order(n, p, q, snake_k)


def _tile_order(n, p, q, snake_k):
    seq, t = [], 0
    row_tiles = list(range(0, n, p))
    for ti, i0 in enumerate(row_tiles):
        col_tiles = list(range(0, n, q))
        if ti % 2:
            col_tiles.reverse()
        for j0 in col_tiles:
            ks = list(range(n))
            if snake_k and t % 2:
                ks.reverse()
            rows = list(range(i0, min(n, i0 + p)))
            cols = list(range(j0, min(n, j0 + q)))
            for kk, k in enumerate(ks):
                for ii, i in enumerate(rows if kk % 2 == 0 else rows[::-1]):
                    cs = cols if (ii + kk) % 2 == 0 else cols[::-1]
                    seq.extend((i, j, k) for j in cs)
            t += 1
    return seq


def _schedule(n: int, R: int, seq) -> tuple | None:
    """Turn a MAC order into a trace, choosing what to keep in registers by
    evicting the value used farthest in the future (Belady). None if the
    order needs more registers than R."""
    uses: dict = {}
    for p, (i, j, k) in enumerate(seq):
        uses.setdefault(("a", i, k), []).append(p)
        uses.setdefault(("b", k, j), []).append(p)
    ptr = {v: 0 for v in uses}
    remaining = Counter((i, j) for i, j, _ in seq)
    started: dict = {}
    slot: list = [None] * R
    lines, loads = [], 0

    def next_use(v, p):
        lst = uses.get(v)
        if lst is None:
            return math.inf
        while ptr[v] < len(lst) and lst[ptr[v]] <= p:
            ptr[v] += 1
        return lst[ptr[v]] if ptr[v] < len(lst) else math.inf

    def free_slot(p, keep):
        if None in slot:
            return slot.index(None)
        cands = [(next_use(v, p), r) for r, v in enumerate(slot)
                 if v[0] != "c" and v not in keep]
        if not cands:
            return None
        return max(cands)[1]

    def name(v):
        return f"{v[0]}[{v[1]}][{v[2]}]"

    for p, (i, j, k) in enumerate(seq):
        a, b = ("a", i, k), ("b", k, j)
        for v in (a, b):
            if v not in slot:
                r = free_slot(p, {a, b})
                if r is None:
                    return None
                slot[r] = v
                lines.append(f"LOAD {name(v)}, R{r}")
                loads += 1
        ra, rb = slot.index(a), slot.index(b)
        if (i, j) not in started:
            # the product may overwrite an operand that is never needed again
            r = None
            if None in slot:
                r = slot.index(None)
            else:
                dead = [rr for rr, v in ((ra, a), (rb, b)) if next_use(v, p) == math.inf]
                r = dead[0] if dead else free_slot(p + 1, {a, b})
            if r is None:
                return None
            lines.append(f"MAC_Z R{ra}, R{rb}, R{r}")
            slot[r] = ("c", i, j)
            started[(i, j)] = r
        else:
            r = started[(i, j)]
            lines.append(f"MAC R{ra}, R{rb}, R{r}, R{r}")
        remaining[(i, j)] -= 1
        if remaining[(i, j)] == 0:
            lines.append(f"STORE R{r}, c[{i}][{j}]")
            slot[r] = None
    return "\n".join(lines), loads


def matmul_schedule(n: int, registers: int, order: str = "best") -> MatmulSchedule:
    """A trace for the n x n matmul on the machine with ``registers`` registers.

    ``order`` is "best" (the candidate with the fewest LOADs), "inner" (one
    output at a time) or "outer" (all outputs in registers, k outermost).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected a positive int (the matrix size), got {n!r}")
    if isinstance(registers, bool) or not isinstance(registers, int) or registers < 3:
        raise ValueError(f"registers: expected an int >= 3 (a matmul needs two operands and an "
                         f"accumulator), got {registers!r}")
    if order not in ("best", "inner", "outer"):
        raise ValueError(f"order: expected 'best', 'inner' or 'outer', got {order!r}")
    if order == "inner":
        cands = [("inner product", _tile_order(n, 1, 1, True))]
    elif order == "outer":
        cands = [("outer product", _tile_order(n, n, n, False))]
    else:
        cands = list(_orders(n, registers))
    best = None
    for name, seq in cands:
        got = _schedule(n, registers, seq)
        if got is not None and (best is None or got[1] < best[2]):
            best = (name, got[0], got[1])
    if best is None:
        raise ValueError(f"the {order} order needs more than {registers} registers for n = {n}")
    return MatmulSchedule(n, registers, best[0], best[1], best[2], n ** 3, n * n)


def matmul_loads(n: int, registers: Sequence[int]) -> list[int]:
    """Fewest LOADs found by :func:`matmul_schedule` for each register count."""
    return [matmul_schedule(n, R).loads for R in registers]


def plot_loads_vs_registers(n: int = 4, registers: Sequence[int] | None = None, ax=None):
    """DRAM loads of the best schedule found, against the register count R."""
    import matplotlib.pyplot as plt
    registers = list(registers or range(3, 2 * n * n + 4))
    loads = matmul_loads(n, registers)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(registers, loads, marker="o", ms=3, label="best schedule found")
    ax.axhline(2 * n ** 3, color="tab:red", ls="--", lw=1, label=f"no reuse: 2n³ = {2 * n ** 3}")
    ax.axhline(2 * n * n, color="tab:green", ls="--", lw=1,
               label=f"each input once: 2n² = {2 * n * n}")
    ax.set_xlabel("registers R")
    ax.set_ylabel("DRAM loads")
    ax.set_title(f"{n}x{n} matmul on the register machine: loads against R")
    ax.set_ylim(0, 2 * n ** 3 * 1.08)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig or ax.figure
