"""Tiled attention dropout (course_utils.dropout) against the whole-matrix reference
and PyTorch autograd, and the mistakes a tiled dropout kernel can make."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_utils.dropout import (attention_dropout_reference, dropout_keep_mask,
                                  flash_attention_dropout_backward,
                                  flash_attention_dropout_forward)


def _inputs(B=1, H=2, Nq=37, Nk=29, D=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=dtype) for n in (Nq, Nk, Nk)]


def _reference_grads(q, k, v, do, p, seed, is_causal):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = attention_dropout_reference(q, k, v, p, seed, is_causal=is_causal)
    (out * do).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


# ------------------------------------------------------------------ the mask
def test_mask_is_a_function_of_the_position_only():
    full = dropout_keep_mask(7, 2, 3, range(40), range(50), 0.3)
    tile = dropout_keep_mask(7, 2, 3, range(16, 24), range(10, 35), 0.3)
    assert torch.equal(full[:, :, 16:24, 10:35], tile)
    assert not torch.equal(full, dropout_keep_mask(8, 2, 3, range(40), range(50), 0.3))
    assert not torch.equal(full[0, 0], full[0, 1]) and not torch.equal(full[0, 0], full[1, 0])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_mask_keeps_one_minus_p(p):
    z = dropout_keep_mask(3, 1, 1, range(300), range(300), p)
    assert abs(z.double().mean().item() - (1 - p)) < 0.01
    # neither rows nor columns are biased
    assert z.double().mean(-1).std().item() < 4 * math.sqrt(p * (1 - p) / 300)


def test_p_zero_keeps_everything_and_equals_sdpa():
    q, k, v = _inputs(dtype=torch.float32)
    assert dropout_keep_mask(0, 1, 2, range(37), range(29), 0.0).all()
    o, _ = flash_attention_dropout_forward(q, k, v, 0.0, 0, Br=8, Bc=5)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------ forward and backward
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Br,Bc", [(8, 8), (5, 16), (64, 3)])
def test_tiled_forward_and_backward_match_autograd(is_causal, Br, Bc):
    Nq, Nk = (37, 37) if is_causal else (37, 29)
    q, k, v = _inputs(Nq=Nq, Nk=Nk)
    do = torch.randn_like(q)
    p, seed = 0.25, 1234
    o_ref, dq_ref, dk_ref, dv_ref = _reference_grads(q, k, v, do, p, seed, is_causal)
    o, lse = flash_attention_dropout_forward(q, k, v, p, seed, is_causal=is_causal, Br=Br, Bc=Bc)
    torch.testing.assert_close(o, o_ref, atol=1e-10, rtol=1e-10)
    dq, dk, dv = flash_attention_dropout_backward(q, k, v, o, lse, do, p, seed,
                                                  is_causal=is_causal, Br=Br, Bc=Bc)
    for got, want in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_gradcheck_of_the_reference():
    q, k, v = (t.requires_grad_(True) for t in _inputs(Nq=6, Nk=5, D=3))
    assert torch.autograd.gradcheck(lambda a, b, c: attention_dropout_reference(a, b, c, 0.3, 5),
                                    (q, k, v))


def test_dropout_output_is_unbiased():
    # averaged over many seeds, dropout attention tends to plain attention
    q, k, v = _inputs(Nq=8, Nk=8, D=4, H=1)
    mean = sum(flash_attention_dropout_forward(q, k, v, 0.5, s, Br=4, Bc=4)[0]
               for s in range(400)) / 400
    plain = F.scaled_dot_product_attention(q, k, v)
    assert (mean - plain).abs().max().item() < 0.15
    one = flash_attention_dropout_forward(q, k, v, 0.5, 0, Br=4, Bc=4)[0]
    assert (one - plain).abs().max().item() > 0.15


# ------------------------------------------------------------------ the mistakes
def _fresh_mask_backward(q, k, v, o, lse, do, p, seed):
    """Wrong: the backward draws a new mask (the RNG state was not saved)."""
    return flash_attention_dropout_backward(q, k, v, o, lse, do, p, seed + 1)


def _dropped_l_forward(q, k, v, p, seed):
    """Wrong: the running sum l adds the dropped probabilities."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale
    z = dropout_keep_mask(seed, q.shape[0], q.shape[1], range(q.shape[2]), range(k.shape[2]), p)
    e = torch.exp(s - s.amax(-1, keepdim=True)) * z / (1 - p)
    return (e / e.sum(-1, keepdim=True)) @ v


def _no_rescale_forward(q, k, v, p, seed):
    """Wrong: the kept probabilities are not divided by 1 - p."""
    prob = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
    z = dropout_keep_mask(seed, q.shape[0], q.shape[1], range(q.shape[2]), range(k.shape[2]), p)
    return (prob * z) @ v


def _undropped_dp_backward(q, k, v, o, lse, do, p, seed):
    """Wrong: dP taken as dO V^T without the mask (dropout forgotten in the backward)."""
    return flash_attention_dropout_backward(q, k, v, o, lse, do, 0.0, seed)


def test_each_mistake_is_caught():
    q, k, v = _inputs()
    do = torch.randn_like(q)
    p, seed = 0.2, 99
    o_ref, dq_ref, dk_ref, dv_ref = _reference_grads(q, k, v, do, p, seed, False)
    o, lse = flash_attention_dropout_forward(q, k, v, p, seed)
    for wrong in (_dropped_l_forward, _no_rescale_forward):
        assert (wrong(q, k, v, p, seed) - o_ref).abs().max().item() > 1e-2, wrong.__doc__
    for wrong in (_fresh_mask_backward, _undropped_dp_backward):
        grads = wrong(q, k, v, o, lse, do, p, seed)
        worst = max((g - w).abs().max().item() for g, w in zip(grads, (dq_ref, dk_ref, dv_ref)))
        assert worst > 1e-2, wrong.__doc__


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("p,seed,exc", [(1.0, 0, ValueError), (-0.1, 0, ValueError),
                                        ("0.1", 0, TypeError), (0.1, -1, ValueError),
                                        (0.1, 1.5, TypeError), (True, 0, TypeError)])
def test_bad_p_or_seed(p, seed, exc):
    q, k, v = _inputs()
    with pytest.raises(exc, match="p must|seed must"):
        flash_attention_dropout_forward(q, k, v, p, seed)


def test_bad_shapes():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="enable_gqa=True|as many K/V heads"):
        flash_attention_dropout_forward(q, k[:, :1], v[:, :1], 0.1, 0)
    o, lse = flash_attention_dropout_forward(q, k, v, 0.1, 0)
    with pytest.raises(ValueError, match="lse must be a tensor of shape"):
        flash_attention_dropout_backward(q, k, v, o, lse[..., :-1], o, 0.1, 0)
    with pytest.raises(ValueError, match="Br must be a positive int"):
        flash_attention_dropout_forward(q, k, v, 0.1, 0, Br=0)
