"""The Triton FlashAttention-2 kernels of lessons 6-7.

On a CPU they run in Triton's interpreter with one fixed configuration, so sizes stay
small; the ``gpu`` tests repeat the cases of ``benchmarks/gpu_check_attention.py`` at
real sizes with the compiled kernels."""
import importlib.util
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, given, settings, strategies as st

from course_utils import device
from course_utils.attention import naive_attention
from course_utils.backward import flash_attention_backward
from course_utils.triton_attention import (padded_head_dim, triton_attention,
                                           triton_attention_backward,
                                           triton_attention_forward)

DEV = device.DEVICE
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEV, dtype).requires_grad_(grad)  # noqa: E731
    return mk(B, Hq, Nq, D), mk(B, Hkv, Nk, D), mk(B, Hkv, Nk, D)


def _rel(x, ref):
    x = x.detach()
    assert torch.isfinite(x).all(), "non-finite values in the kernel output"
    ref = ref.detach().double()
    # a floor of 1e-2 RMS: gradients that are exactly zero (N = 1, causal) compare absolutely
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-2 * ref.numel() ** 0.5))


def _reference(q, k, v, causal, do):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = naive_attention(q64, k64, v64, enable_gqa=True, is_causal=causal, return_lse=True)
    grads = torch.autograd.grad(o, (q64, k64, v64), do.double())
    return o, lse, grads


lengths = st.sampled_from([1, 7, 16, 33, 64])
shapes = st.tuples(lengths, lengths, st.sampled_from([1, 2, 4]), st.sampled_from([16, 32, 64]))


@settings(max_examples=14, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(shape=shapes, causal=st.booleans(), dtype=st.sampled_from([torch.float16, torch.bfloat16]))
def test_forward_and_backward_match_the_reference(shape, causal, dtype):
    Nq, Nk, group, D = shape
    Hkv = 2 if group < 4 else 1
    q, k, v = _inputs(1, Hkv * group, Hkv, Nq, Nk, D, dtype, seed=Nq * 97 + Nk, grad=True)
    o, lse = triton_attention(q, k, v, enable_gqa=True, is_causal=causal, return_lse=True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(DEV, dtype)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    o_ref, lse_ref, (dq_r, dk_r, dv_r) = _reference(q, k, v, causal, do)
    assert o.dtype == dq.dtype == dk.dtype == dv.dtype == dtype and lse.dtype == torch.float32
    assert _rel(o, o_ref) < TOL[dtype]
    torch.testing.assert_close(lse.double(), lse_ref.double(), atol=1e-4, rtol=1e-4)
    for name, x, ref in (("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r)):
        assert _rel(x, ref) < 2 * TOL[dtype], name


def test_long_rows_and_the_largest_head_dim():
    """N = 129 crosses several tiles with a ragged end; D = 256 is the largest head dim."""
    for (Nq, Nk, D, causal) in ((129, 129, 64, True), (40, 24, 256, False)):
        q, k, v = _inputs(1, 2, 1, Nq, Nk, D, torch.float16, seed=D, grad=True)
        o = triton_attention(q, k, v, enable_gqa=True, is_causal=causal)
        do = torch.randn_like(o)
        grads = torch.autograd.grad(o, (q, k, v), do)
        o_ref, _, grads_ref = _reference(q, k, v, causal, do)
        assert _rel(o, o_ref) < TOL[torch.float16]
        for x, ref in zip(grads, grads_ref):
            assert _rel(x, ref) < 2 * TOL[torch.float16]


@pytest.mark.parametrize("D", [8, 48, 80])
def test_other_head_dims_are_padded_inside_the_kernel(D):
    assert padded_head_dim(D) == max(16, 1 << (D - 1).bit_length())
    q, k, v = _inputs(1, 2, 2, 20, 12, D, torch.float16, seed=D, grad=True)
    o = triton_attention(q, k, v, enable_gqa=True, is_causal=True)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    o_ref, _, grads_ref = _reference(q, k, v, True, do)
    assert o.shape == q.shape and _rel(o, o_ref) < TOL[torch.float16]
    for x, ref in zip(grads, grads_ref):
        assert _rel(x, ref) < 2 * TOL[torch.float16]


def test_float32_inputs_stay_float32():
    q, k, v = _inputs(1, 2, 1, 17, 17, 32, torch.float32, seed=3)
    o, lse = triton_attention(q, k, v, enable_gqa=True, is_causal=True, return_lse=True)
    o_ref, lse_ref = naive_attention(q, k, v, enable_gqa=True, is_causal=True, return_lse=True)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)   # exact fp32 in the interpreter
    torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)


def test_strided_inputs_give_the_contiguous_answer():
    g = torch.Generator().manual_seed(5)
    # (B, N, H, D) storage seen as (B, H, N, D), and a key slice with a gap between rows
    q = torch.randn(2, 9, 4, 16, generator=g).to(DEV, torch.float16).transpose(1, 2)
    kv = torch.randn(2, 2, 26, 16, generator=g).to(DEV, torch.float16)
    k, v = kv[:, :, ::2], kv[:, :, 1::2]
    assert not q.is_contiguous() and not k.is_contiguous()
    out = triton_attention(q, k, v, enable_gqa=True, is_causal=True)
    ref = triton_attention(q.contiguous(), k.contiguous(), v.contiguous(), enable_gqa=True, is_causal=True)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_backward_agrees_with_the_lesson5_tiled_backward():
    q, k, v = _inputs(1, 4, 2, 24, 40, 32, torch.float16, seed=11)
    o, lse = triton_attention_forward(q, k, v, enable_gqa=True, is_causal=True)
    do = torch.randn_like(o)
    ours = triton_attention_backward(q, k, v, o, lse, do, enable_gqa=True, is_causal=True)
    theirs = flash_attention_backward(q.float(), k.float(), v.float(), o.float(), lse,
                                      do.float(), enable_gqa=True, is_causal=True)
    for x, ref in zip(ours, theirs):
        assert _rel(x, ref) < 4e-3


def test_causal_output_ignores_future_keys():
    q, k, v = _inputs(1, 2, 2, 20, 20, 16, torch.float16, seed=2)
    o1 = triton_attention(q, k, v, enable_gqa=True, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 10:] = 30.0
    v2[:, :, 10:] = -7.0
    o2 = triton_attention(q, k2, v2, enable_gqa=True, is_causal=True)
    torch.testing.assert_close(o1[:, :, :10], o2[:, :, :10], atol=0, rtol=0)
    assert not torch.allclose(o1[:, :, 10:], o2[:, :, 10:])


def test_lse_comes_back_but_is_not_differentiable():
    q, k, v = _inputs(1, 1, 1, 5, 5, 16, torch.float16, seed=0, grad=True)
    o, lse = triton_attention(q, k, v, return_lse=True)
    assert o.requires_grad and not lse.requires_grad and lse.shape == (1, 1, 5)


def test_bad_inputs_raise_before_any_launch():
    q = torch.randn(1, 2, 4, 16, device=DEV, dtype=torch.float16)
    with pytest.raises(ValueError, match="head dim D=512"):
        triton_attention(*(torch.randn(1, 2, 4, 512, device=DEV, dtype=torch.float16),) * 3)
    with pytest.raises(TypeError, match="float64"):
        triton_attention(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="multiple"):
        triton_attention(q, torch.randn(1, 3, 4, 16, device=DEV, dtype=torch.float16),
                         torch.randn(1, 3, 4, 16, device=DEV, dtype=torch.float16))
    with pytest.raises(TypeError, match="return_lse"):
        triton_attention(q, q, q, return_lse=1)
    with pytest.raises(TypeError, match="is_causal"):
        triton_attention(q, q, q, enable_gqa=True, is_causal="yes")
    o, lse = triton_attention_forward(q, q, q)
    with pytest.raises(ValueError, match="lse must be a tensor of shape"):
        triton_attention_backward(q, q, q, o, lse[:, :1], o)


# --------------------------------------------------------------------------- GPU
def _gpu_check():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check_attention.py"
    spec = importlib.util.spec_from_file_location("gpu_check_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.gpu
@pytest.mark.skipif(not device.HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", range(17))
def test_real_sizes_on_the_gpu(case):
    mod = _gpu_check()
    torch.manual_seed(case)
    ok, errs = mod.run_case(mod.CASES[case])
    assert ok, errs
