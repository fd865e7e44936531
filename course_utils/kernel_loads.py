"""Catch a Triton kernel's out-of-bounds loads in the CPU interpreter.

A :class:`course_utils.guards.Guarded` tensor shows an out-of-bounds *store* (its margin
changes) and a load past the end that reaches a stored value (the margin's NaN comes
back). A load whose value never reaches a stored element -- the query rows past ``NQ`` of
the last tile, the lanes past ``n`` of ``alpha * x + y`` -- shows in neither.
:func:`loads_within` watches the addresses themselves: every lane a kernel launched in
the block loads with its mask on must lie inside one of the tensors given.

Where Triton runs through its interpreter (``TRITON_INTERPRET=1``, every CPU machine)
the loads are watched as the kernel runs. Where kernels are compiled (a GPU), a launch
made through :func:`watched_launch` inside the block -- the course's ``launch`` and the
launches course-grade records go through it -- runs on the GPU and then once more in the
interpreter, on CPU copies of its arguments, and that second run is watched.

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

from course_utils import device
from course_utils.checks import CheckFailed

__all__ = ["loads_within", "watched_launch"]


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
def _watching(interp, ranges, stray):
    """Patch the interpreter's masked load and store for the block: every lane a load
    reads with its mask on must lie in one of ``ranges``; once one has not, every float
    value stored is NaN."""
    builder = interp.interpreter_builder
    original = builder.create_masked_load
    original_store = builder.create_masked_store

    # the cache and volatility arguments differ between Triton versions: passed on as given
    def create_masked_load(ptrs, mask, other, *rest):
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
        return original(ptrs, mask, other, *rest)

    def create_masked_store(ptrs, value, mask, *rest):
        data = np.asarray(value.data)
        if stray and np.issubdtype(data.dtype, np.floating):
            value = interp.TensorHandle(np.full_like(data, np.nan), value.dtype)
        return original_store(ptrs, value, mask, *rest)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    try:
        yield stray
    finally:
        del builder.create_masked_load
        del builder.create_masked_store


# the blocks open around compiled launches (a GPU): (labelled tensors, stray loads found)
_open: list = []
# compiled launches the interpreter could not run again (so not watched), and why
unwatched: list[str] = []


@contextlib.contextmanager
def loads_within(*tensors: torch.Tensor, names=None, name: str = "your kernel",
                 hint: str = "mask every load: tl.load(ptrs, mask=..., other=0.0)"):
    """Fail (after the block) when a kernel launched inside the block loaded an element
    outside every tensor in ``tensors`` -- a read past the end that its mask let through.
    ``names`` labels the tensors in the message. Yields the list of stray loads found
    (``(label of the nearest tensor, elements past its end)``).

    In the interpreter every launch in the block is watched. Where kernels are compiled
    (a GPU), the launches made through :func:`watched_launch` (the course's ``launch``
    and course-grade's recorded launches) run a second time, in the interpreter on CPU
    copies of their arguments, and that run is watched; when it reads outside the tensors,
    its results (NaN after the stray load) replace the GPU's."""
    labels = list(names) if names is not None else [f"argument {i + 1}" for i in range(len(tensors))]
    ranges = _ranges(zip(labels, tensors))
    stray: list[tuple[str, int]] = []
    try:
        from triton.runtime import interpreter as _interp
        _interp.interpreter_builder
    except Exception:  # pragma: no cover - no Triton interpreter
        yield stray
        return
    if device.INTERPRET:
        with _watching(_interp, ranges, stray):
            yield stray
    else:
        entry = (list(zip(labels, tensors)), stray)
        _open.append(entry)
        try:
            yield stray
        finally:
            _open.remove(entry)
    if stray and not _grading_student_run():
        where = sorted({label for label, _ in stray})
        lanes = sum(n for _, n in stray)
        raise CheckFailed(f"{name} read {lanes} element(s) outside its tensors (past the end of "
                          f"{', '.join(where)}): a load whose mask lets through lanes past the "
                          f"last row or element reads memory that is not the tensor's, even when "
                          f"the store is masked afterwards.\n  hint: {hint}")


def _copies(args, kwargs):
    """CPU copies of the whole storage of every tensor among the arguments (guard margins
    included), taken before the launch: ``{storage pointer: (storage, copy)}``."""
    out = {}
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            st = a.untyped_storage()
            if st.data_ptr() not in out:
                cpu = torch.UntypedStorage(st.nbytes(), device="cpu")
                cpu.copy_(st)
                out[st.data_ptr()] = (st, cpu)
    return out


def _on_copy(a, copies):
    if not isinstance(a, torch.Tensor):
        return a
    cpu = copies[a.untyped_storage().data_ptr()][1]
    t = torch.empty(0, dtype=a.dtype)
    t.set_(cpu, a.storage_offset(), a.size(), a.stride())
    return t


def watched_launch(kernel, grid, args, kwargs):
    """``kernel[grid](*args, **kwargs)``; inside a :func:`loads_within` block on a GPU, the
    launch is then run again in Triton's interpreter on CPU copies of its tensors (taken
    before the launch) and its loads are checked there. Device functions the kernel calls
    run interpreted too. Where the interpreter cannot run the kernel, the launch stands
    unwatched."""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # pragma: no cover - no Triton
        JITFunction = ()
    if not _open or device.INTERPRET or not isinstance(kernel, JITFunction):
        return kernel[grid](*args, **kwargs)
    copies = _copies(args, kwargs)
    out = kernel[grid](*args, **kwargs)
    tensors, stray = _open[-1]
    ranges = []
    for label, t in tensors:
        held = copies.get(t.untyped_storage().data_ptr())
        if held is not None:
            lo = held[1].data_ptr() + (t.data_ptr() - held[0].data_ptr())
            ranges.append((label, lo, lo + t.numel() * t.element_size()))
    found: list = []
    try:
        _interpret(kernel.fn, grid, [_on_copy(a, copies) for a in args],
                   {k: _on_copy(v, copies) for k, v in kwargs.items()}, ranges, found)
    except Exception as e:  # noqa: BLE001 - the interpreter could not run it: unwatched
        if len(unwatched) < 100:
            unwatched.append(f"{getattr(kernel.fn, '__name__', kernel)}: {type(e).__name__}: {e}")
        return out
    if found:
        stray.extend(found)
        for st, cpu in copies.values():
            st.copy_(cpu)
    return out


def _interpret(fn, grid, args, kwargs, ranges, found):
    from triton.runtime import interpreter as _interp
    from triton.runtime.jit import JITFunction
    made: dict = {}

    def device_call(self, *a, **k):
        f = made.get(self.fn)
        if f is None:
            f = made[self.fn] = _interp.InterpretedFunction(self.fn)
        return f(*a, **k)

    patch_tensor = getattr(_interp, "_patch_lang_tensor", None)

    def patch_tensor_compat(tensor, *rest):
        # Triton 3.6's interpreter turns a scalar into an index with int() of a one-element
        # array, which NumPy 2.5 refuses (a loop with a runtime bound fails): take the element
        patch_tensor(tensor, *rest)
        scope = rest[0] if rest else None
        if hasattr(scope, "set_attr"):
            scope.set_attr(tensor, "__index__",
                           lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    compiled_call = JITFunction.__call__
    JITFunction.__call__ = device_call      # a device function the kernel calls, interpreted
    if patch_tensor is not None:
        _interp._patch_lang_tensor = patch_tensor_compat
    try:
        with _language_kept(), _watching(_interp, ranges, found):
            _interp.InterpretedFunction(fn)[grid](*args, **kwargs)
    finally:
        JITFunction.__call__ = compiled_call
        if patch_tensor is not None:
            _interp._patch_lang_tensor = patch_tensor


@contextlib.contextmanager
def _language_kept():
    """Put ``triton.language`` back as it was after the block. The interpreter swaps the
    language's functions for its own while a kernel runs; a device function it runs (a
    reduction such as ``tl.sum`` among them) swaps them again without putting them back,
    which is harmless where every kernel is interpreted but breaks the next compilation
    where kernels are compiled."""
    import triton.language as tl
    held = []
    for mod in ("triton.language", "triton.language.core", "triton.language.math",
                "triton.language.standard"):
        m = sys.modules.get(mod)
        if m is not None:
            held.append(m)
    core = sys.modules.get("triton.language.core", tl)
    for name in ("tensor", "dtype", "tensor_descriptor_base"):
        cls = getattr(core, name, None)
        if isinstance(cls, type):
            held.append(cls)
    saved = [(obj, dict(vars(obj))) for obj in held]
    try:
        yield
    finally:
        for obj, before in saved:
            now = vars(obj)
            # a module keeps the names it gained: the interpreter adds its own helpers to the
            # globals of every function it rewrites, and caches the rewritten function, which
            # needs them the next time (a class's new attributes, such as __index__, go)
            for k in [k for k in now if k not in before and isinstance(obj, type)]:
                try:
                    delattr(obj, k)
                except (AttributeError, TypeError):
                    pass
            for k, v in before.items():
                if now.get(k, _GONE) is not v:
                    try:
                        setattr(obj, k, v)
                    except (AttributeError, TypeError):
                        pass


_GONE = object()
