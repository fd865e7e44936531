"""Softmax traces of lesson 2 and the DRAM traffic they cost."""
from __future__ import annotations

from typing import Callable, Sequence

from .interpreter import run_trace, softmax_dram

__all__ = ["naive_softmax_trace", "safe_softmax_trace", "ONLINE_INIT", "online_softmax_trace",
           "softmax_traffic", "plot_softmax_traffic"]


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


