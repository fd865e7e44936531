"""The GPU check scripts under ``benchmarks/`` take their cases from the records of
``course_utils.contract``: every case is declared, every declared value is tried, an
undeclared combination never appears and a new declaration adds cases. Their case
runners also work in the interpreter at tiny sizes, so a CPU catches a broken script."""
import dataclasses

import pytest
import torch

from course_utils.contract import ALIGNMENTS, FLOAT_DTYPES, LAYOUTS, implementation
from tests.bench_scripts import load


ATTN, HOPPER, DECODE = (load(n) for n in ("gpu_check_attention", "check_hopper_gpu",
                                           "check_decode_gpu"))


def _cases(mod, **kw):
    out = mod.plan(**kw)
    return [c[0] if isinstance(c, tuple) else c for c in out]


def _covers_the_records(mod, kernels):
    got = _cases(mod)
    assert {c.impl for c in got} == {r.name for r in kernels}
    for rec in kernels:
        mine = [c for c in got if c.impl == rec.name]
        assert all(rec.declares(c, interpreter=False) for c in mine)
        assert {c.dtype for c in mine} == set(rec.dtypes)          # as declared for a GPU
        assert {c.D for c in mine} == set(rec.example_head_dims())
        assert {c.alignment for c in mine} == set(rec.settings())
        assert {c.layout for c in mine} == set(LAYOUTS)
        assert any(c.Hq != c.Hkv for c in mine) == rec.gqa
        # every size the record takes is used
        takes = {s for s in mod.SIZES if any(
            rec.declares(dataclasses.replace(c, B=s[0], Hq=s[1], Hkv=s[2], Nq=s[3], Nk=s[4]),
                         interpreter=False) for c in mine)}
        assert takes <= {c.size for c in mine}
    return got


def test_which_kernels_each_script_checks():
    assert [r.name for r in ATTN.KERNELS] == ["triton"]
    assert [r.name for r in HOPPER.KERNELS] == ["tma", "gluon", "fp8"]
    assert [r.name for r in DECODE.KERNELS] == ["decode"]


def test_attention_check_cases_are_the_declared_ones():
    got = _covers_the_records(ATTN, ATTN.KERNELS)
    assert got == ATTN.CASES and set(ATTN.QUICK) <= set(got)
    # lower-right rows without a key are left to the CPU tests
    assert not any(c.alignment == "causal_lower_right" and c.Nq > c.Nk for c in got)


def test_hopper_check_cases_are_the_declared_ones():
    got = _covers_the_records(HOPPER, HOPPER.KERNELS)
    gluon = [c for c in got if c.impl == "gluon"]
    # the Gluon kernel: both alignments, Nq != Nk both ways, lengths off the 128-row tile,
    # and a lower-right mask with Nq > Nk (rows and whole tiles that see no key)
    assert {c.alignment for c in gluon} == {None, "causal_upper_left", "causal_lower_right"}
    assert any(c.Nq % 128 for c in gluon) and any(c.Nq > c.Nk for c in gluon)
    assert any(c.alignment == "causal_lower_right" and c.Nq - c.Nk >= 128 for c in gluon)
    assert not any(c.dtype == torch.float32 for c in got)
    assert not any(c.impl == "tma" and c.alignment == "causal_lower_right" for c in got)
    # every case of a kernel runs with each of its schedule options
    todo = HOPPER.plan()
    for rec in HOPPER.KERNELS:
        n = len({c for c, _ in todo if c.impl == rec.name})
        assert len([1 for c, _ in todo if c.impl == rec.name]) == n * len(HOPPER.VARIANTS[rec.name])
    assert not any(o.get("pingpong") for _, o in HOPPER.plan(pingpong=False))


def test_decode_check_cases_are_the_declared_ones():
    got = _covers_the_records(DECODE, DECODE.KERNELS)
    assert all(c.Nq <= c.Nk for c in got)
    assert {r for _, r in DECODE.plan()} == {True, False}
    assert DECODE.split_case(DECODE.KERNELS[0]).D == 128


# ids without the word "hopper": conftest skips items marked (or named) so off Hopper
@pytest.mark.parametrize("mod,name", [(ATTN, "triton"), (HOPPER, "gluon"), (DECODE, "decode")],
                         ids=["attention", "lesson8", "decode"])
def test_a_new_declaration_adds_cases(mod, name):
    rec = implementation(name)
    extra = next(t for t in FLOAT_DTYPES if t not in rec.dtypes)
    wider = dataclasses.replace(rec, alignments=ALIGNMENTS, dtypes=rec.dtypes + (extra,))
    before, after = _cases(mod, kernels=[rec]), _cases(mod, kernels=[wider])
    assert extra not in {c.dtype for c in before} and extra in {c.dtype for c in after}
    assert {c.alignment for c in after} == {None, *ALIGNMENTS}
    narrow = dataclasses.replace(rec, dtypes=rec.dtypes[:1], gqa=False)
    got = _cases(mod, kernels=[narrow])
    assert got and all(c.dtype == rec.dtypes[0] and c.Hq == c.Hkv for c in got)


@pytest.mark.parametrize("mod", [ATTN, HOPPER, DECODE], ids=["attention", "lesson8", "decode"])
def test_help_and_list_work_without_a_gpu(mod, capsys):
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0
    assert mod.main(["--list"]) == 0
    out = capsys.readouterr().out
    first = _cases(mod)[0]
    assert first.id in out and "cases" in out.splitlines()[-1]


def test_case_runners_work_in_the_interpreter():
    """One tiny case of each script through its own runner (Triton's CPU interpreter)."""
    c = ATTN.plan(sizes=[(1, 2, 1, 5, 9)], interpreter=None)[0]
    ok, errs = ATTN.run_case(c)
    assert ok, errs
    c = DECODE.plan(sizes=[(2, 4, 2, 2, 9)], interpreter=None)[0][0]
    assert DECODE.case(c, True, seed=1)
    tma = implementation("tma")
    ok, errs = HOPPER.check(*HOPPER.plan(sizes=[(1, 2, 1, 5, 9)], kernels=[tma],
                                         interpreter=None)[0])
    assert ok, errs
