"""The few helpers a graded notebook calls while it runs (imported inside the
kernel as ``__course_grade__`` by the grader's first cell). There are two kinds
of kernel, and neither trusts the other:

* the **student kernel** runs the official template with the student's answer
  cells. After each answer cell, ``export`` ships the values that answer
  defines (data only) and wraps its functions in a recorder that ships every
  call the template makes to them (inputs and result, as data). Whatever this
  kernel computes can be forged by the answer code, so nothing here is a verdict.
* the **verifier kernel** never runs student code. It runs the same template
  with each answer cell replaced by ``bind``, which defines the exported values
  and, for functions, stand-ins that hand back the recorded results (after
  checking that the inputs are the ones this kernel computed). Its check calls
  go through ``verify_call``, which runs the real check and ships the verdict.

``cell_start`` makes every template cell begin from the random state the
official solution had there, so both kernels compute the same inputs whatever
the answer cells drew.

Answer functions reach the template in three ways, and each is recorded and
replayed: a plain call ``f(x)``; a kernel launch ``kernel[grid](...)``, whose
result is what it writes into its tensor arguments (every tensor argument a
call changes is shipped and copied back in by the stand-in); and a
``@triton.jit`` device function that a template kernel calls. A device function
cannot be recorded on its own (a compiled kernel calls only Triton functions),
so the template kernels that reach it are recorded instead, launch by launch,
and the verifier replays those launches; the answer's device function stays
itself in the student's kernel, compiled for a GPU or run by the CPU
interpreter alike. Both kernels find those template kernels the same way, from
the template's code alone (:func:`_kernels_reaching`).
"""
from __future__ import annotations

import functools
import random
import re
import sys
import types

import torch

from course_utils.grading import codec, guard_keeper

MIME = "application/x-course-grade+json"  # the runner keeps the same constant
# IPython's own names, rebound by every cell (output history, input history, shortcuts)
_IPYTHON_NAME = re.compile(r"^(_+|_i+|_i?\d+|_ih|_oh|_dh|In|Out|exit|quit|get_ipython)$")

_state = {"mode": None, "nonce": "", "inputs": {}, "hits": {}, "record": True, "depth": 0,
          "calls": {}, "reported": None, "failed": {}, "before": None, "answer_bound": {},
          "device": {}, "replays": {}, "prints": {}}
RECORDS_ENV = "COURSE_GRADE_RECORDS"   # verifier under nbval: where its records go


def start(mode: str, nonce: str, inputs_path: str | None = None):
    if mode not in ("reference", "student", "verify"):
        raise ValueError(f"mode must be 'reference', 'student' or 'verify', got {mode!r}")
    _state.update(mode=mode, nonce=nonce, hits={}, inputs={}, record=True, depth=0, calls={},
                  reported=None, failed={}, before=None, answer_bound={}, device={},
                  replays={}, prints={})
    # ``torch.empty`` then holds NaN (or the largest integer) in both kernels, not whatever
    # the allocator left there, so an output buffer the template hands to an answer's
    # kernel is the same input in both kernels. The setter is what
    # ``torch.use_deterministic_algorithms`` calls after importing the compiler's
    # configuration, which alone takes a second in every graded kernel.
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is not None:
        setter(True, warn_only=True)
    else:  # pragma: no cover - a torch without the setter
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    if inputs_path:
        raw = torch.load(inputs_path, weights_only=True)
        if mode != "verify":  # the checking notebook keeps its inputs, to be run again
            try:
                import os
                os.unlink(inputs_path)
            except OSError:
                pass
        _state["inputs"] = codec.decode(raw, whole_run=True)
    sources = _state["inputs"].get("sources")
    if mode == "verify" and isinstance(sources, dict):
        try:  # checks that read an answer's source read the graded one
            from course_utils import guards
        except ImportError:  # pragma: no cover - a course without guards
            guards = None
        if guards is not None and hasattr(guards, "register_answer_sources"):
            guards.register_answer_sources({str(k): str(v) for k, v in sources.items()})
    if mode != "verify":
        try:  # the records go out through the function as it is before any answer runs
            from IPython.display import publish_display_data
            _state["publish"] = publish_display_data
        except ImportError:  # pragma: no cover - a kernel without IPython
            pass
        guard_keeper.capture()
        try:
            from course_utils import guards
            _GUARDS.update(run_answer=guards.run_answer, forbid=guards.forbid)
        except (ImportError, AttributeError):  # pragma: no cover - a course without guards
            pass


_GUARDS: dict = {}


def guard_run_answer(fn, *args, **kwargs):
    """``guards.run_answer`` as it was before any answer cell ran (check cells of
    the student's kernel call this in its place)."""
    return _GUARDS["run_answer"](fn, *args, **kwargs)


def guard_forbid(*groups, **kwargs):
    """``guards.forbid`` as it was before any answer cell ran."""
    return _GUARDS["forbid"](*groups, **kwargs)


def _publish(kind: str, key: str, payload):
    if _state["mode"] == "verify":
        import json
        import os
        path = os.environ.get(RECORDS_ENV)
        if path:  # the checking run (under nbval); run by hand, the verdicts are the cells' errors
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"nonce": _state["nonce"], "kind": kind, "key": key,
                                    "blob": codec.dumps(payload)}) + "\n")
        return
    publish = _state.get("publish")
    if publish is None:
        from IPython.display import publish_display_data as publish
    publish({MIME: {"nonce": _state["nonce"], "kind": kind, "key": key,
                    "blob": codec.dumps(payload)}})


def _rng_states():
    out = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available():   # checks that draw on the GPU draw the same there too
        out["cuda"] = [s.clone() for s in torch.cuda.get_rng_state_all()]
    try:
        import numpy as np
        s = np.random.get_state()
        out["numpy"] = (s[0], torch.from_numpy(s[1].astype("int64")), int(s[2]), int(s[3]),
                        float(s[4]))
    except ImportError:  # pragma: no cover
        pass
    return out


def _set_rng_states(st):
    if not st:
        return
    torch.set_rng_state(st["torch"])
    cuda = st.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    rs = st["random"]
    random.setstate((rs[0], tuple(rs[1]), rs[2]))
    if "numpy" in st:
        import numpy as np
        name, keys, pos, has_gauss, cached = st["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def cell_start(index: int, namespace=None):
    """First line of every template cell: record (reference) or restore the random state,
    and put stand-ins around template kernels defined since the last cell that reach an
    answer's device function (see :func:`_wrap_reaching`)."""
    _state["record"] = True
    if namespace is not None and _state["device"]:
        _wrap_reaching(namespace)
    key = f"cell{index}"
    if _state["mode"] == "reference":
        _publish("rng", key, _rng_states())
    else:
        _set_rng_states(_state["inputs"].get("rng", {}).get(key))


def answer_start(exercise: str | None = None, namespace=None):
    """Before an answer cell: calls made by the student's own code are not recorded;
    note what each global is bound to (see :func:`export`), and forget the
    sources of the cells run so far (check cells hold hidden tests)."""
    _state["record"] = False
    if namespace is not None:
        _state["before"] = {k: id(v) for k, v in namespace.items()}
        _state["held"] = dict(namespace)
        if _state["mode"] == "student":   # the template's kernels as no answer has touched them
            for v in list(namespace.values()):
                if _triton_names(v) is not None and not isinstance(v, _Recorder):
                    _state["prints"].setdefault(id(v), (v, _launch_fingerprint(v)))
    _forget_sources()
    if _state["mode"] != "verify":
        guard_keeper.capture()


def _forget_sources():
    import linecache
    try:
        ip = get_ipython()  # noqa: F821 - defined in a kernel
    except NameError:
        return
    hm = getattr(ip, "history_manager", None)
    for lst in (getattr(hm, "input_hist_parsed", None), getattr(hm, "input_hist_raw", None)):
        if isinstance(lst, list):
            lst[:] = [""] * len(lst)
    out = getattr(hm, "output_hist", None)
    if isinstance(out, dict):
        out.clear()
    ns = ip.user_ns
    for k in [k for k in ns if k in ("_i", "_ii", "_iii", "_", "__", "___")
              or (k.startswith("_i") and k[2:].isdigit()) or (k.startswith("_") and k[1:].isdigit())]:
        ns[k] = ""
    for k in [k for k in linecache.cache if "ipykernel_" in k or k.startswith("<ipython-input")]:
        linecache.cache.pop(k, None)


def _is_function(x) -> bool:
    return callable(x) and not isinstance(x, (torch.Tensor, type))


def _raised(e):
    # the Triton interpreter wraps an error raised in a device function in its own
    # InterpreterError: ship the error the answer raised
    seen = set()
    while type(e).__module__.startswith("triton") and isinstance(e.__cause__, Exception) \
            and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__
    return {"raised": [f"{c.__module__}:{c.__qualname__}" for c in type(e).__mro__],
            "message": str(e)[:2000]}


# --------------------------------------------------------------------------- values as data
def _as_data(x, depth=0):
    """A call's arguments or result as data: tensors copied (so later in-place
    changes do not reach the record); a Triton ``constexpr`` as its value."""
    if depth > 16:
        return x
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if type(x).__name__ == "constexpr" and type(x).__module__.startswith("triton"):
        return _as_data(getattr(x, "value", None), depth + 1)
    if type(x) in (list, tuple):
        return type(x)(_as_data(v, depth + 1) for v in x)
    if type(x) is dict:
        return {k: _as_data(v, depth + 1) for k, v in x.items()}
    return x


# --------------------------------------------------------------------------- device functions
_TRITON_FUNCTIONS = ("JITFunction", "InterpretedFunction")


def _triton_names(obj):
    """The global names the code of a ``@triton.jit`` function refers to (``None``
    for anything else). A stand-in for a template kernel answers for the kernel."""
    if isinstance(obj, _Recorder):
        obj = obj._fn
    elif isinstance(obj, _Replay):
        return obj._code_names
    if type(obj).__name__ not in _TRITON_FUNCTIONS or \
            not type(obj).__module__.startswith("triton"):
        return None
    code = getattr(getattr(obj, "fn", None), "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def _kernels_reaching(targets, namespace, skip=()):
    """The template's outermost Triton functions whose code reaches a name in
    ``targets`` (directly or through other Triton functions of the namespace):
    the kernels whose launches stand for the answer's device functions."""
    jit = {}
    for k, v in list(namespace.items()):
        if isinstance(k, str) and k not in skip and k not in targets:
            names = _triton_names(v)
            if names is not None:
                jit[k] = names
    reach, frontier = set(), set(targets)
    while frontier:
        frontier = {k for k, names in jit.items() if k not in reach and names & frontier}
        reach |= frontier
    return sorted(k for k in reach if not any(k in jit[o] for o in reach if o != k))


def _template_names():
    """Names an answer cell bound (never a template kernel's, in the student's kernel)."""
    return set(_state["answer_bound"])


def _wrap_reaching(namespace):
    for k in _kernels_reaching(_state["device"], namespace, skip=_template_names()):
        kernel = namespace[k]
        if isinstance(kernel, (_Recorder, _Replay)):
            continue
        if _state["mode"] == "verify":
            replay = _state["replays"].get(k)
            if replay is None:
                replay = _Replay(k, _state["inputs"].get("calls", {}).get(k, []))
                replay._code_names = _triton_names(kernel)
                _state["replays"][k] = replay
            namespace[k] = replay
        else:
            names = _triton_names(kernel) or set()
            owners = sorted({ex for f, ex in _state["device"].items() if f in names} or
                            set(_state["device"].values()))
            first = _state["prints"].get(id(kernel))
            held = first[1] if first is not None and first[0] is kernel else \
                _launch_fingerprint(kernel)
            namespace[k] = _Recorder(k, kernel, owners=owners, held=held)


_LAUNCH_PATH = ("run", "__getitem__", "__call__", "_call_hook", "create_binder", "_do_compile",
                "_pack_args", "_init_args_hst", "_restore_args_dev")


_ENTRY_POINTS = (("triton", "compile"), ("triton.compiler", "compile"),
                 ("triton.compiler.compiler", "compile"),
                 ("triton.runtime.interpreter", "GridExecutor"),
                 ("triton.runtime.interpreter", "_patch_lang"))


def _entry_module(name):
    """The module ``name``, imported now if it is not yet: a compiled run imports Triton's
    interpreter only when a check first watches a kernel's loads, and a fingerprint taken
    before that must not read as a change made by an answer."""
    m = sys.modules.get(name)
    if m is None:
        try:
            import importlib
            m = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - no such module in this Triton: nothing to hold
            return None
    return m


def _launch_fingerprint(kernel):
    """What decides what a launch of a template kernel does, by identity: its class and
    the launch methods along the class's MRO, its Python function, that function's code,
    defaults and globals, a launch method set on the kernel object itself, and Triton's
    compile entry points. An answer that swaps any of them (so that the launch does something
    other than the template's kernel calling the answer's device function) changes it."""
    cls = type(kernel)
    fn = getattr(kernel, "fn", None)
    # a check's forbid wraps Triton's launch methods while it is on, to refuse kernels made
    # from a forbidden kernel's function: read through its wrappers to what they wrap
    guards = sys.modules.get("course_utils.guards")
    wrappers = getattr(guards, "_LAUNCH_WRAPPERS", None) or {}

    absent = getattr(guards, "_NO_ATTR", None)

    def under(v):
        w = wrappers.get(id(v))
        while w is not None and w[0] is v:
            v = w[1]
            w = wrappers.get(id(v))
        return v

    def ident(v):
        return id(under(v))

    own = tuple((a, id(vars(kernel).get(a))) for a in _LAUNCH_PATH)
    methods = tuple((c.__qualname__, a, ident(vars(c).get(a))) for c in cls.__mro__
                    for a in _LAUNCH_PATH if a in vars(c) and under(vars(c)[a]) is not absent)
    entry = []
    for mod, attr in _ENTRY_POINTS:
        m = _entry_module(mod)
        if m is not None:
            obj = vars(m).get(attr)
            entry.append((mod, attr, id(obj)))
            if isinstance(obj, type):
                entry.extend((mod, attr, a, ident(v)) for a, v in sorted(vars(obj).items())
                             if callable(v) and under(v) is not absent)
    return (id(cls), id(fn), id(getattr(fn, "__code__", None)),
            id(getattr(fn, "__defaults__", None)), id(getattr(fn, "__globals__", None)),
            own, methods, tuple(entry))


def _is_device_function(name, namespace) -> bool:
    """An answer's name that a template Triton function calls (decided from the
    template's code, so the student's kernel and the verifier agree)."""
    return bool(_kernels_reaching({name}, namespace, skip=_template_names()))


def _tensor_leaves(x, path=(), depth=0):
    """``[(path, tensor)]`` for the tensors in a call's arguments (lists, tuples, dicts)."""
    if isinstance(x, torch.Tensor):
        return [(list(path), x)]
    if depth > 4:
        return []
    if type(x) in (list, tuple):
        return [leaf for i, v in enumerate(x) for leaf in _tensor_leaves(v, path + (i,), depth + 1)]
    if type(x) is dict:
        return [leaf for k, v in x.items() if isinstance(k, (str, int))
                for leaf in _tensor_leaves(v, path + (k,), depth + 1)]
    return []


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a = a.detach().to("cpu").contiguous().reshape(-1)
    b = b.detach().to("cpu").contiguous().reshape(-1)
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a).reshape(-1), torch.view_as_real(b).reshape(-1)
    return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


def _changed(live, snapshot):
    """The tensor arguments a call wrote into: ``[[path, new value]]``."""
    out = []
    before = dict((tuple(p), t) for p, t in _tensor_leaves(snapshot))
    for path, t in _tensor_leaves(live):
        old = before.get(tuple(path))
        if old is not None and not _bytes_equal(old, t):
            out.append([path, t.detach().clone()])
    return out


# --------------------------------------------------------------------------- student kernel
class _Recorder:
    """Student kernel: stands in for an answer's function and ships each call
    the template makes to it (outermost calls only; the random state is put
    back afterwards so the template's next draws do not depend on the answer).
    ``recorder[grid](...)`` records a kernel launch the same way."""

    def __init__(self, name, fn, owners=None, held=None):
        self._name, self._fn = name, fn
        # a template kernel standing for answers' device functions: the exercises they
        # belong to, and what its launch path was before any answer cell ran
        self._owners = owners
        self._held = held
        functools.update_wrapper(self, fn)

    def __getattr__(self, attr):
        if attr.startswith("__") or attr in ("_name", "_fn", "_owners", "_held"):
            raise AttributeError(attr)
        return getattr(object.__getattribute__(self, "_fn"), attr)

    def __call__(self, *args, **kwargs):
        return self._record(None, args, kwargs)

    def __getitem__(self, grid):
        if not _state["record"] or _state["depth"] > 0:
            return functools.partial(_watched, self._fn, grid)
        return functools.partial(_launch, self, grid)

    def _record(self, grid, args, kwargs):
        target = self._fn if grid is None else functools.partial(_watched, self._fn, grid)
        if not _state["record"] or _state["depth"] > 0:
            return target(*args, **kwargs)
        i = _state["calls"].get(self._name, 0)
        _state["calls"][self._name] = i + 1
        rng = _rng_states()
        before = _as_data([list(args), dict(kwargs)])
        payload = {"name": self._name, "index": i, "args": before[0], "kwargs": before[1]}
        if grid is not None:
            payload["grid"] = _as_data(grid)
        _state["depth"] += 1
        # what code the answer left behind changed since its cell ended (see
        # guard_keeper.check_stable_and_restore): put back, and reported with the call
        early = guard_keeper.check_stable_and_restore()
        kept = guard_keeper.snapshot()
        if self._owners is not None and _launch_fingerprint(self._fn) != self._held:
            _state["depth"] -= 1
            what = [f"{self._name} (the template's kernel, changed by an answer)"]
            for ex in self._owners:
                _publish("export", f"{ex}/__tampered__", {"name": "__tampered__",
                                                         "kind": "tampered", "what": what})
            raise RuntimeError(f"the template's kernel {self._name} was changed by an answer")
        try:
            out = target(*args, **kwargs)
            payload["outcome"] = {"returned": _as_data(out)}
            return out
        except Exception as e:
            payload["outcome"] = _raised(e)
            raise
        finally:
            _state["depth"] -= 1
            tampered = early + guard_keeper.check_and_restore(kept)
            if tampered:
                payload["tampered"] = tampered[:20]
            try:
                payload["mutated"] = _changed([list(args), dict(kwargs)], before)
            except Exception:  # noqa: BLE001 - a hostile argument: the stand-in will refuse
                payload["mutated"] = None
            _set_rng_states(rng)
            _publish("call", f"{self._name}/{i}", payload)


def _launch(recorder, grid, *args, **kwargs):
    return recorder._record(grid, args, kwargs)


def _watched(kernel, grid, *args, **kwargs):
    """``kernel[grid](...)``, watched by an open ``kernel_loads.loads_within`` block on a GPU
    (run again in the interpreter, its results NaN after a load outside the tensors)."""
    from course_utils.kernel_loads import watched_launch
    return watched_launch(kernel, grid, args, kwargs)


def export(exercise: str, names, namespace, protect=()):
    """After an answer cell (student kernel): ship its values, wrap its functions.

    Only what this exercise's own answer cell defines counts: a name of this
    exercise that the cell left as an earlier answer cell (another exercise's)
    had bound it is shipped as defined elsewhere, and removed, so that it earns
    nothing here. ``protect``: the names the template's later cells read; one the
    cell rebound or deleted (not one of the exercise's own, nor an earlier answer's)
    gets the template's object back, as the checking kernel has it, so that a check
    calls the template's helpers and not a replacement that never calls the answer (an
    answer function that reads such a name sees the template's object from then on)."""
    _state["record"] = True
    tampered = guard_keeper.check_and_restore()
    if tampered:
        _publish("export", f"{exercise}/__tampered__", {"name": "__tampered__",
                                                        "kind": "tampered", "what": tampered[:20]})
    before, _state["before"] = _state.get("before"), None
    held, _state["held"] = _state.get("held"), None
    bound = _state["answer_bound"]
    if before is not None and held is not None:
        for k in protect:
            if k in held and k not in names and k not in bound and \
                    not _IPYTHON_NAME.match(k) and (k not in namespace or namespace[k] is not held[k]):
                namespace[k] = held[k]
    if before is not None:   # what this answer cell bound (answer_start took the picture)
        for k, v in list(namespace.items()):
            if before.get(k) != id(v):
                bound[k] = (exercise, id(v))
    for name in names:
        origin = bound.get(name) if before is not None else None
        if name in namespace and origin is not None and origin[0] != exercise and \
                origin[1] == id(namespace[name]):
            namespace.pop(name, None)
            _publish("export", f"{exercise}/{name}", {"name": name, "kind": "elsewhere",
                                                      "exercise": origin[0]})
            continue
        if name not in namespace:
            _publish("export", f"{exercise}/{name}", {"name": name, "kind": "missing"})
            continue
        value = namespace[name]
        if isinstance(value, _Recorder):
            value = value._fn
        if _is_device_function(name, namespace):
            namespace[name] = value
            _state["device"][name] = exercise
            _wrap_reaching(namespace)
            _publish("export", f"{exercise}/{name}", {"name": name, "kind": "function"})
        elif _is_function(value):
            namespace[name] = _Recorder(name, value)
            _publish("export", f"{exercise}/{name}", {"name": name, "kind": "function"})
        else:
            _publish("export", f"{exercise}/{name}", {"name": name, "kind": "data",
                                                      "value": value})


class Mismatch(RuntimeError):
    """The verifier computed other inputs for a function than the student's kernel did."""


def _same(a, b) -> bool:
    if isinstance(a, codec.Record) or isinstance(b, codec.Record):
        return (isinstance(a, codec.Record) and isinstance(b, codec.Record)
                and a.name == b.name and a.fields == b.fields and _same(a.values, b.values))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and a.dtype == b.dtype
                and bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001
        return False


class _Replay:
    """Verifier kernel: stands in for an answer's function, call by call."""

    def __init__(self, name, calls):
        self._name, self._calls, self._i = name, calls, 0
        self._code_names = None   # for a template kernel: the names its code refers to
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return self._replay(None, args, kwargs)

    def __getitem__(self, grid):
        return functools.partial(_launch_replay, self, grid)

    def _replay(self, grid, args, kwargs):
        i, self._i = self._i, self._i + 1
        what = self._name if grid is None else f"the launch {self._name}[grid]"
        if i >= len(self._calls):
            raise Mismatch(f"{what} is called here more often ({i + 1} times) than it "
                           "was when your notebook ran")
        rec = self._calls[i]
        if ("grid" in rec) != (grid is not None):
            raise Mismatch(f"call {i + 1} of {self._name}: it was "
                           f"{'launched as a kernel' if 'grid' in rec else 'called'} when your "
                           f"notebook ran and is {'called' if grid is None else 'launched'} here")
        want = codec.decode(codec.encode(_as_data([list(args), dict(kwargs)])))
        if not _same(want, [rec.get("args"), rec.get("kwargs")]) or \
                (grid is not None and not _same(codec.decode(codec.encode(_as_data(grid))),
                                                rec.get("grid"))):
            raise Mismatch(f"call {i + 1} of {self._name}: its inputs differ from the ones "
                           "the same check computed when your notebook ran")
        mutated = rec.get("mutated", [])
        if not isinstance(mutated, list):
            raise Mismatch(f"call {i + 1} of {self._name}: what it wrote into its arguments "
                           "could not be recorded")
        live = dict((tuple(p), t) for p, t in _tensor_leaves([list(args), dict(kwargs)]))
        for item in mutated:
            path, value = (item if isinstance(item, list) and len(item) == 2 else (None, None))
            dest = live.get(tuple(path)) if isinstance(path, list) else None
            if dest is None or not isinstance(value, torch.Tensor) or \
                    dest.shape != value.shape or dest.dtype != value.dtype:
                raise Mismatch(f"call {i + 1} of {self._name}: a recorded change to its "
                               "arguments does not fit them")
            with torch.no_grad():
                dest.copy_(value.to(dest.device))
        out = rec.get("outcome") or {}
        if "returned" in out:
            return codec.materialise(out["returned"])
        msg = str(out.get("message", ""))
        for name in out.get("raised") or []:
            cls = codec.exception_class(name)   # a class of the student's: try its bases
            if cls is not None:
                try:
                    exc = cls(msg)
                except Exception:  # noqa: BLE001
                    continue
                raise exc
        raise Exception(msg)


def _launch_replay(replay, grid, *args, **kwargs):
    return replay._replay(grid, args, kwargs)


def bind(exercise: str, names, namespace):
    """In place of an answer cell (verifier kernel): define what the student's answer exported."""
    exports = _state["inputs"].get("exports", {})
    calls = _state["inputs"].get("calls", {})
    for name in names:
        item = exports.get(f"{exercise}/{name}")
        if not isinstance(item, dict) or item.get("kind") not in ("function", "data"):
            namespace.pop(name, None)
        elif item.get("kind") == "function":
            namespace[name] = _Replay(name, calls.get(name, []))
            if _is_device_function(name, namespace):
                _state["device"][name] = exercise
                _wrap_reaching(namespace)
        else:
            namespace[name] = codec.materialise(item.get("value"))


def _key(exercise, site):
    k = (exercise, site)
    hit = _state["hits"].get(k, 0)
    _state["hits"][k] = hit + 1
    return f"{exercise}/c{site}/{hit}"


def verify_call(exercise: str, site: int, fn, *args, **kwargs):
    """A check call in the verifier kernel: run it for real and ship the verdict."""
    key = _key(exercise, site)
    name = f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
    label = kwargs.get("name") if isinstance(kwargs.get("name"), str) else name.split(":")[-1]
    try:
        result = fn(*args, **kwargs)
    except Exception as e:
        _state["failed"].setdefault(exercise, []).append(label)
        _publish("verdict", key, {"fn": name, "label": label, "passed": False,
                                  "message": f"{e}" if isinstance(e, AssertionError)
                                  else f"{type(e).__name__}: {e}"})
        _state["reported"] = e
        raise
    _publish("verdict", key, {"fn": name, "label": label, "passed": True, "message": ""})
    return result


def stopped(exercise: str, site: int, err: BaseException):
    """A check statement of the verifier stopped with ``err``. When the check itself
    failed its verdict is already out; otherwise computing its arguments raised (an
    answer function's recorded error, or a missing answer), and that call is
    recorded as not reached, with the reason. The check cell then goes on."""
    if _state.get("reported") is err:
        _state["reported"] = None
        return
    _state["failed"].setdefault(exercise, []).append(f"a check not reached ({type(err).__name__})")
    _publish("stop", _key(exercise, site), {"message": f"{type(err).__name__}: {err}"[:2000]})


class ExerciseFailed(AssertionError):
    """The checking notebook's verdict on one exercise (the last line of its check cell)."""


def end_check(exercise: str):
    """Last statement of a check cell in the checking notebook: the cell fails
    (so ``pytest --nbval`` reports the exercise as failed) when any of its checks did."""
    failed = _state["failed"].pop(exercise, [])
    if failed:
        raise ExerciseFailed(f"exercise {exercise}: {len(failed)} check(s) failed: "
                             + "; ".join(str(f) for f in failed[:5]))
