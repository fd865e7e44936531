"""Probe: lesson 7's backward kernels with their query (dK/dV kernel) or key/value (dQ
kernel) tiles read through tensor descriptors (the kernels' ``DESC`` switch, sm90) against
the same tile shapes with pointer loads. Needs a CUDA GPU.

    python benchmarks/bwd_desc_probe.py --d 128 --out bwd_desc_probe.json

Part 1, one kernel at a time: every ``--dkdv`` shape runs the dK/dV kernel alone (the dQ
launch skipped) and every ``--dq`` shape the dQ kernel alone, each with pointer loads and
with descriptors; the row holds the backward's TFLOPS as if that kernel did all of it
(the Delta pass included), so two rows of one kernel compare directly. Every variant's
gradients are checked against the autotuned pointer backward first (the error goes in the
row instead of a speed).

Part 2, the whole backward autotuned: the three-kernel design over the ``--dkdv`` and
``--dq`` shapes with pointer loads only, then with the descriptor variants of the same
shapes added (``--designs`` adds the fused atomic-dQ design the same two ways), beside
SDPA's cuDNN backward, with the autotuner's picks. B = 4, H = 32, ``N = Nq = Nk``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import triton_attention as ta  # noqa: E402  (before triton)
import triton  # noqa: E402
from course_utils.bench import common  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
BLOCKS = {"dkdv": ("BLOCK_M1", "BLOCK_N1"), "atomic_dq": ("BLOCK_M1", "BLOCK_N1"),
          "dq": ("BLOCK_M2", "BLOCK_N2")}
RAW = {"dkdv": ta._attn_bwd_dkdv_kernel, "atomic_dq": ta._attn_bwd_dkdv_kernel,
       "dq": ta._attn_bwd_dq_kernel}
SLOT = {"dkdv": "_attn_bwd_dkdv", "atomic_dq": "_attn_bwd_atomic", "dq": "_attn_bwd_dq"}


def _shapes(text):
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",") if s]


def _config(kind, shape, desc):
    """One tile shape of ``kind``. The dQ kernel's ``DESC`` is a launch argument
    (``_dq_desc``), not a tile shape's: see :func:`_dq_reads`."""
    m, n, w, s = shape
    hook = ta._zero_dq if kind == "atomic_dq" else None
    extra = {} if kind == "dq" else {"DESC": desc}
    return triton.Config({BLOCKS[kind][0]: m, BLOCKS[kind][1]: n, **extra}, num_warps=w,
                         num_stages=s, pre_hook=hook)


_DQ_DESC = ta._dq_desc


def _dq_reads(desc):
    """The dQ kernel reads K and V through descriptors (where the backward's rule allows)
    when ``desc``, with pointers otherwise."""
    ta._dq_desc = _DQ_DESC if desc else (lambda ok, row_bytes: False)


def _kernel(kind, configs):
    if len(configs) == 1:                      # one shape: no tuning, no pruning
        return triton.autotune(configs=configs, key=ta._KEY)(RAW[kind])
    return ta._tuned(configs, ta._KEY)(RAW[kind])


class _Skipped:
    """Stands in for a kernel the row does not time: its launch does nothing."""
    cache = {}

    def __getitem__(self, grid):
        return lambda *a, **k: None


def _picked(kernel):
    cfg = next(iter(getattr(kernel, "cache", {}).values()), None)
    if cfg is None:
        return None
    kw = dict(cfg.kwargs)
    desc = kw.pop("DESC", False)
    return "x".join(str(v) for v in kw.values()) + f"x{cfg.num_warps}x{cfg.num_stages}" \
        + ("+desc" if desc else "")


def emitter(script, out, argv):
    """A function that prints each result row as JSON and, given ``out``, rewrites the
    whole record there (the rows so far, the environment, the command) after every row,
    so a run cut short keeps what it measured."""
    rows = []

    def emit(row):
        print(json.dumps(row), flush=True)
        rows.append(row)
        if out:
            rec = {"environment": common.environment(), "rows": rows}
            rec["environment"]["command"] = f"python benchmarks/{script} " + \
                " ".join(sys.argv[1:] if argv is None else argv)
            Path(out).write_text(json.dumps(rec, indent=1) + "\n")
    return emit


def add_point_options(ap):
    """The options every backward probe shares: where the JSON goes, the head dims,
    lengths and dtype of its points, the timed milliseconds and the settle time."""
    ap.add_argument("--out", default=None)
    ap.add_argument("--d", default="128")
    ap.add_argument("--n", default="4096,16384")
    ap.add_argument("--dtype", default="fp16", choices=tuple(DTYPES))
    ap.add_argument("--rep", type=int, default=60)
    common.add_settle_option(ap, default=300.0)


def gpu_ready():
    """False (with a line saying why) without a CUDA GPU; otherwise let the kernels make
    their tensor descriptors on the device and return True."""
    if not torch.cuda.is_available():
        print("This probe needs a CUDA GPU.")
        return False
    triton.set_allocator(ta._scratch)
    return True


def make_point(d, n, causal, dtype, unaligned=False):
    """One point's inputs on the GPU (B = 4, H = 32, ``N = Nq = Nk``, seeded by ``n + d``):
    ``q, k, v, do``, the course's forward ``o, lse``, the backward's FLOPs and the point's
    fields for a result row. ``unaligned``: each input starts one element past a 16-byte
    boundary (a contiguous view of a longer buffer), so no kernel may read it through
    tensor descriptors and the backward takes its pointer path."""
    B, H = 4, 32
    g = torch.Generator(device="cuda").manual_seed(n + d)

    def one():
        if not unaligned:
            return torch.randn(B, H, n, d, device="cuda", dtype=DTYPES[dtype], generator=g)
        flat = torch.randn(B * H * n * d + 1, device="cuda", dtype=DTYPES[dtype], generator=g)
        return flat[1:].view(B, H, n, d)

    q, k, v, do = (one() for _ in range(4))
    if unaligned:
        assert not (ta._desc_ok(q, do) or ta._desc_ok(k, v))
    o, lse = ta.triton_attention_forward(q, k, v, is_causal=causal)
    fl = common.attention_flops(B, H, n, n, d, causal, "bwd")
    return (q, k, v, do, o, lse), fl, {"d": d, "n": n, "causal": causal, "dtype": dtype,
                                       "unaligned": unaligned}


def _rel_err(got, want):
    return max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))
               for a, b in zip(got, want))


def main(argv=None):
    ap = argparse.ArgumentParser()
    add_point_options(ap)
    ap.add_argument("--dkdv", default="64x128x8x2,64x128x8x3,32x128x8x2,32x128x8x3,"
                                      "32x128x4x3,32x64x4x2")
    ap.add_argument("--dq", default="128x64x8x2,128x64x8x3,128x32x4x3,64x64x4x3")
    ap.add_argument("--designs", default="three_kernels",
                    help="part 2: three_kernels and/or atomic_dq, comma-separated")
    ap.add_argument("--skip-single", action="store_true", help="part 2 only")
    a = ap.parse_args(argv)
    if not gpu_ready():
        return 0
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    saved = {k: getattr(ta, v) for k, v in SLOT.items()}
    shapes = {"dkdv": _shapes(a.dkdv), "atomic_dq": _shapes(a.dkdv), "dq": _shapes(a.dq)}
    emit = emitter("bwd_desc_probe.py", a.out, argv)

    for d in (int(x) for x in a.d.split(",")):
        for n in (int(x) for x in a.n.split(",")):
            for causal in (False, True):
                (q, k, v, do, o, lse), fl, point = make_point(d, n, causal, a.dtype)

                def bwd(design="three_kernels"):
                    return ta.triton_attention_backward(q, k, v, o, lse, do, is_causal=causal,
                                                        bwd=design)

                for kind, cfgs in saved.items():
                    setattr(ta, SLOT[kind], cfgs)
                ptr = {kind: _kernel(kind, [_config(kind, s, False) for s in shapes[kind]])
                       for kind in ("dkdv", "dq")}
                ta._attn_bwd_dkdv, ta._attn_bwd_dq = ptr["dkdv"], ptr["dq"]
                _dq_reads(False)
                ref = bwd()
                if not a.skip_single:
                    for kind, sel in (("dkdv", (1, 2)), ("dq", (0,))):
                        for shape in shapes[kind]:
                            for desc in (False, True):
                                row = dict(point, part="single", kernel=kind,
                                           shape="x".join(map(str, shape)), desc=desc)
                                one = _kernel(kind, [_config(kind, shape, desc)])
                                _dq_reads(desc)
                                ta._attn_bwd_dkdv = one if kind == "dkdv" else _Skipped()
                                ta._attn_bwd_dq = one if kind == "dq" else _Skipped()
                                try:
                                    got = bwd()
                                    row["rel_err"] = _rel_err([got[i] for i in sel],
                                                              [ref[i] for i in sel])
                                    if row["rel_err"] > 1e-2:
                                        raise AssertionError(f"rel_err {row['rel_err']:.3g}")
                                    t = common.time_ms(bwd, rep=a.rep, settle_ms=a.settle)
                                    row["tflops"] = round(fl / t / 1e9, 1)
                                    row["ms"] = round(t, 4)
                                except Exception as e:  # noqa: BLE001 - a failure is a result
                                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                                emit(row)
                for design in a.designs.split(","):
                    kinds = ("dkdv", "dq") if design == "three_kernels" else ("atomic_dq",)
                    for desc in (False, True):
                        row = dict(point, part="tuned", design=design, desc=desc)
                        for kind in kinds:
                            cfgs = [_config(kind, s, False) for s in shapes[kind]]
                            if desc and kind != "dq":
                                cfgs += [_config(kind, s, True) for s in shapes[kind]]
                            setattr(ta, SLOT[kind], _kernel(kind, cfgs))
                        _dq_reads(desc)
                        try:
                            got = bwd(design)
                            row["rel_err"] = _rel_err(got, ref)
                            if row["rel_err"] > 1e-2:
                                raise AssertionError(f"rel_err {row['rel_err']:.3g}")
                            t = common.time_ms(lambda: bwd(design), rep=a.rep,
                                               settle_ms=a.settle)
                            row["tflops"] = round(fl / t / 1e9, 1)
                            for kind in kinds:
                                row[f"picked_{kind}"] = _picked(getattr(ta, SLOT[kind]))
                        except Exception as e:  # noqa: BLE001
                            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                        emit(row)
                for kind, cfgs in saved.items():
                    setattr(ta, SLOT[kind], cfgs)
                _dq_reads(True)
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
