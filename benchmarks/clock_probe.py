"""Do the Gluon forward's slow rounds at 4k keys follow the GPU's clock? An sm90 probe.

In the persistent-grid probe the Gluon forward at head dim 128, 4k keys, ran 639 TFLOPS in
its first round and 566-572 in the next two, while cuDNN, timed beside it, held 642-654.
This probe times the same points in interleaved rounds (the providers in the order given),
notes each timing's start and end, and samples the SM clock, the power draw and the
clock-event reasons with ``nvidia-smi`` meanwhile (``--smi FILE``: the CSV that
``nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms 50`` wrote during the run).
Each row then carries the mean SM clock and power over its timing, so a slow round can be
told apart: lower clocks (power or heat) or the same clocks (the kernel's own schedule).
On an H200 it found the power cap: a timing after an idle gap starts at the full clock,
and each kernel settles at a clock of its own (``benchmarks/nvidia-h200/clock_probe*.json``,
``common.settle``).

``--settle 0,1500``: each timing is made once after no extra warm-up (``do_bench``'s own
10-25 ms, as the benchmarks timed before ``--settle``) and once after running the kernel
back to back for 1.5 s, long enough for the power limiter to settle on the clock that
kernel sustains.
``--providers``: the table's (``course_utils.bench.table``: triton, tma, gluon, fp8,
flash, cudnn) and ``gluon_persistent`` / ``gluon_stages2`` (head dim 128 only).

    python benchmarks/clock_probe.py --rounds 4 --rep 100 --out FILE.json --smi SMI.csv
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from course_utils.bench import common, table  # noqa: E402
from course_utils.hopper import gluon_fwd  # noqa: E402

EXTRA = {"gluon_persistent": dict(persistent=True), "gluon_stages2": dict(stages=2)}


def providers(names, q, k, v, causal):
    fns = {}
    for name in names:
        if name in EXTRA:
            if q.shape[-1] != 128:
                continue
            opts = dict(gluon_fwd.FASTEST[128], **EXTRA[name])
            fns[name] = (lambda o: lambda: gluon_fwd.attention_gluon(
                q, k, v, is_causal=causal, **o))(opts)
        else:
            fn = table._fwd_fn(name, q, k, v, causal)
            if not isinstance(fn, str):
                fns[name] = fn
    return fns


def measure(rounds, rep, lengths, names, settles, head_dims):
    rows = []
    for d in head_dims:
        for q, k, v, causal, flops, row in common.forward_points((d,), lengths):
            fns = providers(names, q, k, v, causal)
            for fn in fns.values():                       # compile outside the timing
                fn()
            torch.cuda.synchronize()
            for r in range(rounds):
                for wait in settles:
                    for name, fn in fns.items():
                        common.settle(fn, wait)
                        t0 = time.time()
                        ms = common.time_ms(fn, rep=rep)
                        rows.append(dict(row, round=r, provider=name, settle_ms=wait,
                                         tflops=round(flops / ms / 1e9, 1),
                                         start=t0, end=time.time()))
                        print(json.dumps(rows[-1]), flush=True)
            del q, k, v, fns
            torch.cuda.empty_cache()
    return rows


def read_smi(path):
    """(unix time, SM MHz, watts, reasons) samples of the nvidia-smi CSV."""
    out = []
    for line in Path(path).read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            stamp = _dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            out.append((stamp.replace(tzinfo=_dt.timezone.utc).timestamp(), float(parts[1]),
                        float(parts[2]), parts[3] if len(parts) > 3 else ""))
        except (ValueError, IndexError):
            continue
    return out


def attach(rows, samples, offset):
    """Mean SM clock and power of the samples inside each row's timing window."""
    for row in rows:
        inside = [s for s in samples if row["start"] <= s[0] + offset <= row["end"]]
        if inside:
            row["sm_mhz"] = round(sum(s[1] for s in inside) / len(inside))
            row["min_sm_mhz"] = min(s[1] for s in inside)
            row["watts"] = round(sum(s[2] for s in inside) / len(inside))
            row["reasons"] = sorted({s[3] for s in inside})
            row["samples"] = len(inside)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--d", default="128,64")
    ap.add_argument("--providers", default="cudnn,gluon,gluon_persistent,gluon_stages2")
    ap.add_argument("--settle", default="0", help="milliseconds run before each timing, "
                    "comma-separated (each value is a separate timing)")
    ap.add_argument("--smi", default=None, help="nvidia-smi CSV written during the run")
    ap.add_argument("--smi-offset", type=float, default=None,
                    help="seconds to add to the CSV's local times (default: this machine's "
                         "UTC offset)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ints = lambda text: tuple(int(x) for x in text.split(",") if x)  # noqa: E731
    rows = measure(args.rounds, args.rep, ints(args.lengths), args.providers.split(","),
                   ints(args.settle), ints(args.d))
    if args.smi:
        offset = args.smi_offset
        if offset is None:
            offset = -time.localtime().tm_gmtoff
        attach(rows, read_smi(args.smi), offset)
    env = common.environment()
    env["command"] = "python benchmarks/clock_probe.py " + " ".join(sys.argv[1:])
    record = {"environment": env, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for row in rows:
        print(row["d"], row["n"], row["causal"], row["round"], row["settle_ms"], row["provider"],
              row["tflops"], row.get("sm_mhz"), row.get("min_sm_mhz"), row.get("watts"),
              row.get("reasons"))


if __name__ == "__main__":
    main()
