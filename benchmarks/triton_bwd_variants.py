"""Probe: lesson 7's autotuned backward against other versions of its module, timed
point by point in one run. Needs a CUDA GPU.

    python benchmarks/triton_bwd_variants.py --variants OLD.py[,NEW.py...] --d 128 \
        --dtype bf16 --out triton_bwd_variants.json

Each file of ``--variants`` is a copy of ``course_utils/triton_attention.py`` with one
change; it is loaded as a module of its own (its kernels compile and autotune apart from
the course's) and named by its file's stem. At every point (B = 4, H = 32, ``N = Nq =
Nk``) the course's forward makes ``o`` and the LSE once; then the course's backward and
each variant's are timed in turns, ``--rounds`` times, each settled first. Every
variant's gradients are compared with the course's before timing (largest error relative
to the largest entry, and whether they are equal bit for bit).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import triton_attention as ta  # noqa: E402  (before triton)
from course_utils.bench import common  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bwd_desc_probe import (_rel_err, add_point_options, emitter, gpu_ready,  # noqa: E402
                            make_point)
from gluon_bwd_probe import _module_from  # noqa: E402  (a module file loaded apart)


def _picked(mod):
    """The tile shapes the autotuner took in the module's last backward: dK/dV, then dQ
    (block sizes, warps, stages, D for descriptors)."""
    out = []
    for kernel in (mod._attn_bwd_dkdv, mod._attn_bwd_dq):
        c = getattr(kernel, "best_config", None)
        if c is None:
            out.append(None)
            continue
        kw = c.kwargs
        out.append("x".join(str(kw[k]) for k in kw if k.startswith("BLOCK"))
                   + f"w{c.num_warps}s{c.num_stages}" + ("D" if kw.get("DESC") else ""))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    add_point_options(ap)
    ap.add_argument("--variants", required=True, help="comma-separated module files")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--unaligned", action="store_true",
                    help="inputs one element off a 16-byte boundary: the pointer path")
    a = ap.parse_args(argv)
    if not gpu_ready():
        return 0
    mods = {"course": ta}
    for path in a.variants.split(","):
        mods[Path(path).stem] = _module_from(path)
    emit = emitter("triton_bwd_variants.py", a.out, argv)
    for dtype in a.dtype.split(","):
        for d in (int(x) for x in a.d.split(",")):
            for n in (int(x) for x in a.n.split(",")):
                for causal in (False, True):
                    (q, k, v, do, o, lse), fl, point = make_point(d, n, causal, dtype,
                                                                  a.unaligned)
                    row = dict(point)
                    fns = {name: (lambda m=m: m.triton_attention_backward(
                        q, k, v, o, lse, do, is_causal=causal)) for name, m in mods.items()}
                    ref = fns["course"]()
                    for name, fn in fns.items():
                        if name != "course":
                            got = fn()
                            row[f"{name}_rel_err"] = _rel_err(got, ref)
                            row[f"{name}_same"] = all(map(torch.equal, got, ref))
                        row[f"{name}_picked"] = _picked(mods[name])
                    for r in range(a.rounds):
                        for name, fn in fns.items():
                            t = common.time_ms(fn, rep=a.rep, settle_ms=a.settle)
                            row[f"{name}_{r}"] = round(fl / t / 1e9, 1)
                    emit(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
