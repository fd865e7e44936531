"""Schedules: traces for an n x n matmul on R registers, written by choosing an order
of the products and evicting the value used farthest in the future (Belady)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

__all__ = ["MatmulSchedule", "matmul_schedule", "matmul_loads", "plot_loads_vs_registers"]


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
