"""Lesson 6 forward, one change at a time: each tile configuration of the current kernel
against the same configuration of a previous version of the kernel (a copy of the old
``triton_attention.py`` passed with ``--baseline``), and SDPA's flash and cuDNN back ends,
in one run.

    python benchmarks/ablation_fwd.py --baseline old_triton_attention.py --out ablation.json
    python benchmarks/ablation_fwd.py --ws both --configs 128x128x8x3,128x64x4x3

``--ws both`` also times the current kernel with Triton's automatic warp specialisation of
its key loop (the kernel's ``WS`` switch), as the row ``new+ws``; ``--lazy both`` with the
conditional rescaling of the running maximum (the ``LAZY`` switch), as the row ``new+lazy``;
``--desc both`` with K and V read through tensor descriptors (the ``DESC`` switch, sm90), as
the row ``new+desc``.
Every variant runs back to back for ``--settle`` milliseconds before it is timed (the GPU's
clock under its power cap depends on the kernel; ``course_utils.bench.common.settle``).

Every variant's output is checked against SDPA before it is timed (relative error
< 1e-2, else the row records the error instead of a speed). B = 4, H = 32, float16.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils.bench import common  # noqa: E402

CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
           (64, 64, 4, 2)]


def _launch(mod, new, q, k, v, causal, cfg, switches):
    bm, bn, w, s = cfg
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(b, h, n, device=q.device, dtype=torch.float32)
    scale = d ** -0.5
    strides = [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3]]
    grid = (triton_cdiv(n, bm), b * h)
    if new:
        args = (h, 1, n, n, d, 0, scale * mod.LOG2E, mod.length_bucket(n), mod.length_bucket(n))
        extra = dict(POS_SCALE=True, **switches)
    else:
        args = (h, 1, n, n, d, scale * mod.LOG2E)
        extra = {}

    def run():
        mod._attn_fwd_kernel[grid](q, k, v, o, lse, *strides, *args, HEAD_DIM=d, CAUSAL=causal,
                                   PAD_D=False, UPCAST=False, BLOCK_M=bm, BLOCK_N=bn,
                                   num_warps=w, num_stages=s, **extra)
        return o
    return run


def triton_cdiv(a, b):
    return -(-a // b)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None, help="an older triton_attention.py")
    ap.add_argument("--out", default="ablation_fwd.json")
    ap.add_argument("--n", default="4096,16384")
    ap.add_argument("--d", default="128,64")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--configs", default=None, help="e.g. 128x64x4x3,128x128x8x3")
    ap.add_argument("--ws", choices=("off", "on", "both"), default="off",
                    help="the current kernel without / with warp specialisation, or both")
    ap.add_argument("--lazy", choices=("off", "on", "both"), default="off",
                    help="the current kernel without / with lazy rescaling, or both")
    ap.add_argument("--desc", choices=("off", "on", "both"), default="off",
                    help="the current kernel without / with K and V through tensor "
                         "descriptors, or both")
    common.add_settle_option(ap)
    args = ap.parse_args(argv)
    import course_utils.triton_attention as cur
    mods = []
    choice = {"off": [False], "on": [True], "both": [False, True]}
    for ws in choice[args.ws]:
        for lazy in choice[args.lazy]:
            for desc in choice[args.desc]:
                label = "new" + "+ws" * ws + "+lazy" * lazy + "+desc" * desc
                mods.append((label, cur, True, dict(WS=ws, LAZY=lazy, DESC=desc)))
    if args.desc != "off":
        import triton
        triton.set_allocator(cur._scratch)            # descriptors made on the device
    if args.baseline:
        mods.insert(0, ("old", common.load_file(args.baseline, "old_triton_attention"), False, {}))
    configs = CONFIGS if not args.configs else [
        tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    rows = []
    for d in (int(x) for x in args.d.split(",")):
        for n in (int(x) for x in args.n.split(",")):
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(n + d)
                q, k, v = (torch.randn(4, 32, n, d, device="cuda", dtype=dtype, generator=g)
                           for _ in range(3))
                flops = common.attention_flops(4, 32, n, n, d, causal)
                ref = common.sdpa("FLASH_ATTENTION", q, k, v, causal)()
                base = {}
                for be in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
                    ms = common.time_ms(common.sdpa(be, q, k, v, causal), warmup=25, rep=100,
                                        settle_ms=args.settle)
                    base[be] = flops / ms * 1e-9
                for label, mod, new, switches in mods:
                    for cfg in configs:
                        row = {"kernel": label, "d": d, "n": n, "causal": causal,
                               "config": "x".join(map(str, cfg)),
                               "flash": base["FLASH_ATTENTION"],
                               "cudnn": base["CUDNN_ATTENTION"]}
                        try:
                            fn = _launch(mod, new, q, k, v, causal, cfg, switches)
                            o = fn()
                            torch.cuda.synchronize()
                            err = float((o.float() - ref.float()).norm() / ref.float().norm())
                            row["err"] = err
                            if not err < 1e-2:
                                raise RuntimeError(f"relative error {err:.3g}")
                            ms = common.time_ms(fn, warmup=25, rep=100, settle_ms=args.settle)
                            row["tflops"] = flops / ms * 1e-9
                            row["x_cudnn"] = row["tflops"] / row["cudnn"]
                        except Exception as e:  # noqa: BLE001 - a config that does not fit
                            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                del q, k, v, ref
                torch.cuda.empty_cache()
    env = common.environment()
    env["command"] = "python benchmarks/ablation_fwd.py " + " ".join(sys.argv[1:])
    env["settle_ms"] = args.settle
    Path(args.out).write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    # best config per point and kernel
    print("\nbest per point:")
    pts = sorted({(r["d"], r["n"], r["causal"]) for r in rows})
    for p in pts:
        line = f"d={p[0]:3d} n={p[1]:5d} causal={int(p[2])}"
        for label, *_ in mods:
            cand = [r for r in rows if (r["d"], r["n"], r["causal"]) == p and r["kernel"] == label
                    and "tflops" in r]
            if cand:
                best = max(cand, key=lambda r: r["tflops"])
                line += (f"  {label}: {best['tflops']:.0f} ({best['config']}, "
                         f"x{best['x_cudnn']:.2f})")
        r0 = next(r for r in rows if (r["d"], r["n"], r["causal"]) == p)
        line += f"  flash {r0['flash']:.0f} cudnn {r0['cudnn']:.0f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
