"""Answers that reach around the guards instead of computing: reading the checker's
expected values from its frames, forbidden calls made in a thread or a process, a
backward pass run through the autograd engine directly, a copy of a guarded course
function, lifting the guard from inside the answer. Each must be refused, and honest
answers must still pass."""
import gc
import inspect
import os
import subprocess
import sys
import threading
import types

import pytest
import torch

from course_utils import guards
from course_utils.guards import ForbiddenCall
import triton.language as tl  # noqa: E402,I001 - after course_utils, which picks the interpreter

CELL = "/tmp/ipykernel_4242/1234567.py"   # the file name IPython gives a notebook cell


def _cell(src: str) -> dict:
    """Run ``src`` as if it were a notebook cell; return its namespace."""
    ns = {"torch": torch, "__name__": "__main__"}
    exec(compile(src, CELL, "exec"), ns)
    return ns


def _own_row_dot(O, DO, OUT, n, D: tl.constexpr, BLOCK: tl.constexpr):
    """A learner's Delta kernel (jitted in the test that uses it)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    base = tl.program_id(1) * n * D
    ok = rows[:, None] < n
    o = tl.load(O + base + rows[:, None] * D + cols[None, :], mask=ok, other=0.0)
    do = tl.load(DO + base + rows[:, None] * D + cols[None, :], mask=ok, other=0.0)
    tl.store(OUT + tl.program_id(1) * n + rows, tl.sum(o * do, 1), mask=rows < n)


def _checker(answer, *args, forbid=("softmax",)):
    """A check that holds the expected value in a local, as the problem sets do."""
    want = torch.full((3,), 42.0)  # noqa: F841 - what a frame walk looks for
    expected = ref = want          # noqa: F841
    return guards.run_answer(answer, *args, forbid=forbid, exercise="9.9")


def _steal(f):
    while f is not None:
        if "want" in f.f_locals:
            return f.f_locals["want"]
        f = f.f_back
    return torch.zeros(3)


def _via_traceback(x):
    try:
        raise ValueError
    except ValueError as e:
        return _steal(e.__traceback__.tb_frame)


def _via_generator(x):
    def gen():
        yield
    g = gen()
    next(g, None)
    return _steal(g.gi_frame)


def _via_gc(x):
    for o in gc.get_referrers(x):
        if isinstance(o, dict) and "want" in o:
            return o["want"]
    return torch.zeros(3)


@pytest.mark.parametrize("answer", [
    lambda x: _steal(sys._getframe(1)),
    lambda x: _steal(inspect.currentframe()),
    lambda x: _steal(inspect.stack()[1].frame),
    _via_traceback,
    _via_generator,
    _via_gc,
    lambda x: [o for o in gc.get_objects() if isinstance(o, types.FrameType)],
], ids=["getframe", "currentframe", "stack", "traceback", "generator", "gc-referrers",
        "gc-objects"])
def test_frame_stealing_is_refused(answer):
    with pytest.raises(ForbiddenCall, match="your answer (inspects the checker's frames|reads)"):
        _checker(answer, torch.zeros(3))


def _in_thread(x):
    box = []
    t = threading.Thread(target=lambda: box.append(torch.softmax(x, 0)))
    t.start()
    t.join()
    return box[0] if box else None


def _in_raw_thread(x):
    import _thread
    import time
    box = []
    _thread.start_new_thread(lambda: box.append(torch.softmax(x, 0)), ())
    for _ in range(200):
        if box:
            break
        time.sleep(0.01)
    return box[0] if box else None


def _in_process(x):
    out = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True)
    return torch.full_like(x, float(out.stdout))


@pytest.mark.parametrize("answer", [_in_thread, _in_raw_thread, _in_process,
                                    lambda x: os.system("true")],
                         ids=["thread", "_thread", "subprocess", "os.system"])
def test_threads_and_processes_are_refused(answer):
    with pytest.raises(ForbiddenCall, match="starts a (thread|process)"):
        guards.run_answer(answer, torch.randn(5), forbid=("softmax",))


def _run_backward(p):
    p = p.detach().requires_grad_(True)
    with torch.enable_grad():
        o = (p * p).sum()
    return torch.autograd.Variable._execution_engine.run_backward(
        (o,), (torch.ones(()),), False, False, (p,), False, False)[0]


def _engine_base(p):
    p = p.detach().requires_grad_(True)
    with torch.enable_grad():
        o = (p * p).sum()
    return type(torch.autograd.Variable._execution_engine).run_backward(
        torch.autograd.Variable._execution_engine,
                                             (o,), (torch.ones(()),), False, False, (p,),
                                             False, False)[0]


def _forward_ad(p):
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level():
        d = fwad.make_dual(p, torch.ones_like(p))
        return fwad.unpack_dual(d * d).tangent


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return 2 * a * g


def _function_grad(p):
    p = p.detach().requires_grad_(True)
    with torch.enable_grad():
        y = _Square.apply(p).sum()
    return type(torch.autograd.Variable._execution_engine).run_backward(
        torch.autograd.Variable._execution_engine,
                                             (y,), (torch.ones(()),), False, False, (p,),
                                             False, False)[0]


@pytest.mark.parametrize("answer", [_run_backward, _engine_base, _forward_ad, _function_grad],
                         ids=["run_backward", "EngineBase", "forward-ad", "Function"])
def test_autograd_engine_is_refused(answer):
    with pytest.raises(ForbiddenCall, match="autograd"):
        guards.run_answer(answer, torch.randn(5), forbid=("autograd",))


def test_honest_answer_still_passes_with_autograd_forbidden():
    out = guards.run_answer(lambda p: 2 * p, torch.ones(3), forbid=("autograd",))
    assert torch.equal(out, torch.full((3,), 2.0))


def _graded_cell(src: str) -> subprocess.CompletedProcess:
    """Run ``src`` as a notebook cell in a fresh Python that imports the guards as a graded
    run does (``COURSE_GRADE_RUN`` in its environment)."""
    prog = ("import torch\nfrom course_utils import guards\n"
            f"exec(compile({src!r}, {CELL!r}, 'exec'), {{'__name__': '__main__'}})\n")
    env = {**os.environ, "COURSE_GRADE_RUN": "test"}
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                          env=env, timeout=300)


def test_copy_of_a_guarded_function_made_in_a_cell_is_refused():
    run = _graded_cell("import types\nfrom course_utils import attention as _A\n"
                       "_f = _A.naive_attention\n"
                       "_b = types.FunctionType(_f.__code__, _f.__globals__, None, _f.__defaults__)\n")
    assert run.returncode != 0 and "GuardEscape" in run.stderr and "__code__" in run.stderr, \
        run.stderr[-2000:]


def test_copy_of_a_guarded_function_made_in_the_answer_is_refused():
    from course_utils import attention
    q = torch.randn(1, 1, 4, 4)

    def answer(q):
        f = attention.naive_attention
        return types.FunctionType(f.__code__, f.__globals__)(q, q, q)

    with pytest.raises(ForbiddenCall):
        guards.run_answer(answer, q, forbid=("reference-attention",))


def test_frames_are_refused_to_a_notebook_cell_at_any_time_in_a_graded_run():
    for src, what in (("import sys\nsys._getframe(0)\n", "frames"),
                      ("import sys\nsys.settrace(None)\n", "settrace"),
                      ("import threading\nthreading.Thread(target=print).start()\n", "thread")):
        run = _graded_cell(src)
        assert run.returncode != 0 and "GuardEscape" in run.stderr and what in run.stderr, \
            (src, run.stderr[-2000:])


def test_namedtuples_typevars_and_enums_may_be_made_in_a_graded_cell_and_an_answer():
    # collections.namedtuple, typing.TypeVar and Enum's functional API read the module name
    # of their caller's frame (sys._getframe inside the standard library): that is no escape
    run = _graded_cell("import collections, enum, typing\n"
                       "P = collections.namedtuple('P', 'm s')\n"
                       "T = typing.TypeVar('T')\n"
                       "E = enum.Enum('E', 'A B')\n"
                       "assert P(1, 2).s == 2 and E.B.value == 2\n")
    assert run.returncode == 0, run.stderr[-2000:]

    def answer(x):
        State = collections.namedtuple("State", ["m", "s"])
        st = State(x.max(), x.sum())
        return st.m + st.s

    import collections
    out = guards.run_answer(answer, torch.ones(3), forbid=("softmax",))
    assert float(out) == 4.0
    # the frame itself stays out of reach, in a graded cell and in an answer
    run = _graded_cell("import collections, sys\nP = collections.namedtuple('P', 'a')\n"
                       "sys._getframe(0)\n")
    assert run.returncode != 0 and "GuardEscape" in run.stderr, run.stderr[-2000:]
    with pytest.raises(ForbiddenCall, match="inspects the checker's frames"):
        _checker(lambda x: (collections.namedtuple("P", "a"), _steal(sys._getframe(1)))[1],
                 torch.zeros(3))


def test_a_learners_own_cells_keep_their_tools_outside_the_checks():
    # outside a graded run and outside an answer, a cell may inspect frames and start
    # threads (a learner's experiments); the same inside an answer is refused (above)
    ns = _cell("import sys, threading\nf = sys._getframe(0)\nbox = []\n"
               "t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()\n")
    assert ns["box"] == [1]


def test_lifting_the_guard_from_the_answer_is_refused():
    from course_utils import attention
    q = torch.randn(1, 1, 4, 4)
    g = sys.modules["course_utils.guards"]
    saved = dict(vars(g))

    def lift_exempt(q):
        if hasattr(g, "_EXEMPT"):
            g._EXEMPT.depth = 1
        g._EXEMPT_VIEW = {threading.get_ident(): 1}
        return torch.softmax(q, -1)

    def empty_table(q):
        g._ACTIVE.clear()
        return attention.naive_attention(q, q, q)

    def call_the_body(q):
        return g._call(max(g._ACTIVE), (q, q, q), {})

    try:
        for answer, group in ((lift_exempt, "softmax"), (empty_table, "reference-attention"),
                              (call_the_body, "reference-attention")):
            with pytest.raises(ForbiddenCall):
                guards.run_answer(answer, q, forbid=(group,))
            if hasattr(g, "_EXEMPT"):
                g._EXEMPT.__dict__.clear()
            vars(g).update(saved)
    finally:
        vars(g).update(saved)


def test_reading_the_guard_internals_is_refused_in_an_answer():
    def answer(x):
        return guards._call.__defaults__

    with pytest.raises(ForbiddenCall, match="__defaults__"):
        guards.run_answer(answer, torch.zeros(1), forbid=("softmax",))


def test_what_a_forbid_swapped_is_out_of_an_answers_reach():
    """The real code of a guarded function, and the stack of forbids holding it, live in the
    audit hook: no table of the guard module holds that code, and an answer that raises the
    guard's own events (to put the real code back, or to drop the forbid holding it) is
    refused."""
    import types

    from course_utils import attention
    q = torch.randn(1, 1, 4, 4)
    g = sys.modules["course_utils.guards"]

    def held_codes(x, seen):
        if isinstance(x, types.CodeType):
            return [x]
        if id(x) in seen or not isinstance(x, (dict, list, tuple, set)):
            return []
        seen.add(id(x))
        items = x.items() if isinstance(x, dict) else enumerate(x)
        return [c for k, v in items for c in held_codes(k, seen) + held_codes(v, seen)]

    def look(q):
        codes = [c for v in vars(g).values() for c in held_codes(v, set())]
        assert not [c for c in codes if c.co_name == "naive_attention"]
        return q

    def forge_unswap(q):
        sys.audit("course_utils.guards.unswap", attention.naive_attention, "__code__", object())
        return attention.naive_attention(q, q, q)

    def forge_swap(q):
        sys.audit("course_utils.guards.swap", attention.naive_attention, "__code__", object(),
                  (lambda q, k, v: q).__code__)
        return attention.naive_attention(q, q, q)

    guards.run_answer(look, q, forbid=("reference-attention",))
    for answer in (forge_unswap, forge_swap):
        with pytest.raises(guards.GuardEscape, match="outside the guard"):
            guards.run_answer(answer, q, forbid=("reference-attention",))
    torch.testing.assert_close(attention.naive_attention(q, q, q),
                               torch.nn.functional.scaled_dot_product_attention(q, q, q))


def test_library_code_may_still_inspect_frames_inside_an_answer():
    import warnings

    def answer(x):
        with warnings.catch_warnings():   # warnings walks frames for stacklevel
            warnings.simplefilter("ignore")
            warnings.warn("x", stacklevel=2)
        torch.testing.assert_close(x, x)  # torch library code
        return x * 2

    out = guards.run_answer(answer, torch.ones(2), forbid=("softmax", "autograd"))
    assert torch.equal(out, torch.full((2,), 2.0))


def _via_torch_frame_walker(x):
    # torch's TorchScript helper: a lookup into the locals of a frame up the stack
    for up in range(8):
        found = torch._jit_internal.createResolutionCallbackFromFrame(up)("want")
        if isinstance(found, torch.Tensor):
            return found
    return torch.zeros(3)


def _via_exec_of_a_walker(x):
    # the same from code run by exec at module level (what a notebook cell's magics look like)
    ns = {"torch": torch, "box": []}
    exec("box.append(torch._jit_internal.createResolutionCallbackFromFrame(3)('want'))", ns)
    return ns["box"][0]


@pytest.mark.parametrize("answer", [_via_torch_frame_walker, _via_exec_of_a_walker],
                         ids=["torch-jit-walker", "exec-of-walker"])
def test_a_library_walking_frames_for_the_answer_is_refused(answer):
    _checker(lambda x: x, torch.zeros(3))       # the check itself still runs
    with pytest.raises(guards.GuardEscape, match="through a library"):
        _checker(answer, torch.zeros(3))


@pytest.mark.parametrize("reader", [sys._getframe, inspect.stack, sys._current_frames],
                         ids=["getframe", "inspect.stack", "current_frames"])
def test_a_frame_reader_handed_to_the_course_to_call_is_refused(reader):
    # run_answer calls what it is given: handed a frame reader, the course's own frame would
    # read the check's frames for the answer
    def answer(x):
        got = guards.run_answer(reader, *((1,) if reader is sys._getframe else ()),
                                exercise="9.9")
        return _steal(got if isinstance(got, types.FrameType) else None)
    with pytest.raises(guards.GuardEscape, match="through the course's code"):
        _checker(answer, torch.zeros(3))


def test_vmap_in_an_answer_still_passes():
    # torch.vmap registers a torch.library.Library on first use, which reads its caller's
    # frame for a module's name: a library's own read, let through
    out = _checker(lambda x: torch.vmap(lambda r: r * 2)(x.reshape(3, 1)).reshape(3),
                   torch.ones(3))
    assert torch.equal(out, torch.full((3,), 2.0))


def test_packages_on_the_path_outside_site_packages_are_library_code(tmp_path):
    # pip --target folders, PYTHONPATH entries, a system dist-packages: their code may walk
    # frames inside an answer (typing_extensions does on every Literal[...]), while the
    # same walk written in the answer is still refused
    lib = tmp_path / "extra"
    lib.mkdir()
    (lib / "framepeek.py").write_text("import sys\n\ndef peek(x):\n"
                                      "    sys._getframe(1)\n    return x * 2\n")
    # a library whose import reads frames (its own, as typing's generics do), imported for
    # the first time inside an answer: the import is let through
    (lib / "framepeek_late.py").write_text("import sys\nNAME = sys._getframe(0).f_globals"
                                           "['__name__']\n")
    prog = ("import sys, torch\nfrom course_utils import guards\nimport framepeek\n"
            "out = guards.run_answer(framepeek.peek, torch.ones(2), forbid=('softmax',))\n"
            "assert torch.equal(out, torch.full((2,), 2.0))\n"
            "def late(x):\n    import framepeek_late\n    return x * 3\n"
            "out = guards.run_answer(late, torch.ones(2), forbid=('softmax',))\n"
            "assert torch.equal(out, torch.full((2,), 3.0))\n"
            "try:\n"
            "    guards.run_answer(lambda x: sys._getframe(1) and x, torch.ones(2),\n"
            "                      forbid=('softmax',))\n"
            "except guards.GuardEscape:\n"
            "    print('refused')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(lib)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    run = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                         env=env, timeout=300, cwd=str(tmp_path))
    assert run.returncode == 0 and run.stdout.strip() == "refused", run.stderr[-2000:]


def test_a_kernel_made_afresh_from_a_forbidden_kernels_function_is_refused():
    """``triton.jit(kernel.fn)`` makes a new kernel object from a forbidden kernel's Python
    function, which the refused kernel's own launch does not cover: every launch path of
    Triton refuses it while the guard is on, and it runs again once the guard is off."""
    import triton

    from course_utils.triton_attention import _attn_bwd_delta
    from course_utils.triton_intro import launch
    ns = _cell("import triton\n"
               "from course_utils.triton_attention import _attn_bwd_delta as _k\n"
               "mine = triton.jit(_k.fn)\n")
    mine = ns["mine"]
    assert mine is not _attn_bwd_delta
    from course_utils import device
    o, do = torch.randn(2, 20, 16, device=device.DEVICE), torch.randn(2, 20, 16, device=device.DEVICE)
    args = lambda d: (o, do, d, o.stride(0), 0, o.stride(1), do.stride(0), 0,  # noqa: E731
                      do.stride(1), 1, 20, 16)
    d = torch.zeros(2, 20, device=device.DEVICE)
    with guards.forbid("course-kernels", exercise="7.6"):
        with pytest.raises(ForbiddenCall, match="_attn_bwd_delta"):
            mine[(2, 2)](*args(d), HEAD_DIM=16, BLOCK=16)
        with pytest.raises(ForbiddenCall, match="_attn_bwd_delta"):
            mine.run(*args(d), HEAD_DIM=16, BLOCK=16, grid=(2, 2), warmup=False)
        with pytest.raises(ForbiddenCall, match="_attn_bwd_delta"):
            launch(mine, (2, 2), *args(d), HEAD_DIM=16, BLOCK=16)
        # a kernel of the learner's own still runs under the same guard
        launch(triton.jit(_own_row_dot), (2, 2), o, do, d, 20, D=16, BLOCK=16)
    assert torch.allclose(d, (o * do).sum(-1), atol=1e-5)
    d.zero_()
    mine[(2, 2)](*args(d), HEAD_DIM=16, BLOCK=16)
    assert torch.allclose(d, (o * do).sum(-1), atol=1e-5)


def test_a_template_kernels_launch_path_reads_the_same_under_a_forbid():
    """The grading hooks compare what a template kernel's launch does before and during a
    check. A forbid that refuses copies of the course's kernels wraps Triton's launch
    methods while it is on; the comparison reads through those wrappers, and still sees a
    launch method that an answer swaps in."""
    import triton

    from course_utils.grading import kernel_side
    kernel = triton.jit(_own_row_dot)
    before = kernel_side._launch_fingerprint(kernel)
    with guards.forbid("course-kernels"):
        assert guards._LAUNCH_WRAPPERS            # the launch methods are wrapped ...
        assert kernel_side._launch_fingerprint(kernel) == before     # ... and read through
        cls = type(kernel)
        held = vars(cls).get("run")
        try:
            cls.run = lambda self, *a, **k: None                 # an answer's own launch
            assert kernel_side._launch_fingerprint(kernel) != before
        finally:
            cls.run = held
    assert not guards._LAUNCH_WRAPPERS and kernel_side._launch_fingerprint(kernel) == before
