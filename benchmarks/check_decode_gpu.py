"""Lesson 9 on a real GPU: is the split-KV kernel right at real sizes?

Run from the repository root with plain ``python3 benchmarks/check_decode_gpu.py``
on a machine with a CUDA GPU. It compiles the kernel and compares it with the float32
reference (and with SDPA where the two mean the same thing) on the cases the decode
kernels' records in ``course_utils.contract`` declare (dtypes, head dims, causal or
not, GQA, strided caches), crossed pairwise with the sizes below (new-token counts,
cache lengths, GQA ratios, ragged cache lengths), then forced split counts and a paged
cache. Unused cache slots are filled with NaN to catch reads past a sequence's end; it
exits non-zero if any case fails. ``--breakdown`` adds per-kernel times from the
profiler, the CUDA-graph replay time and the autotuner's picks; ``--list`` prints the
cases without running them (no GPU needed).
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.attention import merge_states  # noqa: E402
from course_utils.contract import (CAUSAL_LOWER_RIGHT, cases, implementation,  # noqa: E402
                                   implementations)
from course_utils.decoding import decode_attention_reference  # noqa: E402
from course_utils.triton_decode import choose_num_splits, decode_attention  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-3}
# the compiled decode kernels: records of kind "decode" that run on a GPU
KERNELS = implementations(kind="decode", devices=("triton", "hopper"))
# (B, Hq, Hkv, Nq new tokens, cache length L): long caches, GQA 4/8, MQA, Hq == Hkv, an
# empty-ish cache of one key
SIZES = [(1, 32, 8, 1, 32768), (1, 32, 8, 1, 131072), (8, 32, 8, 1, 4000),
         (3, 32, 8, 4, 3000), (2, 16, 2, 3, 2049), (2, 8, 8, 2, 777), (2, 32, 1, 1, 5000),
         (1, 64, 8, 4, 1000), (5, 4, 4, 1, 1), (2, 8, 2, 2, 1500)]
# sizes whose sequences get random lengths <= L (cache_seqlens), with the rest poisoned
RAGGED = {(8, 32, 8, 1, 4000), (3, 32, 8, 4, 3000), (2, 16, 2, 3, 2049), (2, 8, 8, 2, 777),
          (1, 64, 8, 4, 1000), (2, 8, 2, 2, 1500)}


def plan(sizes=SIZES, kernels=None, interpreter=False):
    """``(case, ragged)`` pairs: each decode kernel's declared cases (for a GPU;
    ``interpreter=None``: for this machine) at ``sizes``."""
    return [(c, c.size in RAGGED) for rec in (KERNELS if kernels is None else kernels)
            for c in cases(rec, sizes, interpreter=interpreter)]


def split_case(rec):
    """The case the forced split counts run on: float16, D = 128, causal, GQA 4."""
    return cases(rec, [(2, 32, 8, 2, 5000)], dtypes=[torch.float16], head_dims=[128],
                 settings=[CAUSAL_LOWER_RIGHT], layouts=["bhnd"], interpreter=False)[0]


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def case(c, ragged, num_splits=None, seed=0):
    """Run one :class:`~course_utils.contract.Case` (``Nk`` is the cache length L)."""
    fn = implementation(c.impl).load()
    g = torch.Generator(device=device.DEVICE).manual_seed(seed)
    q, k, v = c.inputs(seed=seed, device=device.DEVICE)
    nq, lmax, dtype = c.Nq, c.Nk, c.dtype
    seqlens = None
    if ragged:
        seqlens = torch.randint(nq, lmax + 1, (c.B,), device=device.DEVICE, generator=g,
                                dtype=torch.int32)
        # poison the unused slots: a kernel that reads them produces NaN
        for i, n in enumerate(seqlens.tolist()):
            k[i, :, n:] = float("nan")
            v[i, :, n:] = float("nan")
    o, lse, parts = fn(q, k, v, seqlens, num_splits=num_splits, return_lse=True,
                       return_partials=True, **c.options())
    ref, ref_lse = decode_attention_reference(q, k, v, seqlens, return_lse=True, **c.options())
    err = rel_err(o, ref)
    lse_err = float((lse - ref_lse).abs().max())
    ok = (bool(torch.isfinite(o).all()) and err < TOL[dtype] and lse_err < 1e-2)
    # the partial states folded by lesson 3's merge give the same answer
    s = parts.m.shape[-1]
    total = None
    for j in range(s):
        st = type(parts)(m=parts.m[..., j], l=parts.l[..., j], acc=parts.acc[..., j, :])
        total = st if total is None else merge_states(total, st)
    merged = (total.acc / total.l[..., None])
    merge_err = rel_err(merged, o.float())
    ok = ok and merge_err < TOL[dtype]
    label = f"{c.id} ragged={ragged} splits={s}"
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
    from course_utils import triton_decode
    from course_utils.bench import common
    for b, n in ((1, 4096), (8, 4096), (1, 32768), (1, 65536)):
        q = torch.randn(b, 32, 1, 128, device=device.DEVICE, dtype=torch.float16)
        k = torch.randn(b, 8, n, 128, device=device.DEVICE, dtype=torch.float16)
        v = torch.randn_like(k)
        times = common.kernel_us(lambda: decode_attention(q, k, v), calls=10)
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--breakdown", action="store_true",
                    help="per-kernel times, CUDA-graph replay time and autotuned configs")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    todo = plan()
    if args.list:
        for c, ragged in todo:
            print(c.id, f"ragged={ragged}")
        for rec in KERNELS:
            print(split_case(rec).id, "ragged=True splits=1,3,17,64")
        print(f"{len(todo)} cases, {4 * len(KERNELS)} forced split counts, a paged cache, "
              "SDPA")
        return 0
    if not device.HAS_GPU:
        print("needs a CUDA GPU")
        return 2
    print(torch.cuda.get_device_name(), "| torch", torch.__version__)
    t = time.time()
    ok = all([case(c, ragged, seed=i) for i, (c, ragged) in enumerate(todo)])
    ok &= all([case(split_case(rec), True, num_splits=s, seed=40 + s)
               for rec in KERNELS for s in (1, 3, 17, 64)])
    ok &= paged_case()
    ok &= sdpa_agrees()
    if args.breakdown:
        breakdown()
    print("heuristic:", {(b, n): choose_num_splits(b, 8, n) for b in (1, 8, 64)
                         for n in (1024, 32768, 131072)})
    print(f"{'all GPU checks passed' if ok else 'SOME GPU CHECKS FAILED'} in {time.time() - t:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
