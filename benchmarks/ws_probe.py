"""Probe: the lesson-6 forward kernel with Triton's automatic warp specialisation of its
key loop (``tl.range(..., warp_specialize=True)``) against the same kernel without it and
SDPA's cuDNN backend, at fixed tile shapes. Needs a CUDA GPU.

    python benchmarks/ws_probe.py [--n 4096 16384] [--d 64 128]
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from course_utils.bench import common  # noqa: E402
from course_utils.constants import LOG2E  # noqa: E402
from course_utils import triton_attention as ta  # noqa: E402

SHAPES = [(128, 128, 8, 3), (128, 128, 4, 3), (128, 64, 8, 3), (128, 64, 4, 3)]


def launch(q, k, v, causal, bm, bn, w, s, ws):
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    ta._attn_fwd_kernel[(triton.cdiv(N, bm), B * H)](
        q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        H, 1, N, N, D, 0, LOG2E / math.sqrt(D), ta.length_bucket(N), ta.length_bucket(N),
        HEAD_DIM=D, CAUSAL=causal, PAD_D=False, UPCAST=False, POS_SCALE=True,
        BLOCK_M=bm, BLOCK_N=bn, WS=ws, num_warps=w, num_stages=s)
    return o


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for d in a.d:
        for n in a.n:
            for causal in (False, True):
                B, H = 4, 32
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.float16,
                                       generator=g) for _ in range(3))
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fl = common.attention_flops(B, H, n, n, d, causal)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    t = common.time_ms(lambda: F.scaled_dot_product_attention(
                        q, k, v, is_causal=causal), rep=50)
                row = {"D": d, "N": n, "causal": causal, "cudnn": fl / t / 1e9}
                for bm, bn, w, s in SHAPES:
                    for ws in (False, True):
                        name = f"{bm}x{bn}w{w}s{s}" + ("_ws" if ws else "")
                        try:
                            o = launch(q, k, v, causal, bm, bn, w, s, ws)
                            err = float((o.float() - ref.float()).abs().max())
                            if err > 2e-2:
                                row[name] = f"wrong (max err {err:.3g})"
                                continue
                            t = common.time_ms(lambda: launch(q, k, v, causal, bm, bn, w, s, ws),
                                               rep=50)
                            row[name] = round(fl / t / 1e9, 1)
                        except Exception as e:  # noqa: BLE001 - report and go on
                            row[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
                        torch.cuda.synchronize()
                print(json.dumps(row), flush=True)
                rows.append(row)
    if a.out:
        Path(a.out).write_text(json.dumps({"environment": common.environment(), "rows": rows},
                                          indent=1) + "\n")


if __name__ == "__main__":
    main()
