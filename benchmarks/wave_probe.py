"""How much the last, partly filled wave of tiles costs the Gluon forward at 4k keys.

At B = 4, H = 32, N = 4096 and head dim 128 the grid of one program per 128-row tile
has 4 * 32 * 32 = 4096 programs; one fits an SM at a time (its shared memory), and an
H100 / H200 has 132 SMs: 31 full waves and 4 programs in a 32nd, which runs as long as
a full one. At H = 33 the same tiles make exactly 32 waves, at H = 31 30 waves and 8
programs. If the partly filled wave is what costs, TFLOPS at H = 31 and 32 are about
31.03 / 32 = 0.970 (and 30.06 / 31) of those at H = 33; a kernel without the effect
(or one that splits its work finer) shows no step. The same for the persistent grid,
and for cuDNN as the reference.

Each point is timed ``--runs`` times, the providers in turn (reversed every other
run), each after ``--settle`` ms of running back to back.

    python benchmarks/wave_probe.py [--heads 31,32,33] [--d 128] [--n 4096] [--runs 2]
        [--settle 300] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from course_utils.bench import common  # noqa: E402
from course_utils.hopper import gluon_fwd  # noqa: E402


def _ints(text):
    try:
        vals = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers expected, got {text!r}")
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"integers >= 1 expected, got {text!r}")
    return vals


def waves(tiles, sms):
    """(tiles / sms, tiles / sms over the whole waves they take): the share of the last
    wave's SMs kept busy, as the grid predicts it."""
    w = tiles / sms
    return w, w / -(-tiles // sms)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=_ints, default=[31, 32, 33])
    ap.add_argument("--d", type=_ints, default=[128])
    ap.add_argument("--n", type=_ints, default=[4096])
    ap.add_argument("--causal", choices=("off", "on", "both"), default="off")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--out", default=None)
    common.add_settle_option(ap, 300.0)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    for d in args.d:
        if d not in gluon_fwd.FASTEST:
            ap.error(f"--d: head dims {sorted(gluon_fwd.FASTEST)} only, got {d}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    causals = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    rows = []
    for d in args.d:
        opts = {o: x for o, x in gluon_fwd.FASTEST[d].items() if o != "persistent"}
        tiles_m = 64 * opts.get("consumers", 2) if opts.get("pingpong") else gluon_fwd.BLOCK_M
        for n in args.n:
            for causal in causals:
                for h in args.heads:
                    gen = torch.Generator(device="cuda").manual_seed(n + d + h)
                    q, k, v = (torch.randn(4, h, n, d, device="cuda", dtype=torch.float16,
                                           generator=gen) for _ in range(3))
                    flops = common.attention_flops(4, h, n, n, d, causal)
                    fns = {"cudnn": common.sdpa("cudnn", q, k, v, causal),
                           "grid": lambda: gluon_fwd.attention_gluon(
                               q, k, v, is_causal=causal, **opts),
                           "persistent": lambda: gluon_fwd.attention_gluon(
                               q, k, v, is_causal=causal, persistent=True, **opts)}
                    ref = torch.nn.functional.scaled_dot_product_attention(
                        q.float(), k.float(), v.float(), is_causal=causal)
                    for name in ("grid", "persistent"):
                        err = float((fns[name]().float() - ref).abs().max())
                        if not err < 1e-2:
                            raise SystemExit(f"{name} D={d} N={n} H={h}: max error {err}")
                    tiles = 4 * h * -(-n // tiles_m)
                    w, busy = waves(tiles, sms)
                    row = {"d": d, "n": n, "h": h, "causal": causal, "tiles": tiles,
                           "waves": round(w, 3), "grid_last_wave_busy": round(busy, 4)}
                    names = list(fns)
                    for r in range(args.runs):
                        for name in (names if r % 2 == 0 else names[::-1]):
                            ms = common.time_ms(fns[name], rep=args.rep, settle_ms=args.settle)
                            row.setdefault(name, []).append(round(flops / ms / 1e9, 1))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    # each provider's TFLOPS against its own at the largest head count of the same point
    for row in rows:
        top = max((r for r in rows if (r["d"], r["n"], r["causal"]) ==
                   (row["d"], row["n"], row["causal"])), key=lambda r: r["h"])
        rel = {name: round(sum(row[name]) / sum(top[name]), 4)
               for name in ("cudnn", "grid", "persistent")}
        print(f"D={row['d']} N={row['n']} causal={row['causal']} H={row['h']}: waves "
              f"{row['waves']} (grid busy {row['grid_last_wave_busy']}), TFLOPS vs "
              f"H={top['h']}: {rel}", flush=True)
    if args.out:
        env = common.environment()
        env["command"] = "python benchmarks/wave_probe.py " + " ".join(sys.argv[1:])
        Path(args.out).write_text(json.dumps({"environment": env, "sms": sms, "rows": rows},
                                             indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
