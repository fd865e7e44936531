"""Keeps the course's guards in force in a graded kernel, whatever answer code does.

A check cell runs an answer under ``course_utils.guards`` (``guards.run_answer``
or ``with guards.forbid(...)``), which makes calls of the things an exercise
forbids raise ``guards.ForbiddenCall``. An answer cell runs in the same process
and could switch that off: rebind ``guards.forbid`` to a no-op, empty the table
of forbidden groups, patch ``TorchFunctionMode`` or torch's function-mode stack
helpers, or rebind the grading hooks themselves.

Before each answer cell runs, and again before each call the template makes to
an answer function, :func:`snapshot` records all of those (the guard module's
namespace, one level into its tables; its classes' attributes; torch's
function-mode machinery and the modes on its stacks; the builtins and ``torch.Tensor``'s
methods, which the guards' code reads; the grading hooks). :func:`check_and_restore`, after
the cell or the call, compares the live objects with the snapshot, puts back
whatever differs and returns what did; the kernel-side hooks ship what it
found, so the grader scores that exercise zero with a line that says what was
changed. Changes the template itself makes between answer cells (a guard that
sets itself up on first use) are not the answer's, and are not reported. The references used for
the comparison are the captured ones, so rebinding a module attribute cannot
hide a change. It works for any forbid groups a check cell names, since it
protects the guard as a whole rather than a list of groups.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import types

_SNAP: dict = {}
_CONTAINERS = (dict, list, set, frozenset, tuple)
_TORCH_C = ("_push_on_torch_function_stack", "_pop_torch_function_stack",
            "_len_torch_function_stack", "_get_function_stack_at",
            "_is_torch_function_mode_enabled", "DisableTorchFunction",
            "DisableTorchFunctionSubclass", "_disabled_torch_function_impl",
            "_len_torch_dispatch_stack", "_get_dispatch_stack_at", "_pop_torch_dispatch_stack",
            "_push_on_torch_dispatch_stack", "_get_dispatch_mode", "_set_dispatch_mode",
            "_unset_dispatch_mode")
_OVERRIDES = ("TorchFunctionMode", "BaseTorchFunctionMode", "_get_current_function_mode",
              "_get_current_function_mode_stack", "_pop_mode", "_pop_mode_temporarily",
              "_push_mode", "handle_torch_function", "has_torch_function",
              "_get_function_stack_at", "_len_torch_function_stack",
              "_pop_torch_function_stack", "_push_on_torch_function_stack")
_TABLES = ("course_utils.guards", "course_utils.checks")
# builtins the kernel itself binds afresh for every cell (stdin forwarding, IPython's own
# names, the last results): no guard reads them
_KERNEL_BUILTINS = frozenset(("input", "raw_input", "getpass", "exit", "quit", "get_ipython",
                              "display", "__IPYTHON__", "_", "__", "___"))
_MODULES = ("course_utils.guards", "course_utils.checks", "course_utils.grading.kernel_side",
            "course_utils.grading.guard_keeper", "course_utils.grading.codec",
            # the load watch of Triton kernels (and the device flags that choose its path)
            "course_utils.kernel_loads", "course_utils.device")
# Triton's launch and interpreter machinery, which the load watch runs kernels through:
# what each name is bound to is kept (their caches and tables change as kernels run)
_TRITON = {"triton.runtime.interpreter": ("InterpreterBuilder", "InterpretedFunction",
                                          "GridExecutor", "FunctionRewriter", "ASTTransformer"),
           "triton.runtime.jit": ("JITFunction", "KernelInterface", "JITCallable")}
# what the grading hooks publish their records through: an answer that rebinds it runs its
# own code each time a hook publishes, in the middle of a check
_DISPLAY = ("IPython.display", "IPython.core.display_functions", "IPython.core.display")


def _copy(v):
    if isinstance(v, threading.local):
        return dict(vars(v))
    if type(v) is dict:
        return dict(v)
    if type(v) in (list, set):
        return type(v)(v)
    return v


def _same(a, b) -> bool:
    if isinstance(a, threading.local):
        a = vars(a)
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    if type(a) in (set, frozenset):
        return a == b
    return a is b


def _targets():
    """``[(label, namespace)]`` of the things to keep: module dicts and class dicts."""
    import torch
    import torch.overrides as ov
    out = []
    for name in _MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        out.append((name, vars(mod)))
        for attr, v in list(vars(mod).items()):
            if isinstance(v, type) and getattr(v, "__module__", None) == name:
                out.append((f"{name}.{attr}", v))
    for name, classes in _TRITON.items():
        mod = sys.modules.get(name)
        if mod is None:
            continue
        out.append((name, vars(mod)))
        for attr in classes:
            v = vars(mod).get(attr)
            if isinstance(v, type):
                out.append((f"{name}.{attr}", v))
    for name in _DISPLAY:
        mod = sys.modules.get(name)
        if mod is not None:
            out.append((name, vars(mod)))
    pub = _display_publisher()
    if pub is not None:
        out.append((f"display publisher {type(pub).__qualname__}", type(pub)))
    # what the guards' own code reads as it judges a call: the builtins (isinstance, len,
    # tuple, ...) and the methods and properties of torch.Tensor (shape, numel, clone, ...);
    # an answer that rebinds one can make the guard see what it likes
    import builtins
    out.append(("builtins", vars(builtins)))
    out.append(("torch.Tensor", torch.Tensor))
    out.append(("torch._C", {k: getattr(torch._C, k) for k in _TORCH_C if hasattr(torch._C, k)}))
    out.append(("torch.overrides", {k: getattr(ov, k) for k in _OVERRIDES if hasattr(ov, k)}))
    for cls in (getattr(ov, "TorchFunctionMode", None), getattr(ov, "BaseTorchFunctionMode", None)):
        if isinstance(cls, type):
            out.append((f"torch.overrides.{cls.__name__}", cls))
    return out


def _display_publisher():
    """The kernel's display publisher (what ``publish_display_data`` hands each record to),
    or None outside a kernel."""
    return getattr(_shell(), "display_pub", None)


def _publisher_state():
    """The publisher itself and the callables set on it (none but an answer's): a method
    replaced on the object runs its own code each time a record is published."""
    pub = _display_publisher()
    if pub is None:
        return {}
    inst = vars(pub) if isinstance(getattr(pub, "__dict__", None), dict) else {}
    return {"publisher": (pub, None)} | {
        f"publisher.{k}": (v, None) for k, v in inst.items()
        if callable(v) and not isinstance(v, type) and not k.startswith("_")}


_SHELL_LISTS = ("ast_transformers", "input_transformers_cleanup", "input_transformers_post")


def _shell():
    """The kernel's IPython shell, or None outside a kernel."""
    shell = sys.modules.get("IPython.core.interactiveshell")
    cls = getattr(shell, "InteractiveShell", None)
    try:
        return cls.instance() if cls is not None and cls.initialized() else None
    except Exception:  # noqa: BLE001 - no shell
        return None


def _library_callback(cb) -> bool:
    """An installed package's own function (matplotlib's inline backend registers one when
    pyplot is first imported): not a notebook's code, nor a callable it put together."""
    code = getattr(cb, "__code__", None) if isinstance(cb, types.FunctionType) else None
    fn = getattr(code, "co_filename", "") or ""
    return ("site-packages" in fn or "dist-packages" in fn) and fn.endswith(".py")


def _shell_hooks() -> dict:
    """The kernel's own hooks into every later cell: the callbacks of its events (a
    ``post_execute`` callback runs after each cell, where no notebook frame is on the stack
    to stop it starting a process or a thread) and the transformers every cell's source and
    syntax tree pass through (one could rewrite the check cells). Each list by its items."""
    sh = _shell()
    if sh is None:
        return {}
    out = {}
    events = getattr(getattr(sh, "events", None), "callbacks", None)
    if isinstance(events, dict):
        for name, cbs in events.items():
            if isinstance(cbs, list):
                out[f"events.{name}"] = (cbs, tuple(c for c in cbs if not _library_callback(c)))
    for name in _SHELL_LISTS:
        items = getattr(sh, name, None)
        if isinstance(items, list):
            out[name] = (items, tuple(items))
    return out


def capture():
    """Import what is to be kept (in a fresh kernel, before any answer cell runs) and
    take the first snapshot."""
    import torch  # noqa: F401 - the function-mode machinery must exist to be kept
    try:
        import course_utils.guards  # noqa: F401
    except ImportError:
        pass
    try:
        import course_utils.checks  # noqa: F401
    except ImportError:  # pragma: no cover
        pass
    _SNAP.clear()
    _SNAP.update(snapshot())


def snapshot() -> dict:
    snap = {}
    for label, ns in _targets():
        if isinstance(ns, type):
            owner, items = ns, dict(vars(ns))
        else:
            owner, items = None, dict(ns)
        # contents are kept for the tables (UPPER_CASE names) of a module, and for
        # everything of a class; other module state (caches, the grading records) may
        # change as it runs, so only what each name is bound to is kept
        whole = not label.startswith("triton.")
        snap[label] = (owner, ns if owner is None else None,
                       {k: (v, _copy(v) if (owner is not None and whole) or (
                           k.isupper() and label in _TABLES) else v)
                        for k, v in items.items()
                        if not (label == "builtins" and k in _KERNEL_BUILTINS)})
    snap["__code__"] = (None, None, _course_code())
    snap["__modules__"] = (None, None, {n: (sys.modules.get(n), None) for n in _MODULES})
    snap["__torch_attrs__"] = (None, None, _torch_attrs())
    snap["__mode_stacks__"] = (None, None, _mode_stacks())
    snap["__display__"] = (None, None, _publisher_state())
    snap["__shell__"] = (None, None, _shell_hooks())
    return snap


def _mode_stacks() -> dict:
    """The modes on torch's function-mode and dispatch-mode stacks, bottom first (and the
    dispatch stack's infrastructure modes, by key). A mode an answer leaves there sees, and
    can change, every torch call that follows (the checks' own computations included), and a
    mode under a guard's runs whatever the guard hands on with the guard stepped aside."""
    import torch
    C = torch._C
    out = {"function": tuple(C._get_function_stack_at(i)
                             for i in range(C._len_torch_function_stack()))}
    if hasattr(C, "_len_torch_dispatch_stack"):
        out["dispatch"] = tuple(C._get_dispatch_stack_at(i)
                                for i in range(C._len_torch_dispatch_stack()))
        keys = getattr(C, "_TorchDispatchModeKey", None)
        if keys is not None and hasattr(C, "_get_dispatch_mode"):
            out["infra"] = tuple((k, C._get_dispatch_mode(k)) for k in keys.__members__.values())
    return out


def _same_modes(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        len(a[k]) == len(b[k]) and all((x[1] if k == "infra" else x) is
                                       (y[1] if k == "infra" else y)
                                       for x, y in zip(a[k], b[k])) for k in a)


def _restore_modes(held: dict):
    import torch
    C = torch._C
    while C._len_torch_function_stack() > 0:
        C._pop_torch_function_stack()
    for m in held["function"]:
        C._push_on_torch_function_stack(m)
    if "dispatch" not in held:
        return
    while C._len_torch_dispatch_stack() > 0:
        C._pop_torch_dispatch_stack(None)
    for k, _ in held.get("infra", ()):
        if C._get_dispatch_mode(k) is not None:
            C._unset_dispatch_mode(k)
    for _, m in held.get("infra", ()):
        if m is not None:
            C._set_dispatch_mode(m)
    for m in held["dispatch"]:
        if all(m is not im for _, im in held.get("infra", ())):
            C._push_on_torch_dispatch_stack(m)


def _torch_attrs():
    import torch
    import torch.overrides as ov
    return {f"torch._C.{k}": (getattr(torch._C, k), None) for k in _TORCH_C if hasattr(torch._C, k)} | \
        {f"torch.overrides.{k}": (getattr(ov, k), None) for k in _OVERRIDES if hasattr(ov, k)}


def _course_code():
    """The code of every function, and the ``run`` of every Triton kernel, that the
    course's modules define: ``forbid`` swaps them while it is on, and an answer must
    not swap them back (or anything else) itself."""
    out = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("course_utils.") or name.startswith("course_utils.grading") \
                or mod is None:
            continue
        for attr, v in list(vars(mod).items()):
            # keyed by what is kept: a function's code, a kernel's run (a function may itself
            # be called ``run``)
            if isinstance(v, types.FunctionType) and getattr(v, "__module__", None) == name:
                out[f"{name}.{attr}.__code__"] = (v, v.__code__)
            elif type(v).__name__ in ("JITFunction", "InterpretedFunction") and \
                    isinstance(getattr(v, "__dict__", None), dict):
                out[f"{name}.{attr}.run"] = (v, vars(v).get("run", _MISSING))
    return out


def check_and_restore(snap: dict | None = None) -> list:
    """What differs from ``snap`` (default: the last :func:`capture`), by name,
    each put back as it was."""
    snap = _SNAP if snap is None else snap
    if not snap:
        return []
    # the builtins first, with nothing but dict operations: the code below (this function's
    # imports included) calls builtins itself
    changed = []
    kept = snap.get("builtins")
    if kept is not None:
        live = kept[1]
        for k, (obj, _) in kept[2].items():
            if live.get(k, _MISSING) is not obj:
                changed.append(f"builtins.{k}")
                live[k] = obj
    import torch
    import torch.overrides as ov
    for label, (owner, ns, items) in list(snap.items()):
        if label == "builtins":
            continue
        if label == "__code__":
            for name, (obj, held) in items.items():
                if not name.endswith(".__code__"):
                    cur = vars(obj).get("run", _MISSING)
                    if cur is not held:
                        changed.append(name)
                        if held is _MISSING:
                            vars(obj).pop("run", None)
                        else:
                            vars(obj)["run"] = held
                elif obj.__code__ is not held:
                    changed.append(name)
                    obj.__code__ = held
            continue
        if label == "__modules__":
            for name, (mod, _) in items.items():
                if sys.modules.get(name) is not mod:
                    changed.append(f"sys.modules[{name!r}]")
                    if mod is not None:
                        sys.modules[name] = mod
            continue
        if label == "__torch_attrs__":
            for name, (obj, _) in items.items():
                mod, attr = (torch._C, name[9:]) if name.startswith("torch._C.") else \
                    (ov, name[len("torch.overrides."):])
                if getattr(mod, attr, None) is not obj:
                    changed.append(name)
                    setattr(mod, attr, obj)
            continue
        if label == "__mode_stacks__":
            if not _same_modes(_mode_stacks(), items):
                changed.append("torch's mode stacks (a TorchFunctionMode or TorchDispatchMode "
                               "entered or left)")
                _restore_modes(items)
            continue
        if label == "__shell__":
            live = _shell_hooks()
            for k, (lst, items_then) in items.items():
                now = live.get(k)
                if now is None or now[0] is not lst or len(now[1]) != len(items_then) or \
                        any(a is not b for a, b in zip(now[1], items_then)):
                    changed.append(f"the kernel's {k.replace('.', ' ')} (a hook into every "
                                   "later cell)")
                    with contextlib.suppress(Exception):
                        kept = [c for c in lst if k.startswith("events.") and _library_callback(c)]
                        lst[:] = list(items_then) + [c for c in kept if c not in items_then]
                        sh = _shell()
                        if k.startswith("events."):
                            sh.events.callbacks[k[len("events."):]] = lst
                        else:
                            setattr(sh, k, lst)
            continue
        if label == "__display__":
            live = _publisher_state()
            pub = items.get("publisher", (None, None))[0]
            for k in set(live) | set(items):
                if live.get(k, (_MISSING,))[0] is not items.get(k, (_MISSING,))[0]:
                    changed.append(f"the display {k}")
                    if k == "publisher" and pub is not None:
                        try:
                            sys.modules["IPython.core.interactiveshell"].InteractiveShell \
                                .instance().display_pub = pub
                        except Exception:  # noqa: BLE001
                            pass
                    elif pub is not None and k.startswith("publisher."):
                        attr = k[len("publisher."):]
                        try:
                            if k in items:
                                setattr(pub, attr, items[k][0])
                            else:
                                vars(pub).pop(attr, None)
                        except Exception:  # noqa: BLE001
                            pass
            continue
        if label in ("torch._C", "torch.overrides"):
            continue  # kept through __torch_attrs__
        live = dict(vars(owner)) if owner is not None else ns
        for k, (obj, content) in items.items():
            cur = live.get(k, _MISSING)
            if cur is not obj or (content is not obj and not _same(cur, content)):
                changed.append(f"{label}.{k}")
                _restore(owner, ns, k, obj, content)
        if owner is None:
            continue
        # added names: not the caches of abc and copyreg (a class's __slotnames__ is written
        # the first time one of its objects is copied or pickled)
        for k in [k for k in live if k not in items and not k.startswith("_abc")
                  and k != "__slotnames__"]:
            changed.append(f"{label}.{k} (added)")
            try:
                delattr(owner, k)
            except (TypeError, AttributeError):
                pass
    return changed


def check_stable_and_restore(snap: dict | None = None) -> list:
    """:func:`check_and_restore` for what nothing but an answer ever changes once a check
    cell is running: the classes kept (the guards' modes, torch's mode classes,
    ``torch.Tensor``), the builtins, torch's mode switches and the display functions. The
    grading hooks run it before each recorded call, against the picture taken before the
    answer cell: code an answer left behind (a hook on the display functions, a thread)
    can change the guards after that cell ended, and the picture each call takes of its
    own would already hold the change."""
    snap = _SNAP if snap is None else snap
    # not Triton's classes: a check's forbid makes their launch paths refuse the kernels
    # it forbids while it is on
    stable = {label: entry for label, entry in snap.items()
              if label in ("builtins", "__torch_attrs__", "__display__") or label in _DISPLAY
              or (entry[0] is not None and not label.startswith("triton."))}
    return check_and_restore(stable) if stable else []


def _restore(owner, ns, k, obj, content):
    if isinstance(obj, threading.local) and type(content) is dict:
        vars(obj).clear()
        vars(obj).update(content)
    elif type(obj) is dict and content is not obj:
        obj.clear()
        obj.update(content)
    elif type(obj) in (list, set) and content is not obj:
        obj.clear()
        (obj.extend if type(obj) is list else obj.update)(content)
    if owner is not None:
        try:
            setattr(owner, k, obj)
        except (TypeError, AttributeError):
            pass
    else:
        ns[k] = obj


class _Missing:
    pass


_MISSING = _Missing()
