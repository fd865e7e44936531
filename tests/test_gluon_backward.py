"""Lesson 8's Gluon backward (course_utils.hopper.gluon_bwd): bad arguments are refused
before any launch on every machine; on an sm90 GPU the gradients of ragged, GQA and
masked cases match float64 autograd about as closely as lesson 7's Triton backward."""
import pytest
import torch

from course_utils import device
from course_utils.hopper import gluon_bwd
from tests.bench_scripts import load

DEV = device.DEVICE


def _inputs(b, hq, hkv, nq, nk, d, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g)
    k, v = (torch.randn(b, hkv, nk, d, generator=g) for _ in range(2))
    do = torch.randn(b, hq, nq, d, generator=g)
    return [t.to(dtype).to(DEV) for t in (q, k, v, do)]


def _lse(q):
    return torch.zeros(q.shape[:3], device=q.device)


@pytest.mark.parametrize("change, error, words", [
    (dict(o="shape"), ValueError, "o must be a tensor of shape"),
    (dict(do="dtype"), TypeError, "do must have q's dtype"),
    (dict(lse="dtype"), TypeError, "lse must be float32"),
    (dict(lse="list"), TypeError, "lse must be a tensor"),
    (dict(stages=0), ValueError, "stages must be an int in 1..4"),
    (dict(stages=True), ValueError, "stages must be an int"),
    (dict(consumer_regs=250), ValueError, "consumer_regs"),
    (dict(loader_regs=20), ValueError, "loader_regs"),
    (dict(d=128, stages=4), ValueError, "KiB of shared memory"),
    (dict(d=32), ValueError, "head dim"),
    (dict(dtype=torch.float32), TypeError, "takes float16, bfloat16"),
])
def test_bad_arguments_are_refused_before_launch(change, error, words):
    d = change.pop("d", 64)
    dtype = change.pop("dtype", torch.float16)
    q, k, v, do = _inputs(1, 2, 2, 64, 64, d, dtype)
    o, lse = q.clone(), _lse(q)
    bad = change.copy()
    if bad.pop("o", None):
        o = o[:, :, :32]
    if bad.pop("do", None):
        do = do.to(torch.bfloat16 if dtype == torch.float16 else torch.float16)
    what = bad.pop("lse", None)
    if what == "dtype":
        lse = lse.double()
    elif what == "list":
        lse = lse.tolist()
    with pytest.raises(error, match=words):
        gluon_bwd.attention_gluon_backward(q, k, v, o, lse, do, **bad)


@pytest.mark.skipif(not device.HAS_TRITON, reason="needs Triton")
def test_row_stats_scale_lse_sum_delta_and_pad_every_head():
    # two heads' worth of ragged tiles (70 rows: one whole tile and 6 rows of the next),
    # one row that saw no key; checked per head, so rows written into the wrong head's
    # slots, an unscaled LSE, a -inf left as it is or unwritten padding all fail
    b, h, nq, d = 2, 3, 70, 64
    g = torch.Generator().manual_seed(7)
    o, do = (torch.randn(b, h, nq, d, generator=g).to(torch.float16).to(DEV)
             for _ in range(2))
    lse = (torch.randn(b, h, nq, generator=g) * 3).to(DEV)
    lse[1, 2, 5] = float("-inf")
    lse2, delta = gluon_bwd.row_stats(o, do, lse)
    pad = 2 * gluon_bwd.BWD_BLOCK_M
    assert lse2.shape == delta.shape == (b * h * pad,)
    lse2, delta = lse2.view(b, h, pad).cpu(), delta.view(b, h, pad).cpu()
    want = lse.cpu() * 1.4426950408889634
    want[1, 2, 5] = float("inf")
    torch.testing.assert_close(lse2[..., :nq], want, rtol=1e-6, atol=0)
    torch.testing.assert_close(delta[..., :nq], (o.float() * do.float()).sum(-1).cpu(),
                               rtol=1e-5, atol=1e-5)
    assert torch.isposinf(lse2[..., nq:]).all()
    assert (delta[..., nq:] == 0).all()


@pytest.mark.skipif(device.IS_HOPPER, reason="off sm90 only")
def test_off_hopper_a_valid_call_says_what_it_needs():
    q, k, v, do = _inputs(1, 2, 2, 64, 64, 64)
    with pytest.raises(RuntimeError, match="sm90"):
        gluon_bwd.attention_gluon_backward(q, k, v, q.clone(), _lse(q), do)
    with pytest.raises(RuntimeError, match="sm90"):
        gluon_bwd.gluon_attention(q.requires_grad_(), k, v)


PROBE = load("gluon_bwd_probe")     # its float64 forward, reference and error measure
_ref, _rel, _forward = PROBE.reference, PROBE.rel, PROBE.forward


# (B, Hq, Hkv, Nq, Nk, D): whole tiles, lengths off the 64-row query step and the
# 128-key tile both ways, one query, GQA and MQA, and Nq > Nk (rows without keys under
# the lower-right mask). At D = 64 a program's steps (query tiles times the group's heads)
# run in pairs with the last one's dQ made after the loop, so the last two cases give
# programs an odd number of steps (1, 3, 5; 3 and 9 with a pair across two heads) and,
# under the mask, none
HOPPER_CASES = [(2, 4, 4, 512, 512, 128), (2, 4, 2, 300, 129, 128), (1, 4, 1, 129, 300, 64),
                (1, 2, 2, 1, 77, 128), (1, 4, 4, 384, 128, 64), (1, 4, 2, 256, 640, 128),
                (1, 8, 2, 1000, 1000, 64), (1, 2, 2, 300, 400, 64), (1, 3, 1, 190, 140, 64)]
# relative error of a gradient against float64: the Triton backward of lesson 7 measures
# about 3e-4 in float16 on these cases; bfloat16 keeps 3 fewer mantissa bits (8x)
BOUND = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.mark.hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", HOPPER_CASES, ids=lambda c: "x".join(map(str, c)))
def test_gradients_match_float64(case, dtype):
    b, hq, hkv, nq, nk, d = case
    q, k, v, do = _inputs(b, hq, hkv, nq, nk, d, dtype, seed=nq + nk)
    for alignment in (None, "causal_upper_left", "causal_lower_right"):
        opts = dict(is_causal=alignment is not None, alignment=alignment, enable_gqa=hkv != hq)
        o, lse = _forward(q, k, v, alignment)
        _, refs = _ref(q, k, v, do, alignment)
        grads = gluon_bwd.attention_gluon_backward(q, k, v, o, lse, do, **opts)
        for name, x, r in zip(("dq", "dk", "dv"), grads, refs):
            where = f"{name} {case} {alignment} {dtype}"
            assert x.dtype == dtype and x.shape == r.shape, where
            assert torch.isfinite(x).all(), where
            assert _rel(x, r) < BOUND[dtype], (where, _rel(x, r))
        if alignment == "causal_lower_right" and nq > nk:
            # the first Nq - Nk rows see no key: no gradient flows through them
            assert (grads[0][:, :, :nq - nk] == 0).all(), case


@pytest.mark.hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_as_close_as_the_triton_backward(dtype):
    from course_utils.triton_attention import triton_attention_backward, triton_attention_forward
    q, k, v, do = _inputs(2, 4, 2, 300, 129, 128, dtype, seed=3)
    for alignment in (None, "causal_upper_left", "causal_lower_right"):
        opts = dict(is_causal=alignment is not None, alignment=alignment, enable_gqa=True)
        o, lse = triton_attention_forward(q, k, v, **opts)
        _, refs = _ref(q, k, v, do, alignment)
        ours = gluon_bwd.attention_gluon_backward(q, k, v, o, lse, do, **opts)
        theirs = triton_attention_backward(q, k, v, o, lse, do, **opts)
        for name, x, t, r in zip(("dq", "dk", "dv"), ours, theirs, refs):
            # the same sums in another order: within half again of the Triton error
            assert _rel(x, r) <= 1.5 * _rel(t, r), (name, alignment, _rel(x, r), _rel(t, r))


@pytest.mark.hopper
def test_autograd_pairs_the_gluon_forward_with_this_backward():
    q, k, v, do = _inputs(1, 8, 2, 777, 777, 128, seed=5)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = gluon_bwd.gluon_attention(q, k, v, is_causal=True, enable_gqa=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    o64, refs = _ref(q, k, v, do, "causal_upper_left")
    assert _rel(o, o64) < 4e-3
    for name, x, r in zip(("dq", "dk", "dv"), grads, refs):
        assert _rel(x, r) < BOUND[torch.float16], name


if gluon_bwd.GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def _round_kernel(x_ptr, y_ptr, N: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([2], [32], [4], [0])
        offs = gl.arange(0, N, layout=layout)
        gl.store(y_ptr + offs, gluon_bwd._round_16(gl.load(x_ptr + offs), gl.bfloat16))


@pytest.mark.hopper
def test_packed_bfloat16_rounding_matches_torch_bit_for_bit():
    # _round_16 writes float32 -> bfloat16 as one PTX instruction per pair of values: the
    # same rounding as torch's (to nearest, ties to even), each value in its own place
    # (a swapped pair would put every odd value first), infinities and NaN kept
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4096, generator=g) * 10.0 ** torch.randint(-30, 30, (4096,), generator=g)
    # exact ties: 1..512 with the highest bit that bfloat16 drops set, halfway between
    # two bfloat16 neighbours (ties to even: some round up, some down)
    x[:512] = torch.arange(1, 513, dtype=torch.float32).view(torch.int32) \
        .bitwise_or(0x8000).view(torch.float32)
    x[512:516] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    x = x.to(DEV)
    y = torch.empty(x.shape, device=DEV, dtype=torch.bfloat16)
    _round_kernel[(1,)](x, y, N=x.numel(), num_warps=4)
    want = x.to(torch.bfloat16)
    assert torch.equal(y[:514].view(torch.int16), want[:514].view(torch.int16))
    assert torch.isnan(y[514]) and torch.equal(y[515:], want[515:])
    chopped = x[:512].view(torch.int32).bitwise_and(-65536).view(torch.float32)
    assert not torch.equal(y[:512], chopped.to(torch.bfloat16))       # not truncation
