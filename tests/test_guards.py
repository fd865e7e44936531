"""The guards must catch the shortcuts learners take, name them, and let honest
answers through untouched."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_utils import device, guards
from course_utils.checks import CheckFailed
from course_utils.guards import ForbiddenCall


def _qkv(n=6, d=4):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, n, d, generator=g) for _ in range(3)]


def honest_attention(q, k, v):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p / p.sum(-1, keepdim=True)) @ v


def test_honest_answer_passes_every_group():
    q, k, v = _qkv()
    out = guards.run_answer(honest_attention, q, k, v,
                            forbid=("sdpa", "softmax", "autograd", "reference-attention"))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("cheat, words", [
    (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "scaled_dot_product_attention"),
    (lambda q, k, v: torch.ops.aten.scaled_dot_product_attention(q, k, v), "scaled_dot_product"),
    (lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ v, "softmax"),
    (lambda q, k, v: (q @ k.mT).softmax(-1) @ v, "softmax"),
    (lambda q, k, v: F.softmax(q @ k.mT, dim=-1) @ v, "softmax"),
    (lambda q, k, v: torch.exp(F.log_softmax(q @ k.mT, -1)) @ v, "softmax"),
    # the softmaxes under other names: masked, sparse (COO and CSR), nested
    (lambda q, k, v: torch._masked_softmax(q @ k.mT, torch.zeros(
        q.shape[:-1] + k.shape[-2:-1], dtype=torch.bool), -1, 0) @ v, "softmax"),
    (lambda q, k, v: torch.sparse.softmax((q @ k.mT)[0, 0].to_sparse(), -1).to_dense() @ v,
     "softmax"),
    (lambda q, k, v: torch.exp(torch.sparse.log_softmax((q @ k.mT)[0, 0].to_sparse(), -1)
                               .to_dense()) @ v, "softmax"),
    (lambda q, k, v: torch.sparse.softmax((q @ k.mT)[0, 0].to_sparse_csr(), -1).to_dense() @ v,
     "softmax"),
    (lambda q, k, v: torch.nested.nested_tensor([(q @ k.mT)[0, 0]]).softmax(-1)[0] @ v,
     "softmax"),
])
def test_library_calls_are_refused_with_the_reason(cheat, words):
    q, k, v = _qkv()
    with pytest.raises(ForbiddenCall, match=words) as e:
        guards.run_answer(cheat, q, k, v, forbid=("sdpa", "softmax"), exercise="4.3",
                          asks="write the attention forward")
    assert "Exercise 4.3" in str(e.value) and "write the attention forward" in str(e.value)


def test_course_reference_is_refused_under_any_name():
    from course_utils import attention
    from course_utils.attention import naive_attention as my_own_code  # imported before the guard
    q, k, v = _qkv()
    with pytest.raises(ForbiddenCall, match="course_utils.attention.naive_attention"):
        guards.run_answer(lambda q, k, v: my_own_code(q, k, v), q, k, v,
                          forbid=("reference-attention",))
    # restored afterwards, and the module's name reaches the same function
    torch.testing.assert_close(my_own_code(q, k, v), attention.naive_attention(q, k, v))


def test_allow_exempts_one_reference():
    from course_utils.attention import naive_attention
    q, k, v = _qkv()
    out = guards.run_answer(lambda q, k, v: naive_attention(q, k, v), q, k, v,
                            forbid=("reference-attention",), allow=("naive_attention",))
    assert out.shape == q.shape


def test_autograd_is_refused():
    x = torch.randn(5, requires_grad=True)

    def via_autograd(x):
        y = (x ** 2).sum()
        return torch.autograd.grad(y, x)[0]

    def via_backward(x):
        x = x.detach().requires_grad_()
        (x ** 2).sum().backward()
        return x.grad

    for cheat in (via_autograd, via_backward):
        with pytest.raises(ForbiddenCall, match="autograd|backward|grad"):
            guards.run_answer(cheat, x, forbid=("autograd",))


def test_course_kernel_launch_is_refused():
    from course_utils import triton_intro
    kernels = [n for n, o in vars(triton_intro).items() if guards._is_triton_kernel(o)]
    assert kernels, "triton_intro defines no kernel to test against"
    obj = getattr(triton_intro, kernels[0])
    with guards.forbid("course-kernels"):
        with pytest.raises(ForbiddenCall, match=kernels[0]):
            obj[(1,)]()
    assert "run" not in vars(obj) or not getattr(obj.run, "__name__", "").startswith("_refusing")


@pytest.mark.parametrize("order", ["newer first", "older first"])
def test_overlapping_forbids_end_in_any_order(order):
    """A notebook-wide forbid entered twice (a set-up cell run again) whose older copy is
    collected first must leave no stub and no launch wrapper behind."""
    import triton

    from course_utils import attention, triton_intro
    name = next(n for n, o in vars(triton_intro).items() if guards._is_triton_kernel(o))
    kernel = getattr(triton_intro, name)
    code = attention.naive_attention.__code__
    getitem = vars(triton.runtime.jit.KernelInterface)["__getitem__"]
    q, k, v = _qkv()
    want = attention.naive_attention(q, k, v)
    older = guards.forbid("reference-attention", "course-kernels")
    newer = guards.forbid("reference-attention", "course-kernels")
    older.__enter__()
    newer.__enter__()
    first, second = (newer, older) if order == "newer first" else (older, newer)
    first.__exit__(None, None, None)
    # the other forbid still refuses, under the function's name and on every launch path
    with pytest.raises(ForbiddenCall, match="naive_attention"):
        attention.naive_attention(q, k, v)
    with pytest.raises(ForbiddenCall, match=name):
        kernel[(1,)]()
    with pytest.raises(ForbiddenCall, match=name):
        triton.jit(guards._kernel_fn(kernel))[(1,)]()
    second.__exit__(None, None, None)
    assert attention.naive_attention.__code__ is code
    torch.testing.assert_close(attention.naive_attention(q, k, v), want)
    assert vars(triton.runtime.jit.KernelInterface)["__getitem__"] is getitem
    assert "run" not in vars(kernel)
    assert not guards._KERNEL_CODES and not guards._LAUNCH_WRAPPERS


def test_input_mutation_is_caught_and_reference_untouched():
    q, k, v = _qkv()
    v_before = v.clone()

    def zero_v(q, k, v):
        v.zero_()
        return torch.zeros_like(q)

    with pytest.raises(CheckFailed, match="changed its input"):
        guards.run_answer(zero_v, q, k, v)
    assert torch.equal(v, v_before)


def test_full_score_matrix_is_caught_by_shape():
    q = torch.randn(1, 1, 13, 4)
    k = v = torch.randn(1, 1, 21, 4)
    with pytest.raises(CheckFailed, match="13 x 21"):
        guards.run_answer(honest_attention, q, k, v, shape_tails=[(13, 21)])

    def tiled(q, k, v, bc=5):
        outs = []
        for j in range(0, k.shape[2], bc):
            outs.append((q @ k[:, :, j:j + bc].mT).amax(-1))
        return torch.stack(outs, -1).amax(-1)
    guards.run_answer(tiled, q, k, v, shape_tails=[(13, 21)])


def test_score_matrix_ban_spares_tensors_shaped_like_an_input():
    # Nq = 8 queries, Nk = 12 keys of head dim 8: dK has K's shape (12, 8), which is also
    # the transposed score matrix's; a tiled backward allocates it and must not fail
    q, k = torch.randn(8, 8), torch.randn(12, 8)

    def grads(q, k):
        dk = torch.zeros_like(k)
        for j in range(0, 12, 4):
            dk[j:j + 4] = (q.T @ (q @ k[j:j + 4].T)).T
        return dk
    guards.run_answer(grads, q, k, shape_tails=[(8, 12)])
    # with a head dim of 5 the sizes no longer collide and the whole matrix is caught
    q5, k5 = torch.randn(8, 5), torch.randn(12, 5)
    with pytest.raises(CheckFailed, match="8 x 12"):
        guards.run_answer(lambda q, k: q @ k.T, q5, k5, shape_tails=[(8, 12)])


def test_torch_math_group_leaves_allocation_alone():
    x = torch.randn(8)
    with guards.forbid("torch-math"):
        y = torch.empty_like(x)
        y.copy_(x)
        z = torch.zeros(3)
    assert torch.equal(y, x) and z.sum() == 0
    with pytest.raises(ForbiddenCall, match="aten.mul"):
        with guards.forbid("torch-math"):
            _ = 2.0 * x


@pytest.mark.parametrize("cheat", [
    lambda o, do: torch.vdot(o[0, 0], do[0, 0]),
    lambda o, do: torch.nn.functional.bilinear(o, do, torch.eye(o.shape[-1])[None]),
    lambda o, do: torch.ops.aten._trilinear(o, torch.ones_like(o), do, [], [], [], [2], 1),
    lambda o, do: torch.outer(o[0, 0], do[0, 0]),
], ids=["vdot", "bilinear", "trilinear", "outer"])
def test_torch_math_group_refuses_arithmetic_by_other_routes(cheat):
    # a wrapper whose Delta (rowsum of O * dO) is made outside its kernel by torch products
    # the plain list did not name
    o, do = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    with pytest.raises(ForbiddenCall, match="kernel must compute"):
        with guards.forbid("torch-math", exercise="7.6"):
            cheat(o, do)


def test_check_finite_and_prediction():
    guards.check_finite(torch.ones(3))
    with pytest.raises(CheckFailed, match="not finite"):
        guards.check_finite(torch.tensor([1.0, float("nan")]), name="k_special")
    with pytest.raises(CheckFailed) as e:
        guards.check_prediction(5, 35, name="tile", choices=range(40))
    assert "35" not in str(e.value)
    with pytest.raises(CheckFailed, match="allowed answers"):
        guards.check_prediction("finite", "exact", choices=("nan", "exact", "finite_but_wrong"))
    with pytest.raises(CheckFailed, match="expected a str"):
        guards.check_prediction(3, "exact")
    guards.check_prediction(4, 4, quiet=True)


def _online_sum(stream):
    total = 0.0
    for x in stream:
        total += x
    return total


def _two_pass(stream):
    m = max(stream)
    return sum(x - m for x in stream)


def _stores(stream):
    xs = list(stream)
    return sum(xs)


def _stores_copies(stream):
    xs = [float(x) * 1.0 for x in stream]
    return sum(xs)


def test_one_pass():
    vals = [float(i % 7) for i in range(20_000)]
    assert guards.one_pass(_online_sum, vals) == sum(vals)
    with pytest.raises(CheckFailed, match="second"):
        guards.one_pass(_two_pass, vals)
    for cheat in (_stores, _stores_copies):
        with pytest.raises(CheckFailed, match="stored"):
            guards.one_pass(cheat, vals)
    with pytest.raises(CheckFailed, match="read 1 of"):
        guards.one_pass(lambda s: next(iter(s)), vals)


def test_check_source_finds_library_use(monkeypatch):
    guards.register_answer_sources({
        "1.2": "# Exercise 1.2\nfrom course_utils.machine import matmul_schedule\n"
               "trace = matmul_schedule(2, 3).trace",
        "1.3": "# Exercise 1.3\nimport course_utils\nf = getattr(course_utils.machine, 'matmul_' + 'schedule')",
        "1.4": "# Exercise 1.4\ntrace = '''LOAD r0 a00\\nSTORE r0 c00'''",
    })
    try:
        with pytest.raises(ForbiddenCall, match="matmul_schedule"):
            guards.check_source("1.2", ["matmul_schedule"], asks="write the trace")
        with pytest.raises(ForbiddenCall, match="machine"):
            guards.check_source("1.3", ["matmul_schedule", "machine"])
        guards.check_source("1.4", ["matmul_schedule", "machine"])
    finally:
        guards.register_answer_sources({})


# --- Triton kernels through guard regions -------------------------------------------------

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _axpy_ok(x, y, o, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, alpha * tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def _axpy_unmasked_store(x, y, o, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, alpha * tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m))


@triton.jit
def _row_sum_unmasked_load(x, o, n, BLOCK: tl.constexpr):
    # one program per row of n values; BLOCK >= n, but the load is not masked
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    tl.store(o + row, tl.sum(tl.load(x + row * n + offs), axis=0))


def _launch(kernel, n=100, block=32, grid=None):
    # on the device the kernels compile for (the interpreter's CPU, or the GPU)
    dev = device.DEVICE
    x, y = guards.Guarded(torch.randn(n, device=dev)), guards.Guarded(torch.randn(n, device=dev))
    o = guards.Guarded.empty((n,), device=dev)
    expected = 2.0 * x.tensor + y.tensor
    with guards.record_launches() as launched:
        kernel[(grid or triton.cdiv(n, block),)](x.tensor, y.tensor, o.tensor, n, 2.0, BLOCK=block)
    return o, expected, (x, y), launched


def test_guarded_kernel_ok_and_launch_recorded():
    o, expected, inputs, launched = _launch(_axpy_ok)
    guards.check_kernel_output(o, expected, inputs=inputs, name="axpy", quiet=True)
    assert [name for name, _ in launched] == ["_axpy_ok"]


def test_unmasked_store_is_named():
    o, expected, inputs, _ = _launch(_axpy_unmasked_store)
    with pytest.raises(CheckFailed, match="past the end.*Mask the store"):
        guards.check_kernel_output(o, expected, inputs=inputs, name="axpy")


def test_unmasked_load_is_named():
    # the last row reads past the end of x, into the guard region
    x = guards.Guarded(torch.randn(3, 20, device=device.DEVICE))
    o = guards.Guarded.empty((3,), device=device.DEVICE)
    _row_sum_unmasked_load[(3,)](x.tensor, o.tensor, 20, BLOCK=32)
    with pytest.raises(CheckFailed, match="mask every load"):
        guards.check_kernel_output(o, x.tensor.sum(-1), inputs=[x], name="row sum")


def test_too_small_grid_is_named():
    o, expected, inputs, _ = _launch(_axpy_ok, grid=2)
    with pytest.raises(CheckFailed, match="never written|grid"):
        guards.check_kernel_output(o, expected, inputs=inputs, name="axpy")


def test_wrong_values_still_fail():
    o, expected, inputs, _ = _launch(_axpy_ok)
    with pytest.raises(CheckFailed, match="differs"):
        guards.check_kernel_output(o, expected + 1e-3, inputs=inputs, name="axpy")


@pytest.mark.parametrize("cheat", [
    lambda s: torch._masked_softmax(s, torch.zeros_like(s, dtype=torch.bool), -1, 0),
    lambda s: torch.sparse.softmax(s.to_sparse(), -1).to_dense(),
    lambda s: torch.exp(torch.sparse.log_softmax(s.to_sparse(), -1).to_dense()),
    # torch's softmax written in Python (reference and decomposition): no softmax operator
    lambda s: torch._refs.softmax(s, -1),
    lambda s: torch._decomp.decompositions._softmax(s, -1, False),
], ids=["masked", "sparse", "sparse-log", "refs", "decomposition"])
def test_a_problem_sets_own_softmax_group_forbids_every_name_of_the_softmax(cheat):
    # a group of a problem set's own that names the softmax by two of its names
    own = guards.Group("a library softmax", torch_api=("softmax", "log_softmax"),
                       aten=("_softmax", "_log_softmax"))
    s = torch.randn(4, 6)
    with pytest.raises(ForbiddenCall, match="a library softmax"):
        guards.run_answer(cheat, s, forbid=[own], exercise="3.3")
    # the same written by hand passes
    out = guards.run_answer(lambda s: (s - s.amax(-1, keepdim=True)).exp() /
                            (s - s.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True), s,
                            forbid=[own], exercise="3.3")
    torch.testing.assert_close(out, torch.softmax(s, -1))


@pytest.mark.parametrize("cheat", [
    lambda s: s.logcumsumexp(-1)[..., -1],
    lambda s: torch._refs.logsumexp(s, -1),
], ids=["logcumsumexp", "refs"])
def test_the_logsumexp_group_forbids_its_other_routes(cheat):
    with pytest.raises(ForbiddenCall, match="logsumexp"):
        guards.run_answer(cheat, torch.randn(4, 6), forbid=("logsumexp",), exercise="9.4")
