"""Probe: does a deeper software pipeline (more stages) or another tile shape help lesson
7's two backward kernels on this GPU? Times the backward (Delta, dK/dV, dQ) with the
kernels' autotune lists as they are and with extra configurations added, and SDPA's cuDNN
backward in the same run. Prints the configuration the autotuner picked per kernel. Needs
a CUDA GPU.

    python benchmarks/bwd_config_probe.py [--out FILE]
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from course_utils.bench import common  # noqa: E402
from course_utils import triton_attention as ta  # noqa: E402

# (BLOCK_M, BLOCK_N, warps, stages) tried beside the current lists
EXTRA = {"dkdv": [(32, 128, 4, 4), (32, 128, 4, 5), (64, 128, 8, 3), (32, 64, 4, 3),
                  (64, 64, 4, 3)],
         "dq": [(128, 32, 4, 4), (128, 32, 4, 5), (128, 64, 8, 3), (64, 32, 4, 3),
                (64, 64, 4, 3)]}
NAMES = {"dkdv": ("BLOCK_M1", "BLOCK_N1"), "dq": ("BLOCK_M2", "BLOCK_N2")}


def tuned(kind, extra):
    configs = ta.bwd_configs(kind)
    if extra:
        configs = configs[:-1] + [triton.Config(dict(zip(NAMES[kind], (m, n))), num_warps=w,
                                                num_stages=s) for m, n, w, s in EXTRA[kind]] \
            + configs[-1:]
    raw = ta._attn_bwd_dkdv_kernel if kind == "dkdv" else ta._attn_bwd_dq_kernel
    return ta._tuned(configs, ta._KEY)(raw)


def picked(kernel):
    cfg = next(iter(getattr(kernel, "cache", {}).values()), None)
    if cfg is None:
        return None
    return f"{tuple(cfg.kwargs.values())} w{cfg.num_warps} s{cfg.num_stages}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    rows = []
    for d in (128, 64):
        for n in (4096, 16384):
            for causal in (False, True):
                B, H = 4, 32
                g = torch.Generator(device="cuda").manual_seed(n + d)
                q, k, v, do = (torch.randn(B, H, n, d, device="cuda", dtype=torch.float16,
                                           generator=g) for _ in range(4))
                o, lse = ta.triton_attention_forward(q, k, v, is_causal=causal)
                fl = common.attention_flops(B, H, n, n, d, causal, "bwd")
                row = {"D": d, "N": n, "causal": causal}
                ref = None
                for variant, extra in (("current", False), ("with_extra", True)):
                    ta._attn_bwd_dkdv, ta._attn_bwd_dq = tuned("dkdv", extra), tuned("dq", extra)
                    fn = lambda: ta.triton_attention_backward(q, k, v, o, lse, do,  # noqa: E731
                                                              is_causal=causal)
                    grads = fn()
                    if ref is None:
                        ref = grads
                    else:
                        row[f"{variant}_max_diff"] = max(float((a - b).abs().max())
                                                         for a, b in zip(grads, ref))
                    t = common.time_ms(fn, rep=60)
                    row[variant] = round(fl / t / 1e9, 1)
                    row[f"{variant}_dkdv"] = picked(ta._attn_bwd_dkdv)
                    row[f"{variant}_dq"] = picked(ta._attn_bwd_dq)
                qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                    t = common.time_ms(lambda: torch.autograd.grad(out, (qq, kk, vv), do,
                                                                   retain_graph=True), rep=60)
                row["cudnn_bwd"] = round(fl / t / 1e9, 1)
                print(json.dumps(row), flush=True)
                rows.append(row)
    if a.out:
        rec = {"environment": common.environment(), "rows": rows}
        rec["environment"]["command"] = "python benchmarks/bwd_config_probe.py"
        Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")


if __name__ == "__main__":
    main()
