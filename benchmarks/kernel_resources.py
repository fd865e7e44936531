"""Registers, spills and shared memory of each lesson-6 forward configuration, as the
compiler reports them (no timing): ``python benchmarks/kernel_resources.py``.
``--gluon``: the same for lesson 8's ping-pong Gluon forward with two and three consumer
warpgroups and key blocks of 64, 128 and 256 (sm90)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import triton_attention as ta  # noqa: E402


def gluon():
    from course_utils.hopper import gluon_fwd as gf
    real = gf._attn_fwd_gluon
    seen = []

    class Keep:
        def __getitem__(self, grid):
            def launch(*a, **k):
                seen.append(real[grid](*a, **k))
                return seen[-1]
            return launch
    gf._attn_fwd_gluon = Keep()
    try:
        for d in (64, 128):
            q = torch.randn(1, 2, 1024, d, device="cuda", dtype=torch.float16)
            for causal in (False, True):
                for consumers, stages, regs, block_n in (
                        (2, 2, None, 128), (2, 3, None, 128), (3, 2, None, 128),
                        (3, 2, 168, 128), (2, 2, None, 64), (2, 2, None, 256)):
                    try:
                        gf.attention_gluon(q, q, q, is_causal=causal, pingpong=True,
                                           consumers=consumers, stages=stages,
                                           consumer_regs=regs, block_n=block_n)
                        k = seen[-1]
                        what = (f"registers {k.n_regs}, spills {k.n_spills}, "
                                f"shared {k.metadata.shared}")
                    except Exception as e:  # noqa: BLE001 - one that does not fit is a result
                        what = f"{type(e).__name__}: {str(e)[:120]}"
                    print(f"gluon d={d:3d} causal={int(causal)} consumers={consumers} "
                          f"stages={stages} consumer_regs={regs or 'default'} "
                          f"block_n={block_n}: {what}")
    finally:
        gf._attn_fwd_gluon = real


def main():
    if "--gluon" in sys.argv[1:]:
        return gluon()
    for d in (64, 128):
        q = torch.randn(1, 2, 1024, d, device="cuda", dtype=torch.float16)
        o, lse = torch.empty_like(q), torch.empty(1, 2, 1024, device="cuda")
        st = (q.stride(0), q.stride(1), q.stride(2)) * 4
        for causal in (False, True):
            for bm, bn, w, s in ((128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3),
                                 (64, 64, 4, 2)):
                k = ta._attn_fwd_kernel[(8, 2)](
                    q, q, q, o, lse, *st, 2, 1, 1024, 1024, d, 0, 0.1, 1024, 1024,
                    HEAD_DIM=d, CAUSAL=causal, PAD_D=False, UPCAST=False, POS_SCALE=True,
                    BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
                print(f"d={d:3d} causal={int(causal)} {bm}x{bn} warps={w} stages={s}: "
                      f"registers {k.n_regs}, spills {k.n_spills}, shared {k.metadata.shared}")


if __name__ == "__main__":
    main()
