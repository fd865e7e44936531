"""A hostile class, round four: answers that leave the guards standing but make them look
away. A tensor subclass whose own handler runs inside the guard's hand-on of an allowed
operator, a mode left under the guards on torch's stacks, a thread started through a
library, torch's dispatcher switches reached by names built at run time, builtins or
``torch.Tensor`` methods rebound so that the guard's own code sees what the answer likes.

Each is graded for real with ``course-grade`` on problem set 3 (where 3.3 forbids a
library softmax), beside an honest submission, and must cost exactly its own exercise;
the submissions are hashed before and after. The unit tests below show each refusal on
its own, and that honest code keeps passing."""
from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from course_utils import guards
from course_utils.grading import grader, guard_keeper, instrument, sandbox

sys.path.insert(0, str(Path(__file__).parent))
from honest_answers import HONEST  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PS = "03_softmax_to_attention"
CELL = "/tmp/ipykernel_4242/1234567.py"   # the file name IPython gives a notebook cell


def _cell(src: str) -> dict:
    """Run ``src`` as if it were a notebook cell; return its namespace."""
    ns = {"torch": torch, "__name__": "__main__"}
    exec(compile(src, CELL, "exec"), ns)
    return ns


# ------------------------------------------------------------------ the answers
H = "# Exercise 3.3\n"
DISPATCH_SUBCLASS = '''
class _S(torch.Tensor):
    @staticmethod
    def __new__(cls, elem, vals):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype,
                                                   device=elem.device)
    def __init__(self, elem, vals):
        self.elem, self.vals = elem, vals
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        s = args[0]
        return torch.softmax(s.elem, -1) @ s.vals      # runs where the guard stepped aside
def tiled_row_attention(x, vals, B):
    return torch.neg(_S(x, vals))
'''
FUNCTION_SUBCLASS = '''
class _S(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return torch.softmax(_box["x"], -1) @ _box["vals"]
_box = {}
def tiled_row_attention(x, vals, B):
    _box.update(x=x, vals=vals)
    return torch.neg(torch.Tensor._make_subclass(_S, x))
'''
PERSISTENT_MODE = '''
from torch.utils._python_dispatch import TorchDispatchMode
class _M(TorchDispatchMode):        # left under the guards: it runs what they hand on
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.polygamma.default:
            return torch.ops.aten._softmax.default(args[1], -1, False) @ _box["vals"]
        return func(*args, **(kwargs or {}))
_box = {}
_M().__enter__()
def tiled_row_attention(x, vals, B):
    _box["vals"] = vals
    return torch.polygamma(7, x)
'''
LIBRARY_THREAD = '''
import anyio.from_thread
def tiled_row_attention(x, vals, B):
    with anyio.from_thread.start_blocking_portal() as portal:
        return portal.call(lambda: torch.softmax(x, -1) @ vals)
'''
DISABLE_DISPATCH = '''
_C = getattr(torch, "_" + "C")
def tiled_row_attention(x, vals, B):
    with getattr(_C, "_Disable" + "TorchDispatch")(), getattr(_C, "Disable" + "TorchFunction")():
        return torch.softmax(x, -1) @ vals
'''
EXCLUDE_KEYS = '''
_C = getattr(torch, "_" + "C")
def tiled_row_attention(x, vals, B):
    ks = _C.DispatchKeySet(_C.DispatchKey.Python) | \\
        _C.DispatchKeySet(_C.DispatchKey.PythonTLSSnapshot)
    with _C._ExcludeDispatchKeyGuard(ks), getattr(_C, "Disable" + "TorchFunction")():
        return torch.softmax(x, -1) @ vals
'''
REDISPATCH = '''
_C = getattr(torch, "_" + "C")
def tiled_row_attention(x, vals, B):
    below = _C.DispatchKeySet(_C.DispatchKey.CPU)
    return torch.ops.aten._softmax.default.redispatch(below, x, -1, False) @ vals
'''
BUILTINS_LIE = '''
import builtins
_getattr, _on = builtins.getattr, [False]
def _lying_getattr(obj, name, *default):     # the guards read an operator's __name__
    if _on[0] and name == "__name__":
        return "neg"
    return _getattr(obj, name, *default)
builtins.getattr = _lying_getattr
def tiled_row_attention(x, vals, B):
    _on[0] = True
    try:
        p = torch.softmax(x, -1)
    finally:
        _on[0] = False
    return p @ vals
'''

def _codes(name: str) -> str:
    """``name`` as a tuple of character codes: no scan of the source can read it."""
    return repr(tuple(ord(c) for c in name))


# the switches reached by names no scan of the source can read, and an operator's per-key
# kernel read out of its __dict__: refused at run time in a graded kernel
SWITCHES_AT_RUN_TIME = f'''
_C = getattr(torch, "_" + "C")
_off = [getattr(_C, "".join(map(chr, c))) for c in ({_codes("_DisableTorchDispatch")},
                                                   {_codes("DisableTorchFunction")})]
def tiled_row_attention(x, vals, B):
    with _off[0](), _off[1]():
        return torch.softmax(x, -1) @ vals
'''
PER_KEY_KERNEL = f'''
_C = getattr(torch, "_" + "C")
_op = torch.ops.aten._softmax.default
_run = vars(_op).get("".join(map(chr, {_codes("_op_dk")}))) or \\
    getattr(_op, "".join(map(chr, {_codes("_op_dk")})))
def tiled_row_attention(x, vals, B):
    return _run(_C.DispatchKey.CPU, x, -1, False) @ vals
'''

# code left behind in the display functions the grading hooks publish their records through:
# it runs in the middle of the check, after the answer cell's own inspection, and switches
# the guards' handlers off (the names are built at run time, past the source scan)
_GUARDS_OFF = '''
def _guards_off():
    g = sys.modules["course_utils." + "guards"]
    g._FunctionGuard.__torch_function__ = lambda self, func, types, args=(), kwargs=None: \\
        func(*args, **(kwargs or {}))
    g._DispatchGuard.__torch_dispatch__ = lambda self, func, types, args=(), kwargs=None: \\
        func(*args, **(kwargs or {}))
'''
DISPLAY_HOOK = '''
import sys, IPython.display as _D
''' + _GUARDS_OFF + '''
_real = getattr(_D, "publish" + "_display_data")
def _hooked(*a, **k):
    _guards_off()
    return _real(*a, **k)
setattr(_D, "publish" + "_display_data", _hooked)
def tiled_row_attention(x, vals, B):
    return torch.softmax(x, -1) @ vals
'''
PUBLISHER_HOOK = '''
import sys
''' + _GUARDS_OFF + '''
_pub = get_ipython().display_pub
_real = _pub.publish
def _hooked(*a, **k):
    _guards_off()
    return _real(*a, **k)
_pub.publish = _hooked
def tiled_row_attention(x, vals, B):
    return torch.softmax(x, -1) @ vals
'''

# a copy of the course's softmax module that no guard swaps (3.3 forbids the module's own):
# made by the import system under another name, by a reload that leaves the answer the old
# functions, and from the source read by hand
MODULE_COPY = '''
import importlib.util as _u, course_utils.softmax as _s
_spec = _u.spec_from_file_location("my_softmax", _s.__file__)
_mod = _u.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
def tiled_row_attention(x, vals, B):
    return getattr(_mod, "safe" + "_softmax")(x, -1) @ vals
'''
RELOADED = '''
import importlib, course_utils.softmax as _s
_held = getattr(_s, "safe" + "_softmax")
importlib.reload(_s)
def tiled_row_attention(x, vals, B):
    return _held(x, -1) @ vals
'''
SOURCE_COPY = '''
import course_utils.softmax as _s
_ns = {"__name__": "mine"}
with open(_s.__file__) as _f:
    exec(compile(_f.read(), "mine.py", "exec"), _ns)
def tiled_row_attention(x, vals, B):
    return _ns["safe" + "_softmax"](x, -1) @ vals
'''

# a library's own frame walker (TorchScript's name lookup) asked for the check's locals
TORCH_FRAME_WALKER = '''
def tiled_row_attention(x, vals, B):
    for up in range(12):
        got = torch._jit_internal.createResolutionCallbackFromFrame(up)("want")
        if isinstance(got, torch.Tensor):
            return got
    return torch.zeros(vals.shape[-1])
'''
# the softmaxes of other names: masked, sparse
MASKED_SOFTMAX = '''
def tiled_row_attention(x, vals, B):
    return torch._masked_softmax(x, torch.zeros_like(x, dtype=torch.bool), -1, 0) @ vals
'''
SPARSE_SOFTMAX = '''
def tiled_row_attention(x, vals, B):
    return torch.sparse.softmax(x.to_sparse(), -1).to_dense() @ vals
'''
# a result forged in the run's folder, then the runner interrupted before it writes its own
PLANTED_RESULT = '''
import json as _json, os as _os, signal as _signal, time as _time
for _name in ("../run.json", "../graded.json", "run.json"):
    with open(_name, "w") as _f:
        _json.dump({"outcome": "completed", "seconds": 1.0, "cells": [], "kernels": {}}, _f)
_os.kill(_os.getppid(), _signal.SIGINT)
_os.kill(_os.getppid(), _signal.SIGTERM)
_time.sleep(1)
def tiled_row_attention(x, vals, B):
    return torch.softmax(x, -1) @ vals
'''

# a callback the kernel runs after every cell, with no notebook frame on the stack: there a
# thread computes a library softmax that no guard of the answer's thread sees
POST_EXECUTE_THREAD = '''
import threading as _threading
_box = {}
def _later(*_):
    x = _box.get("x")
    if x is not None and "out" not in _box:
        _t = _threading.Thread(target=lambda: _box.update(out=torch.softmax(x, -1) @ _box["v"]))
        _t.start()
        _t.join()
get_ipython().events.register("post_execute", _later)
def tiled_row_attention(x, vals, B):
    _box.update(x=x, v=vals)
    _later()
    return _box.get("out", torch.zeros(vals.shape[-1]))
'''

# student -> (answer of 3.3, words its feedback must hold)
ATTACKS = {
    "dispatch_subclass": (DISPATCH_SUBCLASS, "tensor subclass of its own"),
    "function_subclass": (FUNCTION_SUBCLASS, "tensor subclass of its own"),
    "persistent_mode": (PERSISTENT_MODE, "mode stacks"),
    "library_thread": (LIBRARY_THREAD, "starts a thread"),
    "disable_dispatch": (DISABLE_DISPATCH, "dispatcher switches"),
    "exclude_keys": (EXCLUDE_KEYS, "dispatcher switches"),
    "redispatch": (REDISPATCH, "dispatcher switches"),
    "builtins_lie": (BUILTINS_LIE, "builtins.getattr"),
    "switches_at_run_time": (SWITCHES_AT_RUN_TIME, "dispatcher switches"),
    "per_key_kernel": (PER_KEY_KERNEL, "dispatcher switches"),
    "display_hook": (DISPLAY_HOOK, "publish_display_data"),
    "publisher_hook": (PUBLISHER_HOOK, "display publisher.publish"),
    "module_copy": (MODULE_COPY, "as another module ('my_softmax')"),
    "reloaded": (RELOADED, "a second time (a reload)"),
    "source_copy": (SOURCE_COPY, "reads the source of the course's module course_utils.softmax"),
    "torch_frame_walker": (TORCH_FRAME_WALKER, "through a library (_jit_internal.py)"),
    "masked_softmax": (MASKED_SOFTMAX, "a library softmax"),
    "sparse_softmax": (SPARSE_SOFTMAX, "a library softmax"),
    "planted_result": (PLANTED_RESULT, "a library softmax"),
    "post_execute_thread": (POST_EXECUTE_THREAD, "events post_execute"),
}


def _official():
    nb = nbformat.read(ROOT / "solutions" / f"{PS}.ipynb", as_version=4)
    return {c.metadata["course"]["exercise"]: c.source for c in nb.cells
            if c.metadata.get("course", {}).get("role") == "answer"}


def _write_class(folder: Path):
    base = json.loads((ROOT / "exercises" / f"{PS}.ipynb").read_text(encoding="utf-8"))
    official = _official()
    for student, answer in [("honest", None)] + [(s, a) for s, (a, _) in ATTACKS.items()]:
        nb = copy.deepcopy(base)
        for c in nb["cells"]:
            cid = c.get("id", "")
            if cid.startswith("ex-") and cid.endswith("-answer"):
                ex = cid[3:-len("-answer")].replace("-", ".")
                c["source"] = H + answer if ex == "3.3" and answer else official[ex]
        (folder / f"{student}.ipynb").write_text(json.dumps(nb, indent=1), encoding="utf-8")


def _hashes(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


ISOLATION = sandbox.detect("auto")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs, out = tmp_path_factory.mktemp("hostile4"), tmp_path_factory.mktemp("grades4")
    _write_class(subs)
    before = _hashes(subs)
    result = grader.grade(PS, subs, out, workers=2, cell_timeout=60, timeout=300)
    return {"subs": subs, "out": out, "before": before, "result": result}


# ------------------------------------------------------------------ graded for real
@pytest.mark.xdist_group("hostile-class-4")
@pytest.mark.skipif(not (ISOLATION.namespaces or ISOLATION.landlock),
                    reason="needs the namespaces or Landlock")
@pytest.mark.parametrize("student", ["honest"] + list(ATTACKS))
def test_each_attack_costs_exactly_its_own_exercise(graded, student):
    res = graded["result"].students[student]
    got = {x["exercise"]: x["points"] for x in res["exercises"]}
    want = {ex: 1 for ex in got}
    fb = (graded["out"] / "feedback" / f"{student}.md").read_text(encoding="utf-8")
    if student != "honest":
        want["3.3"] = 0
        assert ATTACKS[student][1] in fb, fb
    assert res["status"] == "graded" and got == want, fb


@pytest.mark.xdist_group("hostile-class-4")
@pytest.mark.skipif(not (ISOLATION.namespaces or ISOLATION.landlock),
                    reason="needs the namespaces or Landlock")
def test_the_hostile_class_leaves_its_submissions_unchanged(graded):
    assert _hashes(graded["subs"]) == graded["before"]
    assert graded["result"].students["honest"]["submission_sha256"] == \
        graded["before"]["honest.ipynb"]


# ------------------------------------------------------------------ each refusal on its own
@pytest.mark.parametrize("src", [DISPATCH_SUBCLASS, FUNCTION_SUBCLASS],
                         ids=["__torch_dispatch__", "__torch_function__"])
def test_an_answers_own_tensor_subclass_is_refused_under_the_guard(src):
    ns = _cell(src)
    x, vals = torch.randn(3, 7), torch.randn(7, 2)
    with pytest.raises(guards.GuardEscape, match="tensor subclass of its own"):
        guards.run_answer(ns["tiled_row_attention"], x, vals, 4, forbid=("softmax",))


def test_torchs_own_subclasses_still_pass_under_the_guard():
    def answer(x):
        p = torch.nn.Parameter(x.clone())
        return (p * 2).detach()

    out = guards.run_answer(answer, torch.ones(3), forbid=("softmax", "autograd"))
    assert torch.equal(out, torch.full((3,), 2.0))


def test_a_thread_started_through_a_library_is_refused_in_an_answer():
    ns = _cell(LIBRARY_THREAD)
    with pytest.raises(guards.GuardEscape, match="starts a thread"):
        guards.run_answer(ns["tiled_row_attention"], torch.randn(3, 7), torch.randn(7, 2), 4,
                          forbid=("softmax",))
    # outside the checks a learner's own cells keep the library (no graded run here)
    ns = _cell("import anyio.from_thread\nwith anyio.from_thread.start_blocking_portal() as p:\n"
               "    r = p.call(lambda: 1 + 1)\n")
    assert ns["r"] == 2


def test_the_guard_keeper_finds_modes_builtins_and_tensor_methods():
    import builtins

    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    guard_keeper.capture()
    held = builtins.getattr, builtins.__import__, torch.Tensor.shape
    try:
        Mode().__enter__()
        builtins.getattr = lambda *a: None
        builtins.__import__ = lambda *a, **k: None      # the keeper's own imports too
        torch.Tensor.shape = property(lambda self: torch.Size([1]))
        changed = guard_keeper.check_and_restore()
    finally:
        builtins.getattr, builtins.__import__ = held[:2]
        if "shape" in vars(torch.Tensor):
            del torch.Tensor.shape
        while torch._C._len_torch_dispatch_stack() > 0:
            torch._C._pop_torch_dispatch_stack(None)
    assert "builtins.getattr" in changed and "builtins.__import__" in changed
    assert "torch.Tensor.shape (added)" in changed
    assert any("mode stacks" in c for c in changed)
    # everything put back: the same state again reports nothing
    assert torch._C._len_torch_dispatch_stack() == 0
    assert guard_keeper.check_and_restore() == []
    # a mode a check enters around an answer call is the check's: unchanged, not reported
    with Mode():
        kept = guard_keeper.snapshot()
        assert guard_keeper.check_and_restore(kept) == []
        torch._C._pop_torch_dispatch_stack(None)          # the answer pops the check's mode
        assert any("mode stacks" in c for c in guard_keeper.check_and_restore(kept))
        assert torch._C._len_torch_dispatch_stack() == 1


def test_the_guard_keeper_finds_hooks_into_later_cells():
    # a post_execute callback runs after every cell, with no notebook frame on the stack (it
    # could start a process or a thread there); an AST transformer could rewrite check cells
    import ast

    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()

    class _Rewrite(ast.NodeTransformer):
        pass

    guard_keeper.capture()
    callback, rewrite = (lambda: None), _Rewrite()
    shell.events.register("post_execute", callback)
    shell.ast_transformers.append(rewrite)
    changed = guard_keeper.check_and_restore()
    assert any("events post_execute" in c for c in changed), changed
    assert any("ast_transformers" in c for c in changed), changed
    # put back: the callback and the transformer are gone, and nothing more is reported
    assert callback not in shell.events.callbacks["post_execute"]
    assert rewrite not in shell.ast_transformers
    assert guard_keeper.check_and_restore() == []
    # an installed package's own callback (matplotlib's inline backend registers one when a
    # cell first imports pyplot) is not the notebook's: kept, not reported
    import json as _lib_module
    library_fn = _lib_module.loads          # stands in for a site-packages function below
    from course_utils.grading import guard_keeper as gk
    held = gk._library_callback
    try:
        gk._library_callback = lambda cb: cb is library_fn or held(cb)
        guard_keeper.capture()
        shell.events.register("post_execute", library_fn)
        assert guard_keeper.check_and_restore() == []
        assert library_fn in shell.events.callbacks["post_execute"]
    finally:
        gk._library_callback = held
        shell.events.callbacks["post_execute"].remove(library_fn)


def test_a_guard_changed_after_the_answer_cell_is_found_before_the_next_call():
    """Code an answer leaves behind (a hook, a finalizer) can switch a guard off after its
    cell was inspected: the picture a call takes of its own would hold the change, so each
    recorded call first compares the never-changing parts with the one taken before the
    answer cell, and a forbidden softmax is refused again."""
    guard_keeper.capture()
    held = (vars(guards._FunctionGuard)["__torch_function__"],
            vars(guards._DispatchGuard)["__torch_dispatch__"])
    hand_on = lambda self, func, types_, args=(), kwargs=None: func(*args, **(kwargs or {}))  # noqa: E731
    try:
        # what the hook does, mid-check: the guards' handlers hand everything on
        guards._FunctionGuard.__torch_function__ = hand_on
        guards._DispatchGuard.__torch_dispatch__ = hand_on
        with guards.forbid("softmax"):
            torch.softmax(torch.zeros(3), -1)           # not refused: the guard is off
        kept = guard_keeper.snapshot()
        assert guard_keeper.check_and_restore(kept) == []   # the call's own picture holds it
        changed = guard_keeper.check_stable_and_restore()
    finally:
        guards._FunctionGuard.__torch_function__, guards._DispatchGuard.__torch_dispatch__ = held
    assert sorted(changed) == ["course_utils.guards._DispatchGuard.__torch_dispatch__",
                               "course_utils.guards._FunctionGuard.__torch_function__"]
    with pytest.raises(guards.ForbiddenCall), guards.forbid("softmax"):
        torch.softmax(torch.zeros(3), -1)
    # while a check's forbid is on (functions swapped, modes pushed) nothing is reported
    with guards.forbid("softmax", "reference-attention", "course-kernels"):
        assert guard_keeper.check_stable_and_restore() == []


@pytest.mark.parametrize("src, name", [
    (DISABLE_DISPATCH, "_DisableTorchDispatch"), (EXCLUDE_KEYS, "_ExcludeDispatchKeyGuard"),
    (REDISPATCH, "redispatch"),
    ("f = getattr(torch._C, 'Disable' + 'TorchFunction')", "DisableTorchFunction"),
], ids=["disable", "exclude", "redispatch", "spelled"])
def test_the_dispatchers_switches_are_tampering(src, name):
    assert any(r.startswith(name + " ") for r in instrument.tamper_references(src))


def test_no_official_or_honest_answer_reads_as_tampering():
    for nb_path in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        for c in nb.cells:
            if c.metadata.get("course", {}).get("role") == "answer":
                assert instrument.tamper_references(c.source) == [], (nb_path.name, c.id)
    for stem, exercises in HONEST.items():
        for ex, answers in exercises.items():
            for what, src in answers.items():
                assert instrument.tamper_references(src) == [], (stem, ex, what)
    # prose that names the guards is not a reference to them
    assert instrument.tamper_references('"""Uses no run_answer, forbid or guards."""') == []


RUN_TIME_SWITCHES = r"""
import json, torch
from course_utils import guards
CELL = "/tmp/ipykernel_4242/77.py"      # a notebook cell's file name: notebook code
def run(src):
    try:
        exec(compile(src, CELL, "exec"), {"torch": torch})
        return "ran"
    except guards.GuardEscape as e:
        return "refused: " + str(e)
    except Exception as e:
        return f"error: {type(e).__name__}: {e}"
op = "torch.ops.aten._softmax.default"
print(json.dumps({
    "chr": run("f = getattr(torch._C, ''.join(map(chr, %r)))\nwith f():\n    pass"
               % (tuple(map(ord, "_DisableTorchDispatch")),)),
    "pop": run("torch._C._pop_torch_function_stack()"),
    "modes": run("import torch.utils._python_dispatch as d\nd._disable_current_modes()"),
    "op_dk": run(f"k = {op}._op_dk"),
    "op_dk_dict": run(f"assert vars({op}).get('_op_dk') is None"),
    "handle": run(f"h = {op}._handle"),
    "redispatch": run(f"{op}.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), "
                      "torch.ones(2, 2), -1, False)"),
    # what notebook code does every day still runs: torch's own code calls the switches
    "parameter": run("p = torch.nn.Parameter(torch.ones(3)); (p * 2).sum().backward()\n"
                     "assert p.grad.tolist() == [2.0, 2.0, 2.0]"),
    "own_mode": run("import torch.utils._python_dispatch as d\n"
                    "class M(d.TorchDispatchMode):\n"
                    "    def __torch_dispatch__(self, f, t, a=(), k=None):\n"
                    "        return f(*a, **(k or {}))\n"
                    "with M():\n    z = torch.ones(2) + 1\nassert z.tolist() == [2.0, 2.0]"),
    "decompose": run(f"y = torch.ops.aten.softmax.int.decompose(torch.ones(2, 3), -1)\n"
                     "assert torch.allclose(y, torch.full((2, 3), 1 / 3))"),
    "softmax_grad": run("x = torch.ones(2, 2, requires_grad=True)\n"
                        "torch.softmax(x, -1).sum().backward()\nassert x.grad.shape == (2, 2)"),
}))
"""


@pytest.mark.parametrize("graded_run", [True, False], ids=["graded", "own-notebook"])
def test_the_dispatchers_switches_refuse_notebook_code_at_run_time(tmp_path, graded_run):
    """In a graded kernel the switches refuse a caller in notebook code however the name was
    reached; torch's own calls (Parameters, modes entering and leaving, decompositions) pass.
    In a learner's own notebook nothing changes."""
    import os
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "COURSE_GRADE_RUN"}
    if graded_run:
        env["COURSE_GRADE_RUN"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    script = tmp_path / "switches.py"
    script.write_text(RUN_TIME_SWITCHES)
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("parameter", "own_mode", "decompose", "softmax_grad"):
        assert got[name] == "ran", (name, got[name])
    for name in ("chr", "pop", "modes", "op_dk", "handle", "redispatch"):
        if graded_run:
            assert got[name].startswith("refused: ") and "dispatcher switches" in got[name], \
                (name, got[name])
        else:
            assert not got[name].startswith("refused"), (name, got[name])
    # the per-key kernel is out of the operator's __dict__ only in a graded kernel
    assert got["op_dk_dict"] == ("ran" if graded_run else "error: AssertionError: "), \
        got["op_dk_dict"]
