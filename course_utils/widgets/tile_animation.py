"""Lesson 4: an animation of the tile schedule of tiled attention.

The score matrix ``S = Q K^T`` is drawn as a grid of ``Br x Bc`` tiles. Each step
visits one tile pair ``(i, j)`` in FlashAttention-2 order (query tile ``i`` outer)
or FlashAttention-1 order (key/value tile ``j`` outer) and shows

* which Q, K and V tiles are in SRAM now (and, for FA1, the O/l/m tiles that were
  just read and written back),
* the running max ``m`` and running sum ``l`` of every query row, computed from
  real random scores,
* tiles skipped by the causal mask,
* the HBM traffic counted so far, in elements (the same rules as
  :class:`course_utils.attention.TrafficCounter`).

``TileAnimation`` can be stepped without a browser (``step()``, ``goto(i)``,
``state()``); ``widget()`` builds Play + slider + an HTML view, ``filmstrip()``
draws a few frames with matplotlib.
"""
from __future__ import annotations

import html
import math

import numpy as np

from course_utils.attention import tile_schedule, traffic_formula

__all__ = ["TileAnimation"]

_COLORS = {"pending": "#f2f2f2", "done": "#9ecae1", "current": "#fd8d3c",
           "skipped": "#d9d9d9", "skip-now": "#bdbdbd"}


def _num(x):
    return "-inf" if np.isneginf(x) else f"{x:.2f}"


def _positive_int(name, x, upper=None):
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be a positive int, got {type(x).__name__}")
    if x < 1:
        raise ValueError(f"{name} must be a positive int, got {x}")
    if upper is not None and x > upper:
        raise ValueError(f"{name} must be at most {upper}, got {x}")


class TileAnimation:
    """Step through the tiles of one attention head.

    ``Nq``, ``Nk``: sequence lengths; ``Br``, ``Bc``: tile sizes (at most 16 x 16
    tiles); ``order``: ``"fa2"`` or ``"fa1"``; ``is_causal``: SDPA's top-left mask;
    ``D``: head dim of the random Q and K (only the traffic numbers use it);
    ``seed``: for the random scores."""

    MAX_TILES = 16

    def __init__(self, Nq=16, Nk=16, Br=4, Bc=4, order="fa2", is_causal=False, D=8, seed=0):
        for name, x in (("Nq", Nq), ("Nk", Nk), ("Br", Br), ("Bc", Bc), ("D", D)):
            _positive_int(name, x)
        if order not in ("fa1", "fa2"):
            raise ValueError(f"order must be 'fa1' or 'fa2', got {order!r}")
        if not isinstance(is_causal, bool):
            raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
        self.Tr, self.Tc = -(-Nq // Br), -(-Nk // Bc)
        if self.Tr > self.MAX_TILES or self.Tc > self.MAX_TILES:
            raise ValueError(f"the grid would be {self.Tr} x {self.Tc} tiles; use Br, Bc so that "
                             f"ceil(Nq / Br) and ceil(Nk / Bc) are at most {self.MAX_TILES}")
        self.Nq, self.Nk, self.Br, self.Bc, self.D = Nq, Nk, Br, Bc, D
        self.is_causal = is_causal
        self.seed = seed
        rng = np.random.default_rng(seed)
        q = rng.standard_normal((Nq, D))
        k = rng.standard_normal((Nk, D))
        self.scores = q @ k.T / math.sqrt(D)
        if is_causal:
            self.scores = np.where(np.arange(Nk)[None, :] > np.arange(Nq)[:, None], -np.inf,
                                   self.scores)
        self.set_order(order)

    # ---------------------------------------------------------------- the model
    def set_order(self, order):
        """Switch between ``"fa2"`` and ``"fa1"``; goes back to step 0."""
        if order not in ("fa1", "fa2"):
            raise ValueError(f"order must be 'fa1' or 'fa2', got {order!r}")
        self.order = order
        self.schedule = tile_schedule(order, self.Nq, self.Nk, self.Br, self.Bc, self.is_causal)
        self._frames = self._simulate()
        self.index = 0

    def _rows(self, i):
        return range(i * self.Br, min((i + 1) * self.Br, self.Nq))

    def _cols(self, j):
        return range(j * self.Bc, min((j + 1) * self.Bc, self.Nk))

    def _simulate(self):
        """One frame per tile pair, plus frame 0 (before anything ran)."""
        D = self.D
        m = np.full(self.Nq, -np.inf)
        l = np.zeros(self.Nq)
        reads = {"Q": 0, "K": 0, "V": 0, "O": 0, "l": 0, "m": 0}
        writes = {"O": 0, "l": 0, "m": 0}
        status = np.full((self.Tr, self.Tc), "pending", dtype=object)
        if self.order == "fa1":   # Algorithm 1 fills O, l, m in HBM first
            writes["O"] += self.Nq * D
            writes["l"] += self.Nq
            writes["m"] += self.Nq
        frames = [self._frame(None, m, l, reads, writes, status, "start: nothing loaded yet",
                              {})]
        seen_q, seen_kv = set(), set()
        for n, (i, j, visible) in enumerate(self.schedule):
            rows, cols = self._rows(i), self._cols(j)
            moved = {}
            if not visible:
                status[i, j] = "skip-now"
                note = (f"tile ({i}, {j}) lies above the diagonal: every key is after every "
                        "query row, so it is skipped without loading anything")
            else:
                if self.order == "fa2":
                    if i not in seen_q:
                        seen_q.add(i)
                        reads["Q"] += len(rows) * D
                        moved["Q"] = "read"
                    reads["K"] += len(cols) * D
                    reads["V"] += len(cols) * D
                    moved.update(K="read", V="read")
                else:
                    if j not in seen_kv:
                        seen_kv.add(j)
                        reads["K"] += len(cols) * D
                        reads["V"] += len(cols) * D
                        moved.update(K="read", V="read")
                    reads["Q"] += len(rows) * D
                    for name, size in (("O", len(rows) * D), ("l", len(rows)), ("m", len(rows))):
                        reads[name] += size
                        writes[name] += size
                        moved[name] = "read+write"
                    moved["Q"] = "read"
                s = self.scores[rows.start:rows.stop, cols.start:cols.stop]
                m_new = np.maximum(m[rows.start:rows.stop], s.max(axis=1))
                alpha = np.exp(m[rows.start:rows.stop] - m_new)
                l[rows.start:rows.stop] = (alpha * l[rows.start:rows.stop]
                                           + np.exp(s - m_new[:, None]).sum(axis=1))
                m[rows.start:rows.stop] = m_new
                status[i, j] = "current"
                note = f"S tile ({i}, {j}): query rows {rows.start}-{rows.stop - 1}, keys " \
                       f"{cols.start}-{cols.stop - 1}"
            # FA2 writes a query tile's output once, after its last key/value tile
            last_of_row = self.order == "fa2" and not any(
                ii == i for ii, _, _ in self.schedule[n + 1:])
            if last_of_row:
                writes["O"] += len(rows) * D
                moved["O"] = "write (final)"
                note += f"; query tile {i} is finished and its O tile is written once"
            frames.append(self._frame((i, j, visible), m, l, reads, writes, status, note, moved))
            status[i, j] = "done" if visible else "skipped"
        return frames

    def _frame(self, tile, m, l, reads, writes, status, note, moved):
        return {"tile": tile, "m": m.copy(), "l": l.copy(), "reads": dict(reads),
                "writes": dict(writes), "status": status.copy(), "note": note,
                "moved": dict(moved)}

    # ---------------------------------------------------------------- stepping
    @property
    def n_steps(self):
        """Number of steps (tile pairs); frames run from 0 to ``n_steps``."""
        return len(self.schedule)

    def step(self):
        """Advance one tile; stays on the last frame at the end. Returns ``state()``."""
        self.index = min(self.index + 1, self.n_steps)
        return self.state()

    def goto(self, index):
        """Jump to frame ``index`` (0 = before the first tile). Returns ``state()``."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        if not 0 <= index <= self.n_steps:
            raise ValueError(f"index must be in [0, {self.n_steps}], got {index}")
        self.index = int(index)
        return self.state()

    def state(self):
        """Everything the current frame shows, as plain Python values."""
        f = self._frames[self.index]
        tile = f["tile"]
        sram = {} if tile is None or not tile[2] else {"Q": tile[0], "K": tile[1], "V": tile[1]}
        return {
            "step": self.index, "n_steps": self.n_steps, "order": self.order,
            "tile": None if tile is None else (tile[0], tile[1]),
            "skipped": bool(tile is not None and not tile[2]),
            "sram": sram, "moved": f["moved"],
            "m": f["m"].tolist(), "l": f["l"].tolist(),
            "reads": f["reads"], "writes": f["writes"],
            "hbm_reads": sum(f["reads"].values()), "hbm_writes": sum(f["writes"].values()),
            "status": f["status"].tolist(), "note": f["note"], "text": self.text(),
        }

    def final_traffic(self):
        """The traffic of the whole run, in the keys of ``traffic_formula``."""
        f = self._frames[-1]
        out = {}
        for name in ("Q", "K", "V", "O", "l", "m", "lse"):
            out[f"{name} reads"] = f["reads"].get(name, 0)
            out[f"{name} writes"] = f["writes"].get(name, 0)
        return out

    def formula_traffic(self):
        return traffic_formula(self.order, self.Nq, self.Nk, self.D, self.Br, self.Bc,
                               is_causal=self.is_causal)

    def text(self):
        """One line that changes at every step (shown in the widget)."""
        f = self._frames[self.index]
        head = f"{self.order.upper()} step {self.index}/{self.n_steps}"
        r, w = sum(f["reads"].values()), sum(f["writes"].values())
        return f"{head}: {f['note']} | HBM so far: {r} elements read, {w} written"

    # ---------------------------------------------------------------- drawing
    def _grid_html(self):
        f = self._frames[self.index]
        st = f["status"]
        tile = f["tile"]
        cell = "width:22px;height:18px;border:1px solid #888;padding:0"
        rows_html = []
        head = "<tr><th></th>" + "".join(
            f"<th style='font-size:10px;color:{'#d94801' if tile and tile[1] == j else '#444'}'>"
            f"K{j}</th>" for j in range(self.Tc))
        head += "<th style='font-size:10px'>running m / l per row</th></tr>"
        for i in range(self.Tr):
            tds = []
            for j in range(self.Tc):
                s = st[i, j]
                mark = "&#10007;" if s in ("skipped", "skip-now") else ""
                tds.append(f"<td style='{cell};background:{_COLORS[s]};text-align:center;"
                           f"font-size:10px'>{mark}</td>")
            rs = self._rows(i)
            ml = " ".join(f"{_num(f['m'][r])}/{f['l'][r]:.2f}" for r in rs)
            qcolor = "#d94801" if tile and tile[0] == i else "#444"
            rows_html.append(f"<tr><th style='font-size:10px;color:{qcolor}'>Q{i}</th>"
                             + "".join(tds)
                             + f"<td style='font-family:monospace;font-size:10px;"
                               f"padding-left:6px;white-space:nowrap'>{ml}</td></tr>")
        return ("<table style='border-collapse:collapse'>" + head + "".join(rows_html)
                + "</table>")

    def _panel_html(self):
        s = self.state()
        sram = ", ".join(f"{k}{v}" for k, v in s["sram"].items()) or "(nothing)"
        moved = ", ".join(f"{k}: {v}" for k, v in s["moved"].items()) or "none"
        rows = "".join(f"<tr><td>{k}</td><td style='text-align:right'>{s['reads'].get(k, 0)}</td>"
                       f"<td style='text-align:right'>{s['writes'].get(k, 0)}</td></tr>"
                       for k in ("Q", "K", "V", "O", "l", "m"))
        labels = {"pending": "to do", "done": "done", "current": "in SRAM now",
                  "skipped": "skipped (mask)", "skip-now": "skipped this step"}
        legend = " ".join(f"<span style='background:{c};padding:0 6px;border:1px solid #888'>"
                          f"{labels[n]}</span>" for n, c in _COLORS.items())
        return (f"<div style='font-size:12px'><b>in SRAM:</b> {sram}<br>"
                f"<b>HBM traffic this step:</b> {html.escape(moved)}<br>"
                f"<table style='font-size:11px'><tr><th>tensor</th><th>read</th><th>written</th>"
                f"</tr>{rows}<tr><td><b>total</b></td><td><b>{s['hbm_reads']}</b></td>"
                f"<td><b>{s['hbm_writes']}</b></td></tr></table>"
                f"<div style='margin-top:4px'>{legend}</div></div>")

    def html(self):
        return ("<div style='display:flex;gap:16px;align-items:flex-start'>"
                f"<div>{self._grid_html()}</div><div>{self._panel_html()}</div></div>")

    def widget(self):
        """ipywidgets UI: order buttons, Play + slider, the grid, the counters and a
        one-line state (CSS class ``course-tile-state``)."""
        import ipywidgets as W
        order = W.ToggleButtons(options=[("FA2: query tile outer", "fa2"),
                                         ("FA1: KV tile outer", "fa1")], value=self.order)
        play = W.Play(value=self.index, min=0, max=self.n_steps, step=1, interval=600)
        slider = W.IntSlider(value=self.index, min=0, max=self.n_steps, description="step")
        W.jslink((play, "value"), (slider, "value"))
        view = W.HTML(self.html())
        line = W.HTML(html.escape(self.text()))
        line.add_class("course-tile-state")

        def redraw(*_):
            view.value = self.html()
            line.value = html.escape(self.text())

        def on_slider(change):
            self.goto(int(change["new"]))
            redraw()

        def on_order(change):
            self.set_order(change["new"])
            slider.max = play.max = self.n_steps
            slider.value = play.value = 0
            redraw()

        slider.observe(on_slider, names="value")
        order.observe(on_order, names="value")
        box = W.VBox([order, W.HBox([play, slider]), line, view])
        box._course_parts = {"play": play, "slider": slider, "state": line, "view": view,
                             "order": order}
        return box

    def filmstrip(self, frames=6, cols=3):
        """A matplotlib Figure with ``frames`` evenly spaced steps of the schedule."""
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
            raise ValueError(f"frames must be a positive int, got {frames!r}")
        picks = sorted(set(np.linspace(1, self.n_steps, min(frames, self.n_steps))
                           .round().astype(int).tolist()))
        rows = -(-len(picks) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
        names = list(_COLORS)
        cmap = ListedColormap([_COLORS[n] for n in names])
        keep = self.index
        for ax, k in zip(axes.ravel(), picks):
            self.goto(k)
            f = self._frames[k]
            codes = np.vectorize(names.index)(f["status"])
            ax.imshow(codes, cmap=cmap, vmin=0, vmax=len(names) - 1)
            ax.set_xticks(range(self.Tc))
            ax.set_yticks(range(self.Tr))
            ax.set_xticks(np.arange(-0.5, self.Tc), minor=True)
            ax.set_yticks(np.arange(-0.5, self.Tr), minor=True)
            ax.grid(which="minor", color="#888", linewidth=0.5)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("key/value tile j", fontsize=8)
            ax.set_ylabel("query tile i", fontsize=8)
            r, w = sum(f["reads"].values()), sum(f["writes"].values())
            ax.set_title(f"{self.order.upper()} step {k}/{self.n_steps}\n"
                         f"HBM: {r} read, {w} written", fontsize=8)
        for ax in axes.ravel()[len(picks):]:
            ax.axis("off")
        self.goto(keep)
        fig.suptitle(f"Tile schedule, {self.order.upper()}, Nq={self.Nq}, Nk={self.Nk}, "
                     f"Br={self.Br}, Bc={self.Bc}{', causal' if self.is_causal else ''} "
                     "(orange: current tile, blue: done, grey: skipped by the mask)",
                     fontsize=9)
        fig.tight_layout()
        return fig
