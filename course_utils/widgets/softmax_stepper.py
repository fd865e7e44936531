"""Watch online softmax fold in one element at a time: the running max m,
the running sum s and the rescaling factor exp(m_old - m) that corrects s
whenever the max moves.

    view = SoftmaxStepper([1, 2, 3, 4, 5, 6])
    view.goto(3); view.state()["s"]
    show(view)
"""
from __future__ import annotations

import math

from ..softmax import online_softmax_states

__all__ = ["SoftmaxStepper"]


class SoftmaxStepper:
    """Position 0: nothing seen; position k: after element k-1 (k elements seen)."""

    def __init__(self, x):
        self.x = [float(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]
        if not self.x or any(math.isnan(v) for v in self.x):
            raise ValueError("x: expected a non-empty sequence of numbers without NaN")
        self.states = online_softmax_states(self.x)
        self.position = 0
        self._ui = None

    @property
    def num_steps(self) -> int:
        return len(self.x)

    def goto(self, i: int) -> dict:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= self.num_steps:
            raise ValueError(f"i: expected a position in 0..{self.num_steps}, got {i!r}")
        self.position = i
        self._refresh()
        return self.state()

    def step(self) -> dict:
        return self.goto(min(self.position + 1, self.num_steps))

    def state(self) -> dict:
        k = self.position
        if k == 0:
            return {"seen": 0, "x": None, "m_old": None, "m": -math.inf, "scale": None,
                    "s": 0.0, "max_moved": False, "weights": []}
        st = self.states[k - 1]
        return {"seen": k, "x": st["x"], "m_old": st["m_old"], "m": st["m"],
                "scale": st["scale"], "s": st["s"],
                "max_moved": k > 1 and st["m"] > st["m_old"], "weights": list(st["weights"])}

    def state_html(self, st=None) -> str:
        st = st or self.state()
        if st["seen"] == 0:
            return "<div><b>nothing seen yet</b>: m = −∞, s = 0</div>"
        moved = (f"<span style='color:#b45309'>the max moved: s is rescaled by "
                 f"exp({st['m_old']:.4g} − {st['m']:.4g}) = {st['scale']:.4g}</span>"
                 if st["max_moved"] else
                 ("first element: s starts at exp(0) = 1" if st["seen"] == 1 else
                  "the max did not move: factor exp(0) = 1"))
        bars = "".join(
            f"<div style='display:inline-block;width:34px;margin:1px;text-align:center'>"
            f"<div style='height:{60 * w:.0f}px;background:#3b82f6;margin-top:{60 - 60 * w:.0f}px'>"
            f"</div><small>{w:.3f}</small></div>" for w in st["weights"])
        return (f"<div><b>after x[{st['seen'] - 1}] = {st['x']:.4g}</b> &nbsp; m = {st['m']:.4g}"
                f" &nbsp; s = {st['s']:.6g}</div><div>{moved}</div>"
                f"<div>weights exp(x_j − m)/s of the elements seen:</div><div>{bars}</div>")

    def widget(self):
        import ipywidgets as w
        play = w.Play(value=self.position, min=0, max=self.num_steps, interval=900,
                      description="Play")
        slider = w.IntSlider(value=self.position, min=0, max=self.num_steps,
                             description="seen")
        w.jslink((play, "value"), (slider, "value"))
        box = w.HTML(self.state_html())
        box.add_class("course-softmax-state")
        self._ui = {"slider": slider, "play": play, "state": box}
        slider.observe(lambda ch: self.goto(int(ch["new"])), names="value")
        return w.VBox([w.HBox([play, slider]), box])

    def _refresh(self):
        if not self._ui:
            return
        self._ui["state"].value = self.state_html()
        if self._ui["slider"].value != self.position:
            self._ui["slider"].value = self.position

    def filmstrip(self):
        """Running max, running sum and rescaling factor against elements seen."""
        import matplotlib.pyplot as plt
        ks = list(range(1, self.num_steps + 1))
        fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
        axes[0].plot(ks, self.x, "o", color="0.6", label="x_i")
        axes[0].step(ks, [s["m"] for s in self.states], where="post", label="running max m")
        axes[0].set_title("running max")
        axes[0].legend(fontsize=8)
        axes[1].plot(ks, [s["s"] for s in self.states], marker="o")
        axes[1].set_title("running sum s (relative to the current m)")
        axes[2].bar(ks[1:], [s["scale"] for s in self.states[1:]], color="tab:orange")
        axes[2].set_ylim(0, 1.05)
        axes[2].set_title("rescaling factor exp(m_old − m)")
        for ax in axes:
            ax.set_xlabel("elements seen")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        return fig

