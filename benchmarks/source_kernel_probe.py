"""Lesson 6's forward against the forward kernel of the course's source material, in one
run, beside SDPA's flash and cuDNN back ends.

    python benchmarks/source_kernel_probe.py --source PATH [--ws on|off|both] [--d 128,64]
        [--tma-configs 128x64x4x2,...]   (lesson 8's TMA forward in these tiles too)

The source material is a notebook printed as text (code cells among prose and outputs),
so this file does not carry its kernel: ``--source`` names a copy of that text, and the
three ``@triton.jit`` functions of its forward (``_maybe_make_tensor_desc``,
``_attn_fwd_inner``, ``_attn_fwd``) are cut out of it by name, compiled and launched the
way its host code does on an sm90 GPU: K, Q, V, O through tensor descriptors (made on the
device when warp specialisation is on, on the host otherwise), one program per 128 or 64
query rows, autotuned over the source's configuration space (query tiles of 64 and 128
rows, key tiles of 32, 64 and 128, 2-4 stages, 4 or 8 warps, less the 8-warp small tiles
it drops on Hopper) with the source's autotune key (length, head dim, FP8, warp
specialisation: the causal flag is not in it, so a causal call reuses the non-causal
call's pick at the same length; the non-causal point is measured first). The source's
kernel writes float16 only, and needs N to be a multiple of its tile: the probe measures
float16 at N = 4k and 16k.

Every output is compared with SDPA's before it is timed (relative error < 1e-2, else the
row keeps the error instead of a speed); every provider runs back to back for
``--settle`` milliseconds first. B = 4, H = 32.
"""
from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils.bench import common  # noqa: E402

NEEDED = ("_maybe_make_tensor_desc", "_attn_fwd_inner", "_attn_fwd")


def cut_function(text: str, name: str) -> str:
    """The source of the top-level function ``name`` with its ``@triton.jit`` line: the
    ``def`` line, the signature up to the line that closes it, then every line that is
    blank or indented, up to the first line at column 0."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith(f"def {name}(")]
    if len(starts) != 1:
        raise ValueError(f"expected one 'def {name}(' in the source, found {len(starts)}")
    i = starts[0]
    if not lines[i - 1].strip() == "@triton.jit":
        raise ValueError(f"{name} is not a @triton.jit function in the source")
    out = [lines[i - 1], lines[i]]
    j = i + 1
    if not lines[i].rstrip().endswith(":"):          # a signature over several lines
        while not lines[j].startswith(")"):
            out.append(lines[j])
            j += 1
        out.append(lines[j])
        j += 1
    while j < len(lines) and (not lines[j].strip() or lines[j][0] in " \t"):
        out.append(lines[j])
        j += 1
    return "\n".join(out).rstrip() + "\n"


def load_source_kernel(path: str):
    """The source's forward kernel, compiled from the functions cut out of ``path``."""
    import triton
    import triton.language as tl
    text = Path(path).read_text(encoding="utf-8")
    code = "\n\n".join(cut_function(text, n) for n in NEEDED)
    mod = types.ModuleType("source_fwd")
    mod.__dict__.update(triton=triton, tl=tl)
    # triton.jit reads a function's text through inspect, which needs a file behind it
    where = Path(path).with_name("source_fwd_cut.py")
    where.write_text("import triton\nimport triton.language as tl\n\n\n" + code)
    mod.__file__ = str(where)
    exec(compile(where.read_text(), str(where), "exec"), mod.__dict__)  # noqa: S102
    return mod


def source_configs():
    """The source's configuration space on an sm90 GPU, with its Hopper filter."""
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    def set_blocks(nargs):
        bm, bn, d = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["HEAD_DIM"]
        for name, shape in (("desc_q", [bm, d]), ("desc_k", [bn, d]), ("desc_v", [bn, d]),
                            ("desc_o", [bm, d])):
            if isinstance(nargs[name], TensorDescriptor):
                nargs[name].block_shape = shape

    out = []
    for bm in (64, 128):
        for bn in (32, 64, 128):
            for stages in (2, 3, 4):
                for warps in (4, 8):
                    if warps == 8 and bm * bn < 128 * 128:
                        continue
                    out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages,
                                             num_warps=warps, pre_hook=set_blocks))
    return out


def source_forward(mod):
    """A launcher for the source's kernel: ``run(q, k, v, causal, ws) -> o``."""
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    def fits(configs, named_args, **kwargs):
        return [c for c in configs if c.kwargs["BLOCK_M"] <= kwargs["N_CTX"]]

    tuned = triton.autotune(configs=source_configs(),
                            key=["N_CTX", "HEAD_DIM", "FP8_OUTPUT", "warp_specialize"],
                            prune_configs_by={"early_config_prune": fits})(mod._attn_fwd)
    from course_utils.triton_attention import _scratch
    triton.set_allocator(_scratch)            # the kernel makes descriptors on the device

    def run(q, k, v, causal, ws):
        b, h, n, d = q.shape
        o = torch.empty_like(q)
        m = torch.empty((b, h, n), device=q.device, dtype=torch.float32)
        if ws:                       # the kernel makes its descriptors on the device
            descs = (q, k, v, o)
        else:
            rows = b * h * n
            descs = tuple(TensorDescriptor(t, shape=[rows, d], strides=[d, 1], block_shape=[1, 1])
                          for t in (q, k, v, o))

        def grid(meta):
            return (triton.cdiv(n, meta["BLOCK_M"]), b * h, 1)

        def call():
            tuned[grid](d ** -0.5, m, b, h, *descs, N_CTX=n, HEAD_DIM=d, FP8_OUTPUT=False,
                        STAGE=3 if causal else 1, warp_specialize=ws, IS_HOPPER=True)
            return o
        return call
    return run, tuned


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="a copy of the source material's text")
    ap.add_argument("--out", default="source_kernel_probe.json")
    ap.add_argument("--n", default="4096,16384")
    ap.add_argument("--d", default="128,64")
    ap.add_argument("--ws", choices=("on", "off", "both"), default="on",
                    help="the source's kernel with warp specialisation (its default), without, "
                         "or both")
    ap.add_argument("--tma-configs", default="",
                    help="lesson 8's TMA forward in these tiles too, e.g. 128x128x8x3,128x64x4x3 "
                         "(BLOCK_M x BLOCK_N x warps x stages)")
    common.add_settle_option(ap)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("the source's kernel is written for a GPU (tensor descriptors)")
    if not Path(args.source).is_file():
        ap.error(f"--source {args.source}: no such file")
    from course_utils import triton_attention as ta
    from course_utils.hopper.triton_fwd import attention_tma
    from course_utils.triton_attention import triton_attention_forward
    run_source, tuned = source_forward(load_source_kernel(args.source))
    tma_cfgs = [tuple(int(x) for x in c.split("x")) for c in args.tma_configs.split(",") if c]
    ws_list = {"on": [True], "off": [False], "both": [True, False]}[args.ws]
    env = common.environment()
    env["command"] = "python benchmarks/source_kernel_probe.py " + " ".join(sys.argv[1:])
    env["settle_ms"] = args.settle
    rows = []
    for d in (int(x) for x in args.d.split(",")):
        for n in (int(x) for x in args.n.split(",")):
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(7 * n + d)
                q, k, v = (torch.randn(4, 32, n, d, device="cuda", dtype=torch.float16,
                                       generator=g) for _ in range(3))
                flops = common.attention_flops(4, 32, n, n, d, causal)
                ref = common.sdpa("MATH", q, k, v, causal)() if n <= 4096 else \
                    common.sdpa("CUDNN_ATTENTION", q, k, v, causal)()
                fns = {"flash": common.sdpa("FLASH_ATTENTION", q, k, v, causal),
                       "cudnn": common.sdpa("CUDNN_ATTENTION", q, k, v, causal),
                       "lesson6": lambda: triton_attention_forward(q, k, v, is_causal=causal)[0]}
                for ws in ws_list:
                    fns["source" + ("_ws" if ws else "")] = run_source(q, k, v, causal, ws)
                for bm, bn, w, st in tma_cfgs:
                    fns[f"tma_{bm}x{bn}x{w}x{st}"] = (
                        lambda bm=bm, bn=bn, w=w, st=st: attention_tma(
                            q, k, v, is_causal=causal, block_m=bm, block_n=bn, num_warps=w,
                            num_stages=st))
                row = {"d": d, "n": n, "causal": causal, "dtype": "float16",
                       "reference": "SDPA math" if n <= 4096 else "SDPA cuDNN"}
                for name, fn in fns.items():
                    try:
                        o = fn()
                        torch.cuda.synchronize()
                        err = float((o.float() - ref.float()).norm() / ref.float().norm())
                        row[f"{name}_err"] = err
                        if not err < 1e-2:
                            raise RuntimeError(f"relative error {err:.3g}")
                        ms = common.time_ms(fn, warmup=25, rep=100, settle_ms=args.settle)
                        row[name] = flops / ms * 1e-9
                    except Exception as e:  # noqa: BLE001 - a failure is a result
                        row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                # the configuration the source's autotuner picked for this call's key, and
                # what it timed for each (ms; inf: did not compile or fit)
                for key, cfg in tuned.cache.items():
                    if len(key) >= 4 and key[0] == n and key[1] == d:
                        tag = "source_ws" if key[3] else "source"
                        row[f"{tag}_config"] = str(cfg)
                for key, cfg in ta._attn_fwd.cache.items():
                    if key[:4] == (ta.length_bucket(n), ta.length_bucket(n), d, causal):
                        row["lesson6_config"] = str(cfg)
                if getattr(tuned, "configs_timings", None):
                    row["source_last_tuning"] = {str(c): t if isinstance(t, float) else list(t)
                                                 for c, t in tuned.configs_timings.items()}
                for name in fns:
                    if name in row and "cudnn" in row:
                        row[f"{name}_x_cudnn"] = row[name] / row["cudnn"]
                    if name.startswith("source") and name in row and "lesson6" in row:
                        row[f"lesson6_x_{name}"] = row["lesson6"] / row[name]
                rows.append(row)
                print(json.dumps(row), flush=True)
                # saved after every row, so a run cut short keeps what it measured
                Path(args.out).write_text(json.dumps({"environment": env, "rows": rows},
                                                     indent=1) + "\n")
                del q, k, v, ref
                torch.cuda.empty_cache()
    names = [c for c in ("lesson6", "source_ws", "source", "flash", "cudnn")
             if any(c in r for r in rows)]
    names[1:1] = [f"tma_{bm}x{bn}x{w}x{st}" for bm, bn, w, st in tma_cfgs]
    print("\nTFLOPS (fp16, B = 4, H = 32)")
    print(f"{'d':>4} {'n':>6} {'causal':>6} " + " ".join(f"{c[-10:]:>10}" for c in names)
          + "   lesson6 / source")
    for r in rows:
        ratios = " ".join(f"{r[k]:.3f}" for k in r if k.startswith("lesson6_x_source"))
        print(f"{r['d']:>4} {r['n']:>6} {int(r['causal']):>6} "
              + " ".join(f"{r.get(c, float('nan')):>10.1f}" for c in names) + f"   {ratios}")
    for r in rows:
        print(r["d"], r["n"], int(r["causal"]), "source picked:",
              {k: v for k, v in r.items() if k.endswith("_config")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
