"""Lesson 8's Gluon forward with part of the exponentials on the FMA units (sm90).

    python benchmarks/exp2_split_probe.py --modules split4.py,split2.py [--d 64,128]
        [--settle MS] [--rep MS] [--out FILE.json]

Each module is a copy of ``course_utils/hopper/gluon_fwd.py`` with ``_EXP2_SPLIT`` set to
K > 0 (one probability in every K computed as 2^x by a polynomial instead of on the MUFU
unit); the course's module, which keeps every exponential on the MUFU unit, runs beside
them. First every module's 16-bit forward (the course's fastest schedule at each head dim)
and FP8 forward (its FP8 schedule, with the Hadamard rotation the timing uses) is checked
against the float32 reference on lengths off the tile, GQA and MQA, causal on and off, each
output poisoned with NaN first (a check whose output did not land on the poison fails); the
largest difference from the course's own output is recorded too. Then, at B = 4, H = 32,
N = 4k and 16k, causal and not, float16 inputs, each provider settled first: SDPA's cuDNN
back end once, then the course's and the copies' 16-bit forwards, their FP8 forwards, and
all of these again in the reverse order (each timed twice, once early and once late).
Every point is written to ``--out`` as it is timed. (The run in
``benchmarks/nvidia-h200/exp2_split_probe.json`` checked FP8 without the rotation and did
not yet require the poisoned output.)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.bench import common  # noqa: E402
from course_utils.hopper import fp8, gluon_fwd  # noqa: E402

CHECKS = [(1, 4, 2, 1000, 1900, True), (1, 4, 1, 1900, 1000, True), (2, 2, 2, 333, 777, False),
          (1, 2, 2, 4096, 4096, True), (1, 4, 4, 129, 1, False), (1, 2, 1, 1, 300, True)]


def _runs(mod, d):
    """The module's 16-bit and FP8 forwards as ``(name, run(q, k, v, causal) -> (o, lse))``."""
    def sixteen(q, k, v, causal):
        return mod.attention_gluon(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True,
                                   **mod.FASTEST[d])

    def eight(q, k, v, causal):
        prep = fp8.prepare_fp8(q, k, v, hadamard=True, kernel="gluon", block_m=128,
                               block_n=128)
        return mod.attention_gluon_fp8(prep, is_causal=causal, return_lse=True,
                                       **fp8.GLUON_FP8_SCHEDULE)
    return (("16", sixteen), ("fp8", eight))


def check(mods, d):
    """Per module and format: worst errors against the float32 reference, worst relative
    difference from the course's output, and the cases that failed."""
    from fp8_gluon_probe import FP8_TOL, FP16_TOL, check_one, rel_err
    out = {}
    for b, hq, hkv, nq, nk, causal in CHECKS:
        gen = torch.Generator(device=device.DEVICE).manual_seed(nq * 7 + nk + d)
        q, k, v = (torch.randn(b, h, n, d, device=device.DEVICE, dtype=torch.float16,
                               generator=gen) for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))
        course = {}
        for name, mod in mods.items():
            for fmt, run in _runs(mod, d):
                rec = out.setdefault(f"{name}_{fmt}_d{d}", {"o": 0.0, "lse": 0.0,
                                                           "vs_course": None, "failures": []})
                tol = FP8_TOL if fmt == "fp8" else FP16_TOL
                try:
                    ok, errs = check_one(lambda: run(q, k, v, causal), q, k, v, causal, tol)
                    o = run(q, k, v, causal)[0].float()
                except Exception as e:  # noqa: BLE001 - a module that fails is a result
                    rec["failures"].append(f"{type(e).__name__}: {str(e)[:300]}")
                    continue
                if name == "course":
                    course[fmt] = o
                rec["o"], rec["lse"] = max(rec["o"], errs["o"]), max(rec["lse"], errs["lse"])
                if fmt in course:                  # none if the course's own run failed
                    rec["vs_course"] = max(rec["vs_course"] or 0.0, rel_err(o, course[fmt]))
                if not (ok and errs["poisoned"]):
                    rec["failures"].append(f"B={b} Hq={hq} Hkv={hkv} Nq={nq} Nk={nk} "
                                           f"causal={causal}: {errs}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--modules", required=True,
                    help="comma list of gluon_fwd.py copies with _EXP2_SPLIT > 0")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--rep", type=int, default=40)
    common.add_settle_option(ap, default=200.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dims = tuple(int(x) for x in a.d.split(","))
    if any(x not in gluon_fwd.FASTEST for x in dims):
        ap.error(f"--d: head dims of {sorted(gluon_fwd.FASTEST)}")
    paths = [Path(p) for p in a.modules.split(",") if p]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        ap.error(f"no such module: {missing}")
    mods = {"course": gluon_fwd}
    for p in paths:
        mods[p.stem] = common.load_file(p, f"gluon_fwd_{p.stem}")
    splits = {n: int(getattr(m, "_EXP2_SPLIT").value) for n, m in mods.items()}
    if splits["course"] != 0 or any(v <= 0 for n, v in splits.items() if n != "course"):
        ap.error(f"expected the course's module at 0 and every copy above 0: {splits}")
    if not device.needs("hopper"):
        return 0
    record = {"environment": common.environment(), "splits": splits, "checks": {},
              "rows": [], "settle_ms": a.settle}
    record["environment"]["command"] = "python benchmarks/exp2_split_probe.py " + \
        " ".join(argv if argv is not None else sys.argv[1:])
    for d in dims:
        res = check(mods, d)
        record["checks"].update(res)
        for key, rec in res.items():
            print(f"check {key}: {'ok' if not rec['failures'] else rec['failures'][:2]} "
                  f"o {rec['o']:.2e} lse {rec['lse']:.2e} vs course {rec['vs_course']}",
                  flush=True)
    good = {key for key, rec in record["checks"].items() if not rec["failures"]}
    for q, k, v, causal, flops, row in common.forward_points(dims):
        d = row["d"]
        fns = {"cudnn": common.sdpa("cudnn", q, k, v, causal)}
        prep = fp8.prepare_fp8(q, k, v, hadamard=True, kernel="gluon", block_m=128,
                               block_n=128)
        for fmt in ("16", "fp8"):
            for name, mod in mods.items():
                if f"{name}_{fmt}_d{d}" not in good:
                    continue
                if fmt == "16":
                    fns[f"{name}_{fmt}"] = (lambda mod=mod: mod.attention_gluon(
                        q, k, v, is_causal=causal, **mod.FASTEST[d]))
                else:
                    fns[f"{name}_{fmt}"] = (lambda mod=mod: mod.attention_gluon_fp8(
                        prep, is_causal=causal, **fp8.GLUON_FP8_SCHEDULE))
        order = list(fns.items()) + [(f"{key}_again", fn) for key, fn in reversed(fns.items())
                                     if key != "cudnn"]
        for key, fn in order:
            try:
                row[key] = round(flops / common.time_ms(fn, rep=a.rep, settle_ms=a.settle)
                                 / 1e9, 1)
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        record["rows"].append(row)
        print(json.dumps(row), flush=True)
        _write(a.out, record)       # after every point: a run stopped midway keeps its points
        del q, k, v, prep, fns
        torch.cuda.empty_cache()
    return 0


def _write(out, record):
    if out:
        Path(out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
