"""The tiled attention backward of lesson 5 (course_utils/backward.py)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.attention import TrafficCounter, flash_attention_fa2, naive_attention
from course_utils.backward import (BACKWARD_TENSORS, AllocationTracker, FlashAttentionFunction,
                                   attention_backward_reference, autograd_reference,
                                   backward_traffic_formula, flash_attention,
                                   flash_attention_backward)

SIZES = [1, 7, 129, 300]


def _inputs(B, Hkv, group, Nq, Nk, D, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hkv * group, Nq, D, generator=gen).to(dtype)
    k = torch.randn(B, Hkv, Nk, D, generator=gen).to(dtype)
    v = torch.randn(B, Hkv, Nk, D, generator=gen).to(dtype)
    do = torch.randn(B, Hkv * group, Nq, D, generator=gen).to(dtype)
    return q, k, v, do


def _assert_grads_close(got, ref, atol, rtol):
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


# ----------------------------------------------------------------- gradients vs autograd

@settings(max_examples=10, deadline=None)
@given(Nq=st.sampled_from(SIZES), Nk=st.sampled_from(SIZES), causal=st.booleans(),
       Hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 3]),
       D=st.sampled_from([4, 16]), Br=st.sampled_from([None, 16, 48]),
       Bc=st.sampled_from([None, 32, 80]), d_trick=st.booleans())
def test_tiled_backward_matches_autograd(Nq, Nk, causal, Hkv, group, D, Br, Bc, d_trick):
    q, k, v, do = _inputs(1, Hkv, group, Nq, Nk, D, seed=Nq * 7 + Nk)
    o, lse = flash_attention_fa2(q, k, v, enable_gqa=True, is_causal=causal, return_lse=True)
    got = flash_attention_backward(q, k, v, o, lse, do, enable_gqa=True, is_causal=causal, Br=Br, Bc=Bc,
                                   d_trick=d_trick)
    _assert_grads_close(got, autograd_reference(q, k, v, do, enable_gqa=True, is_causal=causal), 2e-5, 2e-4)


@pytest.mark.parametrize("Nq,Nk", [(1, 300), (300, 7), (129, 129), (7, 129)])
@pytest.mark.parametrize("causal", [False, True])
def test_autograd_function_matches_naive_autograd(Nq, Nk, causal):
    """loss.backward() through flash_attention == loss.backward() through naive_attention."""
    q, k, v, do = _inputs(2, 2, 2, Nq, Nk, 8, seed=Nq + Nk)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = flash_attention(*leaves, enable_gqa=True, is_causal=causal, scale=0.3, Br=32, Bc=64)
    torch.testing.assert_close(out, naive_attention(q, k, v, enable_gqa=True, is_causal=causal, scale=0.3),
                               atol=2e-5, rtol=2e-5)
    (out * do).sum().backward()
    got = [t.grad for t in leaves]
    _assert_grads_close(got, autograd_reference(q, k, v, do, enable_gqa=True, is_causal=causal, scale=0.3),
                        2e-5, 2e-4)


def test_whole_matrix_formulas_match_autograd():
    """The lesson's derivation, written with full matrices, is what autograd computes."""
    for causal in (False, True):
        q, k, v, do = _inputs(1, 2, 3, 9, 13, 5, dtype=torch.float64)
        got = attention_backward_reference(q, k, v, do, enable_gqa=True, is_causal=causal, scale=0.7)
        _assert_grads_close(got, autograd_reference(q, k, v, do, enable_gqa=True, is_causal=causal, scale=0.7),
                            1e-10, 1e-10)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 1, 5, 7, 3), (2, 1, 2, 6, 4, 2)])
def test_gradcheck_float64(causal, shape):
    B, Hkv, group, Nq, Nk, D = shape
    q, k, v, _ = _inputs(B, Hkv, group, Nq, Nk, D, dtype=torch.float64, seed=3)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]

    def f(a, b, c):
        return flash_attention(a, b, c, enable_gqa=True, is_causal=causal, Br=2, Bc=3)
    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_accumulate_in_float32(dtype):
    q, k, v, do = _inputs(1, 1, 2, 129, 70, 16, dtype=dtype)
    o, lse = flash_attention_fa2(q, k, v, return_lse=True, enable_gqa=True)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, Br=32, Bc=32, enable_gqa=True)
    assert (dq.dtype, dk.dtype, dv.dtype) == (dtype, dtype, dtype)
    ref = attention_backward_reference(*(t.double() for t in (q, k, v, do)), enable_gqa=True)
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    _assert_grads_close((dq, dk, dv), ref, tol, tol)


def test_only_requested_gradients_are_returned():
    q, k, v, do = _inputs(1, 1, 1, 7, 9, 4)
    k.requires_grad_(True)
    flash_attention(q, k, v, enable_gqa=True).backward(do)
    assert k.grad is not None and q.grad is None and v.grad is None


def test_rows_without_visible_keys_get_zero_gradient():
    """A row whose lse is -inf (no visible key) contributes nothing, not NaN."""
    q, k, v, do = _inputs(1, 1, 1, 4, 5, 3)
    o, lse = flash_attention_fa2(q, k, v, return_lse=True, enable_gqa=True)
    lse[..., 2] = float("-inf")
    o[..., 2, :] = 0.0
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, Br=2, Bc=2, enable_gqa=True)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert dq[..., 2, :].abs().max() == 0


# ----------------------------------------------------------------- no Nq x Nk tensor

def test_backward_never_allocates_an_nq_by_nk_tensor():
    Nq, Nk, B, H = 96, 160, 1, 2
    q, k, v, do = _inputs(B, H, 1, Nq, Nk, 16)
    o, lse = flash_attention_fa2(q, k, v, return_lse=True, enable_gqa=True)
    for d_trick in (True, False):
        with AllocationTracker() as rec:
            flash_attention_backward(q, k, v, o, lse, do, Br=32, Bc=32, d_trick=d_trick, enable_gqa=True)
        assert rec.shapes, "the tracker saw no torch operation"
        assert not rec.saw_matrix(Nq, Nk) and not rec.saw_matrix(Nk, Nq)
        shape = rec.largest()
        numel = rec.largest_numel()
        assert numel < Nq * Nk, f"backward made a {shape} tensor"
        # the biggest tensors are the (N, D) gradients, not score-sized
        assert numel <= B * H * max(Nq, Nk) * 16


def test_allocation_recorder_catches_the_whole_matrix_backward():
    """The detector can fail: the whole-matrix backward does build Nq x Nk tensors."""
    Nq, Nk = 96, 160
    q, k, v, do = _inputs(1, 2, 1, Nq, Nk, 16)
    with AllocationTracker() as rec:
        attention_backward_reference(q, k, v, do, enable_gqa=True)
    assert rec.saw_matrix(Nq, Nk)
    assert rec.largest_numel() >= 2 * Nq * Nk


# ----------------------------------------------------------------- counted traffic

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 2])
def test_counted_traffic_matches_the_formula(causal, group):
    B, Hkv, Nq, Nk, D, Br, Bc = 2, 1, 70, 100, 8, 16, 32
    q, k, v, do = _inputs(B, Hkv, group, Nq, Nk, D)
    o, lse = flash_attention_fa2(q, k, v, enable_gqa=True, is_causal=causal, return_lse=True)
    for d_trick in (True, False):
        c = TrafficCounter()
        flash_attention_backward(q, k, v, o, lse, do, enable_gqa=True, is_causal=causal, Br=Br, Bc=Bc,
                                 counter=c, d_trick=d_trick)
        f = backward_traffic_formula(Nq, Nk, D, Br, Bc, B=B, H=Hkv * group, is_causal=causal,
                                     d_trick=d_trick)
        assert c.as_dict(BACKWARD_TENSORS) == f
        assert set(c.reads) | set(c.writes) <= set(BACKWARD_TENSORS)
        assert c.tiles_visited == (1 if d_trick else 2) * sum(
            1 for i in range(0, Nq, Br) for j in range(0, Nk, Bc) if not causal or j <= min(i + Br, Nq) - 1)


@pytest.mark.parametrize("Nq,Nk", [(129, 300), (300, 7)])
def test_k_and_v_loaded_once_with_the_d_trick_twice_without(Nq, Nk):
    B, Hkv, group, D = 1, 2, 2, 8
    q, k, v, do = _inputs(B, Hkv, group, Nq, Nk, D)
    o, lse = flash_attention_fa2(q, k, v, return_lse=True, enable_gqa=True)
    per_head_kv = B * Hkv * group * Nk * D   # every K (and V) element, once per query head
    loads = {}
    for d_trick in (True, False):
        c = TrafficCounter()
        flash_attention_backward(q, k, v, o, lse, do, Br=32, Bc=64, counter=c, d_trick=d_trick, enable_gqa=True)
        loads[d_trick] = (c.reads["K"], c.reads["V"])
    assert loads[True] == (per_head_kv, per_head_kv)
    assert loads[False] == (2 * per_head_kv, 2 * per_head_kv)


def test_d_trick_reads_o_once_and_without_it_never():
    q, k, v, do = _inputs(1, 1, 1, 50, 40, 4)
    o, lse = flash_attention_fa2(q, k, v, return_lse=True, enable_gqa=True)
    with_trick, without = TrafficCounter(), TrafficCounter()
    flash_attention_backward(q, k, v, o, lse, do, Br=16, Bc=16, counter=with_trick, enable_gqa=True)
    flash_attention_backward(q, k, v, o, lse, do, Br=16, Bc=16, counter=without, d_trick=False, enable_gqa=True)
    assert with_trick.reads["O"] == o.numel() and "O" not in without.reads
    assert without.total_reads > with_trick.total_reads


def test_traffic_formula_closed_form():
    Nq, Nk, D, Br, Bc = 256, 512, 64, 64, 128
    tc = math.ceil(Nk / Bc)
    f = backward_traffic_formula(Nq, Nk, D, Br, Bc)
    assert f["K reads"] == Nk * D and f["Q reads"] == tc * Nq * D
    assert f["dO reads"] == Nq * D + tc * Nq * D and f["D writes"] == Nq
    g = backward_traffic_formula(Nq, Nk, D, Br, Bc, d_trick=False)
    assert g["K reads"] == 2 * Nk * D and g["O reads"] == 0
    with pytest.raises(TypeError, match="Br"):
        backward_traffic_formula(Nq, Nk, D, None, Bc)
    with pytest.raises(ValueError, match="Bc"):
        backward_traffic_formula(Nq, Nk, D, Br, 0)


# ----------------------------------------------------------------- bad input

def _good():
    q, k, v, do = _inputs(1, 2, 2, 5, 6, 4)
    o, lse = flash_attention_fa2(q, k, v, return_lse=True, enable_gqa=True)
    return dict(q=q, k=k, v=v, o=o, lse=lse, do=do)


@pytest.mark.parametrize("change,exc,words", [
    (dict(o=torch.zeros(1, 4, 5, 3)), ValueError, "o must have shape"),
    (dict(do=[[1.0]]), TypeError, "do must be a torch.Tensor"),
    (dict(do=torch.zeros(1, 4, 5, 4, dtype=torch.int32)), TypeError, "floating"),
    (dict(lse=torch.zeros(1, 4, 6)), ValueError, "lse must have shape"),
    (dict(lse=None), TypeError, "lse must be a torch.Tensor"),
    (dict(Br=0), ValueError, "Br"),
    (dict(Bc=2.5), TypeError, "Bc"),
    (dict(Br=True), TypeError, "Br"),
    (dict(d_trick="yes"), TypeError, "d_trick"),
    (dict(counter={}), TypeError, "counter"),
    (dict(is_causal=1), TypeError, "is_causal"),
    (dict(k=torch.zeros(1, 3, 6, 4), v=torch.zeros(1, 3, 6, 4)), ValueError, "multiple"),
    (dict(scale=-1.0), ValueError, "scale"),
])
def test_bad_input_is_rejected_before_any_work(change, exc, words):
    args = dict(_good(), **change)
    counter = args.pop("counter", None) if "counter" in change else TrafficCounter()
    with AllocationTracker() as rec, pytest.raises(exc, match=words):
        flash_attention_backward(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("o"),
                                 args.pop("lse"), args.pop("do"), counter=counter, **args, enable_gqa=True)
    if isinstance(counter, TrafficCounter):
        assert counter.total == 0
    assert not any(op in ("mm", "bmm", "matmul") for op in rec.ops)


def test_flash_attention_rejects_bad_input_before_the_forward():
    q, k, v, _ = _inputs(1, 1, 1, 3, 3, 2)
    with pytest.raises(ValueError, match="Br"):
        flash_attention(q, k, v, Br=-1, enable_gqa=True)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        flash_attention(q, "k", v, enable_gqa=True)
    assert FlashAttentionFunction.apply(q, k, v, False, None, None, None).shape == q.shape


# The problem set's checks against wrong answers: tests/test_wrong_answers.py grades them
# through course-grade (tests/wrong_answers/05_backward_pass.py).


@pytest.mark.parametrize("causal", [False, True])
def test_float64_gradients_are_float64_accurate(causal):
    """float64 inputs keep the saved lse in float64, so the tiled gradients agree with the
    whole-matrix formulas to float64 round-off (a float32 lse limits them to ~1e-7)."""
    q, k, v, do = _inputs(1, 4, 2, 19, 23, 8, dtype=torch.float64)
    o, lse = flash_attention_fa2(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    assert lse.dtype == torch.float64
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    flash_attention(*leaves, is_causal=causal, enable_gqa=True, Br=8, Bc=8).backward(do)
    ref = attention_backward_reference(q, k, v, do, is_causal=causal, enable_gqa=True)
    for name, got, want in zip("qkv", (t.grad for t in leaves), ref):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("Nq,Nk", [(13, 29), (29, 13), (16, 16)])
def test_lower_right_alignment_gradients(Nq, Nk):
    """causal_lower_right through the tiled forward and backward matches autograd through
    an explicit boolean mask (rows with no visible key get zero output and gradient)."""
    q, k, v, do = _inputs(1, 1, 2, Nq, Nk, 8, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = flash_attention(*leaves, is_causal=True, alignment="causal_lower_right",
                          enable_gqa=True, Br=4, Bc=8)
    out.backward(do)
    mask = torch.ones(Nq, Nk, dtype=torch.bool).tril(Nk - Nq)
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    s = ref_leaves[0] @ ref_leaves[1].repeat_interleave(2, 1).transpose(-1, -2) / 8 ** 0.5
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    ref = p @ ref_leaves[2].repeat_interleave(2, 1)
    ref.backward(do)
    torch.testing.assert_close(out, ref.detach(), atol=1e-12, rtol=1e-12)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-12, rtol=1e-10)
