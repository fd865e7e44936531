"""Guards that make a check measure the learner's own work.

A check that only compares values can be passed by calling the thing the exercise
asks the learner to write (SDPA, ``torch.softmax``, the course's own reference or
kernel), by steering the check (mutating its inputs, returning NaN where NaN is
expected), or by an algorithm that is right only on the inputs the check happens to
use. The tools here close those doors; every problem set's checks use them.

* :func:`forbid` - a context manager in which calling a forbidden group of things
  (``"sdpa"``, ``"softmax"``, ``"autograd"``, the course's references and kernels, ...)
  raises :class:`ForbiddenCall`, a :class:`~course_utils.checks.CheckFailed` that says
  what was called and what the exercise asks for instead. Torch calls are caught at
  the API level (a ``TorchFunctionMode``) and at the operator level (a
  ``TorchDispatchMode``, so ``torch.ops.aten...`` is caught too); Python functions of
  the course are swapped for a refusing body while the guard is on, so a reference
  imported under another name is caught as well; Triton kernels of the course refuse
  to launch.
* :func:`run_answer` - calls an answer on *clones* of its inputs under :func:`forbid`,
  fails if it changed its inputs in place, if it allocated a tensor whose shape ends
  in a forbidden pair of sizes (the ``Nq x Nk`` score matrix), and returns the output.
* :func:`check_finite`, :func:`check_prediction` - NaN/inf in an answer fails unless
  expected; a prediction or choice is checked without ever printing the expected value.
* :func:`one_pass` - feeds a function a one-shot stream and fails when it reads the
  stream twice or stores it (peak memory).
* :class:`Guarded`, :func:`check_kernel_output`, :func:`record_launches` - tensors with
  guard regions around them, so an out-of-bounds load or store of a Triton kernel is
  caught by *this* check with the cause named, never as a crash cells later; outputs
  poisoned before the launch so unwritten elements show; launches recorded.
* :func:`check_source` - a static look at the answer cell's source for names it must
  not use (for answers that are values, such as a trace, where no call can be caught).
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import math
import re
import sys
import threading
import tracemalloc
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from course_utils.checks import CheckFailed

__all__ = [
    "ForbiddenCall", "GROUPS", "forbid", "run_answer", "check_finite", "check_prediction",
    "one_pass", "Guarded", "check_kernel_output", "record_launches", "check_source",
    "answer_source", "register_answer_sources", "GuardEscape",
]


class ForbiddenCall(CheckFailed):
    """The answer called something the exercise asks the learner to write."""


# ---------------------------------------------------------------------------------------
# What can be forbidden
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """One forbidden group: torch API names, aten operator name prefixes, Python
    callables (``"module:qualname"``, or ``"module:*"`` for every function and Triton
    kernel a module defines) and a phrase for the failure message."""
    what: str
    torch_api: tuple = ()
    aten: tuple = ()
    python: tuple = ()
    engine: bool = False    # refuse every operator the autograd engine runs (a backward)
    # functions a module-wide spec leaves out ("module.qualname"): helpers the course gives
    # the learner, which run under the guard like the learner's own code (not exempt from it)
    spare: tuple = ()


_ATTN_ATEN = ("scaled_dot_product_attention", "_scaled_dot_product", "_flash_attention",
              "_efficient_attention", "_cudnn_attention", "_fused_sdp")
_SOFTMAX_ATEN = ("_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax",
                 "special_softmax", "special_log_softmax", "_masked_softmax", "_sparse_softmax",
                 "_sparse_log_softmax", "_sparse_csr_softmax")

# the softmax under each name torch gives it (torch functions, Tensor methods): a group that
# forbids a softmax by one of these names (a problem set's own group too) forbids them all
_SOFTMAX_API = ("softmax", "log_softmax", "_softmax", "_log_softmax", "_masked_softmax",
                "_sparse_softmax", "_sparse_log_softmax")


# and the softmax written in Python inside torch (its reference implementations and
# decompositions), which reach no softmax operator: forbidden with it
_SOFTMAX_PY = ("torch._refs:softmax", "torch._refs:log_softmax", "torch._refs.special:softmax",
               "torch._refs.special:log_softmax", "torch._refs.nn.functional:softmin",
               "torch._decomp.decompositions:_softmax",
               "torch._decomp.decompositions:_log_softmax")


# torch's own Python that a group forbids and a torch release may not have
_TORCH_INTERNALS = frozenset(_SOFTMAX_PY + ("torch._refs:logsumexp",))


def _with_aliases(names: tuple, aliases: tuple) -> tuple:
    return tuple(dict.fromkeys(names + aliases)) if set(names) & set(aliases) else names


GROUPS: dict[str, Group] = {
    "sdpa": Group("PyTorch's scaled_dot_product_attention",
                  torch_api=("scaled_dot_product_attention",), aten=_ATTN_ATEN,
                  python=("torch.nn.functional:scaled_dot_product_attention",)),
    "softmax": Group("a library softmax (torch.softmax, F.softmax, Tensor.softmax, log_softmax, "
                     "the course's own in course_utils.softmax)",
                     torch_api=_SOFTMAX_API,
                     aten=_SOFTMAX_ATEN, python=("course_utils.softmax:*",)),
    "logsumexp": Group("torch.logsumexp", torch_api=("logsumexp", "logcumsumexp"),
                       aten=("logsumexp", "logcumsumexp"), python=("torch._refs:logsumexp",)),
    "autograd": Group("autograd (backward, torch.autograd.grad, torch.func)",
                      torch_api=("backward", "grad", "_make_dual", "_unpack_dual"),
                      aten=("_make_dual", "_unpack_dual"), engine=True,
                      python=("torch.autograd:grad", "torch.autograd:backward",
                              "torch.autograd.functional:*", "torch.func:grad", "torch.func:vjp",
                              "torch.func:jacrev", "torch.func:jacfwd", "torch.func:grad_and_value")),
    "reference-softmax": Group("the course's softmax reference (course_utils.softmax)",
                               python=("course_utils.softmax:*",)),
    "reference-attention": Group("the course's own attention code (course_utils.attention, backward, "
                                 "decoding, its masks, the checks' references, the benchmarks' "
                                 "baselines)",
                                 python=("course_utils.attention:*",
                                         "course_utils.backward:*",
                                         "course_utils.decoding:*",
                                         "course_utils.contract:causal_mask",
                                         "course_utils.contract:visible_keys",
                                         "course_utils.exercise_checks:attention_reference",
                                         "course_utils.exercise_checks:fa1_walk_reference",
                                         "course_utils.bench.decode:grouped_torch_decode",
                                         "course_utils.dropout:*",
                                         "course_utils.tiny_gpt:*")),
    "reference-backward": Group("the course's backward reference (course_utils.backward)",
                                python=("course_utils.backward:*",)),
    "reference-decoding": Group("the course's decoding reference (course_utils.decoding)",
                                python=("course_utils.decoding:*",)),
    "course-kernels": Group("the course's own Triton and Gluon kernels",
                            python=("course_utils.triton_intro:*", "course_utils.triton_attention:*",
                                    "course_utils.triton_decode:*", "course_utils.hopper.triton_fwd:*",
                                    "course_utils.hopper.gluon_fwd:*", "course_utils.hopper.gluon_bwd:*",
                                    "course_utils.hopper.fp8:*"),
                            spare=("course_utils.triton_intro.launch",
                                   "course_utils.triton_intro.launch_grid",
                                   "course_utils.triton_intro.kernel_source")),
    # Triton wrappers must make the kernel do the arithmetic: no torch math on tensors
    "torch-math": Group("PyTorch arithmetic (the kernel must compute the result)",
                        aten=("add", "sub", "mul", "div", "exp", "exp2", "log", "log2", "matmul",
                              "mm", "bmm", "addmm", "baddbmm", "addcmul", "addcdiv", "sum",
                              "mean", "amax", "amin", "max", "min", "maximum", "minimum", "where",
                              "linear", "dot", "mv", "einsum", "cumsum", "rsub", "pow", "sqrt",
                              "rsqrt", "neg", "reciprocal", "clamp", "lerp", "sigmoid", "tanh",
                              "logsumexp", "vdot", "inner", "outer", "ger", "addr", "addmv",
                              "addbmm", "_trilinear", "bilinear", "tensordot", "prod", "nansum",
                              "cumprod", "norm", "linalg_vector_norm", "dist", "kron",
                              "chain_matmul", "linalg_multi_dot", "trace", "std", "var")
                        + _SOFTMAX_ATEN + _ATTN_ATEN),
}


_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _aten_base(op) -> str:
    """``aten._softmax.default`` -> ``_softmax``; ``aten.add_.Tensor`` -> ``add``."""
    name = getattr(op, "__name__", str(op))          # "_softmax.default"
    base = name.split(".", 1)[0]
    return base[:-1] if base.endswith("_") and not base.startswith("__") else base


def _aten_forbidden(base: str, prefixes: tuple) -> bool:
    for p in prefixes:
        if p.startswith("_") or p in ("softmax", "log_softmax", "scaled_dot_product_attention"):
            if base.startswith(p):
                return True
        elif base == p:
            return True
    return False


def _module_targets(modname: str):
    mod = importlib.import_module(modname)
    found = []
    for name, obj in vars(mod).items():
        if name.startswith("__"):
            continue
        if isinstance(obj, types.FunctionType) and obj.__module__ == modname:
            found.append((f"{modname}.{name}", obj))
        elif _is_triton_kernel(obj) and _kernel_module(obj) == modname:
            found.append((f"{modname}.{name}", obj))
        elif isinstance(obj, type) and obj.__module__ == modname:
            for attr, member in vars(obj).items():
                fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if isinstance(fn, types.FunctionType) and not attr.startswith("__"):
                    found.append((f"{modname}.{name}.{attr}", fn))
                elif attr in ("forward", "backward", "__call__", "__init__") and \
                        isinstance(fn, types.FunctionType):
                    found.append((f"{modname}.{name}.{attr}", fn))
    return found


def _is_triton_kernel(obj) -> bool:
    mod = type(obj).__module__
    return mod.startswith("triton.") and hasattr(obj, "run") and hasattr(obj, "__getitem__")


def _innermost(obj):
    """What a Triton kernel wraps, innermost first: Autotuner / Heuristics wrap a
    JITFunction in ``.fn``, which wraps the Python function in its own ``.fn``."""
    fn = obj
    for _ in range(6):
        inner = getattr(fn, "fn", None)
        if inner is None or inner is fn:
            break
        fn = inner
    return fn


def _kernel_module(obj) -> str | None:
    return getattr(_innermost(obj), "__module__", None)


_NO_ATTR = object()
# id(wrapper) -> (wrapper, what the class held before) for the launch methods a forbid has
# wrapped (see _refuse_kernel_copies); empty whenever no forbid is on
_LAUNCH_WRAPPERS: dict = {}
# the Python code of every kernel an active forbid refuses -> the tokens refusing it
_KERNEL_CODES: dict = {}
# What each forbid replaced (a function's code, a kernel's run, Triton's launch methods) is
# kept by the audit hook (see _install_hook), out of any Python code's reach, as one stack
# per attribute of the forbids holding it: forbids may end in any order (a notebook-wide one
# entered twice, the older one collected first), and each end leaves the newest active
# value, or the original after the last. forbid raises these events itself:
#   course_utils.guards.original (obj, attr, out): out gets (what obj held itself, what
#       getattr gave) before any active forbid replaced attr
#   course_utils.guards.swap (obj, attr, forbid, value), course_utils.guards.unswap
#       (obj, attr, forbid)


def _kernel_fn(obj):
    """The Python function under a Triton kernel (through Autotuner / Heuristics)."""
    fn = _innermost(obj)
    return fn if isinstance(fn, types.FunctionType) else None


def _refuse_kernel_copies(codes: dict) -> tuple[list, list]:
    """Make every launch path of Triton refuse a kernel whose Python code is one of
    ``codes`` (code -> token): ``kernel[grid]``, ``kernel.run`` of a compiled or an
    interpreted kernel, and the interpreter's executor. Returns the changes made to the
    table of refused code, for :func:`forbid` to undo, and ``(class, method, make)`` for
    each launch method, for :func:`forbid` to replace by ``make(Triton's method)``. Every
    wrapper wraps Triton's own method and reads the table of all active forbids' codes,
    so forbids that overlap may end in any order."""
    changes = []
    for code, token in codes.items():
        _KERNEL_CODES.setdefault(code, []).append(token)
        changes.append(("code-table", code, token))

    def refused(fn):
        tokens = _KERNEL_CODES.get(getattr(fn, "__code__", None))
        if tokens:
            _refuse(tokens[-1])

    def via_kernel(original):
        def wrapped(self, *a, **k):
            refused(_kernel_fn(self))
            return original(self, *a, **k)
        return wrapped

    def via_executor(original):
        def wrapped(self, fn, *a, **k):
            refused(fn)
            return original(self, fn, *a, **k)
        return wrapped

    jit = sys.modules.get("triton.runtime.jit")
    interp = sys.modules.get("triton.runtime.interpreter")
    methods = []
    for mod, name, attr, make in ((jit, "KernelInterface", "__getitem__", via_kernel),
                                  (jit, "JITFunction", "run", via_kernel),
                                  (interp, "InterpretedFunction", "run", via_kernel),
                                  (interp, "GridExecutor", "__init__", via_executor)):
        cls = getattr(mod, name, None) if mod is not None else None
        if isinstance(cls, type) and hasattr(cls, attr):
            methods.append((cls, attr, make))
    return changes, methods


def _resolve(spec: str):
    modname, _, qual = spec.partition(":")
    if qual == "*":
        try:
            return _module_targets(modname)
        except ImportError:
            # a module this machine cannot import (no Triton, a Triton without Gluon) has
            # nothing an answer could call either
            return []
    obj = importlib.import_module(modname)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return [(f"{modname}.{qual}", obj)]


def _groups(names) -> list[tuple[str, Group]]:
    out = []
    for n in names:
        if isinstance(n, Group):
            out.append((n.what, n))
        elif n in GROUPS:
            out.append((n, GROUPS[n]))
        else:
            raise ValueError(f"unknown forbidden group {n!r}; known: {sorted(GROUPS)}")
    return out


# ---------------------------------------------------------------------------------------
# The guard
# ---------------------------------------------------------------------------------------

_ACTIVE: dict[int, str] = {}          # token -> message for swapped Python functions
_LOCK = threading.Lock()
_NEXT = [0]


def _exempt(_view=None, _ident=threading.get_ident) -> bool:
    """True inside an allowed function. The depth is kept by the audit hook (see
    :func:`_install_hook`) and only read here, through a read-only view."""
    return (_EXEMPT_VIEW if _view is None else _view).get(_ident(), 0) > 0


def _call(token: int, args, kwargs, _originals=None, _audit=sys.audit):
    """The body of every swapped function. A forbidden one raises (unless called from
    inside an allowed function); an allowed one runs its real code with the guard
    lifted for everything it calls. Lifting the guard is an audit event that the hook
    accepts only from this function and only for a token ``forbid`` registered as
    allowed, so neither a flipped table nor a direct call of this function lifts it."""
    original = _originals.get(token)
    message = _ACTIVE.get(token)
    if message is not None and not _exempt():
        raise ForbiddenCall(message)
    if original is None:  # pragma: no cover - guard already closed
        raise ForbiddenCall("this function may not be called in this exercise")
    if message is None:  # allowed: lift the guard inside
        _audit("course_utils.guards.exempt", token, 1)
        try:
            return original(*args, **kwargs)
        finally:
            _audit("course_utils.guards.exempt", token, -1)
    return original(*args, **kwargs)


def _refuse(token: int):
    """Raise the message registered for ``token`` (used by refused kernel launches)."""
    if not _exempt():
        raise ForbiddenCall(_ACTIVE.get(token, "this may not be called in this exercise"))


def _copy_function(fn: types.FunctionType) -> types.FunctionType:
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy


def _stub_code(fn: types.FunctionType, token: int) -> types.CodeType:
    """A code object that hands every call to :func:`_call`, with the same free
    variables as ``fn`` (so it can replace ``fn.__code__`` while the guard is on)."""
    free = fn.__code__.co_freevars
    lines = ["def _outer():"]
    lines += [f"    {v} = None" for v in free]
    lines.append("    def _stub(*args, **kwargs):")
    if free:
        lines.append(f"        ({', '.join(free)},)")
    lines.append(f"        return __import__('course_utils.guards', fromlist=['_'])._call("
                 f"{token}, args, kwargs)")
    lines.append("    return _stub")
    ns: dict = {}
    exec(compile("\n".join(lines), f"<guarded {fn.__qualname__}>", "exec"), ns)
    return ns["_outer"]().__code__


def _message(exercise, what_called, group_what, asks):
    ex = f"Exercise {exercise}: " if exercise else ""
    ask = f" The exercise asks you to {asks}." if asks else ""
    return (f"{ex}your answer called {what_called} ({group_what}).{ask} "
            "Write it yourself; a result computed by the library earns no mark.")


_TORCH_DIR = __import__("os").path.dirname(__import__("os").path.realpath(torch.__file__))
_COURSE_DIR = __import__("os").path.dirname(__import__("os").path.realpath(__file__))

def _library_handler(cls, attr) -> bool:
    """Whether ``cls``'s ``attr`` (``__torch_function__`` or ``__torch_dispatch__``) is
    PyTorch's or the course's own code: a Python function defined in one of their files, or
    one of torch's built-in handlers."""
    import os
    fn = None
    for k in cls.__mro__:
        if attr in vars(k):
            fn = vars(k)[attr]
            break
    fn = getattr(fn, "__func__", fn)        # classmethod / staticmethod
    if isinstance(fn, types.BuiltinFunctionType):
        return str(getattr(fn, "__module__", "")).startswith("torch")
    if not isinstance(fn, types.FunctionType):
        return fn is None
    where = os.path.realpath(fn.__code__.co_filename)
    return any(where.startswith(d + os.sep) for d in (_TORCH_DIR, _COURSE_DIR))


def _own_subclasses(types_, attr):
    """Refuse an operator on a tensor subclass whose ``attr`` handler the answer wrote. A
    guard mode steps aside while it hands an allowed operator on (so that the operator does
    not come back to it), and the subclass's handler runs inside that step: whatever it
    calls (a forbidden operator, the whole score matrix, a backward pass) would not be seen."""
    for cls in types_ or ():
        if not _library_handler(cls, attr):   # read afresh: a class can be changed
            raise GuardEscape(f"your answer runs torch operators on a tensor subclass of its own "
                              f"({getattr(cls, '__qualname__', cls)!s:.80}), whose {attr} would "
                              "run outside the guard. Checks run your code under guards that it "
                              "may not reach around; compute the answer from the inputs you are "
                              "given with plain tensors.")


class _FunctionGuard(TorchFunctionMode):
    def __init__(self, names: dict, exercise, asks):
        super().__init__()
        self.names, self.exercise, self.asks = names, exercise, asks

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        _own_subclasses(types_, "__torch_function__")
        if name in self.names and not _exempt():
            raise ForbiddenCall(_message(self.exercise, f"torch {name}", self.names[name], self.asks))
        return func(*args, **(kwargs or {}))


def _additive_mask(t) -> bool:
    """Whether floating-point ``t`` is an additive causal mask: only 0 and one other value,
    -inf or a large negative number (-1e9, the format's lowest), that no score can carry."""
    try:
        hidden = t[t != 0]
        if hidden.numel() == 0:
            return True
        v = hidden.reshape(-1)[0]
        return bool((hidden == v).all()) and bool(v <= -1e4)
    except Exception:  # noqa: BLE001
        return False


class _DispatchGuard(TorchDispatchMode):
    def __init__(self, prefixes: list, exercise, asks, shape_tails, max_numel, engine=None):
        super().__init__()
        self.prefixes, self.exercise, self.asks = prefixes, exercise, asks
        self.shape_tails, self.max_numel, self.engine = shape_tails, max_numel, engine
        # floating-point tensors of a named tail's shape let through as additive masks (0 and
        # one large negative value): every later op that reads their storage checks they still are
        self.masks: list = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        base = _aten_base(func)
        _own_subclasses(types_, "__torch_dispatch__")
        if _exempt():
            return func(*args, **(kwargs or {}))
        if self.masks:
            self._masks_still_masks(base, args, kwargs)
        if self.engine and _graph_task_id() != -1:
            # an operator run by the autograd engine: a backward pass, however it was
            # started (tensor.backward, torch.autograd.grad, the engine's run_backward,
            # torch.func, an autograd.Function)
            raise ForbiddenCall(_message(self.exercise, "the autograd engine (a backward pass "
                                         f"ran aten.{base})", self.engine, self.asks))
        for prefixes, what in self.prefixes:
            if _aten_forbidden(base, prefixes):
                raise ForbiddenCall(_message(self.exercise, f"the operator aten.{base}", what,
                                             self.asks))
        out = func(*args, **(kwargs or {}))
        if self.shape_tails or self.max_numel:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._size_check(base, t)
        return out

    def _masks_still_masks(self, base, args, kwargs):
        ptrs = set()
        for t in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                try:
                    ptrs.add(t.untyped_storage().data_ptr())
                except Exception:  # noqa: BLE001
                    continue
        live = []
        for ref, ptr in self.masks:
            m = ref()
            if m is None:
                continue
            live.append((ref, ptr))
            if ptr in ptrs and not _additive_mask(m):
                raise CheckFailed(
                    f"{'Exercise ' + self.exercise + ': ' if self.exercise else ''}your answer "
                    f"wrote scores into a tensor of shape {tuple(m.shape)} (read by aten.{base}): "
                    "the scores of a tile of queries against all the keys it sees at once, "
                    "which a tiled algorithm never holds. Work on one tile of queries and one "
                    "tile of keys at a time.")
        self.masks = live

    def _size_check(self, base, t):
        shape = tuple(t.shape)
        for tail in self.shape_tails:
            a, b = tail[0], tail[1]
            if len(tail) > 2 and not t.is_floating_point():
                continue     # a named tail is about scores: a mask or positions may take it
            if len(shape) >= 2 and {shape[-2], shape[-1]} == {a, b} and (a, b) != (1, 1):
                if len(tail) > 2 and _additive_mask(t):
                    # a causal mask of 0 and -inf (or -1e9) over the keys (a bias added to each key
                    # tile's slice of it), as a boolean mask of that shape is let through
                    self.masks.append((weakref.ref(t), t.untyped_storage().data_ptr()))
                    continue
                what = tail[2] if len(tail) > 2 else f"that is the whole {a} x {b} score matrix"
                raise CheckFailed(
                    f"{'Exercise ' + self.exercise + ': ' if self.exercise else ''}your answer "
                    f"built a tensor of shape {shape} (aten.{base}): {what}, which a tiled "
                    "algorithm never holds. Work on one tile of queries and one tile of keys "
                    "at a time.")
        if self.max_numel and t.numel() > self.max_numel:
            raise CheckFailed(
                f"{'Exercise ' + self.exercise + ': ' if self.exercise else ''}your answer "
                f"allocated a tensor of {t.numel()} elements (shape {shape}, aten.{base}); this "
                f"exercise allows at most {self.max_numel} in one intermediate.")


@contextlib.contextmanager
def forbid(*groups, exercise: str | None = None, asks: str | None = None,
           allow: Iterable[str] = (), shape_tails: Iterable[tuple] = (),
           max_numel: int | None = None):
    """While active, calling anything in ``groups`` raises :class:`ForbiddenCall`.

    ``groups`` are names from :data:`GROUPS` (or :class:`Group` objects);
    ``exercise`` and ``asks`` ("write the online softmax update") go into the message;
    ``allow`` names functions (``"module.name"``) exempt from module-wide groups;
    ``shape_tails=[(Nq, Nk)]`` fails any intermediate whose last two dimensions are
    those sizes (in either order; a third element, if any, says what such a tensor is for
    the message and limits the rule to floating-point tensors, so a boolean mask or integer
    positions of that shape pass); ``max_numel`` bounds every intermediate's size.
    """
    resolved = _groups(groups)
    allow = set(allow)
    api: dict[str, str] = {}
    prefixes = []
    engine = None
    swaps: list[tuple[Any, str, Any]] = []
    for _, g in resolved:
        if g.engine:
            engine = g.what
        for n in _with_aliases(g.torch_api, _SOFTMAX_API):
            api[n] = g.what
        if g.aten:
            prefixes.append((_with_aliases(g.aten, _SOFTMAX_ATEN), g.what))
        softmax = bool(set(g.torch_api) & set(_SOFTMAX_API))
        for spec in g.python + (_SOFTMAX_PY if softmax else ()):
            try:
                found = _resolve(spec)
            except (ImportError, AttributeError):
                if spec in _TORCH_INTERNALS:
                    continue        # not in this torch release: nothing to call either
                raise
            for label, obj in found:
                if label in g.spare:
                    continue
                exempt = label in allow or label.rsplit(".", 1)[-1] in allow
                swaps.append((obj, label, None if exempt else g.what))
    applied = []
    tokens = []
    seen = set()
    me = object()               # this forbid, as the owner of what it swaps
    kernel_codes: dict = {}     # the Python code of every refused kernel -> its token
    try:
        for obj, label, what in swaps:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            with _LOCK:
                _NEXT[0] += 1
                token = _NEXT[0]
            tokens.append(token)
            if what is not None:
                _ACTIVE[token] = _message(exercise, label, what, asks)
            if isinstance(obj, types.FunctionType):
                # the hook keeps the real code (the code before any forbid swapped it, so an
                # overlapping forbid registers the function, not another's stub), and
                # accepts these events from forbid only
                before = []
                sys.audit("course_utils.guards.original", obj, "__code__", before)
                real = _copy_function(obj)
                real.__code__ = before[0][1]
                sys.audit("course_utils.guards.register", token, real, what is None)
                sys.audit("course_utils.guards.swap", obj, "__code__", me,
                          _stub_code(obj, token))
                applied.append(("swap", obj, "__code__"))
            elif _is_triton_kernel(obj) and what is not None:
                def _refusing_run(*a, _t=token, _o=obj, **k):
                    _refuse(_t)
                    return type(_o).run(_o, *a, **k)
                sys.audit("course_utils.guards.swap", obj, "run", me, _refusing_run)
                applied.append(("swap", obj, "run"))
                code = getattr(_kernel_fn(obj), "__code__", None)
                if code is not None:
                    kernel_codes[code] = token
        if kernel_codes:
            # a kernel made afresh from a refused kernel's function (triton.jit(kernel.fn)),
            # or that function handed to the interpreter's executor, is the same kernel
            table, methods = _refuse_kernel_copies(kernel_codes)
            applied.extend(table)
            for cls, name, make in methods:
                before = []
                sys.audit("course_utils.guards.original", cls, name, before)
                held, original = before[0]
                wrapper = make(original)
                # what a launch does is unchanged for every other kernel: the grading hooks,
                # which compare a template kernel's launch path before and during a check,
                # read through the wrapper to what it wraps (an answer that adds to this
                # table is tampering)
                _LAUNCH_WRAPPERS[id(wrapper)] = (wrapper, held)
                applied.append(("wrapper", None, id(wrapper)))
                sys.audit("course_utils.guards.swap", cls, name, me, wrapper)
                applied.append(("swap", cls, name))
        modes = []
        if api:
            modes.append(_FunctionGuard(api, exercise, asks))
        if prefixes or shape_tails or max_numel or engine:
            modes.append(_DispatchGuard(prefixes, exercise, asks, list(shape_tails), max_numel,
                                        engine))
        with contextlib.ExitStack() as stack:
            for m in modes:
                stack.enter_context(m)
            sys.audit("course_utils.guards.answer", 1)
            try:
                yield
            finally:
                sys.audit("course_utils.guards.answer", -1)
    finally:
        for kind, obj, old in reversed(applied):
            if kind == "swap":
                sys.audit("course_utils.guards.unswap", obj, old, me)
            elif kind == "wrapper":
                _LAUNCH_WRAPPERS.pop(old, None)
            elif kind == "code-table":
                refusing = _KERNEL_CODES.get(obj, [])
                with contextlib.suppress(ValueError):
                    refusing.remove(old)
                if not refusing:
                    _KERNEL_CODES.pop(obj, None)
        for t in tokens:
            _ACTIVE.pop(t, None)
        sys.audit("course_utils.guards.release", tuple(tokens))


_forbid = forbid  # run_answer's keyword ``forbid`` shadows the function


# ---------------------------------------------------------------------------------------
# Calling an answer
# ---------------------------------------------------------------------------------------

def _clone(x):
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool((a == b).all())


def run_answer(fn: Callable, *args, forbid: Iterable = (), exercise: str | None = None,
               asks: str | None = None, name: str | None = None, allow: Iterable[str] = (),
               shape_tails: Iterable[tuple] = (), max_numel: int | None = None,
               may_modify: Iterable = (), **kwargs):
    """Call ``fn(*args, **kwargs)`` the way a check should: on clones of every tensor
    argument (so the check's own tensors and references stay untouched), under
    :func:`forbid`, and fail if the answer changed an input in place (unless its
    position or keyword is in ``may_modify``). ``shape_tails`` pairs that are the last
    two sizes of an input tensor are dropped (the ban cannot tell that tensor's copies
    from the score matrix). Returns ``fn``'s result."""
    if not callable(fn):
        raise CheckFailed(f"{name or 'answer'}: expected a function, got {type(fn).__name__}")
    label = name or getattr(fn, "__name__", "answer")
    c_args, c_kwargs = _clone(list(args)), _clone(dict(kwargs))
    before_args, before_kwargs = _clone(c_args), _clone(c_kwargs)
    if shape_tails:
        # sizes that coincide (a head dim equal to Nq, say) make an input's own shape look
        # like the score matrix: a tensor shaped like an input is never banned
        inputs = {frozenset(int(n) for n in t.shape[-2:])
                  for t in tree_flatten([c_args, c_kwargs])[0]
                  if isinstance(t, torch.Tensor) and t.dim() >= 2}
        shape_tails = [t for t in shape_tails if frozenset(t[:2]) not in inputs]
    with _forbid(*forbid, exercise=exercise, asks=asks, allow=allow,
                 shape_tails=shape_tails, max_numel=max_numel):
        out = fn(*c_args, **c_kwargs)
    may_modify = set(may_modify)
    pairs = [(i, a, b) for i, (a, b) in enumerate(zip(c_args, before_args))] + \
            [(k, c_kwargs[k], before_kwargs[k]) for k in c_kwargs]
    for where, now, then in pairs:
        if where in may_modify:
            continue
        for t_now, t_then in zip(tree_flatten(now)[0], tree_flatten(then)[0]):
            if isinstance(t_now, torch.Tensor) and not _same(t_now, t_then):
                arg = f"argument {where + 1}" if isinstance(where, int) else f"argument {where!r}"
                raise CheckFailed(f"{label}: your function changed its input ({arg}) in place. "
                                  "An answer must leave its inputs as it found them; compute "
                                  "into new tensors.")
    return out


# ---------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------

def check_finite(x, name: str = "output", hint: str | None = None, quiet: bool = True):
    """Fail if ``x`` (a tensor, number or nested list/tuple of them) holds NaN or inf."""
    leaves = [t for t in tree_flatten(x)[0]]
    for t in leaves:
        if isinstance(t, torch.Tensor):
            if not (t.is_floating_point() or t.is_complex()):
                continue
            bad = ~torch.isfinite(t.detach())
            if bool(bad.any()):
                i = int(bad.reshape(-1).nonzero()[0])
                idx = list(torch.unravel_index(torch.tensor(i), t.shape)) if t.dim() else []
                val = t.detach().reshape(-1)[i].item()
                msg = (f"{name}: element {[int(j) for j in idx]} is {val}; "
                       f"{int(bad.sum())} of {t.numel()} elements are not finite")
                raise CheckFailed(msg + (f"\n  hint: {hint}" if hint else ""))
        elif isinstance(t, float) and not math.isfinite(t):
            raise CheckFailed(f"{name}: is {t}" + (f"\n  hint: {hint}" if hint else ""))
    if not quiet:
        print(f"ok: {name} (finite)")


def check_prediction(actual, expected, *, name: str = "prediction", choices=None,
                     hint: str | None = None, quiet: bool = False):
    """Check a prediction or a choice without ever showing the expected value.

    ``choices`` (optional) lists the allowed answers: anything else fails with the list,
    so a typo is not mistaken for a wrong prediction."""
    if choices is not None and actual not in list(choices):
        raise CheckFailed(f"{name}: {actual!r} is not one of the allowed answers "
                          f"{list(choices)!r}")
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        ok_type = isinstance(actual, (int, float)) and not isinstance(actual, bool)
    else:
        ok_type = isinstance(actual, type(expected))
    if not ok_type:
        raise CheckFailed(f"{name}: expected a {type(expected).__name__}, got "
                          f"{type(actual).__name__}")
    if actual != expected:
        msg = f"{name}: {actual!r} is not what happens."
        raise CheckFailed(msg + (f"\n  hint: {hint}" if hint else ""))
    if not quiet:
        print(f"ok: {name}")


class _OneShot:
    """An iterable that may be iterated once, with no length and no indexing."""

    def __init__(self, values, name):
        self._values, self._name, self._used = list(values), name, False
        self.read = 0

    def __iter__(self):
        if self._used:
            raise CheckFailed(f"{self._name}: your function went over the stream a second "
                              "time. This exercise is one pass: keep a running state and "
                              "update it as each value arrives.")
        self._used = True
        return self._gen()

    def _gen(self):
        for v in self._values:
            self.read += 1
            yield v


def one_pass(fn: Callable, values, *args, name: str = "answer", max_state_bytes: int = 64_000,
             **kwargs):
    """Call ``fn(stream, *args, **kwargs)`` where ``stream`` can be iterated once.
    Fails when ``fn`` iterates twice, does not read every value, or keeps the values
    (its peak Python allocation grows beyond ``max_state_bytes``; pass enough values
    that storing them would exceed it). Returns ``fn``'s result."""
    values = [float(v) for v in values]
    stream = _OneShot(values, name)
    for banned in ("__len__", "__getitem__"):
        if hasattr(stream, banned):  # pragma: no cover - defensive
            raise RuntimeError("one-shot stream must not be sized or indexable")
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        out = fn(stream, *args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was:
            tracemalloc.stop()
    if stream.read != len(values):
        raise CheckFailed(f"{name}: read {stream.read} of the {len(values)} values; a pass "
                          "must see every value once")
    if peak > max_state_bytes:
        raise CheckFailed(f"{name}: your function held about {peak // 1024} KiB while it ran "
                          f"over {len(values)} values, so it stored them (to go over them "
                          "again). A one-pass algorithm keeps only a few running numbers.")
    return out


# ---------------------------------------------------------------------------------------
# Triton kernels: guard regions, poison, launches
# ---------------------------------------------------------------------------------------

def _sentinel(dtype: torch.dtype):
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return -7_777 if dtype not in (torch.uint8,) else 0xA5


class Guarded:
    """A tensor placed inside a larger buffer whose margins (``pad`` elements before and
    after) hold a sentinel (NaN for floats). A kernel that stores past either end
    changes a margin; a kernel that loads past either end reads the sentinel.

    ``Guarded(data)`` copies ``data`` in; ``Guarded.empty(shape, dtype, device)`` makes a
    poisoned output (every element the sentinel, so unwritten elements show)."""

    def __init__(self, data: torch.Tensor, pad: int = 4096, poison: bool = False):
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"Guarded needs a tensor, got {type(data).__name__}")
        self.pad = int(pad)
        self.sentinel = _sentinel(data.dtype)
        n = data.numel()
        self.buffer = torch.full((n + 2 * self.pad,), self.sentinel, dtype=data.dtype,
                                 device=data.device)
        self.tensor = self.buffer[self.pad:self.pad + n].view(data.shape)
        if not poison:
            self.tensor.copy_(data)
        self._initial = None if poison else self.tensor.clone()
        self._margins = self._margin_bits()

    @classmethod
    def empty(cls, shape, dtype=torch.float32, device="cpu", pad: int = 4096):
        return cls(torch.empty(shape, dtype=dtype, device=device), pad=pad, poison=True)

    def _margin_bits(self):
        left, right = self.buffer[:self.pad], self.buffer[self.pad + self.tensor.numel():]
        return left.clone(), right.clone()

    def _changed(self, now: torch.Tensor, then: torch.Tensor):
        if now.is_floating_point():
            diff = ~((now == then) | (now.isnan() & then.isnan()))
        else:
            diff = now != then
        return diff.nonzero().reshape(-1)

    def stores_outside(self) -> tuple[list[int], list[int]]:
        """Element offsets before the start / past the end that a kernel wrote."""
        left, right = self._margin_bits()
        bl = self._changed(left, self._margins[0])
        br = self._changed(right, self._margins[1])
        return [int(i) - self.pad for i in bl], [int(i) for i in br]

    def unwritten(self) -> torch.Tensor:
        """Flat indices of elements that still hold the poison."""
        t = self.tensor.reshape(-1)
        if t.is_floating_point():
            return t.isnan().nonzero().reshape(-1)
        return (t == self.sentinel).nonzero().reshape(-1)


def check_kernel_output(out: Guarded, expected: torch.Tensor | None = None, *,
                        inputs: Iterable[Guarded] = (), name: str = "output",
                        atol: float = 1e-5, rtol: float = 1e-5, hint: str | None = None,
                        check_unwritten: bool = True, quiet: bool = False):
    """After a kernel ran on :class:`Guarded` tensors: fail naming the cause when it
    stored outside ``out`` (mask the store), stored into an input's margin, left
    elements unwritten (grid or mask too small), read an input's margin (NaN where the
    inputs were finite: mask the loads); then compare with ``expected``."""
    from course_utils.checks import check_close
    before, after = out.stores_outside()
    n = out.tensor.numel()
    if before or after:
        where = (f"{len(after)} element(s) past the end (first at offset {n + after[0]})"
                 if after else f"{len(before)} element(s) before the start")
        raise CheckFailed(f"{name}: your kernel wrote {where} of the {n}-element output. "
                          "Mask the store: tl.store(ptr + offs, value, mask=offs < n).")
    for i, g in enumerate(inputs):
        b, a = g.stores_outside()
        if b or a or (g._initial is not None and not _same(g.tensor, g._initial)):
            raise CheckFailed(f"{name}: your kernel wrote outside input {i + 1}'s elements; "
                              "stores go to the output only, under a mask.")
    if check_unwritten:
        bad = out.unwritten()
        if expected is not None and expected.is_floating_point():
            # an element expected to be NaN is not "unwritten"
            exp_nan = expected.reshape(-1).to(out.tensor.device).isnan()
            bad = bad[~exp_nan[bad]] if bad.numel() else bad
        if bad.numel():
            inputs_finite = all(bool(torch.isfinite(g.tensor).all()) for g in inputs
                                if g.tensor.is_floating_point())
            first = int(bad[0])
            if inputs and inputs_finite and out.tensor.is_floating_point():
                raise CheckFailed(
                    f"{name}: {bad.numel()} of {n} elements are NaN (first at flat index "
                    f"{first}), although every input is finite. Either those elements were "
                    "never written (does your grid cover all of them? is the store's mask too "
                    "strict?) or a load read past the end of an input, where this check keeps "
                    "NaN: mask every load with offs < n.")
            raise CheckFailed(f"{name}: {bad.numel()} of {n} elements were never written "
                              f"(first at flat index {first}); does the grid cover them all?")
    if expected is not None:
        check_close(out.tensor, expected, atol=atol, rtol=rtol, name=name, hint=hint, quiet=quiet)


@contextlib.contextmanager
def record_launches():
    """Record every Triton kernel launch made inside the block: yields a list that
    fills with ``(kernel_name, grid)`` tuples."""
    launched: list[tuple[str, Any]] = []
    classes = []
    try:
        from triton.runtime import jit as _jit
        classes.append(_jit.JITFunction)
    except Exception:  # pragma: no cover - no triton
        pass
    try:
        from triton.runtime import interpreter as _interp
        classes.append(_interp.InterpretedFunction)
    except Exception:  # pragma: no cover
        pass
    originals = []
    for cls in classes:
        orig = cls.run
        originals.append((cls, orig))

        def run(self, *a, _orig=orig, **k):
            fn = getattr(self, "fn", None)
            launched.append((getattr(fn, "__name__", getattr(self, "__name__", "?")), k.get("grid")))
            return _orig(self, *a, **k)
        cls.run = run
    try:
        yield launched
    finally:
        for cls, orig in originals:
            cls.run = orig


# ---------------------------------------------------------------------------------------
# Answers that are values: a look at the source
# ---------------------------------------------------------------------------------------

_SOURCES: dict[str, str] = {}
_EX_RE = re.compile(r"^\s*#\s*Exercise\s+([A-Za-z0-9][\w.]*)")


def register_answer_sources(sources: dict[str, str]):
    """Give the answer cells' sources by exercise id (the grader does this in a kernel
    that runs no student code, where the notebook's history holds no answers)."""
    _SOURCES.clear()
    _SOURCES.update({str(k): str(v) for k, v in sources.items()})


def answer_source(exercise: str) -> str | None:
    """The source of the most recently run answer cell of ``exercise``: from the
    registered sources, else from IPython's input history."""
    if exercise in _SOURCES:
        return _SOURCES[exercise]
    try:
        ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821
    except NameError:
        ip = None
    if ip is None:
        try:
            from IPython import get_ipython as _g
            ip = _g()
        except Exception:
            ip = None
    if ip is None:
        return None
    for src in reversed(ip.user_ns.get("In", [])):
        m = _EX_RE.match(src or "")
        if m and m.group(1) == exercise:
            return src
    return None


def _names_used(src: str) -> set[str]:
    tree = ast.parse(src)
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                used.add(a.name.rsplit(".", 1)[-1])
            if isinstance(node, ast.ImportFrom) and node.module:
                used.add(node.module)
                used.update(node.module.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
    return used


def check_source(exercise: str, names: Iterable[str], *, asks: str | None = None,
                 required: bool = False, quiet: bool = True):
    """Fail when the answer cell of ``exercise`` uses any of ``names`` (a function, a
    module, an attribute; also inside strings, which ``getattr`` and ``eval`` take).
    When the source cannot be found (the cell was not run in this kernel) the check is
    skipped unless ``required``."""
    src = answer_source(exercise)
    if src is None:
        if required:
            raise CheckFailed(f"Exercise {exercise}: run its answer cell first")
        return
    try:
        used = _names_used(src)
    except SyntaxError as e:
        raise CheckFailed(f"Exercise {exercise}: the answer cell does not parse ({e.msg})") from None
    hit = sorted(set(names) & used)
    if hit:
        ask = f" The exercise asks you to {asks}." if asks else ""
        raise ForbiddenCall(f"Exercise {exercise}: your answer uses {', '.join(hit)}.{ask} "
                            "Write it yourself; the course's own code earns no mark here.")
    if not quiet:
        print(f"ok: Exercise {exercise} uses none of the library's answers")


# ---------------------------------------------------------------------------------------
# The audit hook: what answer code may not do while it runs (or, in a notebook, at all)
# ---------------------------------------------------------------------------------------

class GuardEscape(ForbiddenCall):
    """The answer reached around the guards (the checker's frames, a thread, a process,
    the real code of a guarded function)."""


_FRAME_ATTRS = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"))
_FRAME_EVENTS = frozenset(("sys._getframe", "sys._current_frames", "sys._getframemodulename",
                           "sys.settrace", "sys.setprofile", "gc.get_referrers",
                           "gc.get_objects", "gc.get_referents"))
_PROCESS_EVENTS = frozenset(("os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn",
                             "os.posix_spawn", "subprocess.Popen", "pty.spawn", "os.startfile"))
_THREAD_EVENTS = frozenset(("_thread.start_new_thread", "_thread.start_joinable_thread"))
# libraries whose functions look names up in their caller's frames (TorchScript's
# resolution callbacks): called for notebook code, they would read a checker's locals
_FRAME_WALKERS = ("torch/_jit_internal.py", "torch/jit/frontend.py", "torch/jit/_script.py",
                  "torch/_sources.py")
_CELL_RE = re.compile(r"(ipykernel_\d+[/\\][^/\\]*\.py$|^<ipython-input-|^<string>$|^<stdin>$)")


def _module_name_readers() -> frozenset:
    """The code objects of the standard library's functions that call ``sys._getframe``
    (or ``sys._getframemodulename``) only to read the ``__name__`` of their caller's module:
    a ``namedtuple``, a ``TypeVar`` or an ``Enum`` made in an answer cell calls them."""
    import collections
    import enum
    import typing
    found = [collections.namedtuple, getattr(typing, "_caller", None)]
    for cls in (getattr(enum, "EnumType", None), getattr(enum, "EnumMeta", None)):
        found.append(getattr(cls, "_create_", None))
    return frozenset(f.__code__ for f in found if isinstance(f, types.FunctionType))


def _install_hook():
    """Install (once per process) the audit hook that refuses, when the caller is not
    library code (the first frame outside the standard library lies outside
    site-packages and ``course_utils``):

    * the caller's frames: ``sys._getframe`` (so ``inspect.currentframe``/``stack``),
      ``sys._current_frames``, a traceback's, generator's or coroutine's frame,
      ``gc.get_referrers``/``get_objects``/``get_referents``, ``sys.settrace``/
      ``setprofile``, ctypes; reading the code, defaults or globals of a course function
      and making a function from a course function's code, or a code object or compiled
      source that claims to be a library file;
    * starting a thread or a process, also through a library while notebook code is on
      the stack (Triton's compilers are let through).

    In a graded run (``course-grade``'s kernels, which carry ``COURSE_GRADE_RUN`` in their
    environment when this is installed) these are refused to notebook code at any time,
    since a thread or a frame taken when a cell runs could serve an answer later; in a
    learner's own notebook and elsewhere only while an answer runs under :func:`forbid`,
    so a learner's experiments outside the checks keep every tool. The hook's
    state (whether an answer runs, which guarded functions are allowed, the real code
    of each swapped function, the depth of allowed calls) lives in its closure, which
    no Python code can reach, and changes only on events raised by :func:`forbid` and
    :func:`_call` themselves (checked by their code objects)."""
    import os
    import sysconfig
    from types import MappingProxyType

    def _dirs(*paths):
        out = []
        for p in paths:
            if p:
                p = os.path.realpath(p)
                out.append(p.rstrip(os.sep) + os.sep)
        return tuple(dict.fromkeys(out))

    paths = sysconfig.get_paths()
    stdlib = _dirs(paths.get("stdlib"), paths.get("platstdlib"))
    course_dir = os.path.dirname(os.path.realpath(__file__))
    # library code: the installation's packages, and every folder on the path when the
    # guards are installed (packages installed with --target or PYTHONPATH, a conda or
    # system dist-packages) except the working folder, the course checkout itself (its
    # tests and notebooks are not library code) and the standard library's own folders
    # (whose callers decide, see _caller)
    cwd = os.path.realpath(os.getcwd())
    checkout = _dirs(os.path.dirname(course_dir))
    on_path = []
    for p in sys.path:
        if not p or not os.path.isdir(p):
            continue
        real = os.path.realpath(p)
        if real.rstrip(os.sep).endswith(("site-packages", "dist-packages")):
            on_path.append(real)
        elif real != cwd and not (real + os.sep).startswith(stdlib + checkout):
            on_path.append(real)
    libs = _dirs(paths.get("purelib"), paths.get("platlib"), course_dir, *on_path)
    try:
        import importlib.util
        spec = importlib.util.find_spec("triton")
        triton_dirs = _dirs(*(spec.submodule_search_locations or ())) if spec else ()
    except Exception:  # pragma: no cover
        triton_dirs = ()
    forbid_code = forbid.__wrapped__.__code__
    call_code = _call.__code__
    # standard-library functions that read only the module name of their caller's frame
    # (collections.namedtuple, typing.TypeVar and the like, Enum's functional API): the
    # frame never reaches the code that called them
    module_name_readers = _module_name_readers()
    # the course's one function that reads frames (whether an op comes from the grader's
    # recorder), by its file and name
    course_frame_readers = {(os.path.join(course_dir, "exercise_checks.py"), "_from_grader")}
    # each course module's code runs once, as that module: a second run (importlib.reload,
    # spec_from_file_location, the loader's code executed by hand) makes copies of its
    # functions that no guard swaps, and a copy of its source read by hand is the same copy
    course_root = os.path.dirname(course_dir)
    course_runs: dict = {}
    source_cache: dict = {}

    def _course_source(filename):
        """The real path of a course module's source file, or None."""
        if not isinstance(filename, str):
            return None
        real = source_cache.get(filename, _NO_ATTR)
        if real is _NO_ATTR:
            real = os.path.realpath(filename) if os.path.isabs(filename) else None
            if real is not None and not (real.endswith(".py") and
                                         real.startswith(course_dir + os.sep)):
                real = None
            if len(source_cache) < 100_000:
                source_cache[filename] = real
        return real

    def _dotted(real):
        name = os.path.relpath(real, course_root)[:-3].replace(os.sep, ".")
        return name[:-len(".__init__")] if name.endswith(".__init__") else name

    for _m in list(sys.modules.values()):
        _src = _course_source(getattr(_m, "__file__", None))
        if _src is not None:
            course_runs[_src] = 1

    def _ipython_file(filename):
        return _kind(filename) == "lib" and (os.sep + "IPython" + os.sep in filename or
                                             os.sep + "ipykernel" + os.sep in filename)

    def _executing_module(f):
        """The name of the module the import system is executing (``exec_module``'s
        ``module``), or None when the code runs some other way."""
        for _ in range(6):
            if f is None:
                return None
            if f.f_code.co_name == "exec_module" and "module" in f.f_locals:
                return getattr(f.f_locals["module"], "__name__", None)
            f = f.f_back
        return None

    active = [0]
    allowed: set = set()
    originals: dict = {}
    depth: dict = {}
    busy = threading.local()
    cache: dict = {}
    getframe = sys._getframe
    ident = threading.get_ident

    def _kind(filename: str) -> str:
        k = cache.get(filename)
        if k is None:
            if filename.startswith("<frozen "):
                k = "std"
            else:
                real = os.path.realpath(filename) if os.path.isabs(filename) else filename
                if real.startswith(libs):
                    k = "lib"
                elif real.startswith(stdlib):
                    k = "std"
                else:
                    k = "user"
            if len(cache) < 100_000:
                cache[filename] = k
        return k

    def _user_below(f):
        """Whether notebook (or other non-library) code is anywhere on the stack."""
        while f is not None:
            if _kind(f.f_code.co_filename) == "user":
                return True
            f = f.f_back
        return False

    def _for_notebook(f):
        """Whether a library that is not the course's reads frames for notebook code: walking
        down the stack from the reader, a notebook frame comes before any frame of the course
        (whose checks call libraries, and the answers under them). A library's code run by an
        import reads its own frames (not for the code importing it); module-level code that a
        library runs (a cell IPython runs, a module torch writes and runs) is passed over, so
        what called that library decides."""
        while f is not None:
            fn = f.f_code.co_filename
            if fn.startswith("<frozen importlib") or _course_source(fn) is not None:
                return False
            if _kind(fn) == "user":
                back = f.f_back
                by_library = f.f_code.co_name == "<module>" and back is not None and \
                    _kind(back.f_code.co_filename) == "lib"
                if not by_library:
                    return True
            f = f.f_back
        return False

    def _quietly(walk, f):
        """``walk(f)`` with the hook off (the walk reads frames itself)."""
        busy.on = True
        try:
            return walk(f)
        finally:
            busy.on = False

    def _caller(f):
        """The filename of the first frame outside the standard library, whether it is
        library code, and the name of its function."""
        while f is not None:
            fn = f.f_code.co_filename
            k = _kind(fn)
            if k != "std":
                return fn, k == "lib", f.f_code.co_name
            f = f.f_back
        return "", True, ""

    graded = bool(os.environ.get("COURSE_GRADE_RUN"))    # read once: answers cannot unset it

    def _strict(fn):
        return active[0] > 0 or (graded and ("ipykernel" in sys.modules
                                             or bool(_CELL_RE.search(fn))))

    def _course_function(obj):
        mod = getattr(obj, "__module__", None) if isinstance(obj, types.FunctionType) else None
        return isinstance(mod, str) and mod.startswith("course_utils.") and \
            not mod.startswith("course_utils.grading")

    def _refuse(what):
        raise GuardEscape(f"your answer {what}. Checks run your code under guards that it may "
                          "not reach around; compute the answer from the inputs you are given.")

    # (id(obj), attribute) -> [obj, what obj held itself before any forbid, what getattr
    # gave then, [(forbid, value), ...]]: see the comment above _KERNEL_CODES
    swapped: dict = {}

    def _swapping(name, args):
        obj, attr = args[0], args[1]
        key = (id(obj), attr)
        entry = swapped.get(key)
        if entry is None and name != "unswap":
            held = obj.__code__ if attr == "__code__" else vars(obj).get(attr, _NO_ATTR)
            entry = [obj, held, getattr(obj, attr, _NO_ATTR), []]
        if name == "original":
            args[2].append((entry[1], entry[2]))
        elif name == "swap":
            swapped[key] = entry
            entry[3].append(args[2:4])
            setattr(obj, attr, args[3])
        elif entry is not None:
            stack = entry[3]
            stack[:] = [pair for pair in stack if pair[0] is not args[2]]
            if stack:
                setattr(obj, attr, stack[-1][1])
                return
            del swapped[key]
            if entry[1] is _NO_ATTR:
                with contextlib.suppress(AttributeError, TypeError):
                    delattr(obj, attr)
            else:
                setattr(obj, attr, entry[1])

    def hook(event, args):
        if getattr(busy, "on", False):
            return
        if event.startswith("course_utils.guards."):
            busy.on = True
            try:
                f = getframe(1)
                name = event[len("course_utils.guards."):]
                if name == "exempt":
                    token, step = args
                    if f.f_code is not call_code or token not in allowed:
                        raise GuardEscape("the guard was lifted for a function this exercise "
                                          "forbids: the guard's tables were changed")
                    key = ident()
                    depth[key] = depth.get(key, 0) + step
                    if depth[key] <= 0:
                        depth.pop(key, None)
                    return
                if f.f_code is not forbid_code:
                    c = f.f_code
                    if c.co_filename == forbid_code.co_filename and c.co_name == "forbid":
                        return  # the guard module imported again: its own hook answers
                    raise GuardEscape(f"the guard's event {event} was raised outside the guard")
                if name in ("original", "swap", "unswap"):
                    _swapping(name, args)
                elif name == "answer":
                    active[0] += args[0]
                elif name == "register":
                    token, fn, ok = args
                    originals[token] = fn
                    if ok:
                        allowed.add(token)
                elif name == "release":
                    for t in args[0]:
                        originals.pop(t, None)
                        allowed.discard(t)
            finally:
                busy.on = False
            return
        if event == "object.__getattr__":
            obj, attr = args
            if attr in _FRAME_ATTRS:
                what = f"reads {attr} (the frames of the code that called it)"
            elif attr in ("__code__", "__defaults__", "__kwdefaults__", "__globals__") and \
                    _course_function(obj):
                what = (f"reads {attr} of the course's function {obj.__module__}."
                        f"{obj.__qualname__} (its real code is guarded)")
            else:
                return
        elif event in _FRAME_EVENTS:
            if event in ("sys._getframe", "sys._getframemodulename"):
                busy.on = True
                try:
                    reader = getframe(1).f_code in module_name_readers
                finally:
                    busy.on = False
                if reader:
                    return
            what = f"inspects the checker's frames or objects ({event})"
        elif event == "function.__new__":
            code = args[0]
            if _kind(code.co_filename) != "lib":
                return
            what = f"makes a function from the code of {code.co_name} (a library's code)"
        elif event in ("code.__new__", "marshal.loads"):
            what = f"makes a code object ({event})"
        elif event == "compile":
            fn = args[1] if len(args) > 1 else None
            if not isinstance(fn, str) or _kind(fn) == "user":
                return
            what = f"compiles source under a library's file name ({fn})"
        elif event == "exec":
            code = args[0] if args else None
            if getattr(code, "co_name", None) != "<module>":
                return
            real = _course_source(code.co_filename)
            if real is None:
                return
            busy.on = True
            try:
                name = _executing_module(getframe(1))
            finally:
                busy.on = False
            runs = course_runs.get(real, 0)
            course_runs[real] = runs + 1
            canonical = _dotted(real)
            if name == canonical and runs == 0:
                return          # the module's own import
            what = (f"runs the code of the course's module {canonical} "
                    + ("a second time (a reload)" if name == canonical else
                       f"as another module ({name!r})" if name else "by hand")
                    + ", which makes copies of its functions that the guards do not watch")
        elif event == "open":
            path = args[0] if args else None
            real = _course_source(path) if isinstance(path, str) else None
            if real is None or (len(args) > 1 and isinstance(args[1], str)
                                and any(c in args[1] for c in "wax+")):
                return
            busy.on = True
            try:
                f = getframe(1)
                # the import system reading a module's source (an import, a first one)
                if f.f_code.co_filename.startswith("<frozen importlib"):
                    return
                # who opens it: the first frame past the standard library and IPython's own
                # wrapper of open (a notebook's open is IPython's)
                while f is not None and (_kind(f.f_code.co_filename) == "std" or
                                         _ipython_file(f.f_code.co_filename)):
                    f = f.f_back
                opener = f.f_code.co_filename if f is not None else ""
            finally:
                busy.on = False
            if _kind(opener) != "user" or not _strict(opener):
                return
            _refuse(f"reads the source of the course's module {_dotted(real)}: code run from "
                    "a copy of it is not watched by the guards")
        elif event.startswith("ctypes."):
            what = f"uses ctypes ({event})"
        elif event in _THREAD_EVENTS:
            what = "starts a thread (the guards watch the thread the check runs in)"
        elif event in _PROCESS_EVENTS:
            what = f"starts a process ({event})"
        elif event == "import" and args and args[0] in ("_thread", "threading"):
            what = f"imports {args[0]} afresh"
        else:
            return
        busy.on = True
        try:
            f = getframe(1)
            if event in ("marshal.loads", "compile"):
                # the import system compiles and loads modules this way: the immediate
                # caller decides
                fn = f.f_code.co_filename if f is not None else ""
                lib, name = _kind(fn) != "user", ""
            else:
                if event in _THREAD_EVENTS and f is not None and f.f_code is wrapper_code:
                    f = f.f_back
                fn, lib, name = _caller(f)
        finally:
            busy.on = False
        if event in _PROCESS_EVENTS or event in _THREAD_EVENTS:
            if fn.startswith(triton_dirs) and (active[0] > 0 or _strict(fn)):
                return   # Triton compiling a kernel (ptxas, the launcher's C compiler)
            if not (active[0] > 0 or _strict(fn)):
                return
            if lib and (event in _THREAD_EVENTS or active[0] == 0):
                # a library starting a thread (or, outside an answer, a process) on its own
                # is let through; one started for notebook code is not: a thread started
                # through a library (a worker pool, an event-loop portal, IPython's `!`)
                # would run the answer's code where the guards do not reach, or serve it later
                if not _quietly(_user_below, f):
                    return
        elif lib:
            if not (active[0] > 0 or _strict(fn)) or event not in _FRAME_EVENTS or \
                    event == "sys._getframemodulename":
                return
            if _course_source(fn) is not None:
                # the course's own code reads frames in one place (exercise_checks'
                # _from_grader); anywhere else it was handed a frame reader to call
                # (run_answer(sys._getframe, 1) would return the check's frame)
                if (_course_source(fn), name) in course_frame_readers:
                    return
                what += ", through the course's code"
            elif not (fn.replace(os.sep, "/").endswith(_FRAME_WALKERS) and
                      _quietly(_for_notebook, f)):
                # a library reading frames for itself (a module's name, a stack level) is
                # let through; one of the libraries that look up names in their caller's
                # frames (TorchScript's) would hand notebook code a checker's locals
                return
            else:
                what += f", through a library ({os.path.basename(fn)})"
        elif not _strict(fn):
            return
        _refuse(what)

    def start_new_thread(function, args, kwargs=None, _orig=threading._start_new_thread, /):
        sys.audit("_thread.start_new_thread", function, args, kwargs)
        return _orig(function, args) if kwargs is None else _orig(function, args, kwargs)

    wrapper_code = start_new_thread.__code__
    sys.addaudithook(hook)
    view = MappingProxyType(depth)
    _call.__defaults__ = (originals, sys.audit)
    _exempt.__defaults__ = (view, ident)
    if graded:
        _guard_switches(getframe, busy, _kind, _refuse)
    # Python 3.11 raises no audit event when a thread starts: raise it here (3.12+ do)
    import _thread
    if sys.version_info < (3, 12) and getattr(threading, "_start_new_thread", None) is \
            _thread.start_new_thread:
        start_new_thread.__name__ = start_new_thread.__qualname__ = "start_new_thread"
        _thread.start_new_thread = start_new_thread
        threading._start_new_thread = start_new_thread
    return view


# torch's switches that run operators past the guards' modes or below the dispatch key they
# sit on: turning a mode stack off, popping or replacing a mode, excluding the Python dispatch
# keys, calling one key's kernel or redispatching below them
_SWITCHES = {
    "torch._C": ("_DisableTorchDispatch", "DisableTorchFunction", "DisableTorchFunctionSubclass",
                 "_ExcludeDispatchKeyGuard", "_IncludeDispatchKeyGuard", "_ForceDispatchKeyGuard",
                 "_PreserveDispatchKeyGuard", "_DisablePythonDispatcher",
                 "_AutoDispatchBelowAutograd", "_AutoDispatchBelowADInplaceOrView",
                 "_dispatch_tls_set_dispatch_key_excluded",
                 "_dispatch_tls_set_dispatch_key_included", "_dispatch_call_boxed",
                 "_dispatch_find_schema_or_throw", "_pop_torch_dispatch_stack",
                 "_push_on_torch_dispatch_stack", "_pop_torch_function_stack",
                 "_push_on_torch_function_stack", "_set_dispatch_mode", "_unset_dispatch_mode"),
    "torch.utils._python_dispatch": ("_disable_current_modes", "_disable_infra_mode",
                                     "_unset_infra_mode", "_push_mode", "_pop_mode",
                                     "_pop_mode_temporarily"),
    "torch.overrides": ("_push_mode", "_pop_mode", "_pop_mode_temporarily"),
}


def _guard_switches(getframe, busy, kind, refuse):
    """In a graded kernel, make torch's dispatcher switches (:data:`_SWITCHES`, an operator's
    ``redispatch``, its per-key kernels ``_op_dk`` and its dispatcher handle) refuse a caller
    in notebook code, however the name was reached (a scan of the source sees names only as
    written). PyTorch's and the course's own calls go through unchanged: the guards' modes
    enter and leave through them."""
    def from_notebook():
        busy.on = True
        try:
            f = getframe(2)                   # the frame that called the switch
            fn = f.f_code.co_filename if f is not None else ""
        finally:
            busy.on = False
        return kind(fn) == "user"

    def what(name):
        return (f"uses torch's dispatcher switches ({name}), which run operators where the "
                "guards do not see them")

    def switch(name, orig):
        def guarded(*args, **kwargs):
            if from_notebook():
                refuse(what(name))
            return orig(*args, **kwargs)
        guarded.__name__ = getattr(orig, "__name__", name)
        guarded.__qualname__ = getattr(orig, "__qualname__", name)
        guarded.__doc__ = getattr(orig, "__doc__", None)
        return guarded

    for modname, names in _SWITCHES.items():
        mod = importlib.import_module(modname)
        for name in names:
            orig = getattr(mod, name, None)
            if orig is not None:
                setattr(mod, name, switch(f"{modname}.{name}", orig))

    import torch._ops as ops
    overload = getattr(ops, "OpOverload", None)
    per_key = weakref.WeakKeyDictionary()   # each operator's per-key kernel, out of its __dict__

    def kernel_of(self):
        if from_notebook():
            refuse(what("an operator's _op_dk"))
        if self not in per_key:
            per_key[self] = self.__dict__.pop("_op_dk")
        return per_key[self]

    def set_kernel(self, value):
        per_key[self] = value
        self.__dict__.pop("_op_dk", None)

    def handle_of(self, _real=vars(overload).get("_handle") if overload is not None else None):
        if from_notebook():
            refuse(what("an operator's _handle"))
        return _real.__get__(self, type(self))

    if overload is not None:
        overload._op_dk = property(kernel_of, set_kernel)
        if vars(overload).get("_handle") is not None:
            overload._handle = property(handle_of)
        # the operators made before this: their per-key kernels leave their __dict__ too
        made = set(getattr(ops, "cached_ops", ()) or ())
        for space in list(vars(torch.ops).values()):
            for packet in list(getattr(space, "__dict__", {}).values()):
                made.update(o for o in list(getattr(packet, "__dict__", {}).values())
                            if isinstance(o, overload))
        for o in made:
            if "_op_dk" in vars(o):
                set_kernel(o, vars(o)["_op_dk"])
        if hasattr(overload, "redispatch"):
            overload.redispatch = switch("OpOverload.redispatch", overload.redispatch)
    handle = getattr(torch._C, "_DispatchOperatorHandle", None)
    if handle is not None and hasattr(handle, "redispatch_boxed"):
        try:
            handle.redispatch_boxed = switch("redispatch_boxed", handle.redispatch_boxed)
        except (AttributeError, TypeError):  # pragma: no cover - a torch that refuses it
            pass


_EXEMPT_VIEW = _install_hook()
