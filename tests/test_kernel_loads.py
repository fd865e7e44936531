"""course_utils.kernel_loads: a load past the end is caught even when its value is never
stored, in the interpreter and, through a second run in the interpreter, on a GPU."""
import math
import os

import pytest
import torch

from course_utils import device, guards
from course_utils.checks import CheckFailed
from course_utils.kernel_loads import loads_within

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from course_utils.triton_intro import launch  # noqa: E402


@triton.jit
def _copy(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if MASK_LOAD:
        x = tl.load(X + offs, mask=mask)
    else:
        x = tl.load(X + offs)
    tl.store(OUT + offs, x, mask=mask)


def _run(mask_load, kernel=_copy):
    x = guards.Guarded(torch.randn(37, device=device.DEVICE))
    out = guards.Guarded.empty((37,), device=device.DEVICE)
    with loads_within(x.tensor, out.tensor, names=("X", "OUT")):
        launch(kernel, (3,), x.tensor, out.tensor, 37, MASK_LOAD=mask_load, BLOCK=16)
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
    from triton.runtime.jit import JITFunction
    call = JITFunction.__call__
    with pytest.raises(CheckFailed):
        _run(False)
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)
    assert "create_masked_store" not in vars(interpreter.interpreter_builder)
    assert JITFunction.__call__ is call


# --- the compiled path on a machine without a GPU: a JITFunction whose launch the
# interpreter stands in for, and a device function it calls, also a JITFunction
def _twice_py(x):
    return x * 2


def _copy_twice_py(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if MASK_LOAD:
        x = tl.load(X + offs, mask=mask)
    else:
        x = tl.load(X + offs)
    tl.store(OUT + offs, _twice(x), mask=mask)


def _as_compiled(fn, monkeypatch):
    """A JITFunction of ``fn`` whose launch the interpreter stands in for (what the GPU would
    compute, with no GPU here): JITFunction's own launch, so that the kernel is a plain one."""
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, grid, warmup, **kw:
                        interpreter.InterpretedFunction(self.fn).run(*a, grid=grid,
                                                                     warmup=warmup, **kw))
    return JITFunction(fn)


@pytest.fixture
def compiled(monkeypatch):
    from course_utils import kernel_loads
    if not device.INTERPRET:
        return _copy
    from triton.runtime.jit import JITFunction
    from triton.runtime import interpreter
    monkeypatch.setattr(kernel_loads.device, "INTERPRET", False)
    # the device function: a compiled JITFunction, callable only inside a kernel
    monkeypatch.setitem(globals(), "_twice", JITFunction(_twice_py))
    kernel = _as_compiled(_copy_twice_py, monkeypatch)
    # the stand-in launch runs in the interpreter, where the device function must run too
    real_call = JITFunction.__call__

    def call(self, *a, **k):
        if self.fn is _twice_py:
            return interpreter.InterpretedFunction(self.fn)(*a, **k)
        return real_call(self, *a, **k)
    monkeypatch.setattr(JITFunction, "__call__", call)
    return kernel


def test_compiled_launch_is_run_again_in_the_interpreter_and_watched(compiled):
    x, out = _run(True, compiled)
    factor = 1 if compiled is _copy else 2
    assert torch.equal(out.tensor, x.tensor * factor)
    with pytest.raises(CheckFailed, match="past the end of X"):
        _run(False, compiled)


def test_compiled_launch_poisons_the_device_results_under_the_grader(compiled, monkeypatch):
    from course_utils import kernel_loads
    monkeypatch.setattr(kernel_loads, "_grading_student_run", lambda: True)
    x, out = _run(False, compiled)
    factor = 1 if compiled is _copy else 2
    assert torch.equal(out.tensor[:32], x.tensor[:32] * factor)
    assert bool(out.tensor[32:].isnan().all())
    assert not any(out.stores_outside())


def test_outside_a_block_a_compiled_launch_runs_once(compiled, monkeypatch):
    from course_utils import kernel_loads
    seen = []
    monkeypatch.setattr(kernel_loads, "_interpret", lambda *a: seen.append(a))
    x = torch.randn(37, device=device.DEVICE)
    out = torch.empty_like(x)
    launch(compiled, (3,), x, out, 37, MASK_LOAD=False, BLOCK=16)
    assert seen == []


@triton.jit
def _column_sums(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    # a loop whose bound is a runtime value (Triton 3.6's interpreter needs NumPy < 2.5 for
    # it, unless the watch's compatibility patch is in place)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        if MASK_LOAD:
            x = tl.load(X + offs, mask=offs < n, other=0.0)
        else:
            x = tl.load(X + offs)
        acc += x
    tl.store(OUT + tl.arange(0, BLOCK), acc)


@pytest.mark.parametrize("mask_load", [True, False])
def test_a_loop_with_a_runtime_bound_is_watched(mask_load):
    x = guards.Guarded(torch.randn(37, device=device.DEVICE))
    out = guards.Guarded.empty((16,), device=device.DEVICE)
    with pytest.raises(CheckFailed, match="past the end of X") if not mask_load else \
            _nothing():
        with loads_within(x.tensor, out.tensor, names=("X", "OUT")):
            launch(_column_sums, (1,), x.tensor, out.tensor, 37, MASK_LOAD=mask_load, BLOCK=16)
    if mask_load:
        want = torch.nn.functional.pad(x.tensor, (0, 11)).view(3, 16).sum(0)
        assert torch.allclose(out.tensor, want, atol=1e-5)


def _nothing():
    import contextlib
    return contextlib.nullcontext()


def _row_total_py(x):
    return tl.sum(x, 0)


def _total_py(X, OUT, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(OUT, _row_total(x))


def _language_state():
    import sys
    mods = [sys.modules[m] for m in ("triton.language", "triton.language.core",
                                     "triton.language.math", "triton.language.standard")]
    classes = [tl.core.tensor, tl.core.dtype]
    return [(o, {k: id(v) for k, v in vars(o).items()}) for o in mods + classes]


def _same_language(before, after):
    """Every name as it was; a module may have gained names (the interpreter's helpers,
    which its cached rewritten functions need), a class may not."""
    for (o, was), (_, now) in zip(before, after):
        if any(now.get(k) != v for k, v in was.items()):
            return False
        if isinstance(o, type) and set(now) != set(was):
            return False
    return True


def test_a_compiled_launch_run_again_leaves_the_language_as_it_was(monkeypatch):
    """A device function that reduces (tl.sum) makes the interpreter swap the language's
    functions without putting them back; on a GPU the next compilation then failed."""
    from course_utils import kernel_loads
    from triton.runtime.jit import JITFunction
    if not device.INTERPRET:
        pytest.skip("the stand-in for a compiled launch needs the CPU interpreter")
    monkeypatch.setattr(kernel_loads.device, "INTERPRET", False)
    monkeypatch.setitem(globals(), "_row_total", JITFunction(_row_total_py))
    kernel = _as_compiled(_total_py, monkeypatch)
    x = guards.Guarded(torch.randn(13))
    out = guards.Guarded.empty((1,))
    before = _language_state()
    for _ in range(2):      # the second run reuses what the interpreter cached in the first
        found = []
        with loads_within(x.tensor, out.tensor, names=("X", "OUT")):
            kernel_loads._interpret(kernel.fn, (1,), [x.tensor, out.tensor, 13], {"BLOCK": 16},
                                    [("X", x.tensor.data_ptr(), x.tensor.data_ptr() + 52),
                                     ("OUT", out.tensor.data_ptr(), out.tensor.data_ptr() + 4)],
                                    found)
        assert found == []
        assert _same_language(before, _language_state())
        assert torch.allclose(out.tensor, x.tensor.sum().reshape(1), atol=1e-5)


@triton.jit
def _tile_max(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK_LOAD:
        x = tl.load(X + offs, mask=offs < n, other=float("-inf"))
    else:
        x = tl.load(X + offs)
    tl.store(OUT + tl.program_id(0), tl.max(x, 0))


def test_watched_launches_with_a_reduction_run_again_and_again(monkeypatch):
    """Reductions run as device functions in the interpreter: the second and later watched
    launches (and, on a GPU, the compilations between them) must work as the first."""
    from course_utils import kernel_loads
    monkeypatch.setattr(kernel_loads, "unwatched", [])
    for mask_load in (True, True, False, True):
        x = guards.Guarded(torch.randn(37, device=device.DEVICE))
        out = guards.Guarded.empty((3,), device=device.DEVICE)
        ctx = _nothing() if mask_load else pytest.raises(CheckFailed, match="past the end of X")
        with ctx:
            with loads_within(x.tensor, out.tensor, names=("X", "OUT")):
                launch(_tile_max, (3,), x.tensor, out.tensor, 37, MASK_LOAD=mask_load, BLOCK=16)
        if mask_load:
            want = torch.nn.functional.pad(x.tensor, (0, 11), value=float("-inf")).view(3, 16).amax(1)
            assert torch.equal(out.tensor, want)
    assert kernel_loads.unwatched == []


# --- kernels that try to read past the end without being seen
@triton.jit
def _atomic_copy(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    # an atomic that adds nothing reads (and hands back) the memory it touches
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK_LOAD:
        x = tl.atomic_or(X.to(tl.pointer_type(tl.int32)) + offs, 0, mask=offs < n)
    else:
        x = tl.atomic_or(X.to(tl.pointer_type(tl.int32)) + offs, 0)
    tl.store(OUT + offs, x.to(tl.float32, bitcast=True), mask=offs < n)


def test_an_atomic_read_past_the_end_fails():
    x, out = _run(True, _atomic_copy)
    assert torch.equal(out.tensor, x.tensor)
    with pytest.raises(CheckFailed, match="past the end of X"):
        _run(False, _atomic_copy)


def _quiet():
    # Python, run by the interpreter inside a kernel: the load watch switched off
    from triton.runtime import interpreter as interp
    b = interp.interpreter_builder
    b.create_masked_load = type(b).create_masked_load.__get__(b)


@triton.jit
def _copy_quietly(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    _quiet()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    tl.store(OUT + offs, x, mask=offs < n)


@triton.jit
def _copy_via_handle(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    x.handle.data[:] = 0.0
    tl.store(OUT + offs, x, mask=offs < n)


@pytest.mark.skipif(not device.INTERPRET, reason="a kernel body runs as Python in the interpreter")
@pytest.mark.parametrize("kernel", [_copy_quietly, _copy_via_handle])
def test_a_kernel_body_of_python_is_refused(kernel):
    from triton.runtime import interpreter
    with pytest.raises(CheckFailed, match="Triton"):
        _run(True, kernel)
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)


def test_a_kernel_whose_launch_was_replaced_is_refused(monkeypatch):
    calls = []
    k = triton.jit(_copy_twice_py) if not device.INTERPRET else \
        __import__("triton").runtime.interpreter.InterpretedFunction(_copy_twice_py)
    monkeypatch.setitem(globals(), "_twice", triton.jit(_twice_py))
    k.run = lambda *a, grid, warmup, **kw: calls.append(a)      # any Python at all
    with pytest.raises(CheckFailed, match="run was replaced"):
        _run(True, k)
    assert calls == []


def test_only_triton_kernels_launch_inside_the_block():
    from course_utils import kernel_loads

    class Fake:
        def __getitem__(self, grid):
            return lambda x, out, *a, **k: out.copy_(x)
    x = torch.randn(8)
    out = torch.empty(8)
    with pytest.raises(CheckFailed, match="not a @triton.jit kernel"):
        with loads_within(x, out):
            kernel_loads.watched_launch(Fake(), (1,), (x, out), {})
    kernel_loads.watched_launch(Fake(), (1,), (x, out), {})      # outside a block: launched
    assert torch.equal(out, x)


def _asm_copy_py(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                  is_pure=True, pack=1)
    tl.store(OUT + offs, x, mask=offs < n)


def test_a_compiled_launch_the_interpreter_cannot_run_again_fails(monkeypatch):
    """A kernel that the interpreter cannot run (inline assembly here) is not watched: on a
    GPU it used to keep its results; it fails the block instead."""
    from course_utils import kernel_loads
    if not device.INTERPRET:
        pytest.skip("the stand-in for a compiled launch needs the CPU interpreter")
    monkeypatch.setattr(kernel_loads.device, "INTERPRET", False)
    from triton.runtime.jit import JITFunction
    # the stand-in compiled launch: what a GPU computes (a copy), without the assembly
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, grid, warmup, **kw:
                        a[1].copy_(a[0]))
    kernel = JITFunction(_asm_copy_py)
    with pytest.raises(CheckFailed, match="interpreter could not run it"):
        _run(True, kernel)


def test_answer_code_cannot_switch_the_watch_off_unseen():
    """An answer cell that rebinds what the watch runs through is reported and undone."""
    from course_utils import kernel_loads
    from course_utils.grading import guard_keeper
    from triton.runtime import interpreter
    guard_keeper.capture()
    held = (kernel_loads.loads_within, kernel_loads._watching, device.INTERPRET,
            interpreter.InterpretedFunction.run, interpreter.interpreter_builder)
    try:
        kernel_loads.loads_within = lambda *a, **k: None
        kernel_loads._watching = lambda *a: None
        device.INTERPRET = not device.INTERPRET
        interpreter.InterpretedFunction.run = lambda *a, **k: None
        interpreter.interpreter_builder = object()
        changed = guard_keeper.check_and_restore()
    finally:
        guard_keeper._SNAP.clear()
    for what in ("course_utils.kernel_loads.loads_within", "course_utils.kernel_loads._watching",
                 "course_utils.device.INTERPRET",
                 "triton.runtime.interpreter.InterpretedFunction.run",
                 "triton.runtime.interpreter.interpreter_builder"):
        assert what in changed, (what, changed)
    assert (kernel_loads.loads_within, kernel_loads._watching, device.INTERPRET,
            interpreter.InterpretedFunction.run, interpreter.interpreter_builder) == held


_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp_with_math(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    # the math module folds into constants when Triton compiles a kernel: -math.inf,
    # math.log2(math.e); a constexpr global too
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=-math.inf)
    y = tl.exp2(x * math.log2(math.e)) + 0.0 * _LOG2E
    tl.store(OUT + offs, tl.where(x == -math.inf, 0.0, y), mask=offs < n)


@triton.jit
def _exp_with_os(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n) + os.getpid() * 0
    tl.store(OUT + offs, x, mask=offs < n)


@triton.jit
def _sum_tiles_with_tl_range(X, OUT, n, BLOCK: tl.constexpr):
    total = tl.zeros([BLOCK], tl.float32)
    for j in tl.range(0, tl.cdiv(n, BLOCK)):
        offs = j * BLOCK + tl.arange(0, BLOCK)
        total += tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(OUT, tl.sum(total, 0))


def test_a_kernel_may_loop_with_tl_range_while_the_language_module_holds_another(monkeypatch):
    # Triton's interpreter puts a range function of its own into triton.language.core while
    # it runs a device function (a reduction among them) and may leave it there: tl.range,
    # the class the kernel names, is still Triton's
    import triton.language.core as core
    monkeypatch.setattr(core, "range", lambda *a, **k: range(*a))
    monkeypatch.setattr(core, "static_range", lambda *a, **k: range(*a))
    x = torch.arange(10.0, device=device.DEVICE)
    out = torch.zeros(1, device=device.DEVICE)
    with loads_within(x, out, names=("X", "OUT"), name="tl.range"):
        launch(_sum_tiles_with_tl_range, (1,), x, out, 10, BLOCK=4)
    assert float(out) == 45.0


def test_kernels_may_use_the_math_module_and_only_it():
    x, out = _run(True, _exp_with_math)
    torch.testing.assert_close(out.tensor, x.tensor.exp())
    # refused by the watch in the interpreter; on a GPU Triton's compiler refuses it first
    refused = CheckFailed if device.INTERPRET else RuntimeError
    with pytest.raises(refused, match="not Triton's|Triton kernel cannot|Unsupported function"):
        _run(True, _exp_with_os)


@triton.jit
def _plus(a, b):
    return a + b


@triton.jit
def _sums_with_my_combine(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    # a learner's own combine function handed to tl.reduce and tl.associative_scan
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    total = tl.reduce(x, 0, _plus)
    running = tl.associative_scan(x, 0, _plus)
    tl.store(OUT + offs, x + 0.0 * (total + running), mask=offs < n)


def test_a_combine_function_of_the_learner_runs_watched():
    x, out = _run(True, _sums_with_my_combine)
    torch.testing.assert_close(out.tensor, x.tensor)


from triton.language.extra import libdevice  # noqa: E402
from triton.language.extra.libdevice import exp2 as _libdevice_exp2  # noqa: E402


def _exp_libdevice_py(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    # libdevice through the backend-neutral module (which the compiler maps to CUDA's), as a
    # module and as a function of it: exp(x) = exp2(x log2 e)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK_LOAD:
        x = tl.load(X + offs, mask=offs < n, other=0.0)
    else:
        x = tl.load(X + offs)
    e = libdevice.fast_expf(x * 0.5) * _libdevice_exp2(x * 0.5 * 1.4426950408889634)
    e = libdevice.abs(libdevice.div_rn(e, 1.0))
    tl.store(OUT + offs, e, mask=offs < n)


def _exp_cuda_libdevice_py(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK_LOAD:
        x = tl.load(X + offs, mask=offs < n, other=0.0)
    else:
        x = tl.load(X + offs)
    tl.store(OUT + offs, _cuda_libdevice.exp(x), mask=offs < n)


from triton.language.extra.cuda import libdevice as _cuda_libdevice  # noqa: E402


@pytest.mark.parametrize("body", [_exp_libdevice_py, _exp_cuda_libdevice_py])
def test_a_compiled_kernel_calling_libdevice_is_run_again_and_watched(body, monkeypatch):
    """On a GPU a right answer may call libdevice, which Triton's interpreter lacks: the
    watch's re-run computes its functions with NumPy (the GPU's results are the ones kept),
    so the answer is watched rather than refused, and a stray load still fails."""
    from course_utils import kernel_loads
    if not device.INTERPRET:
        pytest.skip("the stand-in for a compiled launch needs the CPU interpreter")
    monkeypatch.setattr(kernel_loads.device, "INTERPRET", False)
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction
    # the stand-in compiled launch: what a GPU computes, in PyTorch (the interpreter cannot)
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, grid, warmup, **kw:
                        a[1].copy_(a[0].exp()))
    kernel = JITFunction(body)
    before = (dict(vars(libdevice)), dict(vars(_cuda_libdevice)), _libdevice_exp2)
    x, out = _run(True, kernel)
    torch.testing.assert_close(out.tensor, x.tensor.exp())
    assert kernel_loads.unwatched[-1:] == [] or "libdevice" not in kernel_loads.unwatched[-1]
    with pytest.raises(CheckFailed, match="past the end of X"):
        _run(False, kernel)
    # the modules, the kernel's globals and the interpreter are as they were
    assert (dict(vars(libdevice)), dict(vars(_cuda_libdevice)), _libdevice_exp2) == before
    assert globals()["_libdevice_exp2"] is before[2]
    assert "create_extern_elementwise" not in vars(interpreter.interpreter_builder)


def test_libdevice_names_map_to_numpy_and_unknown_ones_fail_clearly():
    import numpy as np
    from course_utils.kernel_loads import _libdevice_op
    x = np.array([-1.5, -0.5, 0.5, 2.0], dtype=np.float32)
    assert np.allclose(_libdevice_op("__nv_exp2f")(x), np.exp2(x))
    assert np.allclose(_libdevice_op("__nv_fast_expf")(x), np.exp(x))
    assert np.allclose(_libdevice_op("__nv_fdiv_rn")(x, 2.0), x / 2)
    assert np.allclose(_libdevice_op("__nv_rsqrtf")(np.abs(x)), 1 / np.sqrt(np.abs(x)))
    assert list(_libdevice_op("__nv_roundf")(x)) == [-2.0, -1.0, 1.0, 2.0]
    with pytest.raises(NotImplementedError, match="__nv_j0f"):
        _libdevice_op("__nv_j0f")


def test_on_the_gpu_a_libdevice_kernel_is_watched():
    """The same, compiled for real: the GPU's results kept, the re-run's loads watched."""
    if device.INTERPRET:
        pytest.skip("needs a GPU (the interpreter has no libdevice)")
    for body in (_exp_libdevice_py, _exp_cuda_libdevice_py):
        kernel = triton.jit(body)
        x, out = _run(True, kernel)
        torch.testing.assert_close(out.tensor, x.tensor.exp())
        with pytest.raises(CheckFailed, match="past the end of X"):
            _run(False, kernel)


def _sum_max_methods_py(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    # reductions as tensor methods, as learners often write them
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK_LOAD:
        x = tl.load(X + offs, mask=offs < n, other=0.0)
    else:
        x = tl.load(X + offs)
    tl.store(OUT + offs, x + 0.0 * (x.sum(0) + x.max(0)), mask=offs < n)


def test_tensor_methods_that_are_compiled_functions_run_again_in_the_interpreter(monkeypatch):
    """On a GPU ``tl.tensor.sum`` is a compiled Triton function, which the interpreter's
    re-run called without the tensor (an honest answer using ``x.sum(1)`` was refused)."""
    from course_utils import kernel_loads
    if not device.INTERPRET:
        pytest.skip("the stand-in for a compiled launch needs the CPU interpreter")
    from triton.runtime.jit import JITFunction
    monkeypatch.setattr(kernel_loads.device, "INTERPRET", False)
    # the tensor class as a GPU build has it: its reductions are JITFunctions
    for name in ("sum", "max"):
        monkeypatch.setattr(tl.core.tensor, name, JITFunction(getattr(tl, name).fn))
    before = dict(vars(tl.core.tensor))
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, grid, warmup, **kw:
                        a[1].copy_(a[0]))
    kernel = JITFunction(_sum_max_methods_py)
    x, out = _run(True, kernel)
    torch.testing.assert_close(out.tensor, x.tensor)
    with pytest.raises(CheckFailed, match="past the end of X"):
        _run(False, kernel)
    assert dict(vars(tl.core.tensor)) == before


def _leak_py(x):
    # Python that a kernel body may not hold: it would run unwatched in the interpreter
    import course_utils.kernel_loads as kl   # noqa: F401
    return x


def _method_call(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(OUT + offs, x.leak(), mask=offs < n)


def _module_call(X, OUT, n, MASK_LOAD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(OUT + offs, tl.leak(x), mask=offs < n)


def test_functions_of_an_answer_put_on_tritons_classes_or_modules_are_refused(monkeypatch):
    """An answer may put its own @triton.jit function (Python inside) on the tensor class or
    on triton.language, where the kernel's body check does not see it: refused."""
    jit_leak = triton.jit(_leak_py)
    monkeypatch.setattr(tl.core.tensor, "leak", jit_leak, raising=False)
    with pytest.raises(CheckFailed, match="tensor.leak runs code from outside Triton"):
        _run(True, triton.jit(_method_call))
    monkeypatch.setattr(tl.core.tensor, "leak", _leak_py, raising=False)
    with pytest.raises(CheckFailed, match="tensor.leak runs code from outside Triton"):
        _run(True, triton.jit(_method_call))
    monkeypatch.delattr(tl.core.tensor, "leak")
    monkeypatch.setattr(tl.core.tensor, "__add__", _leak_py)
    with pytest.raises(CheckFailed, match="tensor.__add__ runs code from outside Triton"):
        _run(True)
    monkeypatch.undo()
    monkeypatch.setattr(tl, "leak", jit_leak, raising=False)
    # on a GPU the compiler, which runs first, refuses the import in it
    with pytest.raises(CheckFailed if device.INTERPRET else Exception,
                       match="tl.leak, which is not Triton's" if device.INTERPRET else ""):
        _run(True, triton.jit(_module_call))
    monkeypatch.undo()
    _run(True)      # the classes as Triton made them: watched as before
