"""Kernel hardening: tile-ratio asserts, rows that see no key, 64-bit offsets, strided
decode metadata, bucketed autotune keys and the one-slot Gluon ring.

The CPU tests run Triton's interpreter at tiny sizes; the ``gpu`` / ``hopper`` tests use
tensors past 2**31 elements (several GB each) and run only on a GPU."""
import math
import subprocess
import sys
import textwrap

import pytest
import torch

from course_utils import device
import triton  # noqa: E402  (after course_utils.device: the interpreter switch)
from course_utils import triton_attention as ta
from course_utils.attention import naive_attention
from course_utils.constants import CAUSAL_LOWER_RIGHT
from course_utils.decoding import decode_attention_reference, gather_paged_cache
from course_utils.triton_decode import decode_attention

DEV = device.DEVICE
BIG = 2 ** 31
# float32 inputs: exact in the interpreter, TF32 tensor cores on a GPU (about 1e-3)
TOL = 5e-3 if device.HAS_GPU else 1e-4


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEV, dtype=dtype)


# --------------------------------------------------------------- tile-ratio asserts
def _fwd_raw(block_m, block_n):
    q = torch.randn(1, 1, 32, 16)
    o, lse = torch.empty_like(q), torch.empty(1, 1, 32)
    st = (q.stride(0), q.stride(1), q.stride(2)) * 4
    ta._attn_fwd_kernel[(1, 1)](q, q, q, o, lse, *st, 1, 1, 32, 32, 16, 0, 1.0, 32, 32,
                                HEAD_DIM=16, CAUSAL=True, PAD_D=False, UPCAST=False,
                                POS_SCALE=True, BLOCK_M=block_m, BLOCK_N=block_n)
    return o


def _dq_raw(block_m2, block_n2):
    q = torch.randn(1, 1, 32, 16)
    lse, delta = torch.zeros(1, 1, 32), torch.zeros(1, 1, 32)
    st = (q.stride(0), q.stride(1), q.stride(2))
    ta._attn_bwd_dq_kernel[(1, 1)](q, q, q, q, lse, delta, torch.empty_like(q), *st * 5,
                                   1, 1, 32, 32, 16, 1.0, 1.0, 0, 32, 32, HEAD_DIM=16,
                                   CAUSAL=True, PAD_D=False, UPCAST=False,
                                   BLOCK_M2=block_m2, BLOCK_N2=block_n2)


def _dkdv_raw(block_m1, block_n1, atomic_dq=False):
    q = torch.randn(1, 1, 32, 16)
    lse, delta = torch.zeros(1, 1, 32), torch.zeros(1, 1, 32)
    st = (q.stride(0), q.stride(1), q.stride(2))
    ta._attn_bwd_dkdv_kernel[(1, 1)](q, q, q, q, lse, delta, torch.empty_like(q),
                                     torch.empty_like(q), torch.zeros_like(q), *st * 7,
                                     1, 1, 1, 32, 32, 16, 1.0, 1.0, 0, 32, 32, HEAD_DIM=16,
                                     CAUSAL=True, PAD_D=False, UPCAST=False,
                                     ATOMIC_DQ=atomic_dq, BLOCK_M1=block_m1, BLOCK_N1=block_n1)


def _atomic_dq_raw(block_m1, block_n1):
    _dkdv_raw(block_m1, block_n1, atomic_dq=True)


@pytest.mark.skipif(not device.INTERPRET, reason="the GPU variant is test_tile_ratio_gpu")
@pytest.mark.parametrize("call, bad, good, msg", [
    (_fwd_raw, (16, 32), (32, 16), "BLOCK_M must be a multiple of BLOCK_N"),
    (_dq_raw, (16, 32), (32, 16), "BLOCK_M2 must be a multiple of BLOCK_N2"),
    (_dkdv_raw, (32, 16), (16, 32), "BLOCK_N1 must be a multiple of BLOCK_M1"),
    (_atomic_dq_raw, (32, 16), (16, 32), "BLOCK_N1 must be a multiple of BLOCK_M1"),
])
def test_tile_ratio_is_asserted(call, bad, good, msg):
    # a tile shape the causal split cannot handle is refused when the kernel is built,
    # instead of silently skipping or double-counting keys
    with pytest.raises(Exception, match=msg):
        call(*bad)
    call(*good)                                            # a legal ratio runs


# --------------------------------------------------------------- rows that see no key
def _masked_ref(q, k, v, diag):
    nq, nk = q.shape[2], k.shape[2]
    keep = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diag)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ v.double()
    return o, lse


@pytest.mark.parametrize("nq, nk", [(40, 24), (70, 9), (33, 33)])
def test_rows_without_keys_are_zero_with_lse_minus_inf(nq, nk):
    q, k, v = _rand(1, 2, nq, 16, seed=1), _rand(1, 2, nk, 16, seed=2), _rand(1, 2, nk, 16, seed=3)
    diag = nk - nq                            # bottom-right: the first nq - nk rows see nothing
    o, lse = ta.triton_attention_forward(q, k, v, is_causal=True, alignment="causal_lower_right")
    ref, ref_lse = _masked_ref(q, k, v, diag)
    empty = max(0, nq - nk)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert (o[:, :, :empty] == 0).all()
    assert torch.isneginf(lse[:, :, :empty]).all()
    torch.testing.assert_close(o.double(), ref, atol=max(TOL, 2e-3), rtol=max(TOL, 2e-3))
    torch.testing.assert_close(lse[:, :, empty:].double(), ref_lse[:, :, empty:], atol=TOL,
                               rtol=TOL)


# ------------------------------------------------- lazy rescaling (the LAZY switch)
def _fwd_switches(q, k, v, causal, **switches):
    """The forward kernel launched directly, 32 x 16 tiles, with the given switches."""
    b, h, n, d = q.shape
    o, lse = torch.empty_like(q), torch.empty(b, h, n, device=q.device)
    st = [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3]]
    ta._attn_fwd_kernel[((n + 31) // 32, b * h)](
        q, k, v, o, lse, *st, h, 1, n, n, d, 0, d ** -0.5 * ta.LOG2E, ta.length_bucket(n),
        ta.length_bucket(n), HEAD_DIM=d, CAUSAL=causal, PAD_D=False, UPCAST=False,
        POS_SCALE=True, BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, **switches)
    return o, lse


@pytest.mark.parametrize("causal", [False, True])
def test_lazy_rescaling_matches_the_reference_whether_or_not_it_rescales(causal):
    # every query sees scores set per 16-key tile, in base-2 units: +4 (kept maximum,
    # p up to 16), +7.9 (kept, p up to 2**7.9), +26 (past the threshold: rescaled),
    # +1, then lower: both branches of the lazy update run. float16, so p would overflow
    # if the maximum were never moved (2**38.9 > 65504), though float32 would hide that.
    n, d = 96, 16
    steps = torch.tensor([0.0, 4.0, 11.9, 37.9, 38.9, 30.0])
    base2 = steps.repeat_interleave(16)                       # score of each key, base 2
    q = _rand(1, 1, n, d, seed=6) * 0.05
    q[..., 0] = 1.0
    k = _rand(1, 1, n, d, seed=4) * 0.05
    k[..., 0] = base2.to(DEV) / (d ** -0.5 * ta.LOG2E)
    v = _rand(1, 1, n, d, seed=5)
    q, k, v = q.half(), k.half(), v.half()
    ref, ref_lse = _masked_ref(q, k, v, 0 if causal else n)
    for lazy in (False, True):
        o, lse = _fwd_switches(q, k, v, causal, LAZY=lazy)
        torch.testing.assert_close(o.double(), ref, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse.double(), ref_lse, atol=1e-3, rtol=1e-3)


# ------------------------------------------- K and V through tensor descriptors (DESC)
def _fwd_desc(q, k, v, causal, d, desc, group=1, diag=0, tile=(32, 16, 4, 1)):
    """The forward kernel launched directly, ``tile`` = (BLOCK_M, BLOCK_N, warps, stages),
    head dim ``d`` padded to a power of two, K and V through descriptors (``desc``) or
    pointers."""
    bm, bn, warps, stages = tile
    b, hq, nq, _ = q.shape
    nk = k.shape[2]
    hd = ta.padded_head_dim(d)
    o, lse = torch.empty_like(q), torch.empty(b, hq, nq, device=q.device)
    st = [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3]]
    if q.is_cuda:
        triton.set_allocator(ta._scratch)         # descriptors made on the device
    ta._attn_fwd_kernel[((nq + bm - 1) // bm, b * hq)](
        q, k, v, o, lse, *st, hq, group, nq, nk, d, diag, d ** -0.5 * ta.LOG2E,
        ta.length_bucket(nq), ta.length_bucket(nk), HEAD_DIM=hd, CAUSAL=causal,
        PAD_D=hd != d, UPCAST=ta._upcast(q), POS_SCALE=True, BLOCK_M=bm, BLOCK_N=bn, DESC=desc,
        num_warps=warps, num_stages=stages)
    return o, lse


def _check_desc(b, nq, nk, d, group, causal, tile, seed, dtype=torch.float16):
    """Run the descriptor forward on random ``dtype`` inputs (two K/V heads, ``group``
    query heads each; causal: the bottom-right mask) and check it against the float64
    reference: outputs, the log-sum-exp of rows that see a key, and 0 / -inf for rows
    that see none. Returns ``q, k, v, o``."""
    q = _rand(b, 2 * group, nq, d, seed=seed).to(dtype)
    k, v = (_rand(b, 2, nk, d, seed=seed + i).to(dtype) for i in (1, 2))
    diag = nk - nq if causal else 0
    o, lse = _fwd_desc(q, k, v, causal, d, True, group, diag, tile=tile)
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    ref, ref_lse = _masked_ref(q, kk, vv, diag if causal else nk)
    tol = 1e-2 if dtype == torch.float16 else 3e-2           # P rounded to 11 / 8 bits
    torch.testing.assert_close(o.double(), ref, atol=tol, rtol=tol)
    seen = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[seen], ref_lse[seen], atol=1e-3, rtol=1e-3)
    assert torch.isneginf(lse[~seen]).all() and (o[~seen] == 0).all()
    return q, k, v, o


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk, d, group, dtype", [
    (64, 64, 16, 1, torch.float16), (40, 56, 24, 1, torch.float16),
    (33, 70, 16, 2, torch.float16), (48, 20, 8, 1, torch.float16),
    (40, 56, 24, 2, torch.bfloat16)])
def test_tiles_through_descriptors_match_the_reference(causal, nq, nk, d, group, dtype):
    # key lengths off a multiple of the tile (the descriptor fills the rows past the keys
    # with zeros), head dims below the padded tile (24 in 32, 8 in 16: zero columns),
    # grouped heads (K and V of a head shared by two query heads), bottom-right causal
    # mask with rows that see no key (nq > nk); bfloat16 tiles through the same loads
    q, k, v, o = _check_desc(1, nq, nk, d, group, causal, (32, 16, 4, 1), seed=21, dtype=dtype)
    o_ptr, _ = _fwd_desc(q, k, v, causal, d, False, group, nk - nq if causal else 0)
    torch.testing.assert_close(o, o_ptr, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not (device.HAS_GPU and device.CAPABILITY >= (9, 0)),
                    reason="needs an sm90 GPU or newer (the autotuner's descriptor shape)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 80, 128])
def test_descriptor_tile_shape_on_the_gpu(causal, d):
    # the shape the autotuner offers on sm90 (128 x 64, one warpgroup, two stages) on
    # lengths off the tile, a head dim padded to 128, grouped heads, rows without keys
    _check_desc(2, 300, 203, d, 2, causal, (128, 64, 4, 2), seed=31)


def test_descriptor_tiles_only_where_the_tma_can_read_them():
    base = torch.randn(1, 2, 64, 72, dtype=torch.float16)
    assert ta._tma_readable(base[..., :64].contiguous())
    assert ta._tma_readable(base[..., 8:72])              # rows of 144 bytes, start +16 B
    assert not ta._tma_readable(base[..., 1:65])          # start 2 bytes off 16
    assert not ta._tma_readable(base[..., 8:20])          # rows of 24 bytes in 144-byte steps
    wide = torch.randn(1, 2, 64, 68, dtype=torch.float16)
    assert not ta._tma_readable(wide[..., :64])           # rows of 128 bytes in 136-byte steps
    assert not ta._tma_readable(torch.randn(1, 2, 64, 12, dtype=torch.float16))  # 24-B rows
    assert not ta._tma_readable(torch.randn(1, 2, 64, 64))                        # float32
    assert not ta._tma_readable(base.transpose(2, 3))     # last stride not 1
    if not device.HAS_GPU:
        assert not ta._desc_ok(base, base)                # no GPU, no descriptors
    # the autotuner never tries the descriptor shape for a call that may not take it
    desc = triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "DESC": True}, num_warps=4,
                         num_stages=2)
    plain = triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3)
    q = torch.empty(1, dtype=torch.float16)
    for ok, want in ((0, [plain]), (1, [desc, plain])):
        kept = ta._fits([desc, plain], {"Q": q}, HEAD_DIM=64, DESC_OK=ok)
        assert kept == want or (not ta._AUTOTUNE and kept == want[:1]), (ok, kept)
    big = ta._fits([desc, plain], {"Q": q}, HEAD_DIM=256, DESC_OK=1)   # 512-byte rows
    assert desc not in big
    assert "DESC_OK" in ta._FWD_KEY


# ------------------------------- the backward's query / key tiles through descriptors
def _bwd_tiles(monkeypatch, dkdv, dq, desc):
    """Give each backward kernel one tile shape, ``(BLOCK_M, BLOCK_N, warps, stages)``
    (``dkdv`` for the dK/dV and fused atomic-dQ kernels), reading its streamed tiles
    through descriptors (``desc``) or pointers (the dQ kernel's choice is not a tile
    shape's but :func:`_dq_desc`'s)."""
    monkeypatch.setattr(ta, "_dq_desc", lambda ok, row: desc)
    for slot, raw, names, shape, hook in (
            ("_attn_bwd_dkdv", ta._attn_bwd_dkdv_kernel, ("BLOCK_M1", "BLOCK_N1"), dkdv, None),
            ("_attn_bwd_atomic", ta._attn_bwd_dkdv_kernel, ("BLOCK_M1", "BLOCK_N1"), dkdv,
             ta._zero_dq),
            ("_attn_bwd_dq", ta._attn_bwd_dq_kernel, ("BLOCK_M2", "BLOCK_N2"), dq, None)):
        m, n, w, st = shape
        blocks = {names[0]: m, names[1]: n}
        if slot != "_attn_bwd_dq":
            blocks["DESC"] = desc
        cfg = triton.Config(blocks, num_warps=w, num_stages=st, pre_hook=hook)
        monkeypatch.setattr(ta, slot, triton.autotune(configs=[cfg], key=ta._KEY)(raw))
    if device.HAS_GPU:
        triton.set_allocator(ta._scratch)


def _grads_ref(q, k, v, do, diag, group):
    """float64 gradients of attention with key j visible to query i when j <= i + diag;
    a row that sees no key has output 0 and passes no gradient."""
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    kk, vv = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(diag)
    seen = keep.any(-1, keepdim=True)
    s = (qd @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, float("-inf")).masked_fill(~seen, 0.0)
    o = (torch.softmax(s, -1) * seen) @ vv
    return torch.autograd.grad(o, (qd, kd, vd), do.double())


def _check_bwd_desc(monkeypatch, b, nq, nk, d, group, causal, dkdv, dq, seed,
                    dtype=torch.float16, design="three_kernels"):
    """The backward with descriptor tiles on random inputs (two K/V heads, ``group`` query
    heads each; causal: the bottom-right mask) against the float64 gradients; returns
    the inputs and the gradients."""
    q = _rand(b, 2 * group, nq, d, seed=seed).to(dtype)
    k, v = (_rand(b, 2, nk, d, seed=seed + i).to(dtype) for i in (1, 2))
    do = _rand(b, 2 * group, nq, d, seed=seed + 3).to(dtype)
    opts = dict(is_causal=causal, enable_gqa=group > 1,
                alignment=CAUSAL_LOWER_RIGHT if causal else None)
    o, lse = ta.triton_attention_forward(q, k, v, **opts)
    _bwd_tiles(monkeypatch, dkdv, dq, True)
    got = ta.triton_attention_backward(q, k, v, o, lse, do, bwd=design, **opts)
    tol = 1e-2 if dtype == torch.float16 else 3e-2           # P, dS rounded to 11 / 8 bits
    for name, g, r in zip("qkv", got, _grads_ref(q, k, v, do, nk - nq if causal else nk,
                                                 group)):
        err = float((g.double() - r).abs().max() / r.abs().max())
        assert err < tol, (f"d{name}", err)
    return (q, k, v, o, lse, do, opts), got


@pytest.mark.parametrize("design", ["three_kernels", "atomic_dq"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq, nk, d, group, dtype", [
    (64, 64, 16, 1, torch.float16), (40, 56, 24, 1, torch.float16),
    (70, 33, 16, 2, torch.float16), (48, 20, 8, 1, torch.float16),
    (40, 56, 24, 2, torch.bfloat16)])
@pytest.mark.parametrize("dkdv", [(16, 32, 4, 1), (16, 16, 4, 1)], ids=["16x32", "16x16"])
def test_backward_tiles_through_descriptors_match_the_reference(monkeypatch, design, causal,
                                                                nq, nk, d, group, dtype, dkdv):
    # query lengths off the tile (the dK/dV kernel's Q and dO tiles come back zero past
    # the rows), key lengths off the tile (the dQ kernel's K and V tiles), head dims below
    # the padded tile, grouped heads (a key head's descriptors made once per query head),
    # the bottom-right mask with rows that see no key (nq > nk); dK/dV key tiles twice the
    # query tile and equal to it (as the 64 x 64 shape on a GPU: a causal band of one or
    # two query tiles)
    args, got = _check_bwd_desc(monkeypatch, 1, nq, nk, d, group, causal, dkdv,
                                (32, 16, 4, 1), seed=41, dtype=dtype, design=design)
    _bwd_tiles(monkeypatch, dkdv, (32, 16, 4, 1), False)
    q, k, v, o, lse, do, opts = args
    ptr = ta.triton_attention_backward(q, k, v, o, lse, do, bwd=design, **opts)
    for g, p in zip(got, ptr):
        torch.testing.assert_close(g, p, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not (device.HAS_GPU and device.CAPABILITY >= (9, 0)),
                    reason="needs an sm90 GPU or newer (the autotuner's descriptor shapes)")
@pytest.mark.parametrize("design", ["three_kernels", "atomic_dq"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("dkdv", [(32, 128, 8, 2), (64, 64, 4, 2)], ids=["32x128w8", "64x64w4"])
def test_backward_descriptor_tile_shapes_on_the_gpu(monkeypatch, design, causal, d, dkdv):
    # shapes the autotuner may take on sm90 (key tiles twice the query tile, and equal to
    # it), on lengths off the tiles, a head dim padded to 128, grouped heads and rows
    # without keys
    _check_bwd_desc(monkeypatch, 2, 300, 203, d, 2, causal, dkdv, (128, 64, 8, 2),
                    seed=51, design=design)


def test_backward_descriptor_shapes_are_offered_only_where_they_may_run(monkeypatch):
    # on sm90 with autotuning the dK/dV list and the fused atomic-dQ kernel's (the same
    # kernel) gain descriptor twins of four shapes and the one-warpgroup 64 x 64 shape
    # through descriptors only; the dQ list does not (the dQ kernel follows _dq_desc)
    monkeypatch.setattr(ta.device, "INTERPRET", False)
    monkeypatch.setattr(ta.device, "CAPABILITY", (9, 0))
    monkeypatch.setattr(ta, "_AUTOTUNE", True)
    dkdv, atomic, dq = (ta.bwd_configs(k) for k in ("dkdv", "atomic_dq", "dq"))
    shape = lambda c: (c.kwargs["BLOCK_M1"], c.kwargs["BLOCK_N1"], c.num_warps, c.num_stages)  # noqa: E731
    for configs in (dkdv, atomic):
        desc = [c for c in configs if c.kwargs.get("DESC")]
        assert len(desc) == 5 and all(c.num_warps in (4, 8) for c in desc)
        ptr = {shape(c) for c in configs if not c.kwargs.get("DESC")}
        assert (64, 64, 4, 2) in {shape(c) for c in desc} and (64, 64, 4, 2) not in ptr
        assert {shape(c) for c in desc} - {(64, 64, 4, 2)} <= ptr      # the others are twins
        assert ta._is_small(configs[-1])                   # the small shape stays last
    # every fused shape zeroes its float32 dQ before each run (the autotuner runs each
    # shape many times; without the hook its sums would pile up), no other kernel's does
    assert all(c.pre_hook is ta._zero_dq for c in atomic)
    assert not any(c.pre_hook for c in dkdv + dq)
    assert not any(c.kwargs.get("DESC") for c in dq)
    q = torch.empty(1, dtype=torch.float16)
    for ok in (0, 1):
        kept = ta._fits(dkdv, {"Q": q}, HEAD_DIM=128, DESC_OK=ok)
        assert sum(bool(c.kwargs.get("DESC")) for c in kept) == 5 * ok
    assert not any(c.kwargs.get("DESC") for c in ta._fits(dkdv, {"Q": q}, HEAD_DIM=256,
                                                           DESC_OK=1))   # 512-byte rows
    monkeypatch.setattr(ta.device, "CAPABILITY", (8, 0))
    assert not any(c.kwargs.get("DESC") for c in ta.bwd_configs("dkdv"))
    assert (ta._dq_desc(True, 256), ta._dq_desc(True, 512), ta._dq_desc(False, 256)) == \
        (True, False, False)
    assert "DESC_OK" in ta._KEY


@pytest.mark.parametrize("nq", [64, 70])
def test_dq_programs_in_either_order_give_the_same_gradient(monkeypatch, nq):
    # the dQ kernel's LONGEST_FIRST (benchmarks/dq_order_probe.py) only renumbers the
    # causal query tiles of a head: every tile still runs once, bit for bit the same
    q = _rand(1, 2, nq, 16, seed=61).half()
    k, v = (_rand(1, 2, 48, 16, seed=62 + i).half() for i in range(2))
    do = _rand(1, 2, nq, 16, seed=64).half()
    opts = dict(is_causal=True, alignment=CAUSAL_LOWER_RIGHT)
    o, lse = ta.triton_attention_forward(q, k, v, **opts)
    got = []
    for first in (False, True):
        cfg = triton.Config({"BLOCK_M2": 32, "BLOCK_N2": 16, "LONGEST_FIRST": first},
                            num_warps=4, num_stages=1)
        monkeypatch.setattr(ta, "_attn_bwd_dq", triton.autotune(configs=[cfg], key=ta._KEY)(
            ta._attn_bwd_dq_kernel))
        got.append(ta.triton_attention_backward(q, k, v, o, lse, do, **opts)[0])
    assert torch.equal(got[0], got[1])
    ref = _grads_ref(q, k, v, do, 48 - nq, 1)[0]
    assert float((got[1].double() - ref).abs().max() / ref.abs().max()) < 1e-2


def test_decode_rows_without_keys_are_zero_with_lse_minus_inf():
    q, k, v = _rand(3, 4, 2, 16, seed=4), _rand(3, 2, 64, 16, seed=5), _rand(3, 2, 64, 16, seed=6)
    lens = torch.tensor([0, 1, 40], dtype=torch.int32, device=DEV)
    o, lse = decode_attention(q, k, v, lens, check_lengths=False, return_lse=True)
    assert not torch.isnan(o).any()
    assert (o[0] == 0).all() and torch.isneginf(lse[0]).all()          # no key at all
    assert (o[1, :, 0] == 0).all() and torch.isneginf(lse[1, :, 0]).all()   # row 0 of 2
    torch.testing.assert_close(o[1, :, 1].float(), v[1, :, :1].repeat_interleave(2, 0)[:, 0],
                               atol=TOL, rtol=TOL)
    ref = decode_attention_reference(q[2:], k[2:], v[2:], lens[2:])
    torch.testing.assert_close(o[2:].float(), ref.float(), atol=TOL, rtol=TOL)


# --------------------------------------------------------------- strided decode metadata
def test_decode_strided_seqlens_and_block_table():
    b, hq, hkv, lmax, d, page = 3, 4, 2, 64, 16, 16
    q = _rand(b, hq, 1, d, seed=7)
    k, v = _rand(b, hkv, lmax, d, seed=8), _rand(b, hkv, lmax, d, seed=9)
    table = torch.tensor([[40, 7], [64, 9], [17, 3]], dtype=torch.int32, device=DEV)
    lens = table[:, 0]                                     # stride 2, not 1
    assert lens.stride(0) != 1
    o = decode_attention(q, k, v, lens)
    torch.testing.assert_close(o, decode_attention_reference(q, k, v, lens), atol=TOL,
                               rtol=TOL)
    n_pages = b * lmax // page
    kp, vp = _rand(n_pages, hkv, page, d, seed=10), _rand(n_pages, hkv, page, d, seed=11)
    pages = torch.randperm(n_pages, generator=torch.Generator().manual_seed(0))
    pages = pages.view(b, lmax // page).to(torch.int32).to(DEV)
    bt = pages.t().contiguous().t()                        # column-major block table
    assert bt.stride(1) != 1
    o = decode_attention(q, kp, vp, lens, block_table=bt)
    ref = decode_attention_reference(q, gather_paged_cache(kp, pages),
                                     gather_paged_cache(vp, pages), lens)
    torch.testing.assert_close(o, ref, atol=TOL, rtol=TOL)


# --------------------------------------------------------------- autotune keys
@pytest.mark.parametrize("kind", ["fwd", "dkdv", "dq"])
@pytest.mark.parametrize("autotune", [True, False])
def test_tile_shapes_fit_shared_memory_for_every_dtype_and_head_dim(kind, autotune, monkeypatch):
    # float32 at head dim 256 has rows of 1 KiB: 64 x 64 tiles in two stages need
    # 320 KiB (forward) and 512 KiB (dK/dV) of shared memory, past an H100's 227 KiB
    import triton
    monkeypatch.setattr(ta, "_AUTOTUNE", autotune)
    names = {"fwd": ("BLOCK_M", "BLOCK_N"), "dkdv": ("BLOCK_M1", "BLOCK_N1"),
             "dq": ("BLOCK_M2", "BLOCK_N2")}[kind]
    big = [(128, 128, 8, 3), (128, 64, 8, 3), (32, 128, 4, 5), (64, 64, 4, 2)] if autotune \
        else [(64, 64, 4, 2)]
    configs = [triton.Config(dict(zip(names, (m, n))), num_warps=w, num_stages=st)
               for m, n, w, st in big + [ta._SMALL[kind]]]

    def chosen(d, dtype):
        q = torch.empty(0, dtype=dtype)
        return [tuple(c.kwargs.values()) + (c.num_warps, c.num_stages)
                for c in ta._fits(configs, {"Q": q}, HEAD_DIM=d)]

    assert chosen(256, torch.float32) == [ta._SMALL[kind]]
    for d, dtype in ((256, torch.float16), (128, torch.float32)):
        got = chosen(d, dtype)
        assert got and ta._SMALL[kind] not in got
        assert all(m * n <= 64 * 64 * 2 and st <= 3 for m, n, _, st in got)
    for d, dtype in ((64, torch.float16), (128, torch.bfloat16), (64, torch.float32)):
        got = chosen(d, dtype)
        assert got == (big if autotune else big[:1])


def test_autotune_keys_are_length_buckets():
    assert ta.length_bucket(1000) == ta.length_bucket(1024) == 1024
    assert ta.length_bucket(1025) == 2048
    for kernel in (ta._attn_fwd, ta._attn_bwd_dq, ta._attn_bwd_dkdv, ta._attn_bwd_atomic):
        assert "NQ" not in kernel.keys and "NK" not in kernel.keys
        assert {"NQ_BUCKET", "NK_BUCKET"} <= set(kernel.keys)


@pytest.mark.gpu
@pytest.mark.skipif(not ta._AUTOTUNE, reason="autotuning is switched off")
def test_sweep_over_n_tunes_once_per_bucket():
    before = len(ta._attn_fwd.cache)
    for n in (1000, 1008, 1016, 1024):
        q = _rand(1, 2, n, 64, dtype=torch.float16, seed=n)
        ta.triton_attention(q, q, q)
    assert len(ta._attn_fwd.cache) - before <= 1


@pytest.mark.gpu
def test_tile_ratio_gpu():
    with pytest.raises(Exception, match="BLOCK_M must be a multiple of BLOCK_N"):
        q = _rand(1, 1, 64, 16, dtype=torch.float16)
        o, lse = torch.empty_like(q), torch.empty(1, 1, 64, device=DEV)
        st = (q.stride(0), q.stride(1), q.stride(2)) * 4
        ta._attn_fwd_kernel[(1, 1)](q, q, q, o, lse, *st, 1, 1, 64, 64, 16, 0, 1.0, 64, 64,
                                    HEAD_DIM=16, CAUSAL=True, PAD_D=False, UPCAST=False,
                                    POS_SCALE=True, BLOCK_M=32, BLOCK_N=64)


# --------------------------------------------------------------- 64-bit offsets (GPU)
def _rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def _sdpa(q, k, v, causal=False):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            enable_gqa=True)


def _big_bhnd(dtype=torch.float16):
    # 129 * 32 * 4096 * 128 = 2.16e9 elements per tensor: past 2**31
    b, h, n, d = 129, 32, 4096, 128
    assert b * h * n * d > BIG
    return [_rand(b, h, n, d, dtype=dtype, seed=s) for s in (1, 2, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("bwd", ta.BWD_DESIGNS)
def test_triton_attention_packed_qkv_past_2_31(bwd):
    # qkv packed as (B, N, 3, H, D): q, k and v are views whose row stride is 3 * H * D,
    # so row n of a head starts n * 3HD elements in: past 2**31 for the last rows
    b, n, h, d = 1, 1400, 8192, 64
    assert n * 3 * h * d > BIG
    qkv = _rand(b, n, 3, h, d, dtype=torch.float16, seed=12).requires_grad_()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert q.stride(2) == 3 * h * d
    o = ta.triton_attention(q, k, v, is_causal=True, bwd=bwd)
    do = _rand(*o.shape, dtype=torch.float16, seed=13)
    (dqkv,) = torch.autograd.grad(o, (qkv,), do)
    sl = slice(h - 4, h)                            # the last heads: the largest offsets
    qs, ks, vs = (t[:, sl].detach().clone().requires_grad_() for t in (q, k, v))
    ref = _sdpa(qs.float(), ks.float(), vs.float(), True)
    assert _rel(o[:, sl], ref) < 4e-3
    grads = torch.autograd.grad(ref, (qs, ks, vs), do[:, sl].float())
    for i, g in enumerate(grads):
        assert _rel(dqkv[:, :, i, sl].transpose(1, 2), g) < 1e-2


@pytest.mark.gpu
def test_triton_attention_contiguous_past_2_31():
    q, k, v = _big_bhnd()
    o = ta.triton_attention(q, k, v, is_causal=True)
    assert _rel(o[-2:], _sdpa(q[-2:], k[-2:], v[-2:], True)) < 4e-3


@pytest.mark.hopper
def test_hopper_forwards_past_2_31():
    from course_utils.hopper import fp8, gluon_fwd, triton_fwd
    q, k, v = _big_bhnd()
    ref = _sdpa(q[-2:], k[-2:], v[-2:])
    for name, fn in (("tma", lambda: triton_fwd.attention_tma(q, k, v)),
                     ("gluon", lambda: gluon_fwd.attention_gluon(q, k, v)),
                     ("gluon_pingpong", lambda: gluon_fwd.attention_gluon(q, k, v,
                                                                          pingpong=True)),
                     ("gluon_interleaved", lambda: gluon_fwd.attention_gluon(
                         q, k, v, pingpong=True, pipeline=False, consumers=3)),
                     ("gluon_persistent", lambda: gluon_fwd.attention_gluon(
                         q, k, v, **gluon_fwd.FASTEST[128]))):
        o = fn()
        assert _rel(o[-2:], ref) < 4e-3, name
        del o
        torch.cuda.empty_cache()
    prep = fp8.prepare_fp8(q, k, v)
    del k, v
    torch.cuda.empty_cache()
    o = fp8.attention_fp8_prepared(prep, out_dtype=q.dtype)
    assert _rel(o[-2:], ref) < 0.08


@pytest.mark.gpu
def test_decode_packed_cache_past_2_31():
    # a K/V cache packed as (B, L, 2, Hkv, D): the row stride is 2 * Hkv * D, so key j
    # of a head starts j * 2 * Hkv * D elements in: past 2**31 for the last keys
    b, hq, hkv, L, d = 1, 32, 8, (1 << 20) + 4096, 128
    assert L * 2 * hkv * d > BIG
    kv = _rand(b, L, 2, hkv, d, dtype=torch.float16, seed=14)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    q = _rand(b, hq, 1, d, dtype=torch.float16, seed=15)
    o, lse = decode_attention(q, k, v, return_lse=True)
    g = hq // hkv
    for kvh in (0, hkv - 1):
        kk, vv = k[0, kvh].float(), v[0, kvh].float()
        for qh in (kvh * g, kvh * g + g - 1):
            s = (q[0, qh].float() @ kk.T) / math.sqrt(d)
            ref = torch.softmax(s, -1) @ vv
            assert _rel(o[0, qh], ref) < 4e-3
            assert abs(float(lse[0, qh, 0] - torch.logsumexp(s, -1)[0])) < 1e-3


# --------------------------------------------------------------- the one-slot Gluon ring
_STAGES1 = textwrap.dedent("""
    import torch
    from course_utils.hopper.gluon_fwd import attention_gluon
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 1024, 128, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    for kw in ({{"pipeline": True}}, {{"pipeline": False}}, {{"pingpong": True}},
               {{"pingpong": True, "pipeline": False}}, {{"pingpong": True, "persistent": True}},
               {{"pingpong": True, "pipeline": False, "persistent": 5}}):
        o = attention_gluon(q, k, v, stages={stages}, **kw)
        torch.cuda.synchronize()
        err = float((o.float() - ref).norm() / ref.norm())
        assert err < 4e-3, (kw, err)
        print("ok", kw, err)
""")


@pytest.mark.hopper
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_gluon_any_number_of_stages_finishes(stages):
    # in a child process with a time limit: a deadlocked kernel never returns
    try:
        run = subprocess.run([sys.executable, "-c", _STAGES1.format(stages=stages)],
                             capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"attention_gluon(stages={stages}) did not finish in 180 s (deadlock)")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok") == 6


@pytest.mark.hopper
@pytest.mark.parametrize("opts", [dict(pipeline=False), dict(pipeline=True, stages=1),
                                  dict(pipeline=True), dict(pingpong=True, stages=3),
                                  dict(pingpong=True, consumers=3, stages=2),
                                  dict(pingpong=True, consumers=3, pipeline=False, stages=3,
                                       d=64),
                                  dict(pingpong=True, consumers=3, pipeline=False, stages=1,
                                       d=64),
                                  dict(pingpong=True, pipeline=False, stages=2),
                                  dict(pingpong=True, block_n=64),
                                  dict(pingpong=True, block_n=256, d=64),
                                  dict(pipeline=False, persistent=3),
                                  dict(pipeline=True, stages=1, persistent=3),
                                  dict(pingpong=True, stages=3, persistent=True),
                                  dict(pingpong=True, stages=3, persistent=2),
                                  dict(pingpong=True, consumers=3, pipeline=False, stages=3,
                                       d=64, persistent=3),
                                  dict(pingpong=True, consumers=3, pipeline=False, stages=1,
                                       d=64, persistent=2)],
                         ids=["serial", "pipelined-1-stage", "pipelined", "pingpong",
                              "pingpong-3-consumers", "interleaved-3-consumers-d64",
                              "interleaved-3-consumers-1-stage-d64", "interleaved-2-consumers",
                              "block-n-64", "block-n-256-d64", "serial-persistent",
                              "pipelined-1-stage-persistent", "pingpong-persistent",
                              "pingpong-persistent-2-programs",
                              "interleaved-3-consumers-d64-persistent",
                              "interleaved-3-consumers-1-stage-d64-persistent"])
def test_gluon_masks_lengths_and_rows_without_keys(opts):
    """Both alignments, Nq != Nk both ways (lower-right with Nq > Nk leaves whole tiles
    that see no key), lengths off a multiple of the 128-row tile (masked key tail, query
    rows of the next head not stored), and the same lengths without a mask."""
    from course_utils.hopper import gluon_fwd
    opts = dict(opts)
    d = opts.pop("d", 128)
    for nq, nk in ((384, 128), (256, 640), (512, 512), (300, 129), (129, 300), (1, 77)):
        q = _rand(2, 4, nq, d, seed=1).half().cuda()
        k, v = (_rand(2, 2, nk, d, seed=s).half().cuda() for s in (2, 3))
        for alignment, diag in (("causal_upper_left", 0), ("causal_lower_right", nk - nq)):
            o, lse = gluon_fwd.attention_gluon(q, k, v, is_causal=True, alignment=alignment,
                                               enable_gqa=True, return_lse=True, **opts)
            ref, ref_lse = _masked_ref(q.double(), k.double().repeat_interleave(2, 1),
                                       v.double().repeat_interleave(2, 1), diag)
            empty = max(0, -diag)                 # rows that see no key
            where = f"{opts} {alignment} Nq={nq} Nk={nk}"
            assert not torch.isnan(o).any() and not torch.isnan(lse).any(), where
            assert (o[:, :, :empty] == 0).all() and torch.isneginf(lse[:, :, :empty]).all(), where
            assert _rel(o[:, :, empty:], ref[:, :, empty:].to(o.dtype)) < 4e-3, where
            torch.testing.assert_close(lse[:, :, empty:].double(), ref_lse[:, :, empty:],
                                       atol=1e-2, rtol=0, msg=where)
        o = gluon_fwd.attention_gluon(q, k, v, enable_gqa=True, **opts)
        ref, _ = _masked_ref(q.double(), k.double().repeat_interleave(2, 1),
                             v.double().repeat_interleave(2, 1), nk)
        assert _rel(o, ref.to(o.dtype)) < 4e-3, f"{opts} no mask Nq={nq} Nk={nk}"
