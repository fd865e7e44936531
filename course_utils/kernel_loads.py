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

Inside the block a launch through :func:`watched_launch` runs only a plain ``@triton.jit``
kernel whose body (and every device function it calls) is Triton code: in the interpreter a
kernel body is Python, and one that called Python of its own could switch the watch off or
compute its result some other way. A launch the interpreter cannot run again fails rather
than stand unwatched. Atomics count as loads of the memory they touch.

Once a launch has read outside its tensors, every float value it stores afterwards is NaN,
so the verdict also travels as data: ``course-grade`` records what a kernel wrote in the
student's run and replays it in the checking run, where the output's NaN fails the
finiteness check that follows. Under the grader's student run the block does not raise
(the check cell must run to its end there); anywhere else it raises after the block.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import math
import os
import sys
import textwrap
import types

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
    original_rmw = getattr(builder, "create_atomic_rmw", None)
    original_cas = getattr(builder, "create_atomic_cas", None)

    # the cache and volatility arguments differ between Triton versions: passed on as given
    def note(ptrs, mask):
        addrs = np.asarray(ptrs.data).astype(np.uint64)
        on = np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape) if mask is not None \
            else np.ones(addrs.shape, dtype=bool)
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

    def create_masked_load(ptrs, mask, other, *rest):
        note(ptrs, mask)
        return original(ptrs, mask, other, *rest)

    # an atomic reads the memory it changes (and hands back what it read)
    def create_atomic_rmw(op, ptrs, val, mask, *rest):
        note(ptrs, mask)
        return original_rmw(op, ptrs, val, mask, *rest)

    def create_atomic_cas(ptrs, cmp, val, *rest):
        note(ptrs, None)
        return original_cas(ptrs, cmp, val, *rest)

    def create_masked_store(ptrs, value, mask, *rest):
        data = np.asarray(value.data)
        if stray and np.issubdtype(data.dtype, np.floating):
            value = interp.TensorHandle(np.full_like(data, np.nan), value.dtype)
        return original_store(ptrs, value, mask, *rest)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    if original_rmw is not None:
        builder.create_atomic_rmw = create_atomic_rmw
    if original_cas is not None:
        builder.create_atomic_cas = create_atomic_cas
    try:
        yield stray
    finally:
        for name in ("create_masked_load", "create_masked_store", "create_atomic_rmw",
                     "create_atomic_cas"):
            vars(builder).pop(name, None)


# the blocks open: (labelled tensors, stray loads found, launches refused or not watched)
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
    refused: list[str] = []
    entry = (list(zip(labels, tensors)), stray, refused)
    _open.append(entry)
    try:
        if device.INTERPRET:
            with _watching(_interp, ranges, stray):
                yield stray
        else:
            yield stray
    finally:
        _open.remove(entry)
    if refused and not _grading_student_run():
        raise CheckFailed(f"{name} could not be watched: {refused[0]}\n  hint: launch a "
                          "@triton.jit kernel whose body is Triton code (tl.* and other "
                          "@triton.jit functions), as the exercise defines it")
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


def _language_classes() -> frozenset:
    """The classes of Triton's language as it is imported (``tl.range``, ``tl.static_range``,
    ``tl.constexpr``, the dtypes' classes ...), before any kernel runs: the interpreter later
    puts functions of its own in the place of some of them in ``triton.language.core`` and,
    for a device function it runs, does not put them back, so a kernel naming ``tl.range``
    then names a class its module no longer holds under that name."""
    out = set()
    for name, mod in list(sys.modules.items()):
        if isinstance(mod, types.ModuleType) and (name == "triton.language"
                                                  or name.startswith("triton.language.")):
            out.update(v for v in vars(mod).values() if isinstance(v, type)
                       and (getattr(v, "__module__", "") or "").startswith("triton."))
    return frozenset(out)


def _triton_parts():
    """Triton's own launch machinery, as it is when the course's modules are imported
    (before any answer cell runs): a watched launch goes through these and nothing an
    answer put in their place."""
    try:
        from triton.runtime import interpreter as interp
        from triton.runtime.jit import JITFunction
        return {"interp": interp, "JITFunction": JITFunction,
                "InterpretedFunction": interp.InterpretedFunction,
                "GridExecutor": interp.GridExecutor, "InterpreterError": interp.InterpreterError,
                "patch_lang": interp._patch_lang, "rewriter": interp.FunctionRewriter,
                "transformer": interp.FunctionRewriter.ast_transformer,
                "comparison": getattr(interp, "_InterpreterComparison", None),
                "semantic": getattr(interp, "interpreter_semantic", None),
                "patch_builtin": getattr(interp, "_patch_builtin", None),
                "scope": getattr(interp, "_LangPatchScope", None),
                "dir": os.path.dirname(os.path.dirname(os.path.realpath(interp.__file__))) + os.sep,
                "classes": _language_classes()}
    except Exception:  # noqa: BLE001 - no Triton, or an interpreter laid out otherwise
        # (a Triton release this module does not know): launches then run as they are, and
        # in the interpreter the block still watches their loads (not their bodies)
        return None


_TRITON = _triton_parts()


class Refused(CheckFailed):
    """A kernel that a watched launch does not run: not plain Triton code, or one that the
    interpreter cannot run again to watch it."""


# the Python names a kernel body may call besides Triton's (what Triton's compiler accepts)
_BUILTINS = frozenset(("range", "len", "min", "max", "int", "float", "bool", "abs", "isinstance",
                       "print", "zip", "enumerate", "tuple", "list", "round", "str", "getattr",
                       "ValueError", "TypeError", "AssertionError", "RuntimeError", "True",
                       "False", "None"))
# attributes no kernel needs, through which an interpreted body would reach Python's
# machinery (a tensor's NumPy data, a kernel's Python function or its launch)
_ATTRS = frozenset(("handle", "data", "fn", "src", "run", "rewrite", "rewriter", "rewritten_fn",
                    "builder", "interpreter_builder", "device_caches", "cache", "kernel",
                    "pre_run_hooks", "arg_names", "used_global_vals"))
_FORBIDDEN_NODES = (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.ClassDef,
                    ast.AsyncFunctionDef, ast.Await, ast.Yield, ast.YieldFrom, ast.Try,
                    ast.With, ast.AsyncWith, ast.Delete, ast.Starred)


def _triton_module(m) -> bool:
    name = getattr(m, "__name__", None)
    return isinstance(m, types.ModuleType) and isinstance(name, str) and \
        sys.modules.get(name) is m and (name == "triton" or name == "triton.language"
                                        or name.startswith("triton.language."))


def _in_triton(code) -> bool:
    return isinstance(code, types.CodeType) and bool(_TRITON) and \
        os.path.realpath(code.co_filename).startswith(_TRITON["dir"])


def _foreign(v) -> bool:
    """Whether ``v``, an attribute of one of Triton's language classes, runs code from
    outside Triton (an answer's function put in the place of a tensor method, say)."""
    if isinstance(v, (staticmethod, classmethod)):
        v = v.__func__
    if isinstance(v, property):
        return any(f is not None and _foreign(f) for f in (v.fget, v.fset, v.fdel))
    if isinstance(v, types.FunctionType):
        # Triton's, or this module's (its compatibility methods while a re-run lasts)
        real = os.path.realpath(v.__code__.co_filename)
        return not (_in_triton(v.__code__) or real == os.path.realpath(__file__))
    if isinstance(v, (types.WrapperDescriptorType, types.MethodDescriptorType,
                      types.GetSetDescriptorType, types.MemberDescriptorType,
                      types.BuiltinFunctionType)):
        return False
    fn = getattr(v, "fn", None)
    if (getattr(type(v), "__module__", "") or "").startswith("triton.") and \
            isinstance(fn, types.FunctionType):
        return not _in_triton(fn.__code__)     # a JITFunction or another Triton function object
    return callable(v)


def _language_classes_changed() -> list:
    """The methods of Triton's tensor classes that run code from outside Triton."""
    core = sys.modules.get("triton.language.core")
    out = []
    for cls_name in ("tensor", "tensor_descriptor_base"):
        cls = getattr(core, cls_name, None)
        if isinstance(cls, type):
            out += [f"{cls_name}.{k}" for k, v in list(vars(cls).items()) if _foreign(v)]
    return out


def _triton_value(v, depth=0, own=False) -> bool:
    """A value a kernel body may name: a number or string, a Triton language object, a
    Triton kernel or function (its code one of Triton's files)."""
    if depth > 8:
        return False
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if type(v) is tuple:
        return all(_triton_value(x, depth + 1, own) for x in v)
    if _triton_module(v) or v is math:
        return True
    if isinstance(v, types.BuiltinFunctionType) and getattr(v, "__self__", None) is math:
        # math.log2(math.e), -math.inf: Triton's compiler folds these into constants
        return True
    if _TRITON and type(v) in (_TRITON["JITFunction"], _TRITON["InterpretedFunction"]):
        # a kernel's own device functions are checked where they are called; one found on a
        # Triton module (an answer may have put it there) must be Triton's
        return not own or _in_triton(getattr(getattr(v, "fn", None), "__code__", None))
    code = getattr(v, "__code__", None)
    if isinstance(v, types.FunctionType) and isinstance(code, types.CodeType):
        real = os.path.realpath(code.co_filename)
        return bool(_TRITON) and real.startswith(_TRITON["dir"])
    cls = v if isinstance(v, type) else type(v)
    mod = sys.modules.get(getattr(cls, "__module__", "") or "")
    if not (_triton_module(mod) or (mod is not None and
                                    getattr(mod, "__name__", "").startswith("triton."))):
        return False
    if isinstance(v, type):
        return vars(mod).get(v.__name__) is v or (bool(_TRITON) and v in _TRITON["classes"])
    inner = getattr(v, "value", None) if type(v).__name__ == "constexpr" else None
    return inner is None or _triton_value(inner, depth + 1, own)


def _check_tree(tree, glb, what):
    """Refuse (``Refused``) a kernel body that is not Triton code: one that imports, defines
    classes, assigns attributes or items, reads private attributes or a tensor's data, or
    names a global that is neither a Triton object, the ``math`` module (its constants
    and functions fold into constants when Triton compiles) nor a plain Python builtin."""
    fn_def = tree.body[0]
    local = set()
    for node in ast.walk(fn_def):
        if isinstance(node, ast.arg):
            local.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            local.add(node.id)
    builtin_ns = vars(builtins)
    for node in ast.walk(tree):
        if isinstance(node, _FORBIDDEN_NODES):
            raise Refused(f"{what} holds a {type(node).__name__} statement, which a Triton "
                          "kernel cannot")
        if isinstance(node, (ast.FunctionDef, ast.Lambda)) and node is not fn_def:
            ok = isinstance(node, ast.Lambda) and isinstance(node.body, ast.Compare) and \
                [a.arg for a in node.args.args] == ["lhs", "rhs"]
            if not ok:   # the interpreter's own chained comparisons aside
                raise Refused(f"{what} defines a function inside the kernel")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, (ast.Attribute, ast.Subscript)):
                        raise Refused(f"{what} assigns to an attribute or an item")
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_") or node.attr in _ATTRS:
                raise Refused(f"{what} reads the attribute {node.attr!r}")
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            name = node.id
            if name == "_InterpreterComparison" or name == "interpreter_semantic":
                want = _TRITON["comparison" if name[0] == "_" else "semantic"]
                if glb.get(name, want) is not want:
                    raise Refused(f"{what} names {name}, which is not the interpreter's")
                continue
            if name in glb:
                if not _triton_value(glb[name]):
                    raise Refused(f"{what} uses {name}, a {type(glb[name]).__name__} that is "
                                  "not Triton's: a kernel may call only tl.* and other "
                                  "@triton.jit functions")
            elif name not in _BUILTINS or name not in builtin_ns:
                raise Refused(f"{what} uses {name}, which a Triton kernel cannot")
    # attribute chains from a module: every module on the way one of Triton's language
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in glb and base.id not in local:
                v = glb[base.id]
                for attr in reversed(chain):
                    if not isinstance(v, types.ModuleType):
                        break
                    v = getattr(v, attr, None)
                    if not _triton_value(v, own=True):
                        raise Refused(f"{what} uses {base.id}.{'.'.join(reversed(chain))}, "
                                      "which is not Triton's")


_CHECKED: dict = {}
_BAD_OPS = frozenset(("STORE_ATTR", "DELETE_ATTR", "STORE_GLOBAL", "DELETE_GLOBAL", "IMPORT_NAME",
                      "IMPORT_FROM", "IMPORT_STAR", "LOAD_BUILD_CLASS", "STORE_SUBSCR",
                      "DELETE_SUBSCR", "STORE_NAME", "DELETE_NAME", "LOAD_NAME", "SETUP_WITH",
                      "BEFORE_WITH", "PUSH_EXC_INFO", "YIELD_VALUE", "GET_AWAITABLE",
                      "SETUP_FINALLY", "DELETE_DEREF"))
_NESTED = ("<listcomp>", "<genexpr>", "<setcomp>", "<dictcomp>")


def _check_code(fn):
    """:func:`_check_tree` for a function without source: its bytecode."""
    import dis
    what = f"the kernel {fn.__name__}"
    glb = fn.__globals__
    for v in list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values()) + \
            [c.cell_contents for c in (fn.__closure__ or ()) if c.cell_contents is not None]:
        if not _triton_value(v):
            raise Refused(f"{what} holds a {type(v).__name__} that is not Triton's")
    todo = [fn.__code__]
    while todo:
        code = todo.pop()
        for k in code.co_consts:
            if isinstance(k, types.CodeType):
                if k.co_name not in _NESTED:
                    raise Refused(f"{what} defines a function inside the kernel")
                todo.append(k)
        cur = None
        for ins in dis.get_instructions(code):
            op, arg = ins.opname, ins.argval
            if op in _BAD_OPS:
                raise Refused(f"{what} does what a Triton kernel cannot ({op})")
            if op in ("LOAD_ATTR", "LOAD_METHOD"):
                if not isinstance(arg, str) or arg.startswith("_") or arg in _ATTRS:
                    raise Refused(f"{what} reads the attribute {arg!r}")
                if isinstance(cur, types.ModuleType):
                    cur = getattr(cur, arg, None)
                    if not _triton_value(cur, own=True):
                        raise Refused(f"{what} uses {arg}, which is not Triton's")
                else:
                    cur = None
                continue
            cur = None
            if op == "LOAD_GLOBAL":
                if arg in glb:
                    cur = glb[arg]
                    if not _triton_value(cur):
                        raise Refused(f"{what} uses {arg}, a {type(cur).__name__} that is not "
                                      "Triton's: a kernel may call only tl.* and other "
                                      "@triton.jit functions")
                elif arg not in _BUILTINS or arg not in vars(builtins):
                    raise Refused(f"{what} uses {arg}, which a Triton kernel cannot")


def _source_of(fn) -> str:
    """The source Triton reads for ``fn`` (from its ``def`` line, dedented)."""
    lines, _ = inspect.getsourcelines(fn)
    src = textwrap.dedent("".join(lines))
    import re
    m = re.search(r"^def\s+\w+\s*\(", src, re.MULTILINE)
    if m is None:
        raise Refused(f"no source of {getattr(fn, '__name__', fn)} to check")
    return src[m.start():]


def _checked(fn, src=None, compiled=False):
    """``fn`` rewritten for the interpreter as Triton's interpreter does it, from ``src``
    (default: its source), after checking that the code is Triton code; cached by source."""
    if not isinstance(fn, types.FunctionType):
        raise Refused(f"{fn!r} is not a Python function")
    if os.path.realpath(fn.__code__.co_filename).startswith(_TRITON["dir"]):
        # Triton's own device functions (tl.max, tl.sum, ...): as its interpreter runs them
        hit = _CHECKED.get((fn, None))
        if hit is None:
            hit = _CHECKED[(fn, None)] = _TRITON["rewriter"](fn).rewrite_ast()
        return hit
    if src is None:
        try:
            src = _source_of(fn)
        except (OSError, TypeError):
            # no source (a notebook forgets the cells it ran): Triton's interpreter runs the
            # function itself, and so does this, once its code is checked
            if _CHECKED.get((fn, fn.__code__)) is None:
                _check_code(fn)
                _CHECKED[(fn, fn.__code__)] = fn
            return _with_devices(fn, compiled)
    key = (fn, src)
    hit = _CHECKED.get(key)
    if hit is not None:
        return _with_devices(hit, compiled)
    what = f"the kernel {fn.__name__}"
    tree = ast.parse(src)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise Refused(f"{what}: its source is not one function")
    tree.body[0].decorator_list = []
    glb = fn.__globals__
    _check_tree(tree, glb, what)
    tree = _TRITON["transformer"].visit(tree)
    _check_tree(tree, glb, what)
    ast.fix_missing_locations(tree)
    code = compile(tree, filename=fn.__code__.co_filename, mode="exec")
    interp = _TRITON["interp"]
    for k, v in vars(interp).items():    # as the interpreter does: its helpers among the globals
        if k not in glb:
            glb[k] = v
    ns: dict = {}
    exec(code, glb, ns)
    out = ns[tree.body[0].name]
    if len(_CHECKED) > 1000:
        _CHECKED.clear()
    _CHECKED[key] = out
    return _with_devices(out, compiled)


class _Device:
    """A device function as a watched kernel calls it: checked Triton code (``compiled``:
    from the source it is compiled from, a plain JITFunction's)."""

    def __init__(self, dev, compiled):
        self._dev, self._compiled = dev, compiled

    @property
    def fn(self):
        # the interpreter calls a combine function handed to tl.reduce or
        # tl.associative_scan through its .fn: the checked function too
        return self.__call__

    def __call__(self, *args, **kwargs):
        dev = self._dev
        if self._compiled:
            why = _plain(dev)
            if why is not None:
                raise Refused(why)
        _TRITON["patch_lang"](dev.fn)
        fn = _checked(dev.fn, dev.src if self._compiled else None, compiled=self._compiled)
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise _TRITON["InterpreterError"](repr(e)) from e


def _with_devices(fn, compiled):
    """``fn`` with globals in which every device function of the course or the learner
    (not Triton's own) is called as :class:`_Device`: a copy of its globals, as a compiled
    kernel takes them when it is compiled."""
    glb = dict(fn.__globals__)
    kinds = (_TRITON["JITFunction"], _TRITON["InterpretedFunction"])
    for k, v in list(glb.items()):
        if type(v) in kinds and not os.path.realpath(
                getattr(getattr(v, "fn", None), "__code__", fn.__code__).co_filename).startswith(
                    _TRITON["dir"]):
            glb[k] = _Device(v, compiled)
    out = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__annotations__ = dict(fn.__annotations__)
    out.__qualname__ = fn.__qualname__
    return out


def _plain(kernel) -> str | None:
    """Why ``kernel`` is not a plain Triton kernel (None when it is): one of Triton's own
    classes, no launch method or hook of its own, and (compiled) the source it compiles
    is its function's."""
    if not _TRITON:
        return "no Triton"
    cls = type(kernel)
    if cls not in (_TRITON["JITFunction"], _TRITON["InterpretedFunction"]):
        return f"{getattr(kernel, '__name__', cls.__name__)} is a {cls.__name__}, not a @triton.jit kernel"
    own = set(vars(kernel)) & {"run", "__getitem__", "__call__", "rewrite", "parse",
                                "create_binder", "_do_compile", "_call_hook"}
    if own:
        return f"the kernel's {sorted(own)[0]} was replaced"
    if getattr(kernel, "pre_run_hooks", None):
        return "the kernel has hooks of its own"
    return None


def _refuse(entry, why):
    """A launch that cannot be watched fails (raised from the launch, so that course-grade
    records the error as the kernel's outcome)."""
    entry[2].append(why)
    raise Refused(f"{why}. Inside this check a kernel runs only when its loads can be watched: "
                  "launch a @triton.jit kernel whose body is Triton code (tl.* and other "
                  "@triton.jit functions)")


def watched_launch(kernel, grid, args, kwargs):
    """``kernel[grid](*args, **kwargs)``. Inside a :func:`loads_within` block the kernel must be
    a plain ``@triton.jit`` kernel whose body is Triton code (a launch method, a hook or a
    body of Python of its own is not watched, and refused: its results become NaN). In the
    interpreter the block watches the run itself; on a GPU the launch is then run again in
    Triton's interpreter on CPU copies of its tensors (taken before the launch) and its loads
    are checked there. Device functions the kernel calls run interpreted too. A launch the
    interpreter cannot run again is refused as well."""
    if not _open or _TRITON is None:
        return kernel[grid](*args, **kwargs)
    entry = _open[-1]
    why = _plain(kernel)
    if why is not None:
        _refuse(entry, why)
    changed = _language_classes_changed()
    if changed:
        _refuse(entry, f"Triton's {', '.join(changed[:3])} runs code from outside Triton")
    if device.INTERPRET:
        try:
            fn = _checked(kernel.fn)
        except Refused as e:
            fn, why = None, str(e)
        if fn is None:
            _refuse(entry, why)
        names = list(inspect.signature(kernel.fn).parameters)
        return _TRITON["GridExecutor"](fn, names, grid, [])(*args, **kwargs)
    tensors, stray = entry[0], entry[1]
    copies = _copies(args, kwargs)
    out = kernel[grid](*args, **kwargs)
    ranges = []
    for label, t in tensors:
        held = copies.get(t.untyped_storage().data_ptr())
        if held is not None:
            lo = held[1].data_ptr() + (t.data_ptr() - held[0].data_ptr())
            ranges.append((label, lo, lo + t.numel() * t.element_size()))
    found: list = []
    failed = None
    try:
        _interpret(kernel, grid, [_on_copy(a, copies) for a in args],
                   {k: _on_copy(v, copies) for k, v in kwargs.items()}, ranges, found)
    except Exception as e:  # noqa: BLE001 - the interpreter could not run it: refused
        inner = e
        while isinstance(inner.__cause__, Exception) and not isinstance(inner, Refused):
            inner = inner.__cause__
        if len(unwatched) < 100:
            unwatched.append(f"{getattr(kernel.fn, '__name__', kernel)}: {type(e).__name__}: {e}")
        failed = f"{type(inner).__name__}: {str(inner)[:300]}"
    if failed is not None:   # raised here, so that no error of the interpreter's comes with it
        _refuse(entry, f"Triton's interpreter could not run it again to watch its loads "
                       f"({failed})")
    if found:
        stray.extend(found)
        for st, cpu in copies.values():
            st.copy_(cpu)
    return out


def _interpret(kernel, grid, args, kwargs, ranges, found):
    """Run the compiled ``kernel`` once more in the interpreter, from the source it was
    compiled from (a device function too), its loads watched."""
    interp = _TRITON["interp"]
    JITFunction = _TRITON["JITFunction"]

    made: dict = {}

    def device_call(self, *a, **k):
        # Triton's own device functions (a reduction), compiled objects here: interpreted
        f = made.get(self.fn)
        if f is None:
            f = made[self.fn] = _TRITON["InterpretedFunction"](self.fn)
        return f(*a, **k)

    patch_tensor = getattr(interp, "_patch_lang_tensor", None)

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
        interp._patch_lang_tensor = patch_tensor_compat
    try:
        fn = kernel.fn if isinstance(kernel, _TRITON["JITFunction"]) else kernel
        with _language_kept(), _watching(interp, ranges, found), \
                _libdevice_interpreted(interp, fn.__globals__):
            _tensor_methods_interpreted(device_call)
            checked = _checked(fn, getattr(kernel, "src", None), compiled=True)
            names = list(inspect.signature(fn).parameters)
            _TRITON["GridExecutor"](checked, names, grid, [])(*args, **kwargs)
    finally:
        JITFunction.__call__ = compiled_call
        if patch_tensor is not None:
            interp._patch_lang_tensor = patch_tensor


def _tensor_methods_interpreted(device_call):
    """Where kernels are compiled, the tensor methods that are Triton functions (``x.sum(1)``,
    ``x.max(0)``, ...) are compiled objects on the tensor class, which the interpreter calls
    without the tensor: for the block (``_language_kept`` puts the class back) each becomes a
    method that runs its function interpreted, the tensor first."""
    core = sys.modules.get("triton.language.core")
    cls = getattr(core, "tensor", None)
    if not isinstance(cls, type):
        return
    for name, val in list(vars(cls).items()):
        if type(val) is _TRITON["JITFunction"]:
            setattr(cls, name, (lambda f: lambda self, *a, **k: device_call(f, self, *a, **k))(val))


def _np_round(x):
    return np.copysign(np.floor(np.abs(x) + 0.5), x)     # halves away from zero, as libdevice


# libdevice's functions as NumPy computes them, by the name of their float version without
# its "__nv_" and "fast_" (the interpreter has none of them). On a GPU the compiled launch's
# results are the ones kept; these only carry the interpreter's re-run to the loads it watches.
_LIBDEVICE = types.MappingProxyType({
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x), "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "rcp": np.reciprocal, "cbrt": np.cbrt,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "sinh": np.sinh,
    "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "atan2": np.arctan2, "abs": np.abs, "fabs": np.abs, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "rint": np.rint, "nearbyint": np.rint, "round": _np_round,
    "fmax": np.fmax, "fmin": np.fmin, "max": np.maximum, "min": np.minimum,
    "fma": lambda a, b, c: a * b + c, "pow": np.power, "add": np.add, "sub": np.subtract,
    "mul": np.multiply, "div": np.divide, "fdivide": np.divide, "isnan": np.isnan,
    "isinf": np.isinf, "finitef": np.isfinite, "isfinited": np.isfinite,
    "signbit": np.signbit, "copysign": np.copysign, "fmod": np.fmod, "hypot": np.hypot,
    "saturate": lambda x: np.clip(x, 0.0, 1.0), "fdim": lambda a, b: np.maximum(a - b, 0),
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
})


def _libdevice_op(symbol: str):
    name = symbol[5:] if symbol.startswith("__nv_") else symbol
    name = name[5:] if name.startswith("fast_") else name
    for suffix in ("_rn", "_rz", "_rd", "_ru"):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
    for cand in (name, name[:-1] if name.endswith("f") else None,
                 name[1:] if name[:1] in "fd" else None,
                 name[1:-1] if name[:1] in "fd" and name.endswith("f") else None):
        if cand and cand in _LIBDEVICE:
            return _LIBDEVICE[cand]
    raise NotImplementedError(f"libdevice's {symbol} in Triton's interpreter")


@contextlib.contextmanager
def _libdevice_interpreted(interp, glb):
    """libdevice in the interpreter for the block: its extern calls computed by NumPy, and
    the backend-neutral ``triton.language.extra.libdevice`` (which the compiler maps to the
    GPU's) mapped to CUDA's, as a module and as functions named in the kernel's globals."""
    patch_builtin, scope_cls = _TRITON.get("patch_builtin"), _TRITON.get("scope")
    try:
        from triton.language.extra import libdevice as neutral
        from triton.language.extra.cuda import libdevice as cuda
    except Exception:  # noqa: BLE001 - a Triton without them: nothing to map
        yield
        return
    if patch_builtin is None or scope_cls is None:
        yield
        return
    builder = interp.interpreter_builder

    def create_extern_elementwise(lib_name, lib_path, symbol, args, ret, is_pure):
        op = _libdevice_op(symbol)
        scalar = getattr(ret, "scalar", ret)
        data = np.asarray(op(*[np.asarray(a.data) for a in args]))
        return interp.TensorHandle(data.astype(interp._get_np_dtype(scalar)), scalar)

    scope = scope_cls()
    swapped = []
    builder.create_extern_elementwise = create_extern_elementwise
    try:
        patch_builtin(cuda, builder, scope)
        # as the compiler does: the neutral module's names looked up in CUDA's
        for name in dir(cuda):
            if not name.startswith("_") and callable(getattr(cuda, name)):
                scope.set_attr(neutral, name, getattr(cuda, name))
        for k, v in list(glb.items()):
            if isinstance(v, types.FunctionType) and \
                    getattr(v, "__module__", None) == neutral.__name__ and hasattr(cuda, v.__name__):
                swapped.append((k, v))
                glb[k] = getattr(cuda, v.__name__)
        yield
    finally:
        for k, v in swapped:
            glb[k] = v
        scope.restore()
        vars(builder).pop("create_extern_elementwise", None)


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
