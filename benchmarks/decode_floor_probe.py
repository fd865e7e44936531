"""Lesson 9 on an H100: how close can one decode step at B = 1 come to a copy?

    python benchmarks/decode_floor_probe.py [--out DIR]

For a few (B, cache) points of the decode benchmark (fp16, Hq = 32, Hkv = 8, D = 128,
one new token) it times, each as a CUDA-graph replay:

* the split-KV step (split kernel, then the merge kernel) and cuDNN's attention
  through SDPA;
* a copy that moves the step's bytes (half read, half written), the benchmark's
  same-size copy;
* a read-only Triton kernel that streams the step's bytes and does nothing else: the
  most a kernel that must read the cache can hope for, timed the same way.

Each is timed twice: after the benchmark's L2 flush (``do_bench`` writes 256 MB, so
the L2 is full of dirty lines that must go back to memory during the timed step) and
after a clean flush (the same write, then a 256 MB read, so the L2 holds clean lines:
what a decode step finds after a layer that streamed weights). The difference is the
flush's write-back, which every implementation pays alike. It also sweeps the number
of splits at B = 1, 32k, lists the autotuner's picks and the per-kernel times from the
profiler. Writes ``decode_floor.json``. (The committed ``decode_floor.json`` also times a
step with the merge fused into the split kernel, measured and dropped: that kernel is
``course_utils/triton_decode.py`` at commit 89bd9e2.)
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402  (before triton: it sets the interpreter)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_utils.bench import common  # noqa: E402
from course_utils.bench.decode import graphed  # noqa: E402
from course_utils.decoding import kv_bytes_per_step  # noqa: E402

HQ, HKV, D = 32, 8, 128
POINTS = [(1, 16384), (1, 32768), (1, 65536), (1, 131072), (8, 32768)]
FLUSH_BYTES = 256 * 1024 ** 2


@triton.jit
def _read_all(X, OUT, PER_PROG, BLOCK: tl.constexpr):
    # every element of X read once, summed so the loads cannot be dropped
    pid = tl.program_id(0)
    base = X + pid.to(tl.int64) * PER_PROG
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, PER_PROG, BLOCK):
        acc += tl.load(base + i + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, 0))


def read_only(nbytes, programs):
    x = torch.randn(nbytes // 2, device=device.DEVICE, dtype=torch.float16)
    out = torch.empty(programs, device=device.DEVICE, dtype=torch.float32)
    per = x.numel() // programs
    assert per * programs == x.numel() and per % 2048 == 0
    return lambda: _read_all[(programs,)](x, out, per, BLOCK=2048, num_warps=4)


class Flush:
    """The benchmark's flush (write 256 MB) and the clean one (then read 256 MB)."""

    def __init__(self):
        self.dirty = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device.DEVICE)
        self.reader = read_only(FLUSH_BYTES, 1024)

    def __call__(self, mode):
        self.dirty.zero_()
        if mode == "clean":
            self.reader()


def time_replay(replay, flush, mode, rep=200):
    """Median us of ``replay`` after ``flush(mode)``, CUDA events around the replay only."""
    for _ in range(5):
        flush(mode)
        replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(rep)]
    for a, b in ev:
        flush(mode)
        a.record()
        replay()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3


def sdpa_cudnn(q, k, v):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return fn


def point(b, n, flush):
    from course_utils.triton_decode import choose_num_splits, decode_attention
    torch.manual_seed(0)
    q = torch.randn(b, HQ, 1, D, device=device.DEVICE, dtype=torch.float16)
    k = torch.randn(b, HKV, n, D, device=device.DEVICE, dtype=torch.float16)
    v = torch.randn_like(k)
    kv = kv_bytes_per_step(b, HKV, n, D)
    src = torch.randn(kv // 4, device=device.DEVICE, dtype=torch.float16)
    dst = torch.empty_like(src)
    fns = {"two_launch": lambda: decode_attention(q, k, v),
           "cudnn": sdpa_cudnn(q, k, v),
           "copy_same": lambda: dst.copy_(src)}
    for progs in (512, 1024, 2048):
        fns[f"read_only_{progs}"] = read_only(kv, progs)
    row = {"B": b, "cache": n, "kv_bytes": kv, "splits": choose_num_splits(b, HKV, n)}
    for name, fn in fns.items():
        replay = graphed(fn)
        for mode in ("dirty", "clean"):
            row[f"{name}_{mode}_us"] = time_replay(replay, flush, mode)
    for mode in ("dirty", "clean"):
        row[f"read_only_{mode}_us"] = min(row[f"read_only_{p}_{mode}_us"] for p in (512, 1024, 2048))
    # the benchmark's own timer, to tie these numbers to the benchmark's JSON
    row["two_launch_do_bench_us"] = common.time_ms(graphed(fns["two_launch"]), rep=40) * 1e3
    if b == 1 and n == 32768:
        row["split_sweep"] = []
        for s in (8, 16, 32, 64, 128):
            out = {"num_splits": s}
            replay = graphed(lambda: decode_attention(q, k, v, num_splits=s))
            for mode in ("dirty", "clean"):
                out[f"two_launch_{mode}_us"] = time_replay(replay, flush, mode, rep=100)
            row["split_sweep"].append(out)
            print("  sweep", out, flush=True)
        row["profile_us"] = kernel_times(q, k, v)
    return row


def kernel_times(q, k, v):
    """Per-kernel GPU time of one eager step (no flush), from the profiler."""
    from course_utils.triton_decode import decode_attention
    return {"two_launch": common.kernel_us(lambda: decode_attention(q, k, v), calls=20)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for decode_floor.json "
                    "(default: benchmarks/<device>/)")
    args = ap.parse_args(argv)
    if not device.HAS_GPU:
        print("needs a CUDA GPU")
        return 2
    from course_utils import triton_decode
    flush = Flush()
    rows = []
    for b, n in POINTS:
        row = point(b, n, flush)
        rows.append(row)
        print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()
               if not isinstance(v, (list, dict))}, flush=True)
        torch.cuda.empty_cache()
    picks = {str(key): str(cfg) for key, cfg in getattr(triton_decode._split_kv, "cache", {}).items()}
    env = common.environment()
    env["command"] = " ".join(["python benchmarks/decode_floor_probe.py", *sys.argv[1:]])
    record = {"environment": env, "rows": rows, "autotuned": picks,
              "timing": "us per step: median of 200 CUDA-graph replays, CUDA events around "
                        "the replay; dirty: after writing 256 MB (do_bench's flush); clean: "
                        "after writing 256 MB and then reading another 256 MB"}
    out = Path(args.out) if args.out else common.RESULTS / common.device_slug()
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_floor.json").write_text(json.dumps(record, indent=1) + "\n")
    cols = ["two_launch", "cudnn", "read_only", "copy_same"]
    print("\nus per step (dirty flush | clean flush)")
    print("B  cache  " + "  ".join(f"{c:>17s}" for c in cols))
    for r in rows:
        print(f"{r['B']:<2d} {r['cache']:6d} " + "  ".join(
            f"{r[f'{c}_dirty_us']:8.1f}|{r[f'{c}_clean_us']:8.1f}" for c in cols))
    print(f"wrote {out / 'decode_floor.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
