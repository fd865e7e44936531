"""Probe: lesson 7's dK/dV kernel with ``P^T`` kept in 16 bits once it is made (the
kernel's ``P_16BIT`` switch) against the float32 ``P^T`` it keeps live today, and tile
shapes added to the autotuner's list. Needs a CUDA GPU.

    python benchmarks/dkdv_probe.py --d 128 --out dkdv_probe.json

Why: at head dim 128 every dK/dV shape sits at the register limit and spills; a float32
``P^T`` tile that stays live across ``dP^T = V dO^T`` is 32 registers a thread in the
one-warpgroup 64 x 64 shape. ``dS^T = P^T (dP^T - Delta)`` then reads the rounded
``P^T``, as lesson 8's Gluon backward does; the gradients move by the rounding (checked
against float64 below).

For every point:

* ``single``: the dK/dV kernel alone (the dQ launch skipped) in each ``--dkdv`` shape
  (``MxNxWARPSxSTAGES``, a trailing ``d`` for tiles through descriptors), both ways; the
  row holds the backward's TFLOPS as if that kernel did all of it (the Delta pass
  included), so two rows of one shape compare directly;
* ``tuned``: the whole backward with the dK/dV kernel autotuned over the course's list for
  this GPU both ways, then over that list plus ``--add`` with ``P^T`` in 16 bits; the dQ
  kernel as shipped;
* ``cudnn``: SDPA's cuDNN backward in the same run.

Every variant's dK and dV are checked against the course's backward before they are timed
(relative error 1e-2 at most, else the error goes in the row), and at each point the
course's and the 16-bit variant's gradients of two heads against float64 (``err64``).
B = 4, H = 32, ``N = Nq = Nk``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import triton_attention as ta  # noqa: E402  (before triton)
import triton  # noqa: E402
from course_utils.bench import common  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bwd_desc_probe import (_Skipped, add_point_options, emitter, gpu_ready,  # noqa: E402
                            make_point)


def _shapes(text):
    """``"64x64x4x2d,64x128x8x3"`` -> ``[(64, 64, 4, 2, True), (64, 128, 8, 3, False)]``."""
    out = []
    for s in filter(None, text.split(",")):
        desc = s.endswith("d")
        out.append(tuple(int(x) for x in s.rstrip("d").split("x")) + (desc,))
    return out


def _config(shape, p16):
    m, n, w, s, desc = shape
    return triton.Config({"BLOCK_M1": m, "BLOCK_N1": n, "DESC": desc, "P_16BIT": p16},
                         num_warps=w, num_stages=s)


def _with_p16(cfg, p16):
    return triton.Config({**cfg.kwargs, "P_16BIT": p16}, num_warps=cfg.num_warps,
                         num_stages=cfg.num_stages, pre_hook=cfg.pre_hook)


def _kernel(configs):
    if len(configs) == 1:                      # one shape: no tuning, no pruning
        return triton.autotune(configs=configs, key=ta._KEY)(ta._attn_bwd_dkdv_kernel)
    return ta._tuned(configs, ta._KEY)(ta._attn_bwd_dkdv_kernel)


def _picked(kernel):
    cfg = next(iter(getattr(kernel, "cache", {}).values()), None)
    if cfg is None:
        return None
    kw = cfg.kwargs
    return f"{kw['BLOCK_M1']}x{kw['BLOCK_N1']}x{cfg.num_warps}x{cfg.num_stages}" + \
        ("d" if kw.get("DESC") else "")


def _rel_err(got, want):
    return max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))
               for a, b in zip(got, want))


def _err64(grads, q, k, v, do, causal, heads=2):
    """Largest error of ``grads`` (dq, dk, dv) over the first ``heads`` heads of batch 0
    against a float64 backward, relative to each gradient's largest entry."""
    x = [t[:1, :heads].double().requires_grad_() for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*x, is_causal=causal)
    want = torch.autograd.grad(out, x, do[:1, :heads].double())
    return _rel_err([g[:1, :heads] for g in grads], want)


def main(argv=None):
    ap = argparse.ArgumentParser()
    add_point_options(ap)
    ap.add_argument("--dkdv", default="64x64x4x2d,64x128x8x3d,32x64x4x3d,32x64x4x2d")
    ap.add_argument("--add", default="32x64x4x3d,32x64x4x2d",
                    help="shapes added to the course's list in the second tuned pair")
    ap.add_argument("--skip-single", action="store_true")
    a = ap.parse_args(argv)
    if not gpu_ready():
        return 0
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    saved = (ta._attn_bwd_dkdv, ta._attn_bwd_dq)
    course = ta.bwd_configs("dkdv")
    lists = {"course": course, "course+add": course[:-1] + [_config(s, False) for s in
                                                             _shapes(a.add)] + course[-1:]}
    emit = emitter("dkdv_probe.py", a.out, argv)

    for d in (int(x) for x in a.d.split(",")):
        for n in (int(x) for x in a.n.split(",")):
            for causal in (False, True):
                (q, k, v, do, o, lse), fl, point = make_point(d, n, causal, a.dtype)

                def bwd():
                    return ta.triton_attention_backward(q, k, v, o, lse, do, is_causal=causal)

                ta._attn_bwd_dkdv, ta._attn_bwd_dq = saved
                ref = bwd()
                variants = [] if a.skip_single else \
                    [("single", s, p16) for s in _shapes(a.dkdv) for p16 in (False, True)]
                variants += [("tuned", "course", False), ("tuned", "course", True),
                             ("tuned", "course+add", True)]
                for part, what, p16 in variants:
                    row = dict(point, part=part, p16=p16)
                    if part == "single":
                        row["shape"] = "x".join(map(str, what[:4])) + ("d" if what[4] else "")
                        ta._attn_bwd_dkdv = _kernel([_config(what, p16)])
                        ta._attn_bwd_dq = _Skipped()
                    else:
                        row["list"] = what
                        ta._attn_bwd_dkdv = _kernel([_with_p16(c, p16) for c in lists[what]])
                        ta._attn_bwd_dq = saved[1]
                    try:
                        got = bwd()
                        row["rel_err"] = _rel_err(got[1:], ref[1:])
                        if row["rel_err"] > 1e-2:
                            raise AssertionError(f"rel_err {row['rel_err']:.3g}")
                        if part == "tuned" and what == "course":
                            row["err64"] = _err64(got, q, k, v, do, causal)
                        t = common.time_ms(bwd, rep=a.rep, settle_ms=a.settle)
                        row["tflops"] = round(fl / t / 1e9, 1)
                        row["ms"] = round(t, 4)
                        if part == "tuned":
                            row["picked_dkdv"] = _picked(ta._attn_bwd_dkdv)
                    except Exception as e:  # noqa: BLE001 - a failure is a result
                        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    emit(row)
                ta._attn_bwd_dkdv, ta._attn_bwd_dq = saved
                qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                    t = common.time_ms(lambda: torch.autograd.grad(out, (qq, kk, vv), do,
                                                                   retain_graph=True),
                                       rep=a.rep, settle_ms=a.settle)
                emit(dict(point, part="cudnn", tflops=round(fl / t / 1e9, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
