"""The one attention contract: every entry point, driven by its declared record."""
import math
import re
from pathlib import Path

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from course_utils import device
from course_utils.checks import check_close
from course_utils.constants import LN2, LOG2E
from course_utils.contract import (ALIGNMENTS, FLOAT_DTYPES, IMPLEMENTATIONS, LAYOUTS,
                                   GQAError, causal_mask, cases, implementation,
                                   validate_attention)
from course_utils.tracker import AllocationTracker

DEV = device.DEVICE
HERE = [r for r in IMPLEMENTATIONS.values() if r.runs_here()]
IDS = [r.name for r in HERE]


def _case(rec, Nq, Nk, Hq=4, Hkv=2, seed=0):
    """Small inputs the record supports: its first dtype that is not float64 (float32
    where it can), its smallest head dim, lengths rounded up to its multiple."""
    dtype = torch.float32 if torch.float32 in rec.dtypes else rec.dtypes[0]
    D = rec.head_dims[0] if rec.head_dims else 16
    m = rec.multiple_of
    Nq, Nk = -(-Nq // m) * m, -(-Nk // m) * m
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(rec.device_for(), dtype)  # noqa: E731
    return mk(1, Hq, Nq, D), mk(1, Hkv, Nk, D), mk(1, Hkv, Nk, D)


def _call(rec, q, k, v, **opts):
    fn = rec.load()
    if rec.name == "split_kv":
        return fn(q, k, v, 3, **opts)
    return fn(q, k, v, **opts)


def _masked_reference(q, k, v, is_causal, alignment):
    Nq, Nk = q.shape[2], k.shape[2]
    g = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        shift = Nk - Nq if alignment == "causal_lower_right" else 0
        s = s.masked_fill(~torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).tril(shift),
                          float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v.double().repeat_interleave(g, 1)


def _settings(rec):
    return [(False, None)] + [(True, a) for a in rec.alignments]


# --------------------------------------------------------------------------- declarations
def test_every_entry_point_is_declared_and_loads():
    names = {"naive", "fa1", "fa2", "tiled_backward", "triton", "tma", "gluon", "fp8",
             "decode_reference", "split_kv", "decode"}
    assert names <= set(IMPLEMENTATIONS)
    for rec in HERE:
        assert callable(rec.load())
    with pytest.raises(ValueError, match="unknown attention implementation"):
        implementation("flash3")


@pytest.mark.parametrize("rec", HERE, ids=IDS)
def test_each_declared_setting_matches_an_explicit_mask(rec):
    """Every alignment an implementation declares, with Nq != Nk both ways (queries no
    longer than the cache for decoding), and GQA."""
    sizes = [(7, 20), (20, 20)] if rec.kind == "decode" else [(7, 20), (20, 7)]
    for Nq, Nk in sizes:
        q, k, v = _case(rec, Nq, Nk, seed=Nq * 31 + Nk)
        for is_causal, alignment in _settings(rec):
            out = _call(rec, q, k, v, is_causal=is_causal, alignment=alignment, enable_gqa=True)
            ref = _masked_reference(q, k, v, is_causal, alignment)
            seen = ref.abs().sum(-1) > 0          # rows with at least one visible key
            # e4m3 keeps 3 mantissa bits: unit roundoff 2**-4, four of them
            tol = dict(atol=0.25, rtol=0.25) if rec.name == "fp8" else {}
            check_close(out.float()[seen], ref[seen], dtype=q.dtype, quiet=True,
                        name=f"{rec.name} Nq={q.shape[2]} Nk={k.shape[2]} causal={is_causal} "
                             f"{alignment}", **tol)


@pytest.mark.parametrize("rec", HERE, ids=IDS)
def test_undeclared_settings_are_refused_before_any_work(rec):
    q, k, v = _case(rec, 16, 16)
    fn = rec.load()
    for alignment in ALIGNMENTS:
        if alignment not in rec.alignments:
            with pytest.raises(ValueError, match="causal"):
                _call(rec, q, k, v, is_causal=True, alignment=alignment, enable_gqa=True)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        if dtype not in rec.dtypes_for():           # on this machine (interpreter or GPU)
            with pytest.raises(TypeError, match="takes"):
                _call(rec, q.to(dtype), k.to(dtype), v.to(dtype), enable_gqa=True)
    if rec.head_dims or rec.max_head_dim:
        bad = (rec.max_head_dim or 0) + 8 if not rec.head_dims else 24
        q2, k2, v2 = (t.new_zeros(*t.shape[:3], bad) for t in (q, k, v))
        with pytest.raises(ValueError, match="head dim"):
            _call(rec, q2, k2, v2, enable_gqa=True)
    with pytest.raises(TypeError):
        fn(q, k, v, None, True) if rec.name != "split_kv" else fn(q, k, v, 3, None, True)


BAD = [
    (lambda q, k, v: (q[0], k, v), ValueError, "4-D"),
    (lambda q, k, v: (q, k[..., :8], v), ValueError, "head dim"),
    (lambda q, k, v: (q, k, v[:, :, :3]), ValueError, "shape"),
    (lambda q, k, v: (q, k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1)), ValueError, "batch"),
    (lambda q, k, v: (q, k.to(torch.float64 if k.dtype != torch.float64 else torch.float32),
                      v), TypeError, "dtype"),
    (lambda q, k, v: (q.int(), k, v), TypeError, "floating"),
    (lambda q, k, v: (q.tolist(), k, v), TypeError, "torch.Tensor"),
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, ">= 1"),
    (lambda q, k, v: (q.to("meta"), k, v), ValueError, "device"),
    (lambda q, k, v: (q[:, :3], k, v), ValueError, "multiple"),
]


@pytest.mark.parametrize("bad,exc,match", BAD, ids=[b[2] for b in BAD])
@pytest.mark.parametrize("rec", HERE, ids=IDS)
def test_bad_input_raises_like_sdpa_before_any_work(rec, bad, exc, match):
    q, k, v = _case(rec, 16, 16)
    with AllocationTracker() as t, pytest.raises(exc, match=match):
        _call(rec, *bad(q, k, v), enable_gqa=True)
    assert not any(op in ("mm", "bmm", "matmul", "baddbmm") for op in t.ops)


@pytest.mark.parametrize("rec", [r for r in HERE if r.kind == "sdpa"],
                         ids=[r.name for r in HERE if r.kind == "sdpa"])
def test_gqa_needs_enable_gqa_as_in_sdpa(rec):
    q, k, v = _case(rec, 16, 16)
    with pytest.raises(RuntimeError):                 # the type SDPA raises
        torch.nn.functional.scaled_dot_product_attention(q.float().cpu(), k.float().cpu(),
                                                         v.float().cpu())
    for exc in (RuntimeError, ValueError):
        with pytest.raises(exc, match="enable_gqa=True"):
            _call(rec, q, k, v)
    with pytest.raises(TypeError, match="enable_gqa"):
        _call(rec, q, k, v, enable_gqa="yes")


def test_validator_resolves_shape_scale_group_and_alignment():
    q, k, v = torch.randn(2, 8, 5, 4), torch.randn(2, 2, 9, 4), torch.randn(2, 2, 9, 4)
    sh = validate_attention(q, k, v, enable_gqa=True)
    assert (sh.B, sh.Hq, sh.Hkv, sh.Nq, sh.Nk, sh.D, sh.group) == (2, 8, 2, 5, 9, 4, 4)
    assert sh.scale == 0.5 and sh.causal is None and not sh.is_causal and sh.offset == 0
    sh = validate_attention(q, k, v, enable_gqa=True, is_causal=True)
    assert sh.causal == "causal_upper_left" and sh.offset == 0
    sh = validate_attention(q, k, v, enable_gqa=True, is_causal=True,
                            alignment="causal_lower_right", scale=2)
    assert sh.causal == "causal_lower_right" and sh.offset == 4 and sh.scale == 2.0
    sh = validate_attention(q, k, v, enable_gqa=True, is_causal=True, impl="decode_reference")
    assert sh.causal == "causal_lower_right"
    with pytest.raises(GQAError):
        validate_attention(q, k, v)
    with pytest.raises(ValueError, match="alignment must be one of"):
        validate_attention(q, k, v, enable_gqa=True, is_causal=True, alignment="top-left")


# --------------------------------------------------------------------------- the masks
@pytest.mark.parametrize("Nq,Nk", [(2, 5), (5, 2), (4, 4), (1, 9)])
def test_masks_are_torchs_causal_variants(Nq, Nk):
    assert torch.equal(causal_mask(Nq, Nk, "causal_upper_left"),
                       causal_upper_left(Nq, Nk)._materialize())
    assert torch.equal(causal_mask(Nq, Nk, "causal_lower_right"),
                       causal_lower_right(Nq, Nk)._materialize())


def test_mask_pictures_in_the_docstring_are_right():
    import course_utils.contract as contract
    doc = contract.__doc__
    for Nq, Nk in ((2, 5), (5, 2)):
        for name in ALIGNMENTS:
            m = causal_mask(Nq, Nk, name).int().tolist()
            rows = [" ".join(map(str, r)) for r in m]
            assert all(r in doc for r in rows), (name, Nq, Nk, rows)


# --------------------------------------------------------------------------- constants
def test_log2e_and_ln2_are_defined_once():
    assert LOG2E == pytest.approx(1 / math.log(2)) and LN2 == pytest.approx(math.log(2))
    root = Path(__file__).resolve().parents[1] / "course_utils"
    literal = re.compile(r"1\.44269504|0\.69314718")
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "constants.py" and literal.search(p.read_text())]
    assert offenders == [], f"ln 2 / log2 e written as a literal in {offenders}"


# --------------------------------------------------------------------------- cases from records
ALL = list(IMPLEMENTATIONS.values())
ALL_IDS = [r.name for r in ALL]
# tiny sizes with GQA, MQA, Nq != Nk both ways and lengths off and on a multiple of 128
TINY = [(1, 2, 2, 3, 5), (1, 4, 2, 5, 3), (1, 4, 1, 128, 256), (2, 2, 2, 256, 128)]


def _base(rec):
    """The first case the record declares at a tiny size."""
    return cases(rec, [(1, 2, 2, 128, 128)], cover="all")[0]


def _undeclared(rec):
    """One-axis changes of a declared case that the record does not declare, with the
    error type the validator must raise."""
    import dataclasses
    base = _base(rec)
    out = [(dataclasses.replace(base, dtype=dt), TypeError)
           for dt in FLOAT_DTYPES if dt not in rec.dtypes_for()]
    out += [(dataclasses.replace(base, D=d), ValueError)
            for d in (8, 24, 48, 512) if not rec.takes_head_dim(d)]
    out += [(dataclasses.replace(base, alignment=a), ValueError)
            for a in ALIGNMENTS if a not in rec.alignments]
    if rec.multiple_of > 1:
        out += [(dataclasses.replace(base, Nq=base.Nq - 1), ValueError)]
    if not rec.gqa:
        out += [(dataclasses.replace(base, Hq=2 * base.Hkv), GQAError)]
    return out


@pytest.mark.parametrize("rec", ALL, ids=ALL_IDS)
def test_cases_are_exactly_the_declared_ones(rec):
    every = cases(rec, TINY, cover="all")
    for c in every:                      # each one is accepted by the validator
        assert rec.declares(c), c.id
        validate_attention(*c.inputs(device=rec.device_for()), impl=rec, hardware=False,
                           is_causal=c.is_causal, alignment=c.alignment, enable_gqa=True)
    # every declared value of every axis appears, nothing else does
    assert {c.dtype for c in every} == set(rec.dtypes_for())
    on_gpu = cases(rec, TINY, cover="all", interpreter=False)
    assert {c.dtype for c in on_gpu} == set(rec.dtypes) >= set(rec.dtypes_for(True))
    assert {c.D for c in every} == set(rec.example_head_dims())
    assert {c.alignment for c in every} == set(rec.settings())
    assert {c.layout for c in every} == set(LAYOUTS)
    assert all(c.Nq % rec.multiple_of == 0 and c.Nk % rec.multiple_of == 0 for c in every)
    assert any(c.Hq != c.Hkv for c in every) == rec.gqa
    if rec.kind == "decode":
        assert all(c.Nq <= c.Nk for c in every)
    # the pairwise cover is a subset of the product that still holds every value
    few = cases(rec, TINY)
    assert set(few) <= set(every) and len(few) <= len(every)
    for get in (lambda c: c.dtype, lambda c: c.D, lambda c: c.alignment, lambda c: c.layout):
        assert {get(c) for c in few} == {get(c) for c in every}
    assert {c.size for c in few} == {c.size for c in every}


@pytest.mark.parametrize("rec", ALL, ids=ALL_IDS)
def test_the_validator_refuses_what_a_record_does_not_declare(rec):
    """Each axis a record leaves out (and GQA, withdrawn from a copy of the record:
    every implementation takes it) is refused by the validator with the record's
    message, and never generated by :func:`cases`."""
    import dataclasses
    narrow = dataclasses.replace(rec, gqa=False)
    undeclared = [(rec, c, e) for c, e in _undeclared(rec)]
    undeclared += [(narrow, c, e) for c, e in _undeclared(narrow) if e is GQAError]
    assert any(r is narrow for r, _, _ in undeclared)
    for r in (rec, narrow):
        every = set(cases(r, TINY + [(1, 2, 2, 127, 128)], cover="all"))
        for c, exc in [(c, e) for rr, c, e in undeclared if rr is r]:
            assert not r.declares(c) and c not in every, c.id
            with pytest.raises(exc) as info:
                validate_attention(*c.inputs(device=rec.device_for()), impl=r, hardware=False,
                                   is_causal=c.is_causal, alignment=c.alignment, enable_gqa=True)
            assert str(info.value) == str(r.refusal(dtype=c.dtype, D=c.D, Nq=c.Nq, Nk=c.Nk,
                                                    Hq=c.Hq, Hkv=c.Hkv, alignment=c.alignment))


def test_a_new_declaration_adds_cases_and_a_withdrawn_one_removes_them():
    import dataclasses
    tma = implementation("tma")                   # as declared for a GPU
    before = cases(tma, TINY, cover="all", interpreter=False)
    wider = dataclasses.replace(tma, alignments=ALIGNMENTS, dtypes=tma.dtypes + (torch.float32,))
    after = cases(wider, TINY, cover="all", interpreter=False)
    assert set(before) < set(after)
    added = set(after) - set(before)
    assert {c.alignment for c in added} | {c.dtype for c in added} >= {"causal_lower_right",
                                                                       torch.float32}
    no_gqa = cases(dataclasses.replace(tma, gqa=False), TINY, cover="all", interpreter=False)
    assert no_gqa and all(c.Hq == c.Hkv for c in no_gqa)
    assert set(no_gqa) == {c for c in before if c.Hq == c.Hkv}
    few = cases(wider, TINY, interpreter=False)
    assert {c.alignment for c in few} == set(wider.settings())


def test_pairwise_cover_holds_every_pair_and_callers_narrow_axes():
    import itertools
    few = cases("triton", [(1, 2, 2, 7, 7), (2, 4, 2, 9, 13)])
    axes = [lambda c: c.dtype, lambda c: c.D, lambda c: c.alignment, lambda c: c.layout]
    every = cases("triton", [(1, 2, 2, 7, 7)], cover="all")
    for a, b in itertools.combinations(axes, 2):
        assert {(a(c), b(c)) for c in few} == {(a(c), b(c)) for c in every}
    assert len(few) < len(every) // 4
    narrow = cases("triton", [(1, 2, 2, 7, 7)], dtypes=[torch.float16, torch.float64],
                   head_dims=[64, 1024], settings=[None], layouts=["bnhd"])
    assert {(c.dtype, c.D, c.alignment, c.layout) for c in narrow} == {
        (torch.float16, 64, None, "bnhd")}
    kept = cases("triton", [(1, 2, 2, 7, 7), (1, 2, 2, 9, 4)], cover="all",
                 keep=lambda c: not (c.alignment == "causal_lower_right" and c.Nq > c.Nk))
    assert not any(c.alignment == "causal_lower_right" and c.Nq > c.Nk for c in kept)
    # a record that takes only lengths in multiples of 128, offered none
    import dataclasses
    blocky = dataclasses.replace(implementation("gluon"), multiple_of=128)
    with pytest.raises(ValueError, match="no size"):
        cases(blocky, [(1, 2, 2, 100, 100)])
    assert {(c.Nq, c.Nk) for c in cases(blocky, [(1, 2, 2, 100, 100), (1, 2, 2, 128, 256)])} \
        == {(128, 256)}
    with pytest.raises(ValueError, match="declares none"):
        cases("gluon", TINY, dtypes=[torch.float32])
    with pytest.raises(ValueError, match="cover"):
        cases("naive", TINY, cover="some")
    with pytest.raises(ValueError, match=r"\(B, Hq, Hkv, Nq, Nk\)"):
        cases("naive", [(1, 2, 3, 4)])


@pytest.mark.parametrize("rec", HERE, ids=IDS)
def test_every_layout_gives_the_same_answer(rec):
    """A strided view (heads interleaved) computes what the contiguous tensor does."""
    import dataclasses
    for c in cases(rec, [(1, 4, 2, 16 if rec.multiple_of == 1 else 128, 20
                          if rec.multiple_of == 1 else 128)], dtypes=[rec.dtypes[0]],
                   head_dims=[rec.example_head_dims()[0]], layouts=["bnhd"]):
        q, k, v = c.inputs(seed=3)
        assert not q.is_contiguous()
        ref = _call(rec, q.contiguous(), k.contiguous(), v.contiguous(), **c.options())
        out = _call(rec, q, k, v, **c.options())
        # same values in another layout: only the order of a sum may change
        torch.testing.assert_close(out, ref, msg=c.id)
        assert dataclasses.replace(c, layout="bhnd").inputs(seed=3)[0].is_contiguous()


@pytest.mark.parametrize("rec", HERE, ids=IDS)
def test_return_lse_is_taken_only_where_declared(rec):
    q, k, v = _case(rec, 16, 16)
    if rec.returns_lse:
        o, lse = _call(rec, q, k, v, enable_gqa=True, return_lse=True)
        assert o.shape == q.shape and lse.shape == q.shape[:3]
    else:
        with pytest.raises(TypeError, match="return_lse"):
            _call(rec, q, k, v, enable_gqa=True, return_lse=True)


def test_interpreter_dtypes_are_refused_in_the_interpreter_only():
    """A record may take fewer dtypes in Triton's CPU interpreter than on a GPU (the TMA
    kernel: bfloat16 tensor-descriptor tiles reach tl.dot wrong there)."""
    tma = implementation("tma")
    assert tma.dtypes_for(False) == tma.dtypes and tma.dtypes_for(True) == (torch.float16,)
    err = tma.refusal(dtype=torch.bfloat16, D=16, Nq=8, Nk=8, Hq=2, Hkv=2, interpreter=True)
    assert isinstance(err, TypeError) and "interpreter" in str(err)
    assert tma.refusal(dtype=torch.bfloat16, D=16, Nq=8, Nk=8, Hq=2, Hkv=2,
                       interpreter=False) is None
    assert tma.dtypes_for() == tma.dtypes_for(device.INTERPRET)
    if device.INTERPRET:
        q = torch.randn(1, 2, 8, 16).to(DEV, torch.bfloat16)
        with pytest.raises(TypeError, match="interpreter"):
            tma.load()(q, q, q)
