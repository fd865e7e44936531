"""The trace stepper and the online-softmax stepper, stepped without a browser."""
import math

import matplotlib
import pytest

matplotlib.use("Agg")

from course_utils.machine import matmul_dram, online_softmax_trace, run_trace, softmax_dram  # noqa: E402
from course_utils.widgets.softmax_stepper import SoftmaxStepper  # noqa: E402
from course_utils.widgets.trace_stepper import TraceStepper  # noqa: E402

P1 = """LOAD a[0][0], R0
LOAD b[0][0], R1
MAC_Z R0, R1, R2
LOAD a[0][1], R0
LOAD b[1][0], R1
MAC R0, R1, R2, R2
STORE R2, c[0][0]   # done"""


def test_trace_stepper_state_through_the_trace():
    v = TraceStepper(P1, matmul_dram([[1, 2], [3, 4]], [[5, 6], [7, 8]]), registers=3)
    s0 = v.state()
    assert s0["step"] == 0 and s0["cycles"] == 0 and all(r["value"] is None
                                                          for r in s0["registers"].values())
    s = v.step()
    assert s["registers"]["R0"]["value"] == 1.0 and s["dram"] == {"a[0][0]": {"how": "read",
                                                                             "value": 1.0}}
    s = v.goto(3)
    assert s["registers"]["R2"] == {"value": 5.0, "label": "a[0][0]·b[0][0]"}
    assert (s["cycles"], s["reads"], s["writes"]) == (3, 2, 0)
    s = v.goto(7)
    assert s["dram"]["c[0][0]"] == {"how": "written", "value": 19.0}
    assert s["comment"] == "done" and s["line"] == 7 and (s["reads"], s["writes"]) == (4, 1)
    assert v.step()["step"] == 7  # stays at the end
    with pytest.raises(ValueError, match="0..7"):
        v.goto(8)


def test_trace_stepper_widget_follows_the_slider():
    res = run_trace(online_softmax_trace(3), softmax_dram([1.0, 3.0, 2.0]), registers=4,
                    isa="softmax")
    v = TraceStepper.from_result(res)
    ui = v.widget()
    regs = v._ui["registers"]
    assert "course-registers" in regs._dom_classes
    before = regs.value
    v._ui["slider"].value = 4
    assert v.position == 4 and regs.value != before and "after step 4" in regs.value
    text5 = v.goto(5) and regs.value
    assert v._ui["slider"].value == 5 and text5 != before
    assert "cycles <b>5</b>" in v._ui["counters"].value
    fig = v.filmstrip(max_frames=10)
    assert fig.axes and len(ui.children) == 4
    import matplotlib.pyplot as plt
    plt.close("all")


def test_trace_stepper_needs_input():
    with pytest.raises(ValueError, match="trace and dram"):
        TraceStepper()
    with pytest.raises(TypeError, match="TraceResult"):
        TraceStepper(result="x")


def test_softmax_stepper_states_and_widget():
    v = SoftmaxStepper([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert v.state()["seen"] == 0 and v.state()["s"] == 0.0
    s = v.step()
    assert s["m"] == 1.0 and s["s"] == 1.0 and not s["max_moved"]
    s = v.step()
    assert s["max_moved"] and s["scale"] == pytest.approx(math.exp(-1.0))
    s = v.goto(6)
    assert s["m"] == 6.0 and s["s"] == pytest.approx(sum(math.exp(k - 6.0) for k in range(1, 7)))
    assert sum(w * x for w, x in zip(s["weights"], range(1, 7))) == pytest.approx(5.4329, abs=1e-4)
    ui = v.widget()
    box = v._ui["state"]
    assert "course-softmax-state" in box._dom_classes
    before = box.value
    v._ui["slider"].value = 2
    assert box.value != before and "the max moved" in box.value
    fig = v.filmstrip()
    assert len(fig.axes) == 3 and len(ui.children) == 2
    import matplotlib.pyplot as plt
    plt.close("all")
    with pytest.raises(ValueError):
        SoftmaxStepper([])
