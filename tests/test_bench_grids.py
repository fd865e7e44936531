"""The benchmark suites take their points from the contract records: the default grids
are unchanged (the lessons read the saved JSON), every point is declared, and a record
that declares less loses its points (or is refused before anything is timed). Each suite
settles a provider before timing it (``--settle``, refused when not a time), and the clock
probe files each nvidia-smi sample under the timing it fell in."""
import dataclasses
from pathlib import Path

import pytest
import torch

from course_utils.bench import attention, decode, hopper, table
from course_utils.contract import Case, implementation


def test_attention_grid_is_the_declared_part_of_the_asked_grid(monkeypatch):
    args = attention.parse([])
    old = [(m, c, d, n, dt) for dt in ("fp16", "bf16") for m in ("fwd", "fwd+bwd")
           for c in (False, True) for d in (64, 128) for n in (1024, 2048, 4096, 8192, 16384)]
    assert attention.grid(args) == old                    # same points, same order
    assert attention.KERNEL.name == "triton" and attention.BACKENDS[0] == "triton"
    for mode, causal, d, n, dt in old:
        c = Case("triton", 4, 32, 32, n, n, d, attention.DTYPES[dt],
                 "causal_upper_left" if causal else None)
        assert attention.KERNEL.declares(c, interpreter=False)
    # a record that declares less: its points are gone, or the option is refused
    narrow = dataclasses.replace(attention.KERNEL, dtypes=(torch.float16,), alignments=(),
                                 backward=False)
    monkeypatch.setattr(attention, "KERNEL", narrow)
    got = attention.grid(attention.parse(["--modes", "fwd", "--causal", "no"]))
    assert got and {(p[1], p[4]) for p in got} == {(False, "fp16")}
    for bad in (["--causal", "yes"], ["--modes", "fwd,fwd+bwd"], ["--d", "512"]):
        with pytest.raises(SystemExit):
            attention.parse(bad)


def test_hopper_providers_run_the_declared_points():
    names = list(hopper.providers())
    kinds = {n: hopper.record_of(n) for n in names}
    assert {r.name for r in kinds.values() if r} == {r.name for r in hopper.KERNELS} - {"fp8"}
    assert hopper.record_of("fp8_hadamard").name == "fp8"
    assert all((r is None) == n.startswith("sdpa") for n, r in kinds.items())
    assert set(hopper.DTYPES) == {"fp16", "bf16"}
    for n in (4096, 8192, 16384):                       # the default points: all declared
        assert not any(hopper.undeclared(p, n, torch.float16, 16) for p in names)
    assert hopper.undeclared("gluon_pingpong", 1000, torch.float16, 16) is None
    why = hopper.undeclared("gluon_pingpong", 4096, torch.float32, 16)
    assert why and "takes" in why
    assert hopper.undeclared("triton_tma_s1", 1000, torch.float16, 16) is None
    assert "takes" in hopper.undeclared("fp8_hadamard", 4096, torch.float32, 16)
    with pytest.raises(SystemExit):
        hopper.main(["--dtype", "fp32"])


def test_decode_grid_is_declared(monkeypatch):
    assert decode.grid(decode.BATCHES, decode.LENGTHS) == [
        (b, n) for b in decode.BATCHES for n in decode.LENGTHS]
    assert decode.KERNEL is implementation("decode")
    monkeypatch.setattr(decode, "KERNEL", dataclasses.replace(decode.KERNEL,
                                                              dtypes=(torch.bfloat16,)))
    with pytest.raises(ValueError, match="declares none"):
        decode.grid(decode.BATCHES, decode.LENGTHS)


def test_table_columns_and_skips_come_from_the_records():
    assert table.FWD == ("triton", "tma", "gluon", "fp8", "flash", "cudnn")
    assert table.FWD_BWD == ("triton", "gluon", "flash", "cudnn")
    assert table.undeclared("gluon", True, 128, 4000, torch.float16) is None
    assert "head dim" in table.undeclared("gluon", False, 256, 4096, torch.float16)
    assert table.undeclared("gluon", False, 128, 4096, torch.float16) is None
    assert table.undeclared("tma", True, 64, 4096, torch.bfloat16) is None
    assert "head dim" in table.undeclared("fp8", False, 256, 4096, torch.float16)


def test_table_times_the_gluon_pair_through_its_backward(monkeypatch):
    # forward + backward for "gluon" is the differentiable pair of gluon_bwd, forward
    # alone the forward kernel; off sm90 both say why they do not run
    from course_utils.hopper import gluon_bwd, gluon_fwd
    q = k = v = torch.zeros(1, 2, 128, 64, dtype=torch.float16)
    calls = []
    monkeypatch.setattr(gluon_bwd, "gluon_attention", lambda *a, **kw: calls.append("pair"))
    monkeypatch.setattr(gluon_fwd, "attention_gluon", lambda *a, **kw: calls.append("fwd"))
    monkeypatch.setattr(table.device, "IS_HOPPER", False)
    assert "sm90" in table._fwd_fn("gluon", q, k, v, False, grad=True)
    monkeypatch.setattr(table.device, "IS_HOPPER", True)
    table._fwd_fn("gluon", q, k, v, True, grad=True)()
    table._fwd_fn("gluon", q, k, v, True)()
    assert calls == ["pair", "fwd"]


def test_probe_sweep_draws_the_same_inputs_and_records_failures():
    from course_utils.bench import common
    points = list(common.forward_points((16, 32), lengths=(8,), b=1, h=2))
    assert [(r["d"], r["n"], r["causal"]) for *_, r in points] == \
        [(16, 8, False), (16, 8, True), (32, 8, False), (32, 8, True)]
    (q0, k0, v0, c0, f0, _), (q1, k1, v1, c1, f1, _) = points[:2]
    assert q0.shape == (1, 2, 8, 16) and not c0 and c1
    # causal and not see the same inputs, and the causal forward counts half the FLOPs
    assert torch.equal(q0, q1) and torch.equal(k0, k1) and torch.equal(v0, v1)
    assert f1 == f0 / 2 == common.attention_flops(1, 2, 8, 8, 16, True)
    assert not torch.equal(points[0][0][..., :16], points[2][0][..., :16])

    def boom():
        raise RuntimeError("does not compile\nsecond line")
    row = common.time_tflops({"d": 16}, {"ok": lambda: q0 @ k0.transpose(-1, -2), "bad": boom},
                             1e15, rep=10)
    assert isinstance(row["ok"], float) and row["ok"] > 0 and "bad" not in row
    assert row["bad_error"].startswith("RuntimeError: does not compile")


def test_settle_runs_the_kernel_back_to_back_for_the_time_asked():
    import time

    from course_utils.bench import common
    calls = []
    t = time.perf_counter()
    n = common.settle(lambda: calls.append(1), 30)
    took = time.perf_counter() - t
    # it ran the callable, counted each call, and stopped soon after the time asked
    assert n == len(calls) >= 4 and 0.03 <= took < 1.0
    assert common.settle(lambda: calls.append(1), 0) == 0
    for bad in (-1, -0.5):
        with pytest.raises(ValueError, match="settle"):
            common.settle(lambda: None, bad)
        with pytest.raises(ValueError, match="settle"):
            common.time_ms(lambda: None, settle_ms=bad)


@pytest.mark.parametrize("bad", ["-5", "nan", "inf", "-inf", "soon", ""])
@pytest.mark.parametrize("suite", ["table", "hopper", "attention"])
def test_benchmarks_refuse_a_bad_settle_time_before_timing(suite, bad, monkeypatch, capsys):
    # the refusal comes from the argument check, before any GPU work is looked for
    monkeypatch.setattr(table, "measure", lambda *a, **kw: pytest.fail("measured"))
    monkeypatch.setattr(hopper, "run_config", lambda *a, **kw: pytest.fail("measured"))
    run = {"table": table.main, "hopper": hopper.main, "attention": attention.parse}[suite]
    with pytest.raises(SystemExit) as e:
        run(["--settle", bad])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --settle" in err and "unrecognized" not in err


def test_benchmarks_settle_for_a_second_unless_told(monkeypatch):
    from course_utils.bench import common
    # every suite takes the option (here without a GPU: nothing is timed)
    monkeypatch.setattr(table.device, "HAS_GPU", False)
    monkeypatch.setattr(hopper.device, "needs", lambda *a, **kw: False)
    assert table.main(["--settle", "0"]) == 0 and hopper.main(["--settle", "10"]) == 0
    assert attention.parse([]).settle == 1000.0
    assert attention.parse(["--settle", "0"]).settle == 0.0
    assert common.settle_arg("250.5") == 250.5
    import argparse
    ap = argparse.ArgumentParser()
    common.add_settle_option(ap, default=7)
    assert ap.parse_args([]).settle == 7 and ap.parse_args(["--settle", "3"]).settle == 3.0


def test_clock_probe_puts_each_smi_sample_in_the_timing_it_fell_in(tmp_path):
    # benchmarks/clock_probe.py reads nvidia-smi's CSV (local time stamps, MHz, W, reasons)
    # and gives each timing the mean clock and power of the samples inside its window
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "clock_probe", Path(__file__).resolve().parents[1] / "benchmarks" / "clock_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    csv = tmp_path / "smi.csv"
    csv.write_text("2026/11/28 12:00:00.000, 1980, 120.5, 0x0000000000000000\n"
                   "2026/11/28 12:00:00.100, 1680, 650.0, 0x0000000000000004\n"
                   "2026/11/28 12:00:00.200, 1620, 690.0, 0x0000000000000004\n"
                   "not a sample line\n"
                   "2026/11/28 12:00:00.300, [N/A], 690.0, 0x4\n"
                   "2026/11/28 12:00:01.000, 1500, 700.0, 0x0000000000000004\n")
    samples = probe.read_smi(csv)
    assert [s[1] for s in samples] == [1980, 1680, 1620, 1500]     # bad lines skipped
    t0 = samples[0][0]
    rows = [{"start": t0 - 0.01, "end": t0 + 0.05}, {"start": t0 + 0.05, "end": t0 + 0.25},
            {"start": t0 + 0.4, "end": t0 + 0.5}]
    probe.attach(rows, samples, 0.0)
    assert rows[0]["sm_mhz"] == 1980 and rows[0]["samples"] == 1
    assert rows[1]["sm_mhz"] == 1650 and rows[1]["min_sm_mhz"] == 1620
    assert rows[1]["watts"] == 670 and rows[1]["reasons"] == ["0x0000000000000004"]
    assert "sm_mhz" not in rows[2]                       # no sample fell inside it
    # a clock an hour off (the machine's local time) is put right by the offset
    shifted = [{"start": t0 + 3600 - 0.01, "end": t0 + 3600 + 0.05}]
    probe.attach(shifted, samples, 3600.0)
    assert shifted[0]["sm_mhz"] == 1980
