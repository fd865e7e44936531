"""Lesson 9 on a real GPU: is the split-KV kernel right at real sizes?

Run from the repository root with plain ``python3 benchmarks/check_decode_gpu.py``
on a machine with a CUDA GPU. It compiles the kernel, compares it with the float32
reference (and with SDPA where the two mean the same thing) over dtypes, GQA ratios,
new-token counts, ragged cache lengths, forced split counts and a paged cache, fills
unused cache slots with NaN to catch reads past a sequence's end, and exits non-zero
if any case fails. ``--breakdown`` adds per-kernel times from the profiler, the
CUDA-graph replay time and the autotuner's picks.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.attention import merge_states  # noqa: E402
from course_utils.decoding import decode_attention_reference  # noqa: E402
from course_utils.triton_decode import choose_num_splits, decode_attention  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-3}


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def case(b, hq, hkv, nq, lmax, d, dtype, ragged, num_splits=None, seed=0):
    g = torch.Generator(device=device.DEVICE).manual_seed(seed)
    q = torch.randn(b, hq, nq, d, device=device.DEVICE, dtype=dtype, generator=g)
    k = torch.randn(b, hkv, lmax, d, device=device.DEVICE, dtype=dtype, generator=g)
    v = torch.randn(b, hkv, lmax, d, device=device.DEVICE, dtype=dtype, generator=g)
    seqlens = None
    if ragged:
        seqlens = torch.randint(nq, lmax + 1, (b,), device=device.DEVICE, generator=g,
                                dtype=torch.int32)
        # poison the unused slots: a kernel that reads them produces NaN
        for i, n in enumerate(seqlens.tolist()):
            k[i, :, n:] = float("nan")
            v[i, :, n:] = float("nan")
    o, lse, parts = decode_attention(q, k, v, seqlens, num_splits=num_splits, return_lse=True,
                                     return_partials=True)
    ref, ref_lse = decode_attention_reference(q, k, v, seqlens, return_lse=True)
    err = rel_err(o, ref)
    lse_err = float((lse - ref_lse).abs().max())
    ok = (bool(torch.isfinite(o).all()) and err < TOL[dtype] and lse_err < 1e-2)
    # the partial states folded by lesson 3's merge give the same answer
    s = parts.m.shape[-1]
    total = None
    for c in range(s):
        st = type(parts)(m=parts.m[..., c], l=parts.l[..., c], acc=parts.acc[..., c, :])
        total = st if total is None else merge_states(total, st)
    merged = (total.acc / total.l[..., None])
    merge_err = rel_err(merged, o.float())
    ok = ok and merge_err < TOL[dtype]
    label = (f"B={b} Hq={hq} Hkv={hkv} Nq={nq} L={lmax} d={d} {str(dtype)[6:]} "
             f"ragged={ragged} splits={s}")
    print(f"{'ok ' if ok else 'BAD'} {label}: rel err {err:.1e}, lse err {lse_err:.1e}, "
          f"merge err {merge_err:.1e}")
    return ok


def paged_case(b=4, page=64, pages_per_seq=300, seed=7):
    """A paged cache (pages shuffled in one pool) against the gathered contiguous cache."""
    from course_utils.decoding import gather_paged_cache
    g = torch.Generator(device=device.DEVICE).manual_seed(seed)
    kp = torch.randn(b * pages_per_seq + 5, 8, page, 128, device=device.DEVICE,
                     dtype=torch.float16, generator=g)
    vp = torch.randn(kp.shape, device=device.DEVICE, dtype=torch.float16, generator=g)
    table = torch.randperm(kp.shape[0], device=device.DEVICE, generator=g)[:b * pages_per_seq]
    table = table.reshape(b, pages_per_seq).to(torch.int32)
    seqlens = torch.randint(1, page * pages_per_seq + 1, (b,), device=device.DEVICE,
                            generator=g, dtype=torch.int32)
    q = torch.randn(b, 32, 1, 128, device=device.DEVICE, dtype=torch.float16, generator=g)
    o = decode_attention(q, kp, vp, seqlens, block_table=table)
    ref = decode_attention_reference(q, gather_paged_cache(kp, table),
                                     gather_paged_cache(vp, table), seqlens)
    err = rel_err(o, ref)
    print(f"{'ok ' if err < 2e-3 else 'BAD'} paged cache (B={b}, page={page}, "
          f"{pages_per_seq} pages per sequence): rel err {err:.1e}")
    return err < 2e-3


def sdpa_agrees():
    """One new token sees the whole cache: SDPA without a mask is the same function."""
    import torch.nn.functional as F
    q = torch.randn(4, 32, 1, 128, device=device.DEVICE, dtype=torch.float16)
    k = torch.randn(4, 8, 20000, 128, device=device.DEVICE, dtype=torch.float16)
    v = torch.randn_like(k)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    err = rel_err(decode_attention(q, k, v), ref)
    print(f"{'ok ' if err < 2e-3 else 'BAD'} against SDPA (B=4, L=20000): rel err {err:.1e}")
    return err < 2e-3


def breakdown():
    """Where one decode step's GPU time goes: split kernel vs merge kernel, and the
    configuration the autotuner picked, for a few shapes of the benchmark."""
    from torch.profiler import ProfilerActivity, profile
    from course_utils import triton_decode
    for b, n in ((1, 4096), (8, 4096), (1, 32768), (1, 65536)):
        q = torch.randn(b, 32, 1, 128, device=device.DEVICE, dtype=torch.float16)
        k = torch.randn(b, 8, n, 128, device=device.DEVICE, dtype=torch.float16)
        v = torch.randn_like(k)
        for _ in range(3):
            decode_attention(q, k, v)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                decode_attention(q, k, v)
            torch.cuda.synchronize()
        times = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                times[e.name] = times.get(e.name, 0.0) + e.device_time / 10
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            decode_attention(q, k, v)
        t0, t1 = torch.cuda.Event(True), torch.cuda.Event(True)
        t0.record()
        for _ in range(50):
            g.replay()
        t1.record()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        for _ in range(50):
            decode_attention(q, k, v)
        torch.cuda.synchronize()
        host = (time.perf_counter() - t2) / 50 * 1e6
        print(f"B={b} L={n}: per-kernel us {{{', '.join(f'{k}: {v:.1f}' for k, v in times.items())}}}, "
              f"graph replay {t0.elapsed_time(t1) / 50 * 1e3:.1f} us, eager wall {host:.1f} us")
    sk = getattr(triton_decode._split_kv, "cache", {})
    for key, cfg in sk.items():
        print("autotuned", key[:5], "->", cfg)


def main():
    if not device.HAS_GPU:
        print("needs a CUDA GPU")
        return 2
    print(torch.cuda.get_device_name(), "| torch", torch.__version__)
    t = time.time()
    cases = [
        (1, 32, 8, 1, 32768, 128, torch.float16, False),
        (1, 32, 8, 1, 131072, 128, torch.float16, False),
        (8, 32, 8, 1, 4000, 128, torch.float16, True),
        (3, 32, 8, 4, 3000, 128, torch.bfloat16, True),
        (2, 16, 2, 3, 2049, 64, torch.float16, True),
        (2, 8, 8, 2, 777, 128, torch.float32, True),
        (2, 32, 1, 1, 5000, 128, torch.float16, False),
        (1, 64, 8, 4, 1000, 256, torch.float16, True),
        (5, 4, 4, 1, 1, 32, torch.float16, False),
    ]
    # every head dim and dtype the kernel declares in course_utils.contract
    from course_utils.contract import IMPLEMENTATIONS
    declared = IMPLEMENTATIONS["decode"]
    cases += [(2, 8, 2, 2, 1500, d, dt, True) for d in declared.head_dims for dt in declared.dtypes]
    ok = all([case(*c, seed=i) for i, c in enumerate(cases)])
    ok &= all([case(2, 32, 8, 2, 5000, 128, torch.float16, True, num_splits=s, seed=40 + s)
               for s in (1, 3, 17, 64)])
    ok &= paged_case()
    ok &= sdpa_agrees()
    if "--breakdown" in sys.argv:
        breakdown()
    print("heuristic:", {(b, n): choose_num_splits(b, 8, n) for b in (1, 8, 64)
                         for n in (1024, 32768, 131072)})
    print(f"{'all GPU checks passed' if ok else 'SOME GPU CHECKS FAILED'} in {time.time() - t:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
