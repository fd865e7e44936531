"""Another version of lesson 8's Gluon backward (a copy of ``course_utils/hopper/gluon_bwd.py``
with a change) against the course's, on an sm90 GPU: the same gradients? dK and dV must be
equal bit for bit (both add them in the same order), dQ within float32 rounding of the
course's (the TMA unit's adds come in a varying order). Cases: ragged lengths both ways,
GQA, MQA, both causal alignments, a single query, odd and even numbers of query tiles.

    python benchmarks/gluon_bwd_compare.py OTHER.py [--d 64,128] [--dtype fp16,bf16]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from course_utils import device  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gluon_bwd_probe import DTYPES, _module_from, forward  # noqa: E402

# (B, Hq, Hkv, Nq, Nk): query tiles of 64 rows: 1, 2, 3, 5, 16 ...
SHAPES = [(1, 2, 2, 1, 77), (1, 4, 2, 64, 64), (2, 4, 4, 130, 300), (1, 4, 1, 300, 129),
          (2, 8, 2, 1000, 1000), (1, 2, 2, 1024, 2048)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--dtype", default="fp16,bf16")
    args = ap.parse_args(argv)
    if not device.IS_HOPPER:
        raise SystemExit("needs an sm90 GPU")
    from course_utils.hopper import gluon_bwd
    other = _module_from(args.other)
    bad = 0
    for d in (int(x) for x in args.d.split(",")):
        for dname in args.dtype.split(","):
            for n, (b, hq, hkv, nq, nk) in enumerate(SHAPES):
                gen = torch.Generator(device=device.DEVICE).manual_seed(n)
                q = torch.randn(b, hq, nq, d, device=device.DEVICE, dtype=DTYPES[dname],
                                generator=gen)
                k, v = (torch.randn(b, hkv, nk, d, device=device.DEVICE, dtype=DTYPES[dname],
                                    generator=gen) for _ in range(2))
                do = torch.randn_like(q)
                for alignment in (None, "causal_upper_left", "causal_lower_right"):
                    opts = dict(is_causal=alignment is not None, alignment=alignment,
                                enable_gqa=hq != hkv)
                    o, lse = forward(q, k, v, alignment)    # float64, no autotuning
                    ours = gluon_bwd.attention_gluon_backward(q, k, v, o, lse, do, **opts)
                    theirs = other.attention_gluon_backward(q, k, v, o, lse, do, **opts)
                    same = all(torch.equal(a, x) for a, x in zip(ours[1:], theirs[1:]))
                    dq = float((ours[0].float() - theirs[0].float()).norm()
                               / ours[0].float().norm().clamp_min(1e-6))
                    ok = same and dq < 1e-2 and all(torch.isfinite(x).all() for x in theirs)
                    bad += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} D={d} {dname} {(b, hq, hkv, nq, nk)} "
                          f"{alignment}: dK, dV equal {same}, dQ relative difference {dq:.1e}",
                          flush=True)
    print(f"{'all the same' if not bad else f'{bad} cases differ'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
