"""The persistent Gluon forward against the one-program-per-tile grid, on an sm90 GPU.

1. Exactness: for each schedule (the fastest per head dim, one 8-warp consumer pipelined
   and serial, two interleaved consumers) and shapes with ragged lengths, GQA, both causal
   alignments, tiles whose rows see no key, and no mask: ``persistent=True`` returns the
   same output and LSE, bit for bit, as the grid of one program per tile (the same
   arithmetic in the same order; only who runs a tile, and how O leaves, change: from
   registers, or through O slots by TMA where shared memory has room for them), and
   both are within 4e-3 of a float64 reference. FP8 on e4m3 tiles likewise.
2. Speed: the table's points (B = 4, H = 32), each provider timed in turn (reversed
   every other run), ``--runs`` rounds, each after ``--settle`` ms back to back: cuDNN,
   the grid (``gluon``), the persistent grid (``gluon_persistent``; at head dim 128 also
   with two stages, ``gluon_persistent_s2``, where O slots fit), FP8 both ways; with
   ``--before FILE`` also that file's ``attention_gluon`` on the grid and persistent
   (the kernel before the change, same options), and its persistent FP8.

    python benchmarks/persistent_probe.py [--runs 3] [--before FILE] [--settle MS]
        [--out FILE.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from course_utils.attention import naive_attention  # noqa: E402
from course_utils.bench import common  # noqa: E402
from course_utils.hopper import fp8, gluon_fwd  # noqa: E402

SCHEDULES = [("fastest-128", 128, gluon_fwd.FASTEST[128]), ("fastest-64", 64, gluon_fwd.FASTEST[64]),
             ("one-consumer", 128, dict(pipeline=True, stages=2)),
             ("one-consumer-serial", 128, dict(pipeline=False, stages=2)),
             ("interleaved-2", 128, dict(pingpong=True, pipeline=False, stages=2)),
             ("pingpong-2-stages", 128, dict(pingpong=True, stages=2))]
SHAPES = [(2, 4, 2, 384, 128), (2, 4, 2, 256, 640), (2, 4, 2, 300, 129), (2, 4, 2, 129, 300),
          (2, 4, 2, 1, 77), (1, 8, 8, 1024, 1024)]


def _grid(opts):
    """``opts`` without their ``persistent`` choice (the probe sets it)."""
    return {o: x for o, x in opts.items() if o != "persistent"}


def reference(q, k, v, alignment):
    """The course's textbook attention in float64 (GQA, either causal alignment or none)."""
    return naive_attention(q.double(), k.double(), v.double(), is_causal=alignment is not None,
                           alignment=alignment, enable_gqa=True)


def exactness(only=None):
    bad = 0
    for name, d, opts in SCHEDULES:
        if only and name not in only:
            continue
        for b, hq, hkv, nq, nk in SHAPES:
            gen = torch.Generator(device="cuda").manual_seed(nq * 7 + nk)
            q = torch.randn(b, hq, nq, d, device="cuda", dtype=torch.float16, generator=gen)
            k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.float16, generator=gen)
                    for _ in range(2))
            for alignment in (None, "causal_upper_left", "causal_lower_right"):
                kw = dict(is_causal=alignment is not None, alignment=alignment, enable_gqa=True,
                          return_lse=True, **_grid(opts))
                o1, l1 = gluon_fwd.attention_gluon(q, k, v, persistent=False, **kw)
                o2, l2 = gluon_fwd.attention_gluon(q, k, v, persistent=True, **kw)
                # three programs: each runs many tiles (tiles without keys among them)
                o3, l3 = gluon_fwd.attention_gluon(q, k, v, persistent=3, **kw)
                torch.cuda.synchronize()
                ref = reference(q, k, v, alignment)
                err = float((o2.double() - ref).norm() / ref.norm().clamp_min(1e-30))
                same = all(torch.equal(o1, o) and torch.equal(l1, lse)
                           for o, lse in ((o2, l2), (o3, l3)))
                ok = same and err < 4e-3
                bad += not ok
                print(f"{'ok ' if ok else 'BAD'} {name} B={b} Hq={hq} Hkv={hkv} Nq={nq} Nk={nk} "
                      f"{alignment}: equal={same} err={err:.2e}", flush=True)
    for d in (64, 128):
        gen = torch.Generator(device="cuda").manual_seed(d)
        q, k, v = (torch.randn(2, 4, 1000, d, device="cuda", dtype=torch.float16, generator=gen)
                   for _ in range(3))
        prep = fp8.prepare_fp8(q, k, v, kernel="gluon")
        for causal in (False, True):
            kw = dict(is_causal=causal, return_lse=True, **_grid(fp8.GLUON_FP8_SCHEDULE))
            o1, l1 = gluon_fwd.attention_gluon_fp8(prep, **kw)
            o2, l2 = gluon_fwd.attention_gluon_fp8(prep, persistent=True, **kw)
            o3, l3 = gluon_fwd.attention_gluon_fp8(prep, persistent=3, **kw)
            ref = reference(q, k, v, "causal_upper_left" if causal else None)
            err = float((o2.double() - ref).norm() / ref.norm())
            same = all(torch.equal(o1, o) and torch.equal(l1, lse)
                       for o, lse in ((o2, l2), (o3, l3)))
            ok = same and err < 0.08
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} fp8 D={d} causal={causal}: equal={same} "
                  f"err={err:.2e}", flush=True)
    return bad


def speed(runs, before, rep, settle_ms=0.0):
    rows = []
    old = None
    if before:
        spec = importlib.util.spec_from_file_location("gluon_before", before)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    for dtype_name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        for q, k, v, causal, flops, row in common.forward_points((64, 128), dtype=dtype):
            d = row["d"]
            opts = _grid(gluon_fwd.FASTEST[d])
            fns = {"cudnn": common.sdpa("cudnn", q, k, v, causal),
                   "gluon": lambda: gluon_fwd.attention_gluon(q, k, v, is_causal=causal, **opts),
                   "gluon_persistent": lambda: gluon_fwd.attention_gluon(
                       q, k, v, is_causal=causal, persistent=True, **opts)}
            if d == 128:
                # two stages: the ring leaves room for O slots beside it
                fns["gluon_persistent_s2"] = lambda: gluon_fwd.attention_gluon(
                    q, k, v, is_causal=causal, persistent=True, **{**opts, "stages": 2})
            if old is not None:
                fns["gluon_before"] = lambda: old.attention_gluon(q, k, v, is_causal=causal, **opts)
                fns["gluon_persistent_before"] = lambda: old.attention_gluon(
                    q, k, v, is_causal=causal, persistent=True, **opts)
                if d == 128:
                    fns["gluon_persistent_s2_before"] = lambda: old.attention_gluon(
                        q, k, v, is_causal=causal, persistent=True, **{**opts, "stages": 2})
            if dtype_name == "fp16":
                prep = fp8.prepare_fp8(q, k, v, kernel="gluon")
                f8 = _grid(fp8.GLUON_FP8_SCHEDULE)
                fns["fp8"] = lambda: gluon_fwd.attention_gluon_fp8(prep, is_causal=causal, **f8)
                fns["fp8_persistent"] = lambda: gluon_fwd.attention_gluon_fp8(
                    prep, is_causal=causal, persistent=True, **f8)
                if old is not None:
                    fns["fp8_persistent_before"] = lambda: old.attention_gluon_fp8(
                        prep, is_causal=causal, persistent=True, **f8)
            row["dtype"] = dtype_name
            names = list(fns)
            for r in range(runs):
                # the providers in turn, reversed every other run
                for key in (names if r % 2 == 0 else names[::-1]):
                    try:
                        ms = common.time_ms(fns[key], rep=rep, settle_ms=settle_ms)
                        row.setdefault(key, []).append(round(flops / ms / 1e9, 1))
                    except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                        row.setdefault(f"{key}_error", []).append(
                            f"{type(e).__name__}: {str(e)[:200]}")
            med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in row.items()
                   if isinstance(v2, list) and not isinstance(v2[0], str)}
            line = " ".join(f"{k2} {v2:.0f}" for k2, v2 in med.items())
            ratios = " ".join(f"{a}/{b} {med[a] / med[b]:.3f}" for a, b in (
                ("gluon_persistent", "gluon"), ("gluon_persistent", "cudnn"), ("gluon", "cudnn"),
                ("gluon", "gluon_before"), ("gluon_persistent", "gluon_persistent_before"),
                ("gluon_persistent_s2", "gluon_persistent_s2_before"),
                ("gluon_persistent_s2", "gluon"), ("fp8_persistent", "fp8_persistent_before"),
                ("fp8_persistent", "fp8")) if a in med and b in med)
            errors = {k2: v2[0] for k2, v2 in row.items() if isinstance(v2, list) and
                      isinstance(v2[0], str)}
            if errors:
                ratios += f" errors {errors}"
            print(f"{dtype_name} D={d} N={row['n']} causal={causal}: {line} | {ratios}",
                  flush=True)
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rep", type=int, default=30)
    ap.add_argument("--before", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-exactness", action="store_true")
    common.add_settle_option(ap, 0.0)
    ap.add_argument("--schedules", default="", help="exactness: only these (comma-separated)")
    args = ap.parse_args(argv)
    bad = 0 if args.skip_exactness else exactness([x for x in args.schedules.split(",") if x])
    print(f"# exactness: {bad} bad", flush=True)
    rows = speed(args.runs, args.before, args.rep, args.settle) if args.runs else []
    if args.out:
        env = common.environment()
        env["command"] = "python benchmarks/persistent_probe.py " + " ".join(sys.argv[1:])
        Path(args.out).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
