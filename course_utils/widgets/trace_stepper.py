"""Step through a register-machine trace: the register file, the DRAM cells
touched so far and the counters after each instruction.

    view = TraceStepper(trace, dram, registers=3)   # or TraceStepper.from_result(res)
    view.goto(5); view.state()["registers"]
    show(view)                                      # Play + slider in Jupyter
"""
from __future__ import annotations

import html
import math

from ..machine import TraceResult, run_trace

__all__ = ["TraceStepper"]


def _fmt(v):
    if v is None:
        return "·"
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.5g}"


class TraceStepper:
    """Plain-Python stepper over a :class:`~course_utils.machine.TraceResult`.
    Position 0 is the machine before the first instruction; position k is
    the machine after step k."""

    def __init__(self, trace=None, dram=None, *, registers: int = 3, isa: str = "matmul",
                 costs=None, result: TraceResult | None = None, max_label: int = 44):
        if result is None:
            if trace is None or dram is None:
                raise ValueError("TraceStepper needs either trace and dram, or result=")
            result = run_trace(trace, dram, registers=registers, isa=isa, costs=costs)
        elif not isinstance(result, TraceResult):
            raise TypeError(f"result: expected a TraceResult, got {type(result).__name__}")
        self.result = result
        self.max_label = max_label
        self.position = 0
        self._ui = None

    @classmethod
    def from_result(cls, result: TraceResult, **kw) -> "TraceStepper":
        return cls(result=result, **kw)

    @property
    def num_steps(self) -> int:
        return len(self.result.steps)

    # ---------------------------------------------------------------- stepping
    def goto(self, i: int) -> dict:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= self.num_steps:
            raise ValueError(f"i: expected a step in 0..{self.num_steps}, got {i!r}")
        self.position = i
        self._refresh()
        return self.state()

    def step(self) -> dict:
        """Advance one instruction (stays at the end once there)."""
        return self.goto(min(self.position + 1, self.num_steps))

    def state(self) -> dict:
        r, k = self.result, self.position
        s = r.steps[k - 1] if k else None
        regs = r.registers_after(k)
        labels = s.labels if s else (None,) * r.num_registers
        touched = {}
        for st in r.steps[:k]:
            for addr, how in ((st.read, "read"), (st.written, "written")):
                if addr is None:
                    continue
                prev = touched.get(addr, {}).get("how")
                touched[addr] = {"how": "read+written" if prev and prev != how else how}
        current = {}
        for addr, info in touched.items():
            written = "written" in info["how"]
            # the value a cell holds at this point: its last store, else its input
            val = r.initial_dram.get(addr)
            if written:
                for st in r.steps[:k]:
                    if st.written == addr:
                        val = st.value
            current[addr] = {"how": info["how"], "value": val}
        return {
            "step": k, "of": self.num_steps,
            "instruction": s.text if s else None, "line": s.line if s else None,
            "comment": s.comment if s else "",
            "registers": {f"R{i}": {"value": v, "label": lb} for i, (v, lb) in
                          enumerate(zip(regs, labels))},
            "dram": current,
            "cycles": s.cycles if s else 0, "reads": s.reads if s else 0,
            "writes": s.writes if s else 0,
            "last_read": s.read if s else None, "last_written": s.written if s else None,
        }

    # ---------------------------------------------------------------- rendering
    def registers_html(self, st=None) -> str:
        st = st or self.state()
        head = (f"<div><b>after step {st['step']} / {st['of']}</b>: "
                f"<code>{html.escape(st['instruction'] or '(start)')}</code>"
                + (f" <i>— {html.escape(st['comment'])}</i>" if st["comment"] else "") + "</div>")
        rows = "".join(
            f"<tr><td style='{_PAD}'><b>{name}</b></td>"
            f"<td style='{_PAD}text-align:right'>{_fmt(r['value'])}</td>"
            f"<td style='{_PAD}'><code>{html.escape(_clip(r['label'], self.max_label))}</code></td></tr>"
            for name, r in st["registers"].items())
        return head + (f"<table><tr><th style='{_PAD}'>register</th><th style='{_PAD}'>value</th>"
                       f"<th style='{_PAD}'>holds</th></tr>{rows}</table>")

    def dram_html(self, st=None) -> str:
        st = st or self.state()
        if not st["dram"]:
            cells = "<i>no DRAM cell touched yet</i>"
        else:
            cells = " ".join(
                f"<span style='display:inline-block;margin:2px;padding:2px 5px;border-radius:4px;"
                f"background:{'#fde2c8' if 'written' in c['how'] else '#d6e8fa'};"
                f"{'outline:2px solid #333;' if a in (st['last_read'], st['last_written']) else ''}'>"
                f"{html.escape(a)} = {_fmt(c['value'])}</span>"
                for a, c in st["dram"].items())
        return f"<div><b>DRAM cells touched</b> (blue read, orange written): {cells}</div>"

    def counters_html(self, st=None) -> str:
        st = st or self.state()
        return (f"<div class='course-counters'>cycles <b>{st['cycles']}</b> &nbsp; DRAM reads "
                f"<b>{st['reads']}</b> &nbsp; writes <b>{st['writes']}</b></div>")

    def widget(self):
        import ipywidgets as w
        play = w.Play(value=self.position, min=0, max=self.num_steps, step=1, interval=700,
                      description="Play")
        slider = w.IntSlider(value=self.position, min=0, max=self.num_steps, description="step",
                             continuous_update=True)
        w.jslink((play, "value"), (slider, "value"))
        regs = w.HTML(self.registers_html())
        regs.add_class("course-registers")
        dram = w.HTML(self.dram_html())
        dram.add_class("course-dram")
        counters = w.HTML(self.counters_html())
        counters.add_class("course-counters")
        self._ui = {"slider": slider, "play": play, "registers": regs, "dram": dram,
                    "counters": counters}

        def on_change(change):
            self.goto(int(change["new"]))

        slider.observe(on_change, names="value")
        return w.VBox([w.HBox([play, slider]), regs, dram, counters])

    def _refresh(self):
        if not self._ui:
            return
        st = self.state()
        self._ui["registers"].value = self.registers_html(st)
        self._ui["dram"].value = self.dram_html(st)
        self._ui["counters"].value = self.counters_html(st)
        if self._ui["slider"].value != self.position:
            self._ui["slider"].value = self.position

    def filmstrip(self, max_frames: int = 30):
        """A table of the register file after each step (every step when there
        are at most ``max_frames``, evenly spaced ones otherwise)."""
        import matplotlib.pyplot as plt
        r = self.result
        n = self.num_steps
        idx = list(range(1, n + 1)) if n <= max_frames else sorted(
            {round(1 + j * (n - 1) / (max_frames - 1)) for j in range(max_frames)})
        cols = ["step", "instruction"] + [f"R{i}" for i in range(r.num_registers)] + \
            ["cycles", "reads", "writes"]
        cells = []
        for k in idx:
            s = r.steps[k - 1]
            cells.append([str(k), s.text] + [_fmt(v) for v in s.registers] +
                         [str(s.cycles), str(s.reads), str(s.writes)])
        chars = sum(max(len(row[c]) for row in cells + [cols]) + 2 for c in range(len(cols)))
        fig, ax = plt.subplots(figsize=(max(7.0, 0.085 * chars), 1.0 + 0.24 * len(cells)))
        ax.axis("off")
        tab = ax.table(cellText=cells, colLabels=cols, loc="center", cellLoc="center")
        tab.auto_set_font_size(False)
        tab.set_fontsize(8)
        tab.auto_set_column_width(list(range(len(cols))))
        ax.set_title("Register file after each step\n" + r.summary().replace("; ", "\n"), fontsize=8)
        fig.tight_layout()
        return fig


_PAD = "padding:1px 10px;"


def _clip(s, n):
    if s is None:
        return ""
    return s if len(s) <= n else s[: n - 1] + "…"

