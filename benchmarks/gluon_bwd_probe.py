"""The Gluon backward (``course_utils.hopper.gluon_bwd``) on an sm90 GPU: first checked,
then timed against lesson 7's Triton backward and SDPA's flash and cuDNN back ends in one
run.

    python benchmarks/gluon_bwd_probe.py [--check-only] [--d 64,128] [--n 4096,16384]
                                         [--dtype fp16] [--rep 30] [--out FILE]
    python benchmarks/gluon_bwd_probe.py --variants 2 [--baseline OLD.py,...]
                                         [--dtype fp16,bf16] [--settle MS] [--out FILE]

Check: gradients of ragged, GQA and masked cases (both causal alignments, rows that see
no key) against float64 autograd, next to the Triton backward's error on the same case.
Timing (B = 4, H = 32): the backward alone (``bwd``: every provider's forward run once,
then only its gradient timed) and forward + backward (``fwd+bwd``: the Gluon forward
with the Gluon backward, the Triton pair, SDPA's), TFLOPS by the papers' count.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course_utils import device  # noqa: E402
from course_utils.bench import common  # noqa: E402
from course_utils.contract import causal_mask  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# (B, Hq, Hkv, Nq, Nk, D): tile multiples, ragged lengths both ways, one row, GQA and MQA
CASES = [(2, 4, 4, 512, 512, 128), (2, 4, 2, 300, 129, 128), (1, 4, 1, 129, 300, 64),
         (2, 8, 2, 1000, 1000, 64), (1, 2, 2, 1, 77, 128), (1, 4, 4, 384, 128, 64),
         (1, 4, 2, 256, 640, 128), (2, 2, 2, 2048, 2048, 128)]


def scores(q, k, alignment):
    """``Q K^T / sqrt(D)`` in float64, K repeated over its query heads, ``-inf`` where the
    causal mask of ``alignment`` (None: no mask) hides a key."""
    g = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if alignment is not None:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], alignment).to(s.device),
                          float("-inf"))
    return s


def forward(q, k, v, alignment):
    """The forward's ``o`` (in q's dtype) and natural-log LSE (float32) from float64 scores,
    K and V repeated over their query heads; a row that sees no key gives ``o = 0``."""
    s = scores(q, k, alignment)
    g = q.shape[1] // k.shape[1]
    o = torch.softmax(s, -1).nan_to_num(0.0) @ v.double().repeat_interleave(g, 1)
    return o.to(q.dtype), torch.logsumexp(s, -1).float()


def reference(q, k, v, do, alignment):
    """Attention's output and the gradients ``(dq, dk, dv)`` in float64 autograd, K and V
    repeated over their query heads, ``alignment`` None or a causal alignment; a row that
    sees no key gives 0."""
    g = q.shape[1] // k.shape[1]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s = scores(leaves[0], leaves[1], alignment)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ leaves[2].repeat_interleave(g, 1)
    return o, torch.autograd.grad(o, leaves, do.double())


def rel(a, b):
    """``|a - b| / |b|`` (Frobenius norms), absolute where ``b`` is about 0 (one query
    that sees one key has softmax 1 whatever its score: dq = 0)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1.0))


def check(dtype):
    from course_utils.hopper.gluon_bwd import attention_gluon_backward
    from course_utils.triton_attention import triton_attention_backward, triton_attention_forward
    rows, worst = [], 0.0
    for i, (b, hq, hkv, nq, nk, d) in enumerate(CASES):
        gen = torch.Generator(device=device.DEVICE).manual_seed(i)
        q = torch.randn(b, hq, nq, d, device=device.DEVICE, dtype=dtype, generator=gen)
        k, v = (torch.randn(b, hkv, nk, d, device=device.DEVICE, dtype=dtype, generator=gen)
                for _ in range(2))
        do = torch.randn(b, hq, nq, d, device=device.DEVICE, dtype=dtype, generator=gen)
        for alignment in (None, "causal_upper_left", "causal_lower_right"):
            opts = dict(is_causal=alignment is not None, alignment=alignment,
                        enable_gqa=hkv != hq)
            o, lse = triton_attention_forward(q, k, v, **opts)
            _, refs = reference(q, k, v, do, alignment)
            ours = attention_gluon_backward(q, k, v, o, lse, do, **opts)
            tri = triton_attention_backward(q, k, v, o, lse, do, **opts)
            row = {"case": [b, hq, hkv, nq, nk, d], "alignment": alignment,
                   "dtype": str(dtype).replace("torch.", "")}
            for name, x, t, r in zip(("dq", "dk", "dv"), ours, tri, refs):
                row[name] = rel(x, r)
                row[f"{name}_triton"] = rel(t, r)
                row[f"{name}_finite"] = bool(torch.isfinite(x).all())
                worst = max(worst, row[name] / max(row[f"{name}_triton"], 1e-4))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows, worst


def _providers(mode, q, k, v, do, causal):
    from course_utils.hopper.gluon_bwd import attention_gluon_backward, gluon_attention
    from course_utils.triton_attention import (triton_attention, triton_attention_backward,
                                               triton_attention_forward)
    out = {}
    if mode == "fwd+bwd":
        def grad_of(f):
            return lambda: torch.autograd.grad(f(), (q, k, v), do)
        out["gluon"] = grad_of(lambda: gluon_attention(q, k, v, is_causal=causal))
        out["triton"] = grad_of(lambda: triton_attention(q, k, v, is_causal=causal))
        for be in ("flash", "cudnn"):
            out[be] = grad_of(common.sdpa(be, q, k, v, causal))
        return out
    o, lse = triton_attention_forward(q, k, v, is_causal=causal)
    out["gluon"] = lambda: attention_gluon_backward(q, k, v, o, lse, do, is_causal=causal)
    out["triton"] = lambda: triton_attention_backward(q, k, v, o, lse, do, is_causal=causal)
    for be in ("flash", "cudnn"):
        ob = common.sdpa(be, q, k, v, causal)()
        out[be] = (lambda ob=ob: torch.autograd.grad(ob, (q, k, v), do, retain_graph=True))
    return out


def timing(args):
    rows = []
    for dname in args.dtype.split(","):
        dtype = DTYPES[dname]
        for d in (int(x) for x in args.d.split(",")):
            for n in (int(x) for x in args.n.split(",")):
                for causal in (False, True):
                    gen = torch.Generator(device=device.DEVICE).manual_seed(n + d)
                    q, k, v = (torch.randn(4, 32, n, d, device=device.DEVICE, dtype=dtype,
                                           generator=gen).requires_grad_() for _ in range(3))
                    do = torch.randn(4, 32, n, d, device=device.DEVICE, dtype=dtype,
                                     generator=gen)
                    for mode in args.modes.split(","):
                        row = {"mode": mode, "d": d, "n": n, "causal": causal, "dtype": dname}
                        flops = common.attention_flops(4, 32, n, n, d, causal, mode)
                        for name, fn in _providers(mode, q, k, v, do, causal).items():
                            try:
                                ms = common.time_ms(fn, warmup=10, rep=args.rep)
                                row[name] = flops / ms * 1e-9
                            except Exception as e:  # noqa: BLE001 - report, go on
                                row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:200]
                        for name in ("gluon", "triton"):
                            if row.get(name) and row.get("cudnn"):
                                row[f"{name}_x_cudnn"] = row[name] / row["cudnn"]
                        rows.append(row)
                        print(json.dumps({k: (round(x, 3) if isinstance(x, float) else x)
                                          for k, x in row.items()}), flush=True)
                        torch.cuda.empty_cache()
    return rows


def _module_from(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"variant_{Path(path).stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def variants(args):
    """The backward alone with each ``stages`` of ``--variants`` (and the backward of
    every file of ``--baseline FILE[,FILE...]``, other versions of the module, each named
    by its file's stem), next to cuDNN's backward of the same point, in one run; each
    point in every dtype of ``--dtype`` (comma-separated) in turn; ``NAME_same_dkdv``:
    whether a version's dK and dV equal the first version's bit for bit."""
    from course_utils.hopper import gluon_bwd
    from course_utils.triton_attention import triton_attention_forward
    kernels = {f"stages{x}": (gluon_bwd, int(x)) for x in args.variants.split(",")}
    for path in (args.baseline.split(",") if args.baseline else []):
        kernels[Path(path).stem] = (_module_from(path), 2)
    rows = []
    points = [(d, n, causal, dname) for d in (int(x) for x in args.d.split(","))
              for n in (int(x) for x in args.n.split(",")) for causal in (False, True)
              for dname in args.dtype.split(",")]
    for d, n, causal, dname in points:
        gen = torch.Generator(device=device.DEVICE).manual_seed(n + d)
        q, k, v = (torch.randn(4, 32, n, d, device=device.DEVICE, dtype=DTYPES[dname],
                               generator=gen).requires_grad_() for _ in range(3))
        do = torch.randn(4, 32, n, d, device=device.DEVICE, dtype=DTYPES[dname], generator=gen)
        flops = common.attention_flops(4, 32, n, n, d, causal, "bwd")
        row = {"d": d, "n": n, "causal": causal, "dtype": dname}
        ob = common.sdpa("cudnn", q, k, v, causal)()
        row["cudnn"] = flops / common.time_ms(
            lambda: torch.autograd.grad(ob, (q, k, v), do, retain_graph=True),
            warmup=10, rep=args.rep, settle_ms=args.settle) * 1e-9
        o, lse = triton_attention_forward(q, k, v, is_causal=causal)
        first = None
        for name, (mod, stages) in kernels.items():
            try:
                ms = common.time_ms(lambda: mod.attention_gluon_backward(
                    q, k, v, o, lse, do, is_causal=causal, stages=stages),
                    warmup=10, rep=args.rep, settle_ms=args.settle)
                row[name] = flops / ms * 1e-9
                # dK and dV are reproducible (dQ's float32 adds come in varying order):
                # whether each version's equal the first version's bit for bit
                dkdv = mod.attention_gluon_backward(q, k, v, o, lse, do, is_causal=causal,
                                                    stages=stages)[1:]
                if first is None:
                    first = dkdv
                else:
                    row[f"{name}_same_dkdv"] = all(map(torch.equal, dkdv, first))
            except Exception as e:  # noqa: BLE001 - report, go on
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
        print(json.dumps({k: (round(x, 1) if isinstance(x, float) else x)
                          for k, x in row.items()}), flush=True)
        del ob
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--n", default="4096,16384")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--modes", default="bwd,fwd+bwd")
    ap.add_argument("--rep", type=int, default=30)
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default=None,
                    help="time only the backward with these stages, e.g. 2,3 (no check)")
    common.add_settle_option(ap, default=0.0)
    ap.add_argument("--baseline", default=None,
                    help="with --variants: also time these files' attention_gluon_backward "
                         "(comma-separated; each named by its file name)")
    args = ap.parse_args(argv)
    if not device.IS_HOPPER:
        raise SystemExit("needs an sm90 GPU")
    result = {"environment": device.describe(), "command": " ".join(sys.argv)}
    if args.variants:
        result["variants"] = variants(args)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return 0
    result["check"], worst = check(torch.float16)
    print(f"worst error against the Triton backward's on the same case: {worst:.2f}x")
    if not args.check_only:
        result["rows"] = timing(args)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
