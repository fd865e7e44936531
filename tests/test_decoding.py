"""Lesson 9: the decode reference, the split-KV model and the Triton kernel."""
import json
import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from course_utils import device
from course_utils.attention import AttentionState, merge_states, naive_attention, tolerance_for
from course_utils.checks import CheckFailed, check_close
from course_utils.contract import (CAUSAL_LOWER_RIGHT, FLOAT_DTYPES, cases, implementation,
                                   implementations)
from course_utils.decoding import (causal_mask, check_decode_output, chunk_bounds,
                                   decode_attention_reference, decode_flops_per_step,
                                   gather_paged_cache, kv_bytes_per_step,
                                   split_kv_states)
from course_utils.triton_decode import choose_num_splits, decode_attention

DEV = device.DEVICE
# float32 results of the decoding kernel: the interpreter computes in float32; on a GPU
# its products are TF32 (the precision policy of course_utils.checks)
FP32 = dict(atol=1e-4, rtol=1e-4) if device.INTERPRET else dict(atol=3e-3, rtol=3e-3)
# The decode entry points by their records in course_utils.contract: what a record
# declares (dtypes, head dims, causal settings, GQA, cache layouts) is what the tests
# below try. Sizes (B, Hq, Hkv, Nq new tokens, cache length L) are this file's choice:
# one key, caches past one chunk, ragged lengths (two sequences), GQA ratios 1, 2, 4 and
# MQA.
RECORDS = [r for r in implementations(kind="decode") if r.runs_here()]
MODELS = [implementation("decode_reference"), implementation("split_kv")]
KERNEL = implementation("decode")
SIZES = [(1, 2, 2, 1, 1), (2, 4, 2, 4, 161), (1, 8, 2, 3, 129), (2, 2, 1, 2, 7),
         (1, 4, 4, 4, 4), (2, 8, 1, 1, 64), (2, 4, 1, 3, 17)]
# the sizes whose sequences get their own lengths <= L (cache_seqlens)
RAGGED = {(2, 4, 2, 4, 161), (2, 2, 1, 2, 7), (2, 8, 1, 1, 64), (2, 4, 1, 3, 17)}
SPLITS = [1, 2, 3, 5, 9]


def _call(rec, q, k, v, seqlens=None, num_splits=3, **opts):
    """One decode call through ``rec``'s entry point (the split-KV model takes the
    number of chunks as an argument, the kernel as an option)."""
    fn = rec.load()
    if rec.name == "split_kv":
        return fn(q, k, v, num_splits, seqlens, **opts)
    if rec.name == "decode":
        return fn(q, k, v, seqlens, num_splits=num_splits, **opts)
    return fn(q, k, v, seqlens, **opts)


def _seqlens(case, seed):
    """Per-sequence cache lengths in [Nq, L] for a ragged size, else ``None``."""
    if case.size not in RAGGED:
        return None
    g = torch.Generator().manual_seed(seed)
    return torch.randint(case.Nq, case.Nk + 1, (case.B,), generator=g).to(DEV)


def make(b, hq, hkv, nq, lmax, d, dtype=torch.float32, ragged=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, lmax, d, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, lmax, d, generator=g, dtype=dtype)
    seqlens = torch.randint(nq, lmax + 1, (b,), generator=g) if ragged else None
    to = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    return to(q), to(k), to(v), to(seqlens)


def sdpa_bottom_right(q, k, v, length):
    """SDPA with an explicit bottom-right mask and K/V expanded to the query heads."""
    g = q.shape[1] // k.shape[1]
    mask = causal_mask(q.shape[2], length, device=q.device)
    return F.scaled_dot_product_attention(
        q.float(), k[:, :, :length].float().repeat_interleave(g, 1),
        v[:, :, :length].float().repeat_interleave(g, 1), attn_mask=mask)


# ---------------------------------------------------------------- the reference

def test_masks_bottom_right_vs_top_left():
    br = causal_mask(2, 5)
    assert br.tolist() == [[True] * 4 + [False], [True] * 5]
    tl = causal_mask(2, 5, "causal_upper_left")
    assert tl.tolist() == [[True, False, False, False, False], [True, True, False, False, False]]
    assert torch.equal(causal_mask(4, 4), causal_mask(4, 4, "causal_upper_left"))
    with pytest.raises(ValueError, match="align"):
        causal_mask(2, 5, "middle")


def test_reference_matches_naive_when_no_cache_is_hidden():
    q, k, v, _ = make(2, 4, 2, 6, 6, 16)
    # with Nq < L the reference computes what lesson 3's naive attention does with the
    # same alignment, for each alignment the reference declares
    q3 = q[:, :, :3]
    for alignment in implementation("decode_reference").alignments:
        torch.testing.assert_close(
            decode_attention_reference(q3, k, v, alignment=alignment),
            naive_attention(q3, k, v, is_causal=True, alignment=alignment, enable_gqa=True),
            atol=1e-5, rtol=1e-5)
    # Nq == L: bottom-right and top-left coincide, so lesson 3's naive attention agrees
    o, lse = decode_attention_reference(q, k, v, return_lse=True)
    ref, ref_lse = naive_attention(q, k, v, is_causal=True, return_lse=True, enable_gqa=True)
    torch.testing.assert_close(o, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse.float(), atol=1e-5, rtol=1e-5)
    q1 = q[:, :, :1]
    torch.testing.assert_close(decode_attention_reference(q1, k, v),
                               naive_attention(q1, k, v, is_causal=False, enable_gqa=True), atol=1e-5, rtol=1e-5)


def test_sdpa_is_causal_is_the_wrong_alignment_for_decoding():
    q, k, v, _ = make(1, 2, 2, 3, 10, 16)
    ours = decode_attention_reference(q, k, v)
    torch.testing.assert_close(ours, sdpa_bottom_right(q, k, v, 10).to(q.dtype),
                               atol=1e-5, rtol=1e-5)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (ours - top_left).abs().max() > 1e-2


# every pair of declared values (dtype with head dim, head dim with causal setting,
# setting with layout, ...) at least once, for the reference and the split-KV model
MODEL_CASES = [c for rec in MODELS for c in cases(rec, SIZES)]


@pytest.mark.parametrize("i", range(len(MODEL_CASES)), ids=[c.id for c in MODEL_CASES])
def test_reference_and_split_kv_model_match_sdpa(i):
    """Each sequence against SDPA with an explicit mask of the case's alignment over its
    own cache length (float32 on the same rounded inputs, float64 for float64), the
    log-sum-exp against the float64 scores, and the split-KV model against the
    reference with a number of chunks that changes from case to case."""
    case = MODEL_CASES[i]
    rec = implementation(case.impl)
    q, k, v = (t.to(DEV) for t in case.inputs(seed=i))
    sl = _seqlens(case, seed=i)
    opts = case.options()
    o, lse = _call(rec, q, k, v, sl, num_splits=SPLITS[i % len(SPLITS)], return_lse=True,
                   **opts)
    assert o.dtype == case.dtype and o.shape == q.shape
    work = torch.float64 if case.dtype == torch.float64 else torch.float32
    assert lse.dtype == work and lse.shape == q.shape[:3]
    # float32 runs in the reference's own arithmetic: round-off only
    atol, rtol = (1e-5, 1e-5) if case.dtype == torch.float32 else tolerance_for(case.dtype)
    g = case.Hq // case.Hkv
    lengths = [case.Nk] * case.B if sl is None else sl.tolist()
    for b, n in enumerate(lengths):
        qb, kb, vb = (t[b:b + 1].to(work) for t in (q, k, v))
        kb, vb = (t[:, :, :n].repeat_interleave(g, 1) for t in (kb, vb))
        mask = None if case.alignment is None else causal_mask(case.Nq, n, case.alignment,
                                                              device=q.device)
        want = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
        torch.testing.assert_close(o[b:b + 1].to(work), want, atol=atol, rtol=rtol,
                                   msg=lambda m: f"{case.id} sequence {b}: {m}")
        s = qb.double() @ kb.double().transpose(-1, -2) / math.sqrt(case.D)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(lse[b:b + 1].double(), torch.logsumexp(s, -1),
                                   atol=1e-5, rtol=1e-5)
    if rec.name != "decode_reference":
        ref, ref_lse = decode_attention_reference(q, k, v, sl, return_lse=True, **opts)
        torch.testing.assert_close(o, ref, atol=atol, rtol=rtol)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_split_states_merge_in_any_order():
    q, k, v, sl = make(2, 4, 2, 2, 50, 16, ragged=True, seed=3)
    states = split_kv_states(q, k, v, 5, sl)
    ref, ref_lse = decode_attention_reference(q, k, v, sl, return_lse=True)
    for seed in range(3):
        order = states[:]
        random.Random(seed).shuffle(order)
        total = order[0]
        for s in order[1:]:
            total = merge_states(total, s)
        torch.testing.assert_close(total.acc / total.l[..., None], ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(total.m + total.l.log(), ref_lse, atol=1e-5, rtol=1e-5)


def test_chunk_bounds_and_byte_counts():
    chunk, bounds = chunk_bounds(100, 3, align=16)
    assert chunk == 48 and bounds == [(0, 48), (48, 96), (96, 100)]
    assert chunk_bounds(10, 4)[1][-1] == (9, 10)
    assert kv_bytes_per_step(1, 8, 32768, 128) == 2 * 8 * 32768 * 128 * 2
    assert decode_flops_per_step(1, 32, 1, 1000, 128) == 4 * 32 * 1000 * 128
    for bad in (dict(length=0, num_splits=1), dict(length=5, num_splits=0),
                dict(length=5, num_splits=1, align=0)):
        with pytest.raises(ValueError):
            chunk_bounds(**bad)


BAD_INPUTS = [
    (lambda q, k, v, s: (q[0], k, v, None), ValueError, "q must be 4-D"),
    (lambda q, k, v, s: ([1.0], k, v, None), TypeError, "q must be a torch.Tensor"),
    (lambda q, k, v, s: (q, k, v[..., :8], None), ValueError, "v_cache must have k_cache.s shape"),
    (lambda q, k, v, s: (q, k[:1], v[:1], None), ValueError, "batch"),
    (lambda q, k, v, s: (q, k[..., :8], v[..., :8], None), ValueError, "head dim"),
    (lambda q, k, v, s: (q[:, :3], k, v, None), ValueError, "multiple of"),
    (lambda q, k, v, s: (q, k.half(), v, None), TypeError, "share one dtype"),
    (lambda q, k, v, s: (q.int(), k, v, None), TypeError, "q must have a floating dtype"),
    (lambda q, k, v, s: (q, k[:, :, :1], v[:, :, :1], None), ValueError, "Nq <= cache length"),
    (lambda q, k, v, s: (q, k, v, [3, 3]), TypeError, "cache_seqlens must be a torch.Tensor"),
    (lambda q, k, v, s: (q, k, v, s.float()), TypeError, "int32 or int64"),
    (lambda q, k, v, s: (q, k, v, s[:1]), ValueError, "shape (B,)"),
    (lambda q, k, v, s: (q, k, v, s * 0 + 1), ValueError, "[Nq, Lmax]"),
    (lambda q, k, v, s: (q, k, v, s * 0 + 99), ValueError, "[Nq, Lmax]"),
]


@pytest.mark.parametrize("rec", RECORDS, ids=[r.name for r in RECORDS])
@pytest.mark.parametrize("bad,exc,msg", BAD_INPUTS, ids=[m for _, _, m in BAD_INPUTS])
def test_bad_inputs_are_named(rec, bad, exc, msg):
    q, k, v, s = make(2, 4, 2, 2, 20, 16, ragged=True)
    args = bad(q, k, v, s)
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        _call(rec, *args)


def test_scale_must_be_positive():
    q, k, v, _ = make(1, 2, 1, 1, 4, 16)
    with pytest.raises(ValueError, match="scale"):
        decode_attention_reference(q, k, v, scale=-1.0)


# ---------------------------------------------------------------- the Triton kernel

# the kernel's declared cases (on this machine: the interpreter's dtypes on a CPU),
# every pair of declared values at least once, with split counts up to 4 in turn (None:
# the kernel chooses)
KERNEL_CASES = cases(KERNEL, SIZES)
KERNEL_SPLITS = [None, 2, 1, 3, 4]


@pytest.mark.parametrize("i", range(len(KERNEL_CASES)), ids=[c.id for c in KERNEL_CASES])
def test_triton_matches_reference(i):
    case = KERNEL_CASES[i]
    q, k, v = case.inputs(seed=i)
    sl = _seqlens(case, seed=i)
    splits = KERNEL_SPLITS[i % len(KERNEL_SPLITS)]
    o, lse, parts = decode_attention(q, k, v, sl, num_splits=splits, return_lse=True,
                                     return_partials=True, **case.options())
    ref, ref_lse = decode_attention_reference(q, k, v, sl, return_lse=True, **case.options())
    assert o.dtype == case.dtype and o.shape == q.shape and lse.dtype == torch.float32
    # float16 / bfloat16: both round the same float32 rows to the dtype (the policy's
    # tolerance); float32: the interpreter's float32 against the reference's
    tol = FP32 if case.dtype == torch.float32 else dict(zip(("atol", "rtol"),
                                                             tolerance_for(case.dtype)))
    check_close(o, ref, **tol, name=f"o of {case.id}", quiet=True)
    torch.testing.assert_close(lse, ref_lse, **FP32)
    # the kernel's partial states, folded with lesson 3's merge, give the same rows
    total = None
    for c in range(parts.m.shape[-1]):
        s = AttentionState(m=parts.m[..., c], l=parts.l[..., c], acc=parts.acc[..., c, :])
        total = s if total is None else merge_states(total, s)
    check_close(total.acc / total.l[..., None], o.float(), **tol, name=f"merged {case.id}",
                quiet=True)


def test_triton_non_causal_and_custom_scale():
    # scale is an option, not a declaration: one case with a scale other than 1/sqrt(D)
    q, k, v, sl = make(2, 4, 2, 3, 40, 16, ragged=True, seed=5)
    o = decode_attention(q, k, v, sl, is_causal=False, scale=0.3, num_splits=3)
    ref = decode_attention_reference(q, k, v, sl, is_causal=False, scale=0.3)
    torch.testing.assert_close(o, ref, **FP32)


def test_triton_ignores_unused_cache_slots():
    q, k, v, sl = make(2, 4, 2, 1, 64, 16, seed=1)
    sl = torch.tensor([17, 40], device=DEV)
    k[0, :, 17:] = float("nan")
    v[1, :, 40:] = float("nan")
    o = decode_attention(q, k, v, sl, num_splits=4)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, decode_attention_reference(q, k, v, sl), **FP32)


def test_triton_without_length_checks_reads_nothing_back():
    # chunks come from the capacity Lmax, so the call needs no value of cache_seqlens on the host
    q, k, v, _ = make(2, 4, 2, 2, 80, 16, seed=4)
    sl = torch.tensor([5, 61], device=DEV, dtype=torch.int32)
    o = decode_attention(q, k, v, sl, num_splits=4, check_lengths=False)
    torch.testing.assert_close(o, decode_attention_reference(q, k, v, sl), **FP32)


def make_paged(b, hq, hkv, nq, page_size, pages_per_seq, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_pages = b * pages_per_seq + 3                # a few pages belong to nobody
    k_pages = torch.randn(num_pages, hkv, page_size, d, generator=g)
    v_pages = torch.randn(num_pages, hkv, page_size, d, generator=g)
    table = torch.randperm(num_pages, generator=g)[:b * pages_per_seq].reshape(b, pages_per_seq)
    lmax = page_size * pages_per_seq
    seqlens = torch.randint(nq, lmax + 1, (b,), generator=g)
    q = torch.randn(b, hq, nq, d, generator=g)
    return [t.to(DEV) for t in (q, k_pages, v_pages, table, seqlens)]


def test_gather_paged_cache_layout():
    pages = torch.arange(3 * 1 * 2 * 1, dtype=torch.float32).reshape(3, 1, 2, 1)
    table = torch.tensor([[2, 0], [1, 1]])
    got = gather_paged_cache(pages, table)[:, 0, :, 0]
    assert got.tolist() == [[4, 5, 0, 1], [2, 3, 2, 3]]


# a paged cache (block_table) is a storage scheme of its own, not one of the declared
# layouts: page sizes and counts are this test's choice
@given(page_size=st.sampled_from([1, 3, 16, 32]), pages=st.integers(1, 6), nq=st.integers(1, 4),
       ratio=st.sampled_from([1, 4]), splits=st.one_of(st.none(), st.integers(1, 5)),
       seed=st.integers(0, 10 ** 6))
@settings(max_examples=8)
def test_triton_paged_cache_matches_gathered_reference(page_size, pages, nq, ratio, splits, seed):
    nq = min(nq, page_size * pages)
    q, kp, vp, table, sl = make_paged(2, 2 * ratio, 2, nq, page_size, pages, 16, seed)
    o, lse = decode_attention(q, kp, vp, sl, block_table=table, num_splits=splits,
                              return_lse=True)
    ref, ref_lse = decode_attention_reference(q, gather_paged_cache(kp, table),
                                              gather_paged_cache(vp, table), sl, return_lse=True)
    torch.testing.assert_close(o, ref, **FP32)
    torch.testing.assert_close(lse, ref_lse, **FP32)


def test_paged_cache_bad_inputs():
    q, kp, vp, table, sl = make_paged(2, 4, 2, 1, 16, 3, 16)
    with pytest.raises(ValueError, match="cache_seqlens is required"):
        decode_attention(q, kp, vp, block_table=table)
    with pytest.raises(TypeError, match="block_table must be int32 or int64"):
        decode_attention(q, kp, vp, sl, block_table=table.float())
    with pytest.raises(ValueError, match="block_table must have shape"):
        decode_attention(q, kp, vp, sl, block_table=table[:1])
    with pytest.raises(ValueError, match="page indices"):
        decode_attention(q, kp, vp, sl, block_table=table + kp.shape[0])
    with pytest.raises(ValueError, match="cache_seqlens must lie"):
        decode_attention(q, kp, vp, sl * 0 + 49, block_table=table)
    with pytest.raises(ValueError, match="v_cache must have the shape"):
        decode_attention(q, kp, vp[:-1], sl, block_table=table)
    with pytest.raises(TypeError, match="block_table must be a torch.Tensor"):
        gather_paged_cache(kp, [[0, 1]])


def test_triton_kernel_specific_errors():
    """What the kernel's record leaves out is refused before any launch: each dtype it
    does not declare and a head dim between two declared ones."""
    q, k, v, _ = make(1, 2, 1, 1, 8, 16)
    undeclared = [t for t in FLOAT_DTYPES if t not in KERNEL.dtypes]
    assert undeclared
    names = ", ".join(str(t).replace("torch.", "") for t in KERNEL.dtypes)
    for dt in undeclared:
        with pytest.raises(TypeError, match=f"{names} tensors"):
            decode_attention(q.to(dt), k.to(dt), v.to(dt))
    d = next(d for d in range(KERNEL.example_head_dims()[0] + 1, 512)
             if not KERNEL.takes_head_dim(d))
    qd, kd, vd, _ = make(1, 2, 1, 1, 8, d)
    with pytest.raises(ValueError, match="head dim"):
        decode_attention(qd, kd, vd)
    with pytest.raises(ValueError, match="num_splits"):
        decode_attention(q, k, v, num_splits=0)


def test_choose_num_splits_fills_the_machine():
    assert choose_num_splits(1, 8, 32768, num_sms=132) == 64        # 528 programs wanted
    assert choose_num_splits(64, 8, 32768, num_sms=132) == 2        # batch already fills it
    assert choose_num_splits(1, 8, 1024, num_sms=132) == 2          # chunks stay >= 512 keys
    assert choose_num_splits(1, 8, 100, num_sms=132) == 1
    for b in (1, 2, 8, 64):
        for n in (1, 700, 5000, 131072):
            s = choose_num_splits(b, 8, n, num_sms=132)
            assert 1 <= s and (s == 1 or math.ceil(n / s) >= 512)
    with pytest.raises(ValueError, match="cache_len"):
        choose_num_splits(1, 8, 0)
    with pytest.raises(ValueError, match="num_sms"):
        choose_num_splits(1, 8, 10, num_sms=0)


# ---------------------------------------------------------------- the learner check

def test_check_decode_output_passes_and_fails_with_hints(capsys):
    q, k, v, sl = make(2, 4, 2, 3, 12, 16, ragged=True, seed=2)
    check_decode_output(decode_attention_reference(q, k, v, sl), q, k, v, sl)
    assert "ok:" in capsys.readouterr().out
    # top-left mask: the hint names the alignment mistake
    full = make(2, 4, 2, 3, 12, 16, seed=2)[:3]
    tl = F.scaled_dot_product_attention(full[0], full[1].repeat_interleave(2, 1),
                                        full[2].repeat_interleave(2, 1), is_causal=True)
    with pytest.raises(CheckFailed, match="top-left"):
        check_decode_output(tl, *full)
    # wrong kv head for a query head (h % Hkv instead of h // group)
    wrong = F.scaled_dot_product_attention(full[0], full[1].repeat(1, 2, 1, 1),
                                           full[2].repeat(1, 2, 1, 1),
                                           attn_mask=causal_mask(3, 12, device=DEV))
    with pytest.raises(CheckFailed, match="kv head"):
        check_decode_output(wrong, *full)
    # cache lengths ignored
    with pytest.raises(CheckFailed, match="cache_seqlens"):
        check_decode_output(decode_attention_reference(q, k, v), q, k, v, sl)
    with pytest.raises(CheckFailed, match="shape"):
        check_decode_output(tl[:, :2], *full)


# ---------------------------------------------------------------- the committed benchmark

def test_committed_benchmark_record_plots(tmp_path):
    from course_utils.bench import common
    from course_utils.bench.decode import plot
    paths = sorted(common.RESULTS.glob("*/decode.json"))
    if not paths:
        pytest.skip("no GPU decode benchmark committed yet")
    rec = json.loads(paths[0].read_text())
    assert rec["rows"] and rec["copy_TBps"] > 0
    for r in rec["rows"]:
        assert r["triton_ms"] > 0 and 0 < r["bw_fraction_of_copy"] < 1.5
    import matplotlib
    matplotlib.use("Agg")
    fig = plot(rec, tmp_path / "decode.png")
    assert (tmp_path / "decode.png").stat().st_size > 10_000
    import matplotlib.pyplot as plt
    plt.close(fig)


# ---------------------------------------------------------------- real sizes on a GPU

# real sizes, with the dtypes the kernel declares for a GPU taking them in turn; the
# head dim, alignment and layout are fixed here (benchmarks/check_decode_gpu.py crosses
# every declared one with real sizes)
GPU_CASES = cases(KERNEL, [(1, 32, 8, 1, 32768), (8, 32, 8, 4, 4099), (64, 32, 8, 1, 2048)],
                  head_dims=[128], settings=[CAUSAL_LOWER_RIGHT], layouts=["bhnd"],
                  interpreter=False)


@pytest.mark.gpu
@pytest.mark.skipif(not device.HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_gpu_real_sizes(case):
    b, nq, lmax, dtype = case.B, case.Nq, case.Nk, case.dtype
    torch.manual_seed(0)
    q = torch.randn(b, case.Hq, nq, case.D, device=DEV, dtype=dtype)
    k = torch.randn(b, case.Hkv, lmax, case.D, device=DEV, dtype=dtype)
    v = torch.randn_like(k)
    sl = torch.randint(nq, lmax + 1, (b,), device=DEV, dtype=torch.int32)
    o, lse = decode_attention(q, k, v, sl, return_lse=True)
    ref, ref_lse = decode_attention_reference(q, k, v, sl, return_lse=True)
    err = ((o.double() - ref.double()).norm() / ref.double().norm()).item()
    # float32 multiplies in TF32 on a GPU (the course's policy): float16's bound
    assert err < (2e-2 if dtype == torch.bfloat16 else 3e-3), err
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not device.HAS_GPU, reason="needs a CUDA GPU")
def test_gpu_paged_cache():
    torch.manual_seed(0)
    b, page, n = 4, 64, 80
    kp = torch.randn(b * n, 8, page, 128, device=DEV, dtype=torch.float16)
    vp = torch.randn_like(kp)
    table = torch.randperm(b * n, device=DEV).reshape(b, n).to(torch.int32)
    sl = torch.randint(1, page * n + 1, (b,), device=DEV, dtype=torch.int32)
    q = torch.randn(b, 32, 1, 128, device=DEV, dtype=torch.float16)
    o = decode_attention(q, kp, vp, sl, block_table=table)
    ref = decode_attention_reference(q, gather_paged_cache(kp, table), gather_paged_cache(vp, table), sl)
    err = ((o.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err < 3e-3, err


# The problem set's checks against wrong answers: tests/test_wrong_answers.py grades them
# through course-grade (tests/wrong_answers/09_decoding.py).
