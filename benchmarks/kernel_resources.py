"""Registers, spills and shared memory of each lesson-6 forward configuration, as the
compiler reports them (no timing): ``python benchmarks/kernel_resources.py``.
``--gluon``: the same for lesson 8's ping-pong Gluon forward with two and three consumer
warpgroups and key blocks of 64, 128 and 256 (sm90).
``--sm90``: no GPU needed; the installed Triton compiles the lesson-6 forward for sm90
(float16, the strides of contiguous tensors) with and without tensor descriptors
(``DESC``), and the CUDA tools that ship with Triton report the machine code's registers,
stack bytes per thread (spilled registers live there) and shared memory."""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if "--sm90" in sys.argv[1:]:
    # compile for the GPU even on a machine without one: the course turns on Triton's
    # interpreter there, so switch it back off before the kernels are defined
    import course_utils.device  # noqa: E402,F401
    os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

from course_utils import triton_attention as ta  # noqa: E402


def sm90(configs=((128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 2))):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = ta._attn_fwd_kernel
    ints = ["sqb", "sqh", "sqn", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "son"]
    sig = {n: "*fp16" for n in ("Q", "K", "V", "O")}
    sig.update(LSE="*fp32", qk_scale="fp32")
    sig.update({n: "i32" for n in ints + ["HQ", "GROUP", "NQ", "NK", "D", "DIAG", "NQ_BUCKET",
                                          "NK_BUCKET", "DESC_OK"]})
    # what a launch on contiguous tensors tells the compiler: 16-aligned pointers and strides
    aligned = {(fn.arg_names.index(n),): [["tt.divisibility", 16]]
               for n in ["Q", "K", "V", "O", "LSE"] + ints}
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    print(f"triton {triton.__version__}, compiled for sm90 (no GPU), float16")
    for d in (128, 64):
        for causal in (False, True):
            for bm, bn, w, st in configs:
                for desc in (False, True):
                    const = dict(HEAD_DIM=d, CAUSAL=causal, PAD_D=False, UPCAST=False,
                                 POS_SCALE=True, BLOCK_M=bm, BLOCK_N=bn, WS=False, LAZY=False,
                                 DESC=desc)
                    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}},
                                    constexprs={(fn.arg_names.index(k),): v
                                                for k, v in const.items()},
                                    attrs=aligned)
                    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                       options=dict(num_warps=w, num_stages=st))
                    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                        f.write(k.asm["cubin"])
                        f.flush()
                        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name],
                                               capture_output=True, text=True,
                                               check=True).stdout
                    reg, stack = (int(re.search(rf"{key}:(\d+)", usage).group(1))
                                  for key in ("REG", "STACK"))
                    print(f"d={d:3d} causal={int(causal)} {bm}x{bn} warps={w} stages={st} "
                          f"desc={int(desc)}: registers {reg}, stack {stack} bytes, "
                          f"shared {k.metadata.shared}")


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
    if "--sm90" in sys.argv[1:]:
        return sm90()
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
