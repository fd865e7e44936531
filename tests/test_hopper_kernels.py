"""Lesson 8 kernels: the cases each Hopper kernel's record declares (the ones
``benchmarks/check_hopper_gpu.py`` runs at real sizes), in Triton's interpreter at tiny
sizes on a CPU and at real sizes on an sm90 GPU, where the Gluon kernel runs too."""
import pytest
import torch

from course_utils import device
from course_utils.hopper import fp8, gluon_fwd, triton_fwd
from tests.bench_scripts import load

DEV = device.DEVICE


CHECK = load("check_hopper_gpu")
# (B, Hq, Hkv, Nq, Nk): one row, ragged lengths both ways, GQA and MQA, and one size the
# Gluon kernel takes (multiples of 128); on an sm90 GPU the script's real sizes
CPU_SIZES = [(1, 2, 2, 1, 1), (1, 2, 1, 33, 20), (1, 4, 2, 17, 40), (1, 2, 1, 128, 128)]


def _params():
    out = []
    for case, opts in CHECK.plan(CHECK.SIZES if device.IS_HOPPER else CPU_SIZES,
                                 interpreter=None):
        rec = next(r for r in CHECK.KERNELS if r.name == case.impl)
        marks = () if rec.runs_here() else (pytest.mark.hopper,)
        out.append(pytest.param(case, opts, id=CHECK.label(case, opts).replace(" ", "-"),
                                marks=marks))
    return out


@pytest.mark.parametrize("case,opts", _params())
def test_declared_cases_match_the_reference(case, opts):
    ok, errs = CHECK.check(case, opts)
    assert ok, (case.id, opts, errs)


def _qkv(b, hq, hkv, nq, nk, d, dtype=torch.float16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, device=DEV, dtype=dtype)
            for h, n in ((hq, nq), (hkv, nk), (hkv, nk))]


def test_tma_forward_rejects_bad_input():
    q, k, v = _qkv(1, 2, 2, 8, 8, 16)
    with pytest.raises(TypeError, match="float16"):
        triton_fwd.attention_tma(q.float(), k.float(), v.float(), enable_gqa=True)
    with pytest.raises(ValueError, match="head dim D must be one of"):
        triton_fwd.attention_tma(*_qkv(1, 2, 2, 8, 8, 24), enable_gqa=True)
    with pytest.raises(ValueError, match="4-D"):
        triton_fwd.attention_tma(q[0], k, v, enable_gqa=True)
    with pytest.raises(ValueError, match="num_stages must be a positive int"):
        triton_fwd.attention_tma(q, k, v, num_stages=0, enable_gqa=True)


def test_fp8_quantize_roundtrip_and_scales():
    x = torch.randn(1, 2, 40, 16)
    x[..., 3] *= 50
    x8, s = fp8.quantize_fp8_blocks(x, 16)
    assert x8.dtype == fp8.FP8_DTYPE and x8.shape == (1, 2, 48, 16) and s.shape == (1, 2, 3)
    back = fp8.dequantize_fp8_blocks(x8, s, 40)
    # e4m3 keeps 3 mantissa bits: relative error at most 2^-4 for normal numbers, plus
    # half a subnormal step (2^-10 of the scale) for the tiny ones
    step = s.repeat_interleave(16, dim=-1)[..., :40, None] * 2 ** -10
    assert ((back - x).abs() <= x.abs() * 2 ** -4 + step).all()
    assert x8.float().abs().amax() == fp8.FP8_MAX
    with pytest.raises(ValueError, match="block must be a positive int"):
        fp8.quantize_fp8_blocks(x, 0)


def test_hadamard_is_orthogonal_and_spreads_outliers():
    h = fp8.hadamard_matrix(16, device_="cpu")
    torch.testing.assert_close(h @ h.T, torch.eye(16), atol=1e-6, rtol=0)
    x = torch.zeros(1, 16)
    x[0, 3] = 1.0
    assert float((x @ h).abs().max()) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="power of two"):
        fp8.hadamard_matrix(12)


def test_gluon_refuses_off_hopper_or_bad_sizes():
    q, k, v = _qkv(1, 2, 2, 100, 100, 96)
    with pytest.raises(ValueError, match="head dim"):
        gluon_fwd.attention_gluon(q, k, v, enable_gqa=True)
    q, k, v = _qkv(1, 2, 2, 100, 100, 64)
    with pytest.raises(ValueError, match="pass pipeline=True"):
        gluon_fwd.attention_gluon(q, k, v, pingpong=True, pipeline=False, enable_gqa=True)
    with pytest.raises(ValueError, match="loader_regs"):
        gluon_fwd.attention_gluon(q, k, v, loader_regs=20, enable_gqa=True)
    for consumers in (1, 4, True, 2.0):
        with pytest.raises(ValueError, match="consumers must be 2 or 3"):
            gluon_fwd.attention_gluon(q, k, v, pingpong=True, consumers=consumers,
                                      enable_gqa=True)
    with pytest.raises(ValueError, match="pass pingpong=True"):
        gluon_fwd.attention_gluon(q, k, v, consumers=3, enable_gqa=True)
    if not device.IS_HOPPER:
        with pytest.raises(RuntimeError, match="sm90"):
            gluon_fwd.attention_gluon(q, k, v, enable_gqa=True)


def test_bench_skips_off_hopper_and_ablation_maps_schedules(capsys):
    import json
    from pathlib import Path
    from course_utils.bench import hopper as bench
    if not device.IS_HOPPER:
        assert bench.main(["--n", "4096"]) == 0
        assert "needs a Hopper GPU" in capsys.readouterr().out
    rec = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "nvidia-h100-80gb-hbm3"
                      / "hopper.json").read_text())
    abl = bench.ablation(rec["rows"], rec["ablation_N"])
    sims = {r["provider"]: r["sim_tflops"] for r in abl}
    assert sims["gluon_pingpong"] > sims["gluon_ws_serial"] and sims["sdpa_cudnn"] is None
    assert all(r.get("tflops") for r in abl), "every committed provider has a measurement"


def test_table_suite_rows_are_consistent(capsys):
    import json
    from pathlib import Path
    from course_utils.bench import table
    if not device.HAS_GPU:
        assert table.main([]) == 0
        assert "needs a CUDA GPU" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        table.main(["--modes", "bwd"])
    rec = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "nvidia-h100-80gb-hbm3"
                      / "table.json").read_text())
    assert rec["environment"]["command"].startswith("python -m course_utils.bench table")
    for r in rec["rows"]:
        names = table.FWD if r["mode"] == "fwd" else table.FWD_BWD
        for name in names:
            # every provider has a speed, or says why it has none
            assert r.get(name) or r.get(f"{name}_skip") or r.get(f"{name}_error"), (r, name)
            for base in ("flash", "cudnn"):
                if name not in ("flash", "cudnn") and r.get(name) and r.get(base):
                    assert r[f"{name}_x_{base}"] == pytest.approx(r[name] / r[base])
        assert r["cudnn"] and r["flash"] and r["triton"]
