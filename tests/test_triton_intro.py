"""Lesson 6's small Triton kernels (run in the interpreter on a CPU)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from course_utils import device
from course_utils.checks import tolerance
from course_utils.triton_intro import launch_grid, matmul, softmax_rows, vector_add

DEV = device.DEVICE


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 300), block=st.sampled_from([16, 64]))
def test_vector_add_any_length(n, block):
    g = torch.Generator().manual_seed(n)
    x, y = torch.randn(n, generator=g).to(DEV), torch.randn(n, generator=g).to(DEV)
    torch.testing.assert_close(vector_add(x, y, block=block), x + y)


def test_launch_grid_rounds_up():
    assert [launch_grid(n, 64) for n in (0, 1, 64, 65, 128)] == [0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="block >= 1"):
        launch_grid(10, 0)


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 200),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_softmax_rows_matches_torch(rows, cols, dtype):
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = (torch.randn(rows, cols, generator=g) * 5).to(DEV, dtype)
    out = softmax_rows(x)
    assert out.dtype == dtype
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=tol, rtol=tol)


def test_softmax_rows_is_safe_for_large_inputs():
    x = torch.tensor([[1000.0, 1000.0, -1000.0]], device=DEV)
    torch.testing.assert_close(softmax_rows(x), torch.tensor([[0.5, 0.5, 0.0]], device=DEV))


@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       transpose_b=st.booleans())
def test_matmul_matches_torch(m, n, k, dtype, transpose_b):
    g = torch.Generator().manual_seed(m * 10000 + n * 100 + k)
    a = torch.randn(m, k, generator=g).to(DEV, dtype)
    b = torch.randn(n, k, generator=g).to(DEV, dtype).T if transpose_b else \
        torch.randn(k, n, generator=g).to(DEV, dtype)
    c = matmul(a, b)
    ref = a.float() @ b.float()
    if dtype == torch.float32:
        # the precision policy: exact float32 products in the interpreter, TF32 on a GPU
        atol, rtol = tolerance(torch.float32, device=DEV, op="dot", k=k)
    else:
        atol = rtol = {torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(c.float(), ref, atol=atol, rtol=rtol)


def test_bad_inputs_raise_before_launch():
    x = torch.randn(8, device=DEV)
    with pytest.raises(ValueError, match="share shape"):
        vector_add(x, torch.randn(9, device=DEV))
    with pytest.raises(TypeError, match="torch.Tensor"):
        vector_add([1.0], x)
    with pytest.raises(ValueError, match="power of two"):
        vector_add(x, x, block=48)
    with pytest.raises(ValueError, match="2-D"):
        softmax_rows(x)
    with pytest.raises(TypeError, match="dtype"):
        softmax_rows(torch.zeros(2, 2, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match=r"\(K, N\)"):
        matmul(torch.randn(4, 5, device=DEV), torch.randn(4, 5, device=DEV))
    with pytest.raises(ValueError, match="block_k"):
        matmul(torch.randn(4, 5, device=DEV), torch.randn(5, 4, device=DEV), block_k=8)


def test_launch_unwraps_an_unsolved_exercise():
    import triton
    import triton.language as tl
    from course_utils.triton_intro import launch

    @triton.jit
    def stub(X, N: tl.constexpr):
        raise NotImplementedError("Exercise 9.9: not yet")

    @triton.jit
    def fine(X, N: tl.constexpr):
        r = tl.arange(0, N)
        tl.store(X + r, tl.load(X + r) + 1)

    x = torch.zeros(16, device=DEV)
    if device.INTERPRET:
        with pytest.raises(NotImplementedError, match="Exercise 9.9"):
            launch(stub, (1,), x, N=16)
    launch(fine, (1,), x, N=16)
    assert float(x.sum()) == 16
