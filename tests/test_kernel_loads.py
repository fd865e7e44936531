"""course_utils.kernel_loads: a load past the end is caught even when its value is never stored."""
import pytest
import torch

from course_utils import device, guards
from course_utils.checks import CheckFailed
from course_utils.kernel_loads import loads_within

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.skipif(not device.INTERPRET, reason="watches the CPU interpreter's loads")


@triton.jit
def _copy(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if MASK_LOAD:
        x = tl.load(X + offs, mask=mask)
    else:
        x = tl.load(X + offs)
    tl.store(OUT + offs, x, mask=mask)


def _run(mask_load):
    x, out = guards.Guarded(torch.randn(37)), guards.Guarded.empty((37,))
    with loads_within(x.tensor, out.tensor, names=("X", "OUT")):
        _copy[(3,)](x.tensor, out.tensor, 37, MASK_LOAD=mask_load, BLOCK=16)
    return x, out


def test_masked_loads_pass():
    x, out = _run(True)
    assert torch.equal(out.tensor, x.tensor)


def test_a_load_past_the_end_fails():
    with pytest.raises(CheckFailed, match="past the end of X"):
        _run(False)


def test_under_the_graders_student_run_it_poisons_the_stores_instead(monkeypatch):
    from course_utils import kernel_loads
    monkeypatch.setattr(kernel_loads, "_grading_student_run", lambda: True)
    x, out = _run(False)
    assert torch.equal(out.tensor[:32], x.tensor[:32])     # the programs before the stray load
    assert bool(out.tensor[32:].isnan().all())             # the store after it


def test_the_interpreter_is_restored():
    from triton.runtime import interpreter
    with pytest.raises(CheckFailed):
        _run(False)
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)
    assert "create_masked_store" not in vars(interpreter.interpreter_builder)
