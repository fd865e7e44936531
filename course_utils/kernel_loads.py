"""Catch a Triton kernel's out-of-bounds loads in the CPU interpreter.

A :class:`course_utils.guards.Guarded` tensor shows an out-of-bounds *store* (its margin
changes) and a load past the end that reaches a stored value (the margin's NaN comes
back). A load whose value never reaches a stored element -- the query rows past ``NQ`` of
the last tile, the lanes past ``n`` of ``alpha * x + y`` -- shows in neither.
:func:`loads_within` watches the addresses themselves: every lane a kernel launched in
the block loads with its mask on must lie inside one of the tensors given.

It works where Triton runs through its interpreter (``TRITON_INTERPRET=1``, every CPU
machine); a compiled kernel on a GPU is not watched, and the block then checks nothing.

Once a launch has read outside its tensors, every float value it stores afterwards is NaN,
so the verdict also travels as data: ``course-grade`` records what a kernel wrote in the
student's run and replays it in the checking run, where the output's NaN fails the
finiteness check that follows. Under the grader's student run the block does not raise
(the check cell must run to its end there); anywhere else it raises after the block.
"""
from __future__ import annotations

import contextlib
import sys

import numpy as np
import torch

from course_utils.checks import CheckFailed

__all__ = ["loads_within"]


def _grading_student_run() -> bool:
    side = sys.modules.get("course_utils.grading.kernel_side")
    state = getattr(side, "_state", None)
    return isinstance(state, dict) and state.get("mode") == "student"


def _ranges(tensors):
    out = []
    for label, t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"loads_within takes tensors, got {type(t).__name__} for {label}")
        if not t.is_contiguous():
            raise ValueError(f"loads_within needs contiguous tensors ({label} is not)")
        lo = t.data_ptr()
        out.append((label, lo, lo + t.numel() * t.element_size()))
    return out


@contextlib.contextmanager
def loads_within(*tensors: torch.Tensor, names=None, name: str = "your kernel",
                 hint: str = "mask every load: tl.load(ptrs, mask=..., other=0.0)"):
    """Fail (after the block) when a kernel launched inside the block loaded an element
    outside every tensor in ``tensors`` -- a read past the end that its mask let through.
    ``names`` labels the tensors in the message. Yields the list of stray loads found
    (``(label of the nearest tensor, elements past its end)``)."""
    labels = list(names) if names is not None else [f"argument {i + 1}" for i in range(len(tensors))]
    ranges = _ranges(zip(labels, tensors))
    stray: list[tuple[str, int]] = []
    try:
        from triton.runtime import interpreter as _interp
        builder = _interp.interpreter_builder
    except Exception:  # pragma: no cover - no Triton interpreter
        yield stray
        return
    original = builder.create_masked_load
    original_store = builder.create_masked_store

    def create_masked_load(ptrs, mask, other, cache_policy, is_volatile):
        addrs = np.asarray(ptrs.data).astype(np.uint64)
        on = np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)
        seen = addrs[on]
        if seen.size:
            ok = np.zeros(seen.shape, dtype=bool)
            for _, lo, hi in ranges:
                ok |= (seen >= lo) & (seen < hi)
            if not ok.all():
                bad = seen[~ok]
                # name it after the tensor it sticks out of (the nearest start below it)
                first = int(bad.min())
                below = [(first - lo, label) for label, lo, _ in ranges if lo <= first]
                label = min(below)[1] if below else "before every tensor"
                stray.append((label, int(bad.size)))
        return original(ptrs, mask, other, cache_policy, is_volatile)

    def create_masked_store(ptrs, value, mask, cache_policy):
        data = np.asarray(value.data)
        if stray and np.issubdtype(data.dtype, np.floating):
            value = _interp.TensorHandle(np.full_like(data, np.nan), value.dtype)
        return original_store(ptrs, value, mask, cache_policy)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    try:
        yield stray
    finally:
        del builder.create_masked_load
        del builder.create_masked_store
    if stray and not _grading_student_run():
        where = sorted({label for label, _ in stray})
        lanes = sum(n for _, n in stray)
        raise CheckFailed(f"{name} read {lanes} element(s) outside its tensors (past the end of "
                          f"{', '.join(where)}): a load whose mask lets through lanes past the "
                          f"last row or element reads memory that is not the tensor's, even when "
                          f"the store is masked afterwards.\n  hint: {hint}")
