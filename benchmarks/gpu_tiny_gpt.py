"""Lesson 7 capstone at GPU size: train TinyGPT with SDPA and with the Triton kernel
from one seed, under bfloat16 autocast, and save both loss curves.

    python benchmarks/gpu_tiny_gpt.py [--steps 200]

Writes ``benchmarks/<device>/tiny_gpt.json`` (the losses, the model size, the device
and versions); lesson 7 plots it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.bench import common  # noqa: E402
from course_utils.tiny_gpt import train  # noqa: E402

SIZE = dict(block_size=256, n_layer=4, n_head=4, n_embd=256, batch_size=16, lr=1e-3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args(argv)
    if not device.HAS_GPU:
        print("needs a CUDA GPU")
        return 0
    curves, seconds = {}, {}
    for attention in ("sdpa", "triton"):
        t = time.time()
        curves[attention] = train(attention, args.steps, amp_dtype=torch.bfloat16, **SIZE)
        seconds[attention] = time.time() - t
        print(f"{attention:>6}: loss {curves[attention][0]:.3f} -> {curves[attention][-1]:.3f} "
              f"({seconds[attention]:.1f} s, first step compiles)", flush=True)
    gap = max(abs(a - b) for a, b in zip(curves["sdpa"], curves["triton"]))
    print(f"largest loss difference over {args.steps} steps: {gap:.4f}")
    env = common.environment()
    env["command"] = "python benchmarks/gpu_tiny_gpt.py " + " ".join(sys.argv[1:])
    out = common.RESULTS / common.device_slug()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tiny_gpt.json"
    path.write_text(json.dumps({"environment": env, "config": SIZE, "steps": args.steps,
                                "amp_dtype": "bfloat16", "losses": curves,
                                "max_abs_loss_gap": gap}, indent=1) + "\n")
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
