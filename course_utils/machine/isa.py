"""The instruction set of the register machine, in one table.

Each :class:`Instruction` says everything about one instruction: its operands (``"a"``
a DRAM address, ``"r"`` a register read, ``"w"`` the register written), how to write
it, what it computes from the values it reads, the symbolic label of its result, and
which machines have it. The interpreter, the error messages and the lessons' tables
all read this table; adding an instruction is one row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

__all__ = ["Instruction", "INSTRUCTIONS", "MACHINES", "ISAS", "instruction_table"]


def _paren(s: str) -> str:
    return f"({s})" if (" + " in s or " − " in s) else s


def _exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _div(a: float, b: float) -> float:
    if b != 0:
        return a / b
    return math.copysign(math.inf, a) if a else math.nan


@dataclass(frozen=True)
class Instruction:
    """One instruction. ``compute`` and ``label`` take the values (labels) of the
    registers it reads, in operand order; LOAD and STORE move data and have neither."""
    op: str
    operands: tuple[str, ...]
    form: str                   # how it is written: "MAC Ra, Rb, Rc, Rd"
    effect: str                 # what it does: "Rd = Ra * Rb + Rc"
    machines: tuple[str, ...]
    compute: Callable[..., float] | None = None
    label: Callable[..., str] | None = None

    @property
    def syntax(self) -> str:
        return f"{self.form}  ({self.effect})"


_BOTH = ("matmul", "softmax")

INSTRUCTIONS: dict[str, Instruction] = {i.op: i for i in (
    Instruction("LOAD", ("a", "w"), "LOAD src, Rd", "Rd = DRAM[src]", _BOTH),
    Instruction("STORE", ("r", "a"), "STORE Rs, dst", "DRAM[dst] = Rs", _BOTH),
    Instruction("MAC_Z", ("r", "r", "w"), "MAC_Z Ra, Rb, Rd", "Rd = Ra * Rb", ("matmul",),
                lambda a, b: a * b, lambda a, b: f"{a}·{b}"),
    Instruction("MAC", ("r", "r", "r", "w"), "MAC Ra, Rb, Rc, Rd", "Rd = Ra * Rb + Rc",
                ("matmul",), lambda a, b, c: a * b + c, lambda a, b, c: f"{c} + {a}·{b}"),
    Instruction("MAX", ("r", "r", "w"), "MAX Ra, Rb, Rd", "Rd = max(Ra, Rb)", ("softmax",),
                max, lambda a, b: f"max({a}, {b})"),
    Instruction("SUB", ("r", "r", "w"), "SUB Ra, Rb, Rd", "Rd = Ra - Rb", ("softmax",),
                lambda a, b: a - b, lambda a, b: f"{a} − {_paren(b)}"),
    Instruction("EXP", ("r", "w"), "EXP Ra, Rd", "Rd = exp(Ra)", ("softmax",),
                _exp, lambda a: f"exp({a})"),
    Instruction("ADD", ("r", "r", "w"), "ADD Ra, Rb, Rd", "Rd = Ra + Rb", ("softmax",),
                lambda a, b: a + b, lambda a, b: f"{a} + {b}"),
    Instruction("MUL", ("r", "r", "w"), "MUL Ra, Rb, Rd", "Rd = Ra * Rb", ("softmax",),
                lambda a, b: a * b, lambda a, b: f"{_paren(a)}·{_paren(b)}"),
    Instruction("DIV", ("r", "r", "w"), "DIV Ra, Rb, Rd", "Rd = Ra / Rb", ("softmax",),
                _div, lambda a, b: f"{_paren(a)}/{_paren(b)}"),
    Instruction("MOV", ("r", "w"), "MOV Rs, Rd", "Rd = Rs", ("softmax",),
                lambda a: a, lambda a: a),
)}

MACHINES = ("matmul", "softmax")

# machine -> {op: operand kinds}, in table order (the form the interpreter reads)
ISAS: dict[str, dict[str, tuple[str, ...]]] = {
    m: {op: ins.operands for op, ins in INSTRUCTIONS.items() if m in ins.machines}
    for m in MACHINES
}


def instruction_table(machine: str) -> str:
    """The instructions of ``machine`` as a markdown table (instruction | effect)."""
    if machine not in ISAS:
        raise ValueError(f"machine: expected one of {list(ISAS)}, got {machine!r}")
    rows = ["| instruction | effect |", "| --- | --- |"]
    rows += [f"| `{INSTRUCTIONS[op].form}` | `{INSTRUCTIONS[op].effect}` |" for op in ISAS[machine]]
    return "\n".join(rows)
