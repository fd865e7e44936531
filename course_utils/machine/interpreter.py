"""The interpreter of the register machine: parse a trace, run it, report what it cost.

DRAM is a set of named cells (``a[0][1]``, ``x[3]``, ``out[3]``, ...). The chip has a
register file of ``R`` registers ``R0 .. R{R-1}`` and one compute unit, whose
instructions are listed in :mod:`course_utils.machine.isa`. A trace is text, one
instruction per line; ``#`` or ``//`` starts a comment. :func:`run_trace` runs it and
returns a :class:`TraceResult`: the final DRAM, the register file after every step, the
cycles (1 per instruction unless ``costs`` says otherwise) and the DRAM reads and
writes. An illegal trace raises :class:`TraceError` naming its line.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from .isa import INSTRUCTIONS, ISAS

__all__ = ["TraceError", "Step", "TraceResult", "run_trace", "matmul_dram", "softmax_dram"]

_SYNTAX = {op: ins.syntax for op, ins in INSTRUCTIONS.items()}
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
            spec = INSTRUCTIONS[ins.op]
            regs[rd], rlab[rd] = spec.compute(*vals), spec.label(*labs)
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


