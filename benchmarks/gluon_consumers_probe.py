"""Variants of the Gluon forward (sm90): two or three consumer warpgroups taking turns
(pipelined) or interleaved by the warp schedulers (serial), two or three stages, key
blocks of 64, 128 or 256.

    python benchmarks/gluon_consumers_probe.py [--out FILE.json] [--rep MS]
        [--variants pp2_s2,pp3_s2,...] [--baseline OLD_gluon_fwd.py]
        [--alt NAME=OTHER_gluon_fwd.py:pp2_s2,pp3_s2 ...]

First every variant is checked against SDPA's math backend (float32) on odd lengths,
GQA and both causal alignments; then, in one run, the forward is timed at B = 4, H = 32,
N = 4k and 16k, D = 64 and 128, causal and not (fp16), next to SDPA's flash and cuDNN
backends. A variant that does not compile or run is recorded with its error. The JSON
keeps every number with the ratios to cuDNN. ``--baseline`` also times an older copy of
``course_utils/hopper/gluon_fwd.py`` (its two-consumer variants, prefixed ``before_``) in
the same run, so a change to the kernel is measured against what it replaced. ``--alt``
(repeatable) times another copy of the module with the variants named after the colon,
as ``NAME_<variant>``, so a change under trial is measured beside the kernel kept."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.attention import naive_attention  # noqa: E402
from course_utils.bench import common  # noqa: E402
from course_utils.hopper.gluon_fwd import attention_gluon  # noqa: E402

# name -> keyword arguments of attention_gluon
VARIANTS = {
    "pp2_s2": dict(pingpong=True, stages=2),
    "pp2_s3": dict(pingpong=True, stages=3),
    "pp3_s2": dict(pingpong=True, consumers=3, stages=2),
    "pp3_s3": dict(pingpong=True, consumers=3, stages=3),
    "pp3_s2_r168": dict(pingpong=True, consumers=3, stages=2, consumer_regs=168),
    # serial consumers without turns, interleaved by the warp schedulers
    "il2_s2": dict(pingpong=True, pipeline=False, stages=2),
    "il3_s2": dict(pingpong=True, consumers=3, pipeline=False, stages=2),
    "il3_s3": dict(pingpong=True, consumers=3, pipeline=False, stages=3),
    # key blocks of 64 and 256 (256 fits shared memory at head dim 64 only)
    "pp2_s2_n64": dict(pingpong=True, stages=2, block_n=64),
    "pp2_s3_n64": dict(pingpong=True, stages=3, block_n=64),
    "pp2_s2_n256": dict(pingpong=True, stages=2, block_n=256),
    "pp2_s3_n256": dict(pingpong=True, stages=3, block_n=256),
}


def check(name, kw, d, fwd=attention_gluon):
    bad = []
    for nq, nk, hq, hkv, causal, align in ((1000, 1900, 4, 2, True, "causal_upper_left"),
                                           (1000, 1900, 4, 2, True, "causal_lower_right"),
                                           (1900, 1000, 4, 1, True, "causal_lower_right"),
                                           (333, 777, 2, 2, False, None),
                                           (4096, 4096, 2, 2, True, "causal_upper_left")):
        gen = torch.Generator(device=device.DEVICE).manual_seed(nq + nk + d)
        q = torch.randn(1, hq, nq, d, device=device.DEVICE, dtype=torch.float16, generator=gen)
        k = torch.randn(1, hkv, nk, d, device=device.DEVICE, dtype=torch.float16, generator=gen)
        v = torch.randn(1, hkv, nk, d, device=device.DEVICE, dtype=torch.float16, generator=gen)
        extra = {"alignment": align} if causal else {}
        o = fwd(q, k, v, is_causal=causal, enable_gqa=True, **extra, **kw)
        ref = naive_attention(q.float(), k.float(), v.float(), is_causal=causal, alignment=align,
                              enable_gqa=True)
        err = float((o.float() - ref).abs().max())
        if not err < 1e-2:
            bad.append(f"Nq={nq} Nk={nk} causal={causal} {align}: max |error| {err:.3g}")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rep", type=int, default=40)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--baseline", default=None, help="an older gluon_fwd.py")
    ap.add_argument("--alt", action="append", default=[], metavar="NAME=FILE:VARIANTS",
                    help="another copy of gluon_fwd.py and the variants to time with it")
    a = ap.parse_args(argv)
    runs = {name: (attention_gluon, VARIANTS[name]) for name in a.variants.split(",") if name}
    for spec in a.alt:
        name, sep, rest = spec.partition("=")
        path, sep2, names = rest.rpartition(":")
        if not (sep and sep2 and name.isidentifier() and Path(path).is_file()):
            ap.error(f"--alt takes NAME=FILE:VARIANT,..., got {spec!r}")
        unknown = [v for v in names.split(",") if v not in VARIANTS]
        if unknown:
            ap.error(f"--alt {name}: unknown variants {unknown}; known: {', '.join(VARIANTS)}")
        fwd = common.load_file(path, f"gluon_fwd_{name}").attention_gluon
        runs.update({f"{name}_{v}": (fwd, VARIANTS[v]) for v in names.split(",")})
    if a.baseline:
        old = common.load_file(a.baseline, "gluon_fwd_before").attention_gluon
        runs = {**{f"before_{n}": (old, VARIANTS[n]) for n in ("pp2_s2", "pp2_s3")}, **runs}
    if not device.needs("hopper"):
        return 0
    record = {"environment": common.environment(), "checks": {}, "rows": []}
    record["environment"]["command"] = "python benchmarks/gluon_consumers_probe.py " + \
        " ".join(argv if argv is not None else sys.argv[1:])
    ok = {}
    for d in (64, 128):
        for name, (fwd, kw) in runs.items():
            try:
                bad = check(name, kw, d, fwd)
            except Exception as e:  # noqa: BLE001 - a variant that does not build is a result
                bad = [f"{type(e).__name__}: {str(e)[:300]}"]
            record["checks"][f"{name}_d{d}"] = bad or "ok"
            ok[(name, d)] = not bad
            print(f"check {name} D={d}: {'ok' if not bad else bad}", flush=True)
    for q, k, v, causal, flops, row in common.forward_points((64, 128)):
        d = row["d"]
        fns = {key: common.sdpa(key, q, k, v, causal) for key in ("flash", "cudnn")}
        for name, (fwd, kw) in runs.items():
            if ok[(name, d)]:
                fns[name] = (lambda fwd=fwd, kw=kw: fwd(q, k, v, is_causal=causal, **kw))
        common.time_tflops(row, fns, flops, a.rep)
        for key in list(row):
            if key in fns and key != "cudnn" and row.get("cudnn"):
                row[f"{key}_x_cudnn"] = round(row[key] / row["cudnn"], 3)
        record["rows"].append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
