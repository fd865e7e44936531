"""Probe: the order in which lesson 7's causal dQ programs start. Needs a CUDA GPU.

    python benchmarks/dq_order_probe.py --d 128 --out dq_order_probe.json

With a causal mask the query tiles of one head carry unequal work: the last tile sees
every key, the first one tile of keys. The forward starts the longest tiles first (the
short ones then fill the end of the grid); the dQ kernel's ``LONGEST_FIRST`` switch does
the same. For every causal point this times, each order against the other:

* ``single``: the dQ kernel alone (the dK/dV launch skipped) in each ``--dq`` tile shape;
  the row holds the backward's TFLOPS as if that kernel did all of it (the Delta pass
  included), so two rows of one shape compare directly;
* ``tuned``: the whole three-kernel backward, the dQ kernel autotuned over the ``--dq``
  shapes in one order, the dK/dV kernel as the course ships it.

The dQ tiles of one head are independent, so both orders must give the same gradients
bit for bit; every variant is checked against the course's backward before it is timed
(a mismatch goes in the row instead of a speed). B = 4, H = 32, ``N = Nq = Nk``.
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
from bwd_desc_probe import (_Skipped, _shapes, add_point_options, emitter,  # noqa: E402
                            gpu_ready, make_point)


def _dq_kernel(shapes, longest_first):
    cfgs = [triton.Config({"BLOCK_M2": m, "BLOCK_N2": n, "LONGEST_FIRST": longest_first},
                          num_warps=w, num_stages=s) for m, n, w, s in shapes]
    if len(cfgs) == 1:                          # one shape: no tuning, no pruning
        return triton.autotune(configs=cfgs, key=ta._KEY)(ta._attn_bwd_dq_kernel)
    return ta._tuned(cfgs, ta._KEY)(ta._attn_bwd_dq_kernel)


def _picked(kernel):
    cfg = next(iter(getattr(kernel, "cache", {}).values()), None)
    if cfg is None:
        return None
    return f"{cfg.kwargs['BLOCK_M2']}x{cfg.kwargs['BLOCK_N2']}x{cfg.num_warps}x{cfg.num_stages}"


def main(argv=None):
    ap = argparse.ArgumentParser()
    add_point_options(ap)
    ap.add_argument("--dq", default=None,
                    help="tile shapes MxNxWARPSxSTAGES, comma-separated (default: the "
                         "course's dQ list for this GPU, less its small shape for wide rows)")
    a = ap.parse_args(argv)
    if not gpu_ready():
        return 0
    if a.dq:
        shapes = _shapes(a.dq)
    else:
        shapes = [(c.kwargs["BLOCK_M2"], c.kwargs["BLOCK_N2"], c.num_warps, c.num_stages)
                  for c in ta.bwd_configs("dq") if not ta._is_small(c)]
    saved = (ta._attn_bwd_dkdv, ta._attn_bwd_dq)
    emit = emitter("dq_order_probe.py", a.out, argv)

    for d in (int(x) for x in a.d.split(",")):
        for n in (int(x) for x in a.n.split(",")):
            (q, k, v, do, o, lse), fl, point = make_point(d, n, True, a.dtype)

            def bwd():
                return ta.triton_attention_backward(q, k, v, o, lse, do, is_causal=True)

            ta._attn_bwd_dkdv, ta._attn_bwd_dq = saved
            ref = bwd()
            variants = [("single", s, lf) for s in shapes for lf in (False, True)]
            variants += [("tuned", None, lf) for lf in (False, True)]
            for part, shape, lf in variants:
                row = dict(point, part=part, longest_first=lf)
                if part == "single":
                    row["shape"] = "x".join(map(str, shape))
                    ta._attn_bwd_dkdv = _Skipped()
                    ta._attn_bwd_dq = _dq_kernel([shape], lf)
                else:
                    ta._attn_bwd_dkdv = saved[0]
                    ta._attn_bwd_dq = _dq_kernel(shapes, lf)
                try:
                    got = bwd()
                    sel = (0,) if part == "single" else (0, 1, 2)
                    if not all(torch.equal(got[i], ref[i]) for i in sel):
                        raise AssertionError("gradients differ from the course's backward")
                    t = common.time_ms(bwd, rep=a.rep, settle_ms=a.settle)
                    row["tflops"] = round(fl / t / 1e9, 1)
                    row["ms"] = round(t, 4)
                    if part == "tuned":
                        row["picked_dq"] = _picked(ta._attn_bwd_dq)
                except Exception as e:  # noqa: BLE001 - a failure is a result
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                emit(row)
            ta._attn_bwd_dkdv, ta._attn_bwd_dq = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
