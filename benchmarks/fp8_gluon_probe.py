"""FP8 in the Gluon kernel (sm90): the ping-pong schedule on e4m3 tiles against the
16-bit Gluon kernel, the plain Triton FP8 kernel and SDPA, in one run.

    python benchmarks/fp8_gluon_probe.py [--out FILE.json] [--rep MS]
        [--variants g8_pp_s2,g8_pp_s3,...] [--sixteen g16_s2,g16_s3,...]
        [--baseline OLD_gluon_fwd.py]

First every FP8 variant (and the 16-bit Gluon kernel it shares its code with) is checked
against the float32 reference on odd lengths, GQA and causal on and off, each output
poisoned with NaN before the run (a row the kernel does not write fails). Then the
forward is timed at B = 4, H = 32, N = 4k and 16k, D = 64 and 128, causal and not, fp16
inputs: our FP8 variants (kernel time; the quantisation, Hadamard rotation included, is
timed on its own in ``quant_ms``), the Triton FP8 kernel, the 16-bit Gluon ping-pong
kernel with 2 and 3 stages, SDPA's flash and cuDNN back ends. ``x_best16`` divides by the
fastest 16-bit forward of the point (ours or SDPA's). ``--baseline`` also times an older
copy of ``course_utils/hopper/gluon_fwd.py`` (16-bit, prefixed ``before_``)."""
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
from course_utils.hopper import fp8  # noqa: E402
from course_utils.hopper.gluon_fwd import attention_gluon, attention_gluon_fp8  # noqa: E402

# name -> (prepare_fp8 keyword arguments, attention_gluon_fp8 keyword arguments)
VARIANTS = {
    "g8_pp_s2": (dict(block_n=128), dict(stages=2)),
    "g8_pp_s3": (dict(block_n=128), dict(stages=3)),
    "g8_pp_bn256_s2": (dict(block_n=256), dict(stages=2)),
    "g8_one_s2": (dict(block_n=128), dict(stages=2, pingpong=False)),
    # Q scales per 64 rows (one per consumer) with the same schedule, and the serial
    # consumers the schedulers interleave: two, or three on a 192-row tile
    "g8_pp64_s2": (dict(block_n=128, block_m=64), dict(stages=2)),
    "g8_il2_s2": (dict(block_n=128), dict(stages=2, pipeline=False)),
    "g8_il3_s2": (dict(block_n=128, block_m=64), dict(stages=2, consumers=3, pipeline=False)),
    "g8_il3_s3": (dict(block_n=128, block_m=64), dict(stages=3, consumers=3, pipeline=False)),
    # 64-key blocks: no stack at D = 128 with three consumers (40 bytes with 128 keys)
    "g8_il3_bn64_s3": (dict(block_n=64, block_m=64),
                       dict(stages=3, consumers=3, pipeline=False)),
}
# measured slower everywhere it was tried (D = 128: 0.71-0.83x g8_pp_s2; the compiler
# spills 64-72 bytes of its [64, 256] score tiles there): left out unless named
DEFAULT = ("g8_pp_s2", "g8_pp_s3", "g8_one_s2")
SIXTEEN = {"g16_s2": dict(pingpong=True, stages=2), "g16_s3": dict(pingpong=True, stages=3),
           "g16_il3_s3": dict(pingpong=True, consumers=3, pipeline=False, stages=3),
           "g16_il3_bn64_s3": dict(pingpong=True, consumers=3, pipeline=False, stages=3,
                                   block_n=64)}
SIXTEEN_DEFAULT = ("g16_s2", "g16_s3")
# relative error of o, largest |lse error|: the tolerances of benchmarks/check_hopper_gpu.py
FP8_TOL, FP16_TOL = (0.1, 0.15), (4e-3, 1e-2)
# (B, Hq, Hkv, Nq, Nk, causal): lengths off the 128-row tile both ways, GQA and MQA
CHECKS = [(1, 4, 2, 1000, 1900, True), (1, 4, 1, 1900, 1000, True), (2, 2, 2, 333, 777, False),
          (1, 2, 2, 4096, 4096, True), (1, 4, 4, 129, 1, False), (1, 2, 1, 1, 300, True)]


def poison(*like):
    """Fill the caching allocator's next blocks of these ``(shape, dtype)`` with NaN, so
    an output allocated next starts as NaN; returns their addresses."""
    blocks = [torch.full(shape, float("nan"), dtype=dt, device=device.DEVICE)
              for shape, dt in like]
    ptrs = [b.data_ptr() for b in blocks]
    del blocks
    return ptrs


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def check_one(run, q, k, v, causal, tol):
    """Run ``run()`` (returns o, lse) into NaN-poisoned memory; errors against the
    float32 reference, or why it fails."""
    b, hq, nq, d = q.shape
    ptrs = poison(((b, hq, nq, d), q.dtype), ((b, hq, nq), torch.float32))
    o, lse = run()
    torch.cuda.synchronize()
    ref, ref_lse = naive_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                   enable_gqa=True, return_lse=True)
    errs = {"o": rel_err(o.float(), ref), "lse": float((lse - ref_lse).abs().max()),
            "poisoned": [o.data_ptr(), lse.data_ptr()] == ptrs}
    ok = (bool(torch.isfinite(o).all()) and bool(torch.isfinite(lse).all())
          and errs["o"] < tol[0] and errs["lse"] < tol[1])
    return ok, errs


def checks(name, d, fn8=None, kw16=None, fwd16=attention_gluon):
    bad, worst = [], {"o": 0.0, "lse": 0.0}
    for b, hq, hkv, nq, nk, causal in CHECKS:
        gen = torch.Generator(device=device.DEVICE).manual_seed(nq * 7 + nk + d)
        q = torch.randn(b, hq, nq, d, device=device.DEVICE, dtype=torch.float16, generator=gen)
        k = torch.randn(b, hkv, nk, d, device=device.DEVICE, dtype=torch.float16, generator=gen)
        v = torch.randn(b, hkv, nk, d, device=device.DEVICE, dtype=torch.float16, generator=gen)
        if fn8 is not None:
            ok, errs = check_one(lambda: fn8(q, k, v, causal), q, k, v, causal, FP8_TOL)
        else:
            ok, errs = check_one(lambda: fwd16(q, k, v, is_causal=causal, enable_gqa=True,
                                               return_lse=True, **kw16), q, k, v, causal, FP16_TOL)
        worst = {key: max(worst[key], errs[key]) for key in worst}
        if not ok:
            bad.append(f"B={b} Hq={hq} Hkv={hkv} Nq={nq} Nk={nk} causal={causal}: {errs}")
    return bad, worst


def gluon8(pkw, kw, hadamard=False):
    def run(q, k, v, causal):
        prep = fp8.prepare_fp8(q, k, v, hadamard=hadamard, kernel="gluon", **pkw)
        return attention_gluon_fp8(prep, is_causal=causal, return_lse=True, **kw)
    return run


def triton8(q, k, v, causal):
    prep = fp8.prepare_fp8(q, k, v, kernel="triton")
    return fp8.attention_fp8_prepared(prep, is_causal=causal, return_lse=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rep", type=int, default=40)
    ap.add_argument("--variants", default=",".join(DEFAULT))
    ap.add_argument("--sixteen", default=",".join(SIXTEEN_DEFAULT),
                    help=f"16-bit Gluon schedules timed beside, of {sorted(SIXTEEN)}")
    ap.add_argument("--baseline", default=None, help="an older gluon_fwd.py (16-bit)")
    a = ap.parse_args(argv)
    for names, known in ((a.variants, VARIANTS), (a.sixteen, SIXTEEN)):
        unknown = [n for n in names.split(",") if n not in known]
        if unknown:
            ap.error(f"unknown {unknown}: choose from {sorted(known)}")
    variants = {n: VARIANTS[n] for n in a.variants.split(",")}
    sixteen = {n: (attention_gluon, SIXTEEN[n]) for n in a.sixteen.split(",")}
    if a.baseline:
        old = common.load_file(a.baseline, "gluon_fwd_before").attention_gluon
        sixteen.update({f"before_{n}": (old, SIXTEEN[n]) for n in a.sixteen.split(",")})
    if not device.needs("hopper"):
        return 0
    record = {"environment": common.environment(), "checks": {}, "rows": []}
    record["environment"]["command"] = "python benchmarks/fp8_gluon_probe.py " + \
        " ".join(argv if argv is not None else sys.argv[1:])
    ok = {}
    todo = [(n, dict(fn8=gluon8(*variants[n]))) for n in variants]
    todo += [("g8_pp_s2_hadamard", dict(fn8=gluon8(*VARIANTS["g8_pp_s2"], hadamard=True))),
             ("t8", dict(fn8=triton8))]
    todo += [(n, dict(kw16=kw, fwd16=f)) for n, (f, kw) in sixteen.items()]
    for d in (128, 64):
        for name, kw in todo:
            try:
                bad, worst = checks(name, d, **kw)
            except Exception as e:  # noqa: BLE001 - a variant that does not build is a result
                bad, worst = [f"{type(e).__name__}: {str(e)[:300]}"], None
            record["checks"][f"{name}_d{d}"] = {"failures": bad, "worst": worst}
            ok[(name, d)] = not bad
            print(f"check {name} D={d}: {'ok' if not bad else bad} worst {worst}", flush=True)
    for q, k, v, causal, flops, row in common.forward_points((128, 64)):
        d = row["d"]
        fns = {key: common.sdpa(key, q, k, v, causal) for key in ("flash", "cudnn")}
        for name, (f, kw) in sixteen.items():
            if ok[(name, d)]:
                fns[name] = (lambda f=f, kw=kw: f(q, k, v, is_causal=causal, **kw))
        preps = {}
        for name, (pkw, kw) in variants.items():
            if ok[(name, d)]:
                key = tuple(sorted(pkw.items()))
                if key not in preps:
                    preps[key] = fp8.prepare_fp8(q, k, v, hadamard=True, kernel="gluon",
                                                 **pkw)
                fns[name] = (lambda p=preps[key], kw=kw:
                             attention_gluon_fp8(p, is_causal=causal, **kw))
        if ok[("t8", d)]:
            pt = fp8.prepare_fp8(q, k, v, hadamard=True, kernel="triton")
            fns["t8"] = lambda: fp8.attention_fp8_prepared(pt, is_causal=causal)
        common.time_tflops(row, fns, flops, a.rep)
        for kern in ("gluon", "triton"):
            row[f"quant_ms_{kern}"] = round(common.time_ms(
                lambda: fp8.prepare_fp8(q, k, v, hadamard=True, kernel=kern),
                rep=a.rep), 3)
        best16 = max((k16 for k16 in fns if not k16.startswith(("g8", "t8"))
                      and row.get(k16)), key=lambda k16: row[k16])
        row["best16"] = best16
        for key in fns:
            if key.startswith(("g8", "t8")) and row.get(key):
                row[f"{key}_x_best16"] = round(row[key] / row[best16], 3)
                row[f"{key}_x_cudnn"] = round(row[key] / row["cudnn"], 3)
                quant = row["quant_ms_gluon" if key.startswith("g8") else
                            "quant_ms_triton"]
                row[f"{key}_with_quant"] = round(
                    flops / (flops / (row[key] * 1e9) + quant) / 1e9, 1)
        for key in list(sixteen):
            if row.get(key):
                row[f"{key}_x_cudnn"] = round(row[key] / row["cudnn"], 3)
        record["rows"].append(row)
        print(json.dumps(row), flush=True)
        if a.out:      # after every point, so that a run stopped midway keeps what it timed
            Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
        del q, k, v, preps, fns
        torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
