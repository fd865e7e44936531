"""Lesson 8 kernels: the cases each Hopper kernel's record declares (the ones
``benchmarks/check_hopper_gpu.py`` runs at real sizes), in Triton's interpreter at tiny
sizes on a CPU and at real sizes on an sm90 GPU, where the Gluon kernel runs too."""
import itertools

import pytest
import torch

from course_utils import device
from course_utils.attention import naive_attention
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
    for flag in ("pipeline", "pingpong"):
        for bad in (1, None, "yes"):
            with pytest.raises(TypeError, match=f"{flag} must be True or False"):
                gluon_fwd.attention_gluon(q, k, v, enable_gqa=True, **{flag: bad})
    with pytest.raises(ValueError, match="loader_regs"):
        gluon_fwd.attention_gluon(q, k, v, loader_regs=20, enable_gqa=True)
    for consumers in (1, 4, True, 2.0):
        with pytest.raises(ValueError, match="consumers must be 2 or 3"):
            gluon_fwd.attention_gluon(q, k, v, pingpong=True, consumers=consumers,
                                      enable_gqa=True)
    with pytest.raises(ValueError, match="pass pingpong=True"):
        gluon_fwd.attention_gluon(q, k, v, consumers=3, enable_gqa=True)
    for persistent in (0, -2, 2.0, "yes", None):
        with pytest.raises(TypeError, match="persistent must be True, False or a number"):
            gluon_fwd.attention_gluon(q, k, v, persistent=persistent, enable_gqa=True)
    for block_n in (32, 96, 512, True, 128.0):
        with pytest.raises(ValueError, match="block_n must be one of"):
            gluon_fwd.attention_gluon(q, k, v, block_n=block_n, enable_gqa=True)
    # 256 keys a block fit at head dim 64 with 3 stages, not with 4, nor at head dim 128
    with pytest.raises(ValueError, match="needs 272 KiB of shared memory"):
        gluon_fwd.attention_gluon(q, k, v, block_n=256, stages=4, enable_gqa=True)
    q2, k2, v2 = _qkv(1, 2, 2, 100, 100, 128)
    with pytest.raises(ValueError, match="needs 288 KiB"):
        gluon_fwd.attention_gluon(q2, k2, v2, block_n=256, enable_gqa=True)
    if not device.IS_HOPPER:
        with pytest.raises(RuntimeError, match="sm90"):
            gluon_fwd.attention_gluon(q, k, v, enable_gqa=True)


def _blocks_seen(m, nk, causal, diag, bm=128, bn=128):
    # key blocks query tile m must load, counted key by key: those holding a key its
    # last row (m * bm + bm - 1, past Nq or not) may see
    last_key = nk - 1 if not causal else min(nk - 1, m * bm + bm - 1 + diag)
    return 0 if last_key < 0 else last_key // bn + 1


@pytest.mark.parametrize("nq,nk,causal,diag,heads,programs", [
    (4096, 4096, False, 0, 128, 132), (4096, 4096, True, 0, 128, 132),
    (16384, 16384, True, 0, 8, 132), (300, 129, True, 129 - 300, 6, 4),
    (384, 128, True, -256, 8, 3), (129, 300, True, 300 - 129, 5, 7), (1, 77, False, 0, 3, 132)])
def test_persistent_schedule_runs_every_tile_once_longest_first_and_balanced(
        nq, nk, causal, diag, heads, programs):
    blocks = tuple(gluon_fwd.tile_blocks(nq, nk, 128, 128, causal, diag))
    n_m = -(-nq // 128)
    assert blocks == tuple(_blocks_seen(m, nk, causal, diag) for m in range(n_m))
    sched = gluon_fwd.persistent_schedule(heads, blocks, programs)
    offsets, tiles = sched[:programs + 1], sched[programs + 1:]
    assert offsets[0] == programs + 1 and offsets[-1] == len(sched)
    assert all(a <= b for a, b in zip(offsets, offsets[1:]))
    assert sorted(tiles) == list(range(heads * n_m))          # every tile, once
    loads = []
    for p in range(programs):
        run = sched[offsets[p]:offsets[p + 1]]
        # head by head; within a head, the longest tiles first
        assert all(a // n_m <= b // n_m for a, b in zip(run, run[1:])), (p, run)
        assert all(blocks[a % n_m] >= blocks[b % n_m] for a, b in zip(run, run[1:])
                   if a // n_m == b // n_m), (p, run)
        loads.append(sum(blocks[t % n_m] + gluon_fwd.TILE_COST for t in run))
    # each tile went to the program free first, so no program ends more than one tile's
    # cost after the one that ends first
    assert max(loads) - min(loads) <= max(blocks) + gluon_fwd.TILE_COST
    if heads * n_m >= programs:
        assert min(len(sched[offsets[p]:offsets[p + 1]]) for p in range(programs)) >= 1
    with pytest.raises(ValueError, match="programs >= 1"):
        gluon_fwd.persistent_schedule(heads, blocks, 0)


def test_fastest_gluon_options_are_valid_schedules_that_fit():
    # every head dim the kernel takes has an entry, each a schedule _schedule accepts whose
    # query tile and K/V ring fit an sm90 block; off Hopper the call gets as far as the
    # hardware check (so no option is refused before it)
    assert set(gluon_fwd.FASTEST) == {64, 128} and set(gluon_fwd.FASTEST_CAUSAL) <= {64, 128}
    assert gluon_fwd.fastest(128, True) == gluon_fwd.FASTEST_CAUSAL[128] != gluon_fwd.FASTEST[128]
    assert gluon_fwd.fastest(128, False) == gluon_fwd.FASTEST[128]
    assert gluon_fwd.fastest(64, True) == gluon_fwd.FASTEST[64] and gluon_fwd.fastest(96) == {}
    for d, opts in list(gluon_fwd.FASTEST.items()) + list(gluon_fwd.FASTEST_CAUSAL.items()):
        tiles, block_m, regs = gluon_fwd._schedule(
            opts.get("stages", 2), opts.get("pipeline", True), 24, opts.get("pingpong", False),
            opts.get("consumers", 2), None)
        assert tiles * 64 == block_m and regs * 128 * tiles + 24 * 32 <= 65536
        shared = (block_m + 2 * opts.get("stages", 2) * gluon_fwd.BLOCK_N) * d * 2
        assert shared <= gluon_fwd.SM90_SHARED_BYTES, (d, opts)
        if not device.IS_HOPPER:
            q, k, v = _qkv(1, 2, 2, 100, 100, d)
            with pytest.raises(RuntimeError, match="sm90"):
                gluon_fwd.attention_gluon(q, k, v, enable_gqa=True, **opts)


def test_bench_runs_merge_to_medians_and_keep_every_error():
    from course_utils.bench import hopper as bench

    def row(provider, tflops=None, error=None, n=4096, dtype="float16"):
        r = {"provider": provider, "N": n, "dtype": dtype, "B": 4, "H": 16, "D": 128}
        if error:
            r["error"] = error
        else:
            r.update(tflops=tflops, ms=1000.0 / tflops, rel_err=tflops * 1e-6, x_cudnn=9.0)
        return r

    runs = [[row("sdpa_cudnn", 600), row("gluon_pingpong", 580), row("fp8_hadamard", 700),
             row("sdpa_cudnn", 500, dtype="bfloat16")],
            [row("sdpa_cudnn", 640), row("gluon_pingpong", 520), row("fp8_hadamard", error="E: x"),
             row("sdpa_cudnn", 510, dtype="bfloat16")],
            [row("sdpa_cudnn", 620), row("gluon_pingpong", 610), row("fp8_hadamard", 720)]]
    out = {(r["provider"], r["dtype"]): r for r in bench.merge_runs(runs)}
    cud, pp = out["sdpa_cudnn", "float16"], out["gluon_pingpong", "float16"]
    assert cud["tflops_runs"] == [600, 640, 620] and cud["tflops"] == 620 and cud["runs"] == 3
    assert pp["tflops"] == 580 and pp["x_cudnn"] == pytest.approx(580 / 620)
    assert pp["ms"] == pytest.approx(1000.0 / 580) and pp["rel_err"] == pytest.approx(610e-6)
    # an error in any run is kept and no speed is reported, nor a ratio
    f8 = out["fp8_hadamard", "float16"]
    assert f8["error"] == "E: x" and "tflops" not in f8 and "x_cudnn" not in f8
    # a row missing from a run is not given the median of the others
    bf = out["sdpa_cudnn", "bfloat16"]
    assert bf["error"] == "measured in 2 of 3 runs" and "tflops" not in bf
    with pytest.raises(SystemExit):
        bench.main(["--runs", "0"])


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


# --------------------------------------------------------------- FP8 in the Gluon kernel
def _prep(d=64, nq=100, nk=70, hq=2, hkv=1, **kw):
    q, k, v = _qkv(1, hq, hkv, nq, nk, d)
    return fp8.prepare_fp8(q, k, v, **kw)


def test_fp8_gluon_path_refuses_bad_arguments_before_launch():
    # checked on any machine: sizes and options first, the GPU last
    with pytest.raises(ValueError, match="kernel must be"):
        _prep(kernel="cuda")
    for bad in (dict(d=32), dict(block_m=32), dict(block_m=256), dict(block_n=32)):
        with pytest.raises(ValueError, match="Gluon FP8 kernel takes"):
            _prep(**{"block_m": 128, "block_n": 128, "kernel": "gluon", **bad})
    plain = _prep(block_m=128, block_n=128, kernel="triton")
    prep = _prep(block_m=128, block_n=128, kernel="gluon")
    with pytest.raises(ValueError, match="quantised for the 'triton' kernel"):
        fp8.attention_fp8_prepared(plain, kernel="gluon")
    with pytest.raises(ValueError, match="quantised for the 'triton' kernel"):
        gluon_fwd.attention_gluon_fp8(plain)
    with pytest.raises(ValueError, match="kernel must be"):
        fp8.attention_fp8_prepared(prep, kernel="gluon8")
    with pytest.raises(ValueError, match="num_warps is the Triton kernel's"):
        fp8.attention_fp8_prepared(prep, num_warps=8)
    q, k, v = _qkv(1, 2, 2, 40, 40, 64)
    with pytest.raises(ValueError, match="kernel must be"):
        fp8.attention_fp8(q, k, v, kernel="fast")
    # what prepare_fp8 returns, and nothing else
    with pytest.raises(TypeError, match="the dict prepare_fp8 returns"):
        gluon_fwd.attention_gluon_fp8({k: v for k, v in prep.items() if k != "vs"})
    with pytest.raises(TypeError, match="prep\\['k8'\\] must be a 4-D"):
        gluon_fwd.attention_gluon_fp8({**prep, "k8": prep["k8"].half()})
    with pytest.raises(ValueError, match="prep\\['ks'\\] has shape"):
        gluon_fwd.attention_gluon_fp8({**prep, "ks": prep["ks"][..., :0].contiguous()})
    with pytest.raises(ValueError, match="do not match its padded rows"):
        gluon_fwd.attention_gluon_fp8({**prep, "Nq": 300})
    with pytest.raises(ValueError, match="stages must be"):
        gluon_fwd.attention_gluon_fp8(prep, stages=0)
    with pytest.raises(TypeError, match="pingpong must be"):
        gluon_fwd.attention_gluon_fp8(prep, pingpong="yes")
    # Q scales per 64 rows: one per ping-pong consumer; one consumer of 128 rows cannot
    prep64 = _prep(block_m=64, block_n=128, kernel="gluon")
    with pytest.raises(ValueError, match="consumers of 128 rows"):
        gluon_fwd.attention_gluon_fp8(prep64, pingpong=False)
    with pytest.raises(ValueError, match="consumers must be 2 or 3"):
        gluon_fwd.attention_gluon_fp8(prep64, consumers=4)
    with pytest.raises(TypeError, match="out_dtype"):
        gluon_fwd.attention_gluon_fp8(prep, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="is_causal"):
        gluon_fwd.attention_gluon_fp8(prep, is_causal=1)
    # the kernel folds the scale into the row max: positive scales only, as the contract
    for bad in (-0.2, 0.0, float("nan")):
        with pytest.raises(ValueError, match="scale must be a positive"):
            fp8.attention_fp8_prepared(prep, scale=bad)
    if not device.IS_HOPPER:
        with pytest.raises(RuntimeError, match="sm90"):
            gluon_fwd.attention_gluon_fp8(prep)
        # off Hopper the default is the Triton kernel, in the plain key order
        assert fp8.prepare_fp8(q, k, v)["kernel"] == "triton"


def test_v_key_order_is_the_operand_order_of_p():
    order = fp8.v_key_order(64)
    assert sorted(order.tolist()) == list(range(64))
    # the register of thread t (its place in a quad) that holds key 16 b1 + 8 b0 + 2 t + e
    # in S's accumulator is the operand's column 16 b1 + 4 t + 2 b0 + e
    for b1, b0, t, e in itertools.product(range(2), range(2), range(4), range(2)):
        assert order[32 + 16 * b1 + 4 * t + 2 * b0 + e] == 32 + 16 * b1 + 8 * b0 + 2 * t + e
    with pytest.raises(ValueError, match="multiple of 32"):
        fp8.v_key_order(48)
    # prepare_fp8 stores V^T in that order; P with its columns renumbered the same way
    # gives the same P V (exactly: e4m3 values times small integers, summed in float64)
    prep = _prep(nk=200, block_m=128, block_n=64, kernel="gluon")
    plain = _prep(nk=200, block_m=128, block_n=64, kernel="triton")
    order = fp8.v_key_order(256)
    assert torch.equal(prep["vt8"].float(), plain["vt8"].float()[..., order])
    p = torch.randint(0, 4, (5, 256)).double().to(prep["vt8"].device)
    order = order.to(p.device)
    assert torch.equal(p[:, order] @ prep["vt8"][0, 0].double().T,
                       p @ plain["vt8"][0, 0].double().T)


def _poison(*like):
    # NaN in the caching allocator's next blocks of these sizes: an output the kernel
    # leaves unwritten stays NaN; returns the addresses, to show the outputs landed there
    blocks = [torch.full(shape, float("nan"), dtype=dt, device=DEV) for shape, dt in like]
    ptrs = [b.data_ptr() for b in blocks]
    del blocks
    return ptrs


def _random_fp8_sizes(seed, n=6):
    """(B, Hq, Hkv, Nq, Nk, D, causal): lengths from 1 to 1100 (mostly off a multiple of
    the 128-row tile), GQA groups 1, 2, 4, both head dims, causal on and off."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        hkv, group = (int(x) for x in (torch.randint(1, 3, (1,), generator=g),
                                       2 ** torch.randint(0, 3, (1,), generator=g)))
        nq, nk = (int(x) for x in torch.randint(1, 1100, (2,), generator=g))
        out.append((1 + i % 2, hkv * group, hkv, nq, nk, (64, 128)[i % 2], i % 3 != 0))
    return out


@pytest.mark.hopper
@pytest.mark.parametrize("opts", [dict(), dict(stages=3), dict(pingpong=False),
                                  dict(block_n=64), dict(block_n=256), dict(block_m=64),
                                  dict(consumers=3, pipeline=False),
                                  dict(block_m=64, consumers=3, pipeline=False, stages=3),
                                  dict(block_m=64, pipeline=False),
                                  dict(consumers=3, pipeline=False, stages=3, persistent=True),
                                  dict(block_m=64, persistent=4, stages=1)],
                         ids=["pingpong", "3-stages", "one-consumer", "block-n-64",
                              "block-n-256", "q-scale-per-consumer", "three-interleaved",
                              "three-interleaved-q-scale-per-consumer",
                              "two-interleaved-q-scale-per-consumer",
                              "three-interleaved-persistent", "pingpong-persistent-1-stage"])
def test_fp8_gluon_matches_the_reference_on_random_sizes(opts):
    tol, lse_tol = CHECK.FP8_TOL
    opts = dict(opts)
    block_n = opts.pop("block_n", 128)
    block_m = opts.pop("block_m", 128)
    sizes = _random_fp8_sizes(seed=block_n + block_m + len(opts))
    assert any(s[3] % 128 for s in sizes) and any(s[1] != s[2] for s in sizes)
    for i, (b, hq, hkv, nq, nk, d, causal) in enumerate(sizes):
        q, k, v = _qkv(b, hq, hkv, nq, nk, d, seed=i)
        prep = fp8.prepare_fp8(q, k, v, hadamard=bool(i % 2), block_m=block_m,
                               block_n=block_n, kernel="gluon")
        ptrs = _poison(((b, hq, nq, d), q.dtype), ((b, hq, nq), torch.float32))
        o, lse = gluon_fwd.attention_gluon_fp8(prep, is_causal=causal, return_lse=True, **opts)
        ref, ref_lse = naive_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                       enable_gqa=True, return_lse=True)
        where = f"{opts} block_m={block_m} block_n={block_n} B={b} Hq={hq} Hkv={hkv} Nq={nq} Nk={nk} D={d} " \
                f"causal={causal}"
        assert [o.data_ptr(), lse.data_ptr()] == ptrs, "the poisoned blocks were not reused"
        assert torch.isfinite(o).all() and torch.isfinite(lse).all(), where
        assert CHECK.rel_err(o.float(), ref) < tol, where
        assert float((lse - ref_lse).abs().max()) < lse_tol, where


@pytest.mark.hopper
def test_fp8_default_is_the_gluon_kernel_on_hopper_and_agrees_with_triton():
    q, k, v = _qkv(2, 4, 2, 1000, 1000, 128, seed=3)
    prep = fp8.prepare_fp8(q, k, v)
    assert prep["kernel"] == "gluon"
    for causal in (False, True):
        o = fp8.attention_fp8_prepared(prep, is_causal=causal, out_dtype=q.dtype)
        ref = fp8.attention_fp8(q, k, v, is_causal=causal, enable_gqa=True, kernel="triton")
        assert CHECK.rel_err(o.float(), ref.float()) < 2e-2, causal



@pytest.mark.hopper
@pytest.mark.parametrize("opts", [dict(block_m=64), dict(block_m=64, consumers=3, pipeline=False),
                                  dict(block_m=128, consumers=3, pipeline=False),
                                  dict(block_m=64, consumers=3, pipeline=False, persistent=3)],
                         ids=["pingpong-64", "three-interleaved-64", "three-interleaved-128",
                              "three-interleaved-64-persistent"])
def test_fp8_gluon_each_consumer_takes_its_own_rows_q_scale(opts):
    """Query rows whose size changes every 64 rows (x1, x3, x1/2, x2): neighbouring Q scale
    blocks of 64 rows differ by 1.5x to 6x, so a consumer multiplying by another block's
    scale is far off; checked against the float32 reference and, tighter, against the
    Triton FP8 kernel on the same blocks."""
    tol, lse_tol = CHECK.FP8_TOL
    opts = dict(opts)
    block_m = opts.pop("block_m")
    for nq, causal in ((700, True), (1000, False), (130, True)):
        q, k, v = _qkv(2, 4, 2, nq, 900, 128, seed=nq)
        size = torch.tensor([1.0, 3.0, 0.5, 2.0], device=DEV)[(torch.arange(nq, device=DEV)
                                                               // 64) % 4]
        q = (q.float() * size[:, None]).to(q.dtype)
        prep = fp8.prepare_fp8(q, k, v, block_m=block_m, block_n=128, kernel="gluon")
        if block_m == 64 and nq >= 256:
            ratio = prep["qs"][..., 1:4] / prep["qs"][..., 0:3]
            assert bool(((ratio / torch.tensor([3.0, 1 / 6, 4.0], device=DEV) - 1).abs()
                         < 0.3).all())
        o, lse = gluon_fwd.attention_gluon_fp8(prep, is_causal=causal, return_lse=True, **opts)
        ref, ref_lse = naive_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                       enable_gqa=True, return_lse=True)
        plain = fp8.prepare_fp8(q, k, v, block_m=block_m, block_n=128, kernel="triton")
        o_t = fp8.attention_fp8_prepared(plain, is_causal=causal)
        where = f"{opts} block_m={block_m} Nq={nq} causal={causal}"
        assert CHECK.rel_err(o.float(), ref) < tol, where
        assert float((lse - ref_lse).abs().max()) < lse_tol * 3, where
        assert CHECK.rel_err(o.float(), o_t.float()) < 2e-2, where
