"""Lesson 7's two backward designs: three launches (Delta, dK/dV, dQ) and the fused
dK/dV kernel that adds dQ with atomics (``bwd="atomic_dq"``).

On a CPU both run in Triton's interpreter at small sizes against float64 autograd of the
textbook attention; the ``gpu`` test compares them at a real size."""
import pytest
import torch
import triton

from course_utils import device
from course_utils import triton_attention as ta
from course_utils.attention import naive_attention
from course_utils.checks import check_close

DEV = device.DEVICE


def _inputs(B, Hq, Hkv, Nq, Nk, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEV, dtype)  # noqa: E731
    return mk(B, Hq, Nq, D), mk(B, Hkv, Nk, D), mk(B, Hkv, Nk, D), mk(B, Hq, Nq, D)


def _reference_grads(q, k, v, do, **opts):
    """float64 autograd through the textbook attention (rows with no key: zero)."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o = naive_attention(*leaves, enable_gqa=True, **opts)
    return torch.autograd.grad(o, leaves, do.double())


def _strided(q, k, v):
    """The same values in other layouts: q stored as (B, N, H, D), k and v as the even
    and odd rows of one tensor (a gap of one row between consecutive keys)."""
    q2 = q.transpose(1, 2).contiguous().transpose(1, 2)
    kv = torch.stack((k, v), 3).flatten(2, 3)                   # rows k0, v0, k1, v1, ...
    k2, v2 = kv[:, :, 0::2], kv[:, :, 1::2]
    assert not q2.is_contiguous() and not k2.is_contiguous() and torch.equal(k2, k)
    return q2, k2, v2


CASES = {
    # name: (Hq, Hkv, Nq, Nk, D, dtype, options)
    "lower_right_nq>nk_gqa": (4, 2, 45, 20, 16, torch.float16,
                              dict(is_causal=True, alignment="causal_lower_right")),
    "lower_right_nq<nk_mqa_d24": (4, 1, 20, 45, 24, torch.bfloat16,
                                  dict(is_causal=True, alignment="causal_lower_right")),
    "upper_left_nq>nk": (2, 2, 45, 20, 32, torch.float16,
                         dict(is_causal=True, alignment="causal_upper_left")),
    "upper_left_nq<nk_gqa_scale": (4, 2, 20, 45, 16, torch.bfloat16,
                                   dict(is_causal=True, scale=0.3)),
    "non_causal_float32": (2, 1, 33, 70, 32, torch.float32, dict()),
    "strided_causal": (4, 2, 37, 37, 16, torch.float16, dict(is_causal=True, strided=True)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_atomic_dq_matches_float64_and_the_three_kernels(case):
    Hq, Hkv, Nq, Nk, D, dtype, opts = CASES[case]
    opts = dict(opts)
    q, k, v, do = _inputs(1, Hq, Hkv, Nq, Nk, D, dtype, seed=Nq * 7 + Nk + D)
    if opts.pop("strided", False):
        q, k, v = _strided(q, k, v)
    leaves = [t.clone().requires_grad_() if t.is_contiguous() else t.requires_grad_()
              for t in (q, k, v)]
    o, lse = ta.triton_attention(*leaves, enable_gqa=True, return_lse=True, bwd="atomic_dq",
                                 **opts)
    atomic = torch.autograd.grad(o, leaves, do)                 # through TritonAttention
    three = ta.triton_attention_backward(q, k, v, o.detach(), lse, do, enable_gqa=True,
                                         bwd="three_kernels", **opts)
    ref = _reference_grads(q, k, v, do, **opts)
    for name, x, y, r in zip(("dq", "dk", "dv"), atomic, three, ref):
        assert x.dtype == dtype and x.shape == r.shape, name
        check_close(x, r, dtype=dtype, op="backward", name=f"atomic {name} {case}", quiet=True)
        check_close(x, y, dtype=dtype, op="backward", name=f"atomic vs three {name} {case}",
                    quiet=True)
    # the fused kernel is the dK/dV kernel with one more product: in the interpreter (one
    # program at a time, the same tile shape) its dK and dV are the same bits
    same_tiles = [c.kwargs for c in ta.bwd_configs("dkdv")] == \
        [c.kwargs for c in ta.bwd_configs("atomic_dq")]
    if device.INTERPRET and same_tiles:
        assert torch.equal(atomic[1], three[1]) and torch.equal(atomic[2], three[2])
    if opts.get("alignment") == "causal_lower_right" and Nq > Nk:
        # the first Nq - Nk rows see no key: their dQ is exactly zero, as in the dQ kernel
        assert (atomic[0][:, :, :Nq - Nk] == 0).all() and (three[0][:, :, :Nq - Nk] == 0).all()


def test_strided_inputs_give_the_contiguous_gradients():
    q, k, v, do = _inputs(1, 2, 1, 21, 30, 16, torch.float16, seed=3)
    opts = dict(is_causal=True, enable_gqa=True, alignment="causal_lower_right")
    o, lse = ta.triton_attention_forward(q, k, v, **opts)
    flat = ta.triton_attention_backward(q, k, v, o, lse, do, bwd="atomic_dq", **opts)
    assert [x.dtype for x in flat] == [torch.float16] * 3      # dQ leaves float32 behind
    qs, ks, vs = _strided(q, k, v)
    strided = ta.triton_attention_backward(qs, ks, vs, o, lse, do, bwd="atomic_dq", **opts)
    for x, y in zip(strided, flat):
        torch.testing.assert_close(x, y, atol=0, rtol=0)        # one program at a time on CPU


def _fake_bench(fn, quantiles=None, **_):
    for _ in range(3):                                          # like do_bench: repeated runs
        fn()
    return [1.0, 1.0, 1.0]


def test_autotuning_runs_do_not_add_into_dq(monkeypatch):
    """The autotuner runs each config several times on the real buffers; dQ must come
    out as one run's, not the sum of every trial (each config zeroes DQ first)."""
    configs = ta.bwd_configs("atomic_dq")
    tuner = triton.autotune(configs=configs * 2, key=ta._KEY, do_bench=_fake_bench)(
        ta._attn_bwd_dkdv_kernel)
    q, k, v, do = _inputs(1, 2, 2, 24, 40, 16, torch.float16, seed=4)
    o, lse = ta.triton_attention_forward(q, k, v, is_causal=True)
    want = ta.triton_attention_backward(q, k, v, o, lse, do, is_causal=True, bwd="atomic_dq")
    monkeypatch.setattr(ta, "_attn_bwd_atomic", tuner)
    got = ta.triton_attention_backward(q, k, v, o, lse, do, is_causal=True, bwd="atomic_dq")
    assert tuner.cache, "the tuner benchmarked its configs"
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_bad_bwd_is_rejected_before_any_work(monkeypatch):
    q, k, v, do = _inputs(1, 2, 2, 8, 8, 16, torch.float16, seed=5)
    o, lse = ta.triton_attention_forward(q, k, v)

    def no_work(*args, **kwargs):
        raise AssertionError("inputs were validated (work started) before bwd was checked")
    monkeypatch.setattr(ta, "_validate", no_work)
    for bad, exc in (("fused", ValueError), ("Atomic_DQ", ValueError), (None, TypeError),
                     (1, TypeError)):
        with pytest.raises(exc, match="'three_kernels', 'atomic_dq'"):
            ta.triton_attention(q, k, v, bwd=bad)
        with pytest.raises(exc, match="'three_kernels', 'atomic_dq'"):
            ta.triton_attention_backward(q, k, v, o, lse, do, bwd=bad)
    with pytest.raises(TypeError):
        ta.triton_attention_backward(q, k, v, o, lse, do, False, None, False, None,
                                     "atomic_dq")            # options are keyword-only


# --------------------------------------------------------------------------- benchmark
def test_benchmark_default_table_is_unchanged():
    from course_utils.bench import attention as bench
    args = bench.parse([])
    assert args.bwd == ["three_kernels"]
    assert bench.providers("fwd+bwd", args) == ["triton", "flash", "cudnn"]
    assert bench.columns(args) == ["mode", "causal", "d", "n", "dtype", "triton", "flash",
                                   "cudnn", "x_flash", "x_cudnn", "err_vs_flash"]
    both = bench.parse(["--bwd", "three_kernels,atomic_dq"])
    assert bench.providers("fwd", both) == ["triton", "flash", "cudnn"]
    assert bench.providers("fwd+bwd", both) == ["triton", "triton_atomic_dq", "flash", "cudnn"]
    for bad in ("fused", "", "three_kernels,atomic"):
        with pytest.raises(SystemExit):
            bench.parse(["--bwd", bad])


def test_benchmark_rows_ratios_and_json(monkeypatch, tmp_path):
    """One fwd+bwd point with both designs, timed by a fake clock (4, 2, 8 ms for the
    three kernels, the atomic design and flash), saved and plotted."""
    import json
    from course_utils.bench import attention as bench, common
    clock = iter([4.0, 2.0, 8.0, 16.0])
    settled = []

    def fake_time_ms(fn, warmup=10, rep=50, settle_ms=0):
        settled.append(settle_ms)
        return next(clock)
    monkeypatch.setattr(common, "time_ms", fake_time_ms)
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    args = bench.parse(["--batch", "1", "--heads", "2", "--bwd", "three_kernels,atomic_dq",
                        "--name", "designs"])
    row = bench.measure("fwd+bwd", True, 16, 40, "fp16", args)
    flops = common.attention_flops(1, 2, 40, 40, 16, True, "fwd+bwd")
    assert row["triton_ms"] == 4.0 and row["triton_atomic_dq_ms"] == 2.0
    assert row["triton_atomic_dq"] == pytest.approx(flops / 2.0 * 1e-9)
    assert row["atomic_dq_x_three"] == pytest.approx(2.0)       # twice as fast
    # every provider was settled for the suite's default second before it was timed
    assert settled and set(settled) == {1000.0} and row["settle_ms"] == 1000.0
    assert row["err_vs_flash"] < 2e-2 and row["atomic_dq_err_vs_flash"] < 2e-2
    if row.get("flash"):                                         # SDPA flash runs on this CPU
        assert row["x_flash"] == pytest.approx(2.0) and row["atomic_dq_x_flash"] == 4.0
    if row.get("cudnn") is None:
        assert row["cudnn_error"]                                # says why, no speed
    path = bench._save(args, [row], [], bench.columns(args))
    rec = json.loads(path.read_text())
    assert path.parent.parent == tmp_path and path.name == "designs.json"
    assert rec["bwd_designs"] == ["three_kernels", "atomic_dq"]
    assert "atomic_dq_x_three" in rec["columns"] and rec["rows"] == [row]
    assert rec["environment"]["command"].startswith("python -m course_utils.bench")
    assert all(png.exists() for png in bench.plot(path))


# --------------------------------------------------------------------------- GPU
def _gpu_check():
    from tests.bench_scripts import load
    return load("gpu_check_attention")


@pytest.mark.gpu
@pytest.mark.skipif(not device.HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", range(len(_gpu_check().QUICK)))
def test_atomic_dq_at_real_sizes(case):
    """The GPU check's cases with N >= 1000 (every dtype, both alignments, GQA/MQA,
    strided, head dim 256) through the fused backward."""
    mod = _gpu_check()
    torch.manual_seed(case)
    ok, errs = mod.run_case(mod.QUICK[case], bwd="atomic_dq")
    assert ok, errs


@pytest.mark.gpu
@pytest.mark.skipif(not device.HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype, D, Hkv, Nq, Nk, opts", [
    (torch.float16, 128, 8, 2085, 2085, dict(is_causal=True)),
    (torch.bfloat16, 64, 2, 1500, 2085, dict()),
    (torch.float16, 64, 2, 2085, 1000, dict(is_causal=True, alignment="causal_lower_right")),
    (torch.bfloat16, 128, 8, 4096, 4096, dict(is_causal=False)),
])
def test_both_designs_agree_at_real_sizes(dtype, D, Hkv, Nq, Nk, opts):
    q, k, v, do = _inputs(2, 8, Hkv, Nq, Nk, D, dtype, seed=D + Nq)
    o, lse = ta.triton_attention_forward(q, k, v, enable_gqa=True, **opts)
    three = ta.triton_attention_backward(q, k, v, o, lse, do, enable_gqa=True, **opts)
    atomic = ta.triton_attention_backward(q, k, v, o, lse, do, enable_gqa=True,
                                          bwd="atomic_dq", **opts)
    again = ta.triton_attention_backward(q, k, v, o, lse, do, enable_gqa=True,
                                         bwd="atomic_dq", **opts)
    ref = _reference_grads(q, k, v, do, **opts)
    limit = _gpu_check().TOL[dtype]
    for name, x, y, r in zip(("dq", "dk", "dv"), atomic, three, ref):
        assert x.dtype == dtype and torch.isfinite(x).all(), name
        err_atomic = float((x.double() - r).norm() / r.norm())
        err_three = float((y.double() - r).norm() / r.norm())
        assert err_atomic < limit and err_three < limit, (name, err_atomic, err_three)
        # neither design is much less accurate than the other
        assert err_atomic < 1.5 * err_three + 1e-4, (name, err_atomic, err_three)
    # dK and dV have no atomics: bitwise the same run to run; dQ only close
    assert torch.equal(atomic[1], again[1]) and torch.equal(atomic[2], again[2])
    assert float((atomic[0] - again[0]).float().norm() / atomic[0].float().norm()) < 1e-3
