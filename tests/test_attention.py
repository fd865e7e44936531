"""Tests for course_utils.attention: the reference, the two tiled forwards, the
state merge, the block sizes, the traffic counter and the allocation tracker."""
import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.attention import (
    AllocationTracker, AttentionState, TrafficCounter, block_sizes_from_sram,
    flash_attention_fa1, flash_attention_fa2, merge_states, naive_attention,
    state_from_scores, tile_schedule, tolerance_for, traffic_formula,
    validate_attention_inputs,
)
from course_utils.checks import check_close
from course_utils.contract import (CAUSAL_UPPER_LEFT, cases, causal_mask, implementation,
                                   implementations)


@pytest.fixture(autouse=True)
def _one_thread():
    # tiny tensors: one intra-op thread avoids oversubscribing the CI's two cores
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# The PyTorch entry points of lessons 3-5, by their records in course_utils.contract:
# what a record declares (dtypes, head dims, causal settings, GQA, layouts, LSE,
# gradients) is what the tests below try, and nothing else.
RECORDS = implementations(devices="any", kind="sdpa")   # naive, fa1, fa2, tiled_backward
TILED_RECORDS = [implementation("fa1"), implementation("fa2")]
TILED = [r.load() for r in TILED_RECORDS]
LENGTHS = [1, 2, 7, 64, 129, 300]
# (B, Hq, Hkv, Nq, Nk): the sizes are this file's choice, small for a CPU and odd on
# purpose: one query, one key, ragged lengths past a tile, Nq > Nk and Nq < Nk, and GQA
# ratios 1, 2, 4 and 8 (MQA)
SIZES = [(1, 8, 8, 1, 7), (1, 8, 4, 7, 1), (1, 8, 2, 64, 129), (1, 8, 1, 129, 2),
         (1, 4, 4, 129, 64), (2, 2, 1, 2, 129), (1, 8, 1, 7, 7)]
# tile shapes (Br, Bc) the tiled forwards take in turn: one row or key per tile, tiles
# that do not divide the lengths, and tiles larger than the whole block
BLOCKS = [(1, 5), (3, 32), (16, 1), (64, 64), (16, 5)]


def _qkv(b, hq, hkv, nq, nk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, nk, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, nk, d, generator=g).to(dtype)
    return q, k, v


def _masked_scores(q, k, alignment):
    """float64 scores ``Q K^T / sqrt(D)`` (K expanded to the query heads), ``-inf``
    where the causal mask of ``alignment`` hides a key (``None``: no mask)."""
    g = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if alignment is not None:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], alignment), float("-inf"))
    return s


# ------------------------------------------------------------------ declared cases
def _tiles(i, nq, nk):
    br, bc = BLOCKS[i % len(BLOCKS)]
    if math.ceil(nq / br) * math.ceil(nk / bc) > 100:
        br, bc = 32, 32   # keep the Python loop over tiles short
    return br, bc


@pytest.mark.parametrize("rec", RECORDS, ids=[r.name for r in RECORDS])
def test_declared_cases_match_sdpa(rec):
    """Each record's declared cases (every pair of declared values: dtype with head dim,
    head dim with causal setting, setting with layout, ... at least once, at the sizes
    above) against SDPA (float32 on the same rounded inputs, float64 for float64), the
    log-sum-exp against the float64 scores where the record returns it, and the
    gradients against autograd in float64 where it has a backward. Rows that see no key
    (lower-right with Nq > Nk) are 0 with lse -inf. One test per record: the cases are
    cheap, and every failure names its case."""
    for i, case in enumerate(cases(rec, SIZES)):
        _check_declared_case(rec, case, i)


def _check_declared_case(rec, case, i):
    fn = rec.load()
    opts = case.options()
    if rec.name != "naive":                    # the tiled ones take a tile shape
        opts["Br"], opts["Bc"] = _tiles(i, case.Nq, case.Nk)
    q, k, v = case.inputs(seed=i, requires_grad=rec.backward)
    if rec.returns_lse:
        o, lse = fn(q, k, v, return_lse=True, **opts)
    else:
        o = fn(q, k, v, **opts)
    assert o.dtype == case.dtype and o.shape == q.shape, case.id
    work = torch.float64 if case.dtype == torch.float64 else torch.float32
    s = _masked_scores(q.detach(), k.detach(), case.alignment)
    seen = torch.isfinite(s[0, 0]).any(-1)    # rows with at least one visible key
    mask = None if case.alignment is None else causal_mask(case.Nq, case.Nk, case.alignment)
    ref = F.scaled_dot_product_attention(*(t.detach().to(work) for t in (q, k, v)),
                                         attn_mask=mask, enable_gqa=True)
    atol, rtol = tolerance_for(case.dtype)
    torch.testing.assert_close(o.detach().to(work)[:, :, seen], ref[:, :, seen],
                               atol=atol, rtol=rtol, msg=lambda m: f"{case.id}: {m}")
    assert bool((o[:, :, ~seen] == 0).all()), f"{case.id}: a row that sees no key must be 0"
    if rec.returns_lse:
        assert lse.dtype == work and lse.shape == q.shape[:3], case.id
        torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), atol=1e-4, rtol=1e-5,
                                   msg=lambda m: f"lse of {case.id}: {m}")
    if rec.backward:
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(i)).to(case.dtype)
        grads = torch.autograd.grad(o, (q, k, v), do)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        s64 = _masked_scores(leaves[0], leaves[1], case.alignment)
        g = case.Hq // case.Hkv
        o64 = torch.softmax(s64, -1).nan_to_num(0.0) @ leaves[2].repeat_interleave(g, 1)
        refs = torch.autograd.grad(o64, leaves, do.double())
        for name, x, r in zip(("dq", "dk", "dv"), grads, refs):
            assert x.dtype == case.dtype, f"{name} of {case.id}"
            check_close(x, r, dtype=case.dtype, op="backward", name=f"{name} of {case.id}",
                        quiet=True)


@pytest.mark.parametrize("rec", TILED_RECORDS, ids=[r.name for r in TILED_RECORDS])
def test_every_length_fp32_error_is_round_off(rec):
    """float32 at every length, with no mask and with SDPA's: at Nq == Nk the two
    alignments are one mask, so the record's settings are narrowed to distinct masks
    (the declared cases above try lower-right where it differs)."""
    for case in cases(rec, [(2, 4, 2, n, n) for n in LENGTHS], dtypes=[torch.float32],
                      head_dims=[32], settings=[None, CAUSAL_UPPER_LEFT], layouts=["bhnd"],
                      cover="all"):
        q, k, v = case.inputs()
        mask = None if case.alignment is None else causal_mask(case.Nq, case.Nk, case.alignment)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        o = rec.load()(q, k, v, **case.options(), Br=16, Bc=32)
        assert (o - ref).abs().max().item() < 5e-6, case.id


def test_naive_matches_sdpa_and_logsumexp():
    for alignment in implementation("naive").settings():
        q, k, v = _qkv(2, 8, 2, 33, 47, 8)
        o, lse = naive_attention(q, k, v, enable_gqa=True, is_causal=alignment is not None,
                                 alignment=alignment, return_lse=True)
        mask = None if alignment is None else causal_mask(33, 47, alignment)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(o, ref, atol=2e-6, rtol=2e-6)
        s = torch.einsum("bhqd,bhkd->bhqk", q, k.repeat_interleave(4, dim=1)) / math.sqrt(8)
        if alignment is not None:
            s = s.masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-5, rtol=1e-5)


def test_scale_argument_and_float64():
    q, k, v = _qkv(1, 2, 1, 9, 13, 4, torch.float64)
    takes = [r for r in RECORDS if torch.float64 in r.dtypes]
    assert {"naive", "fa1", "fa2"} <= {r.name for r in takes}
    for rec in takes:
        o = rec.load()(q, k, v, enable_gqa=True, scale=0.3)
        assert o.dtype == torch.float64
        ref = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
        torch.testing.assert_close(o, ref, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("rec", [r for r in RECORDS if r.gqa],
                         ids=[r.name for r in RECORDS if r.gqa])
def test_gqa_uses_kv_head_q_head_floordiv_group(rec):
    q, k, v = _qkv(1, 8, 2, 5, 6, 4)
    tiles = {} if rec.name == "naive" else dict(Br=2, Bc=4)
    o = rec.load()(q, k, v, enable_gqa=True, **tiles)
    for h in range(8):
        kv = h // 4
        ref = naive_attention(q[:, h:h + 1], k[:, kv:kv + 1], v[:, kv:kv + 1])
        torch.testing.assert_close(o[:, h:h + 1], ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("rec", TILED_RECORDS, ids=[r.name for r in TILED_RECORDS])
def test_block_size_invariance(rec):
    # about the tile shape: SDPA's causal mask makes whole tiles skip. The declared cases
    # above run every declared alignment with the tile shapes of BLOCKS in turn.
    fa = rec.load()
    q, k, v = _qkv(1, 2, 2, 50, 70, 8)
    ref = naive_attention(q, k, v, enable_gqa=True, is_causal=True)
    for br, bc in [(1, 1), (7, 3), (50, 70), (64, 128), (16, 9)]:
        torch.testing.assert_close(fa(q, k, v, enable_gqa=True, is_causal=True, Br=br, Bc=bc), ref,
                                   atol=2e-6, rtol=2e-6)


def test_decoding_step_one_query_matches_last_row():
    # an odd shape on purpose (Nq = 1 against a cache), not a declaration: the declared
    # lower-right alignment with Nq = 1 is in the declared cases above
    # one new token attends to the whole cache: the last row of the full causal result
    q, k, v = _qkv(1, 4, 1, 40, 40, 8)
    full = naive_attention(q, k, v, enable_gqa=True, is_causal=True)
    for fa in TILED:
        step = fa(q[:, :, -1:], k, v, enable_gqa=True, is_causal=False, Br=1, Bc=16)
        torch.testing.assert_close(step, full[:, :, -1:], atol=2e-6, rtol=2e-6)


# ------------------------------------------------------------------ never Nq x Nk
@pytest.mark.parametrize("rec", TILED_RECORDS, ids=[r.name for r in TILED_RECORDS])
def test_tiled_never_allocates_score_matrix(rec):
    nq, nk = 96, 80
    q, k, v = _qkv(1, 4, 2, nq, nk, 8)
    for alignment in rec.settings():            # no mask and each declared alignment
        with AllocationTracker() as t:
            rec.load()(q, k, v, enable_gqa=True, is_causal=alignment is not None,
                       alignment=alignment, Br=16, Bc=16, return_lse=True)
        assert t.shapes, "the tracker saw no operation"
        assert not any(len(s) >= 2 and s[-2:] in ((nq, nk), (nk, nq)) for s in t.shapes)
        # nothing as large as one head's score matrix, let alone all of them
        assert max(math.prod(s) for s in t.shapes) < nq * nk


def test_tracker_catches_naive_score_matrix_and_peak_grows_quadratically():
    peaks = []
    for n in (64, 128):
        q, k, v = _qkv(1, 2, 2, n, n, 8)
        with AllocationTracker() as t:
            naive_attention(q, k, v)
        assert t.saw_matrix(n, n)
        peaks.append(t.peak_bytes)
    assert peaks[1] > 3 * peaks[0]
    tiled = []
    for n in (256, 512):
        q, k, v = _qkv(1, 2, 2, n, n, 8)
        with AllocationTracker() as t:
            flash_attention_fa2(q, k, v, Br=32, Bc=32)
        tiled.append(t.peak_bytes)
    assert tiled[1] < 2.5 * tiled[0]


def test_tracker_counts_live_bytes():
    with AllocationTracker() as t:
        a = torch.zeros(1000)           # 4000 bytes
        b = torch.zeros(500)            # 2000 bytes
        del a
        c = torch.zeros(250)            # 1000 bytes, while 2000 are alive
    assert t.peak_bytes == 6000
    assert t.current_bytes == 3000
    del b, c


# ------------------------------------------------------------------ merge
def _tile_states(s, v, bounds):
    return [state_from_scores(s[..., lo:hi], v[..., lo:hi, :]) for lo, hi in bounds]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n=st.integers(1, 40), cuts=st.lists(st.integers(1, 39), max_size=6),
       seed=st.integers(0, 10_000), tree=st.booleans())
def test_merge_any_order_or_tree_equals_full(n, cuts, seed, tree):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(3, n, generator=g, dtype=torch.float64) * 5
    v = torch.randn(n, 4, generator=g, dtype=torch.float64)
    edges = sorted({0, n, *[c for c in cuts if c < n]})
    states = _tile_states(s, v, list(zip(edges[:-1], edges[1:])))
    rng = random.Random(seed)
    rng.shuffle(states)
    while len(states) > 1:
        if tree:   # merge random neighbours: any bracketing
            i = rng.randrange(len(states) - 1)
            states[i:i + 2] = [merge_states(states[i], states[i + 1])]
        else:      # left fold in the shuffled order
            states[:2] = [merge_states(states[0], states[1])]
    full = torch.softmax(s, -1) @ v
    torch.testing.assert_close(states[0].output, full, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(states[0].lse, torch.logsumexp(s, -1), atol=1e-12, rtol=1e-12)


def test_merge_with_empty_state_and_errors():
    s = torch.tensor([[1.0, -2.0, 30.0]])
    v = torch.randn(3, 2)
    a = state_from_scores(s, v)
    empty = AttentionState(m=torch.full((1,), float("-inf")), l=torch.zeros(1),
                           acc=torch.zeros(1, 2))
    for m in (merge_states(a, empty), merge_states(empty, a)):
        torch.testing.assert_close(m.output, a.output)
    both = merge_states(empty, empty)
    assert both.l.item() == 0 and not torch.isnan(both.acc).any()
    with pytest.raises(TypeError, match="AttentionState"):
        merge_states(a, (a.m, a.l, a.acc))
    with pytest.raises(ValueError, match="shape"):
        merge_states(a, AttentionState(m=torch.zeros(2), l=torch.ones(2), acc=torch.zeros(2, 2)))


# ------------------------------------------------------------------ block sizes
def test_block_sizes_paper_example():
    assert block_sizes_from_sram(59, 3) == (3, 4)
    assert block_sizes_from_sram(59, 3, rounding="ceil") == (3, 5)
    br, bc = block_sizes_from_sram(59, 3)
    assert 2 * br * 3 + 2 * bc * 3 <= 59
    # an A100-like 100 KB of SRAM in fp32 words with d = 64
    assert block_sizes_from_sram(25_600, 64) == (64, 100)
    with pytest.raises(ValueError, match="at least"):
        block_sizes_from_sram(11, 3)
    with pytest.raises(TypeError, match="M must be a positive int"):
        block_sizes_from_sram(59.0, 3)
    with pytest.raises(ValueError, match="d must be"):
        block_sizes_from_sram(59, 0)
    with pytest.raises(ValueError, match="rounding"):
        block_sizes_from_sram(59, 3, rounding="round")


# ------------------------------------------------------------------ traffic
@pytest.mark.parametrize("fa,order", [(flash_attention_fa1, "fa1"), (flash_attention_fa2, "fa2")])
@pytest.mark.parametrize("nq,nk,br,bc", [(64, 64, 16, 16), (37, 23, 5, 4), (5, 5, 3, 4),
                                         (1, 300, 64, 64), (129, 7, 16, 2)])
# the traffic formula of lesson 4 counts no mask and SDPA's upper-left mask (is_causal):
# ``causal`` here is that formula's argument, not a declared setting
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lse", [False, True])
def test_counted_traffic_equals_formula(fa, order, nq, nk, br, bc, causal, lse):
    q, k, v = _qkv(2, 4, 2, nq, nk, 8)
    c = TrafficCounter()
    fa(q, k, v, enable_gqa=True, is_causal=causal, Br=br, Bc=bc, counter=c, return_lse=lse)
    assert c.as_dict() == traffic_formula(order, nq, nk, 8, br, bc, B=2, H=4,
                                          is_causal=causal, return_lse=lse)
    sched = tile_schedule(order, nq, nk, br, bc, causal)
    assert c.tiles_visited == sum(ok for *_, ok in sched)
    assert c.tiles_visited + c.tiles_skipped == len(sched)


def test_traffic_table_closed_forms():
    n, d, b = 1024, 64, 128
    t = n // b
    fa2 = traffic_formula("fa2", n, n, d, b, b)
    fa1 = traffic_formula("fa1", n, n, d, b, b)
    assert fa2["K reads"] == t * n * d and fa2["Q reads"] == n * d and fa2["O reads"] == 0
    assert fa1["K reads"] == n * d and fa1["Q reads"] == t * n * d
    assert fa1["O writes"] == (t + 1) * n * d and fa1["O reads"] == t * n * d
    # one row per tile reproduces the element table: n^2 reloads
    el2 = traffic_formula("fa2", n, n, 1, 1, 1)
    el1 = traffic_formula("fa1", n, n, 1, 1, 1)
    assert el2["K reads"] == n * n and el1["Q reads"] == n * n and el1["O reads"] == n * n
    # causal roughly halves the K/V reloads of FA2
    c2 = traffic_formula("fa2", n, n, d, b, b, is_causal=True)
    assert c2["K reads"] == (t * (t + 1) // 2) * b * d


def test_counter_basics():
    c = TrafficCounter()
    c.read("Q", 5)
    c.write("O", 3)
    c.read("Q", 1)
    assert c.total_reads == 6 and c.total_writes == 3 and c.total == 9
    assert c.as_dict()["Q reads"] == 6
    c.reset()
    assert c.total == 0


# ------------------------------------------------------------------ bad input
BAD = [
    (lambda q, k, v: (q[0], k, v), ValueError, "q must be 4-D"),
    (lambda q, k, v: (q, k[..., :3], v), ValueError, "head dim"),
    (lambda q, k, v: (q, k, v[..., :3]), ValueError, "v must have k's shape"),
    (lambda q, k, v: (q, k, v[:, :, :4]), ValueError, "v must have k's shape"),
    (lambda q, k, v: (q[:, :3], k, v), ValueError, "multiple"),
    (lambda q, k, v: (q, k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1)), ValueError, "batch"),
    (lambda q, k, v: (q.half(), k, v), TypeError, "dtype"),
    (lambda q, k, v: (q.int(), k, v), TypeError, "floating"),
    (lambda q, k, v: (q.numpy(), k, v), TypeError, "torch.Tensor"),
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, ">= 1"),
    (lambda q, k, v: (q.to("meta"), k, v), ValueError, "device"),
]


@pytest.mark.parametrize("rec", RECORDS, ids=[r.name for r in RECORDS])
@pytest.mark.parametrize("bad,exc,match", BAD)
def test_bad_input_names_argument(rec, bad, exc, match):
    q, k, v = _qkv(1, 4, 2, 6, 5, 4)
    with pytest.raises(exc, match=match):
        rec.load()(*bad(q, k, v), enable_gqa=True)


@pytest.mark.parametrize("fn", TILED, ids=[r.name for r in TILED_RECORDS])
def test_bad_blocks_scale_counter(fn):
    q, k, v = _qkv(1, 2, 2, 6, 5, 4)
    with pytest.raises(ValueError, match="Br must be a positive int"):
        fn(q, k, v, Br=0)
    with pytest.raises(ValueError, match="Bc must be a positive int"):
        fn(q, k, v, Bc=-4)
    with pytest.raises(TypeError, match="Bc must be a positive int"):
        fn(q, k, v, Bc=2.0)
    with pytest.raises(ValueError, match="scale"):
        fn(q, k, v, scale=-1.0)
    with pytest.raises(TypeError, match="scale"):
        fn(q, k, v, scale="0.5")
    with pytest.raises(TypeError, match="is_causal"):
        fn(q, k, v, is_causal="yes")
    with pytest.raises(TypeError, match="counter"):
        fn(q, k, v, counter={})


def test_validate_returns_shape():
    q, k, v = _qkv(2, 8, 2, 6, 5, 4)
    sh = validate_attention_inputs(q, k, v, enable_gqa=True)
    assert (sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nk, sh.D, sh.group) == (2, 8, 2, 6, 5, 4, 4)
    assert sh.scale == 0.5
    assert validate_attention_inputs(q, k, v, scale=2, enable_gqa=True).scale == 2.0


def test_tolerance_for_rejects_other_dtypes():
    with pytest.raises(TypeError):
        tolerance_for(torch.int32)


# ------------------------------------------------------------------ BREAK IT variant
def test_variant_intact_matches_and_breaks_as_described():
    from course_utils.attention import fa2_variant
    q, k, v = _qkv(1, 2, 2, 64, 96, 16)
    ref = naive_attention(q, k, v)
    torch.testing.assert_close(fa2_variant(q, k, v, Br=16, Bc=16), ref, atol=2e-6, rtol=2e-6)
    silent = fa2_variant(q * 2, k * 2, v, Br=16, Bc=16, rescale=False)
    err = (silent - naive_attention(q * 2, k * 2, v)).abs().max().item()
    assert torch.isfinite(silent).all() and err > 0.05
    # a ramp of scores 0.5 * j: fp16 exp overflows past 11.09, fp32 past 88.72
    q1 = torch.ones(1, 1, 1, 1)
    k1 = (0.5 * torch.arange(200.0)).reshape(1, 1, 200, 1)
    v1 = torch.ones(1, 1, 200, 1)
    first = {}
    for dt in (torch.float16, torch.float32):
        trace = []
        out = fa2_variant(q1, k1, v1, Br=1, Bc=8, subtract_max=False, compute_dtype=dt,
                          trace=trace)
        first[dt] = next(t["j"] for t in trace if t["p_inf"])
        assert torch.isnan(out).all()
    assert first == {torch.float16: 23 // 8, torch.float32: 178 // 8}
    with pytest.raises(TypeError, match="trace"):
        fa2_variant(q, k, v, trace={})
    with pytest.raises(TypeError, match="compute_dtype"):
        fa2_variant(q, k, v, compute_dtype=torch.int32)


# ------------------------------------------------------------------ the learner check
def _relative_mask_fa2(q, k, v, is_causal=False):
    # the classic bug: tile-relative indices in the causal mask
    o = torch.empty_like(q)
    d = q.shape[-1]
    for i0 in range(0, q.shape[2], 8):
        s = q[:, :, i0:i0 + 8] @ k.transpose(-1, -2) / math.sqrt(d)
        if is_causal:
            r = torch.arange(s.shape[-2])[:, None]
            c = torch.arange(s.shape[-1])[None, :]
            s = s.masked_fill(c > r, float("-inf"))
        o[:, :, i0:i0 + 8] = torch.softmax(s, -1) @ v
    return o


def test_check_attention_fn_passes_good_and_fails_wrong_with_hints(capsys):
    from course_utils.attention import check_attention_fn
    from course_utils.checks import CheckFailed
    good = lambda q, k, v, **kw: flash_attention_fa2(q, k, v, enable_gqa=True, Br=8, Bc=8, **kw)  # noqa: E731
    check_attention_fn(good, is_causal=True, gqa=True)
    assert "ok:" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="absolute"):
        check_attention_fn(_relative_mask_fa2, is_causal=True)
    with pytest.raises(CheckFailed, match="ignores the causal mask"):
        check_attention_fn(lambda q, k, v, is_causal: naive_attention(q, k, v), is_causal=True)

    def wrong_heads(q, k, v):
        idx = torch.arange(q.shape[1]) % k.shape[1]
        return naive_attention(q, k[:, idx], v[:, idx])
    with pytest.raises(CheckFailed, match="h // "):
        check_attention_fn(wrong_heads, gqa=True)
    from course_utils.attention import fa2_variant
    with pytest.raises(CheckFailed, match="exp\\(m_old - m_new\\)"):
        check_attention_fn(lambda q, k, v: fa2_variant(q, k, v, Br=4, Bc=4, rescale=False))
    with pytest.raises(CheckFailed, match="shape"):
        check_attention_fn(lambda q, k, v: q[:, :, :1])


# ------------------------------------------------------------------ problem-set checks
from pathlib import Path  # noqa: E402

import nbformat  # noqa: E402

from course_utils.checks import CheckFailed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

WRONG = {
    ("03", "3.1"): ("def attention_update(state, x, v):\n    m, den, num = state\n"
                    "    return torch.maximum(m, x), den + torch.exp(x), num + torch.exp(x) * v",
                    "subtract the running max"),
    ("03", "3.2"): ("def merge(a, b):\n    (ma, da, na), (mb, db, nb_) = a, b\n"
                    "    m = torch.maximum(ma, mb)\n    ca, cb = torch.exp(ma - m), torch.exp(mb - m)\n"
                    "    return m, ca * da + cb * db, ca[:, None] * na + cb[:, None] * nb_",
                    "exp(-inf - (-inf))"),
    ("03", "3.3"): ("def tiled_row_attention(x, vals, B):\n"
                    "    states = [state_from_scores(x[:, lo:lo + B], vals[lo:lo + B])\n"
                    "              for lo in range(0, x.shape[1] - B + 1, B)]\n"
                    "    total = states[0]\n    for s in states[1:]:\n"
                    "        total = merge_states(total, s)\n    return total.acc / total.l[:, None]",
                    "cover every key once"),
    ("03", "3.4"): ("def hbm_traffic(N, d, Br, Bc):\n    tc = -(-N // Bc)\n"
                    "    return 2 * N * d, 2 * N * d, 2 * tc * N * d",
                    "every one of the Tr query tiles"),
    ("03", "3.5"): ("def fa2_intensity(N, d, Br, Bc, nbytes):\n    tr = -(-N // Br)\n"
                    "    return 4 * N * N * d / (N * d + 2 * tr * N * d + N * d)", "bytes"),
    ("03", "3.6"): ('orders = {"o_written_once": "fa1", "kv_loaded_once": "fa2", "lm_in_hbm": "fa1",'
                    ' "intensity_grows_with_Br": "fa2"}', "stays in SRAM"),
    ("04", "4.1"): ("def my_block_sizes(M, d):\n    bc = -(-M // (4 * d))\n    return min(bc, d), bc",
                    "floor"),
    ("04", "4.2"): ("def tile_visible(i0, j0, rows, cols):\n"
                    "    return torch.arange(cols)[None, :] <= torch.arange(rows)[:, None]",
                    "absolute positions"),
    ("04", "4.3"): ("from course_utils.attention import fa2_variant\n"
                    "def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):\n"
                    "    return fa2_variant(q, k, v, Br=Br, Bc=Bc, rescale=False)",
                    "course_utils.attention"),
    ("04", "4.4"): ('predicted_tile = {"fp16": 2, "fp32": 22}\npredicted_output = "nan"', "j // 12"),
    ("04", "4.5"): ('prediction_4_5 = "finite_but_wrong"\nk_special = torch.ones(1, 1, 32, 4)',
                    "two different key rows"),
    ("04", "4.6"): ("import torch.nn.functional as F\ndef decode_step(q_new, k_cache, v_cache):\n"
                    "    return F.scaled_dot_product_attention(q_new, k_cache, v_cache, is_causal=True,"
                    " enable_gqa=True)", "scaled_dot_product_attention"),
}


def _run_with_answer(prefix, exercise, answer_src):
    path = next((ROOT / "solutions").glob(f"{prefix}_*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    ns = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.get("metadata", {}).get("course", {})
        src = cell.source
        if meta.get("exercise") == exercise and meta.get("role") == "answer":
            src = answer_src
        if meta.get("exercise") == exercise and meta.get("role") == "check":
            exec(compile(src, f"check {exercise}", "exec"), ns)   # noqa: S102
            return
        exec(compile(src, str(path.name), "exec"), ns)            # noqa: S102
    raise AssertionError(f"no check cell for exercise {exercise}")


@pytest.mark.parametrize("key", sorted(WRONG), ids=[f"{p}-{e}" for p, e in sorted(WRONG)])
def test_problem_set_checks_reject_wrong_answers(key, capsys):
    prefix, exercise = key
    wrong, hint = WRONG[key]
    with pytest.raises(CheckFailed) as err:
        _run_with_answer(prefix, exercise, wrong)
    assert hint in str(err.value), str(err.value)
