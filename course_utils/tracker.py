"""The course's one allocation tracker: what a function allocates, on any device.

Lessons 3 to 5 use it to show that the naive attention and its backward build an
``Nq x Nk`` matrix and the tiled versions never do.
"""
from __future__ import annotations

import math

import torch

__all__ = ["AllocationTracker"]


class AllocationTracker:
    """Watch every tensor PyTorch creates inside a ``with`` block (any device).

    ``peak_bytes``: the most bytes of tensor storage alive at once that were
    created inside the block (inputs made before it do not count), the CPU
    counterpart of ``torch.cuda.max_memory_allocated``. ``shapes``: the shape of
    every tensor an operation produced, in order, so a test can ask whether some
    ``Nq x Nk`` matrix ever existed; ``ops``: the name of the operator that produced
    each of them (``"mm"``, ``"bmm"``, ...). Built on ``TorchDispatchMode``: each operator's
    outputs are seen once, and a storage is counted as freed when Python drops its
    last reference."""

    def __init__(self):
        self.peak_bytes = 0
        self.current_bytes = 0
        self.shapes = []
        self.ops = []
        self._live = {}
        self._mode = None

    def _free(self, key):
        n = self._live.pop(key, 0)
        self.current_bytes -= n

    def _see(self, t, op=""):
        import weakref
        self.shapes.append(tuple(t.shape))
        self.ops.append(op)
        st = t.untyped_storage()
        key = id(st)
        if key in self._live:
            return
        n = st.nbytes()
        self._live[key] = n
        self.current_bytes += n
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        weakref.finalize(st, self._free, key)

    def largest(self):
        """The shape with the most elements among everything produced (or ``()``)."""
        return max(self.shapes, key=lambda s: math.prod(s), default=())

    def largest_numel(self):
        """Elements of the largest tensor produced (0 if none)."""
        return math.prod(self.largest()) if self.shapes else 0

    def saw_matrix(self, rows, cols):
        """True when some produced tensor had ``rows x cols`` as its last two sizes."""
        return any(len(s) >= 2 and s[-2:] == (rows, cols) for s in self.shapes)

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        tracker._see(t, str(func.overloadpacket.__name__))
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self._mode = None
        return False
