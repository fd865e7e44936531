"""Registers, spills and shared memory of each lesson-6 forward configuration, as the
compiler reports them (no timing): ``python benchmarks/kernel_resources.py``.
``--gluon``: the same for lesson 8's ping-pong Gluon forward with two and three consumer
warpgroups and key blocks of 64, 128 and 256 (sm90).
``--waits``: no GPU needed either; the order in which the sm90 code of the lesson-6 forward
and of lesson 7's dK/dV kernel issues its tensor-core products (``warp_group_dot``) and
waits for them (``warp_group_dot_wait``) inside the key / query loop, from the compiler's
TritonGPU IR.
``--gluon-bwd [FILE,...]``: no GPU needed; lesson 8's Gluon backward (the course's module,
or each named file, another version of ``course_utils/hopper/gluon_bwd.py``) compiled for
sm90 at D = 64 and 128, float16 and bfloat16, causal and not: stack and spill-store bytes a
thread and the performance losses ptxas names, such as serialized tensor-core products
(``tests/gluon_compile_check.py``'s reading of ptxas's report), and for each named file
whether its machine code is the course's, instruction for instruction.
``--gluon-fwd [FILE,...]``: the same for lesson 8's Gluon forward (the course's module and
each named copy of ``course_utils/hopper/gluon_fwd.py``), float16 in the course's fastest
schedule per head dim and FP8 in its FP8 schedule, with the machine code's instruction count
and its exponentials (``MUFU.EX2``).
``--sm90``: no GPU needed; the installed Triton compiles the lesson-6 forward for sm90
(float16, the strides of contiguous tensors) with and without tensor descriptors
(``DESC``), and lesson 7's backward kernels in the tile shapes their autotuners try on a
GPU, each with pointer loads and through descriptors; the CUDA tools that ship with Triton
report the machine code's registers, stack bytes per thread (spilled registers live there)
and shared memory, and ptxas's report the performance losses it names (tensor-core products
it had to serialize)."""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if {"--sm90", "--waits", "--gluon-bwd", "--gluon-fwd"} & set(sys.argv[1:]):
    # compile for the GPU even on a machine without one: the course turns on Triton's
    # interpreter there, so switch it back off before the kernels are defined
    import course_utils.device  # noqa: E402,F401
    os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

from course_utils import triton_attention as ta  # noqa: E402


# the tensor arguments of the lesson 6 / 7 kernels
_POINTERS = {"Q", "K", "V", "O", "DO", "LSE", "DELTA", "DK", "DV", "DQ"}


def _sm90_compile(fn, const, warps, stages, fp32=("LSE", "DELTA")):
    """Compile ``fn`` for sm90 with the constexprs ``const``. Pointers are float16 except
    those named in ``fp32``; ``qk_scale`` / ``scale`` are floats, other arguments 32-bit
    ints; pointers and strides (arguments starting with ``s``) are marked 16-aligned, as on
    contiguous tensors."""
    import triton
    from triton.backends.compiler import GPUTarget
    return triton.compile(_sm90_source(fn, const, fp32), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=stages))


def _sm90_source(fn, const, fp32):
    """The source :func:`_sm90_compile` compiles: ``fn``'s signature as described there."""
    from triton.compiler import ASTSource
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in const:
            sig[name] = "constexpr"
        elif name in _POINTERS:
            sig[name] = "*fp32" if name in fp32 else "*fp16"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("qk_scale", "scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name.startswith("s"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn=fn, signature=sig, attrs=attrs,
                     constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})


def _cuobjdump(kernel, flag):
    """The output of ``cuobjdump FLAG`` (the copy that ships with Triton) on ``kernel``'s
    cubin."""
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def _sm90_report(fn, const, warps, stages, fp32=("LSE", "DELTA")):
    """Compile as :func:`_sm90_compile` (afresh, with ptxas's report printed); return
    (registers, stack bytes a thread, shared bytes, the performance losses ptxas names,
    such as serialized tensor-core products: ``tests/gluon_compile_check.py``'s reading)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from gluon_compile_check import compile_reported
    k, (_, _, losses) = compile_reported(_sm90_source(fn, const, fp32),
                                         dict(num_warps=warps, num_stages=stages))
    usage = _cuobjdump(k, "--dump-resource-usage")
    reg, stack = (int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "STACK"))
    return reg, stack, k.metadata.shared, losses


def sm90(configs=((128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 2))):
    import triton
    print(f"triton {triton.__version__}, compiled for sm90 (no GPU), float16")
    base = dict(PAD_D=False, UPCAST=False)
    for d in (128, 64):
        for causal in (False, True):
            for bm, bn, w, st in configs:
                for desc in (False, True):
                    const = dict(base, HEAD_DIM=d, CAUSAL=causal, POS_SCALE=True, BLOCK_M=bm,
                                 BLOCK_N=bn, WS=False, LAZY=False, DESC=desc)
                    reg, stack, shared, loss = _sm90_report(ta._attn_fwd_kernel, const, w, st)
                    print(f"d={d:3d} causal={int(causal)} {bm}x{bn} warps={w} stages={st} "
                          f"desc={int(desc)}: registers {reg}, stack {stack} bytes, "
                          f"shared {shared}" + "".join(f", ptxas: {x}" for x in loss))
    # lesson 7's backward kernels in the shapes their autotuners try on a GPU
    kernels = (("dkdv", ta._attn_bwd_dkdv_kernel, ("BLOCK_M1", "BLOCK_N1"), dict(ATOMIC_DQ=False)),
               ("atomic_dq", ta._attn_bwd_dkdv_kernel, ("BLOCK_M1", "BLOCK_N1"),
                dict(ATOMIC_DQ=True)),
               ("dq", ta._attn_bwd_dq_kernel, ("BLOCK_M2", "BLOCK_N2"), {}))
    # the autotune lists as a run on an sm90 GPU builds them (this machine has none)
    interpret, autotune, cap = ta.device.INTERPRET, ta._AUTOTUNE, ta.device.CAPABILITY
    ta.device.INTERPRET, ta._AUTOTUNE, ta.device.CAPABILITY = False, True, (9, 0)
    # the fused kernel's descriptor shapes add dQ by the TMA unit on a GPU (the module set
    # this switch off when it was imported under the interpreter)
    import triton.language as tl
    ta._TMA_REDUCE = tl.constexpr(True)
    try:
        lists = {name: ta.bwd_configs(name) for name, *_ in kernels}
    finally:
        ta.device.INTERPRET, ta._AUTOTUNE, ta.device.CAPABILITY = interpret, autotune, cap
    for name, fn, blocks, extra in kernels:
        fp32 = ("LSE", "DELTA", "DQ") if name == "atomic_dq" else ("LSE", "DELTA")
        # each tile shape once (a descriptor shape and its pointer twin are one shape here)
        shapes = {}
        for c in lists[name]:
            shapes.setdefault(tuple(c.kwargs[b] for b in blocks) + (c.num_warps, c.num_stages), c)
        for d in (128, 64):
            for causal in (False, True):
                for c in shapes.values():
                    bm, bn = (c.kwargs[b] for b in blocks)
                    for desc in (False, True):
                        const = dict(base, HEAD_DIM=d, CAUSAL=causal, **extra,
                                     **{b: c.kwargs[b] for b in blocks}, DESC=desc)
                        reg, stack, shared, loss = _sm90_report(fn, const, c.num_warps,
                                                                c.num_stages, fp32)
                        print(f"{name} d={d:3d} causal={int(causal)} {bm}x{bn} "
                              f"warps={c.num_warps} stages={c.num_stages} desc={int(desc)}: "
                              f"registers {reg}, stack {stack} bytes, shared {shared}"
                              + "".join(f", ptxas: {x}" for x in loss), flush=True)


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


def _loop_products(ttgir):
    """The tensor-core products and waits of the first innermost loop that issues products,
    in order: ``("dot", name, accumulates)`` and ``("wait", pendings)``; ``name`` is the
    source variable the compiler tagged the product with, ``accumulates`` whether it adds
    into a value carried round the loop rather than into zeros."""
    frames, depth = [], 0                  # open loops: [depth at the for, items, nested]
    for line in ttgir.splitlines():
        s = line.strip()
        if "scf.for" in s:
            if frames:
                frames[-1][2] = True
            frames.append([depth, [], False])
        elif frames and "ttng.warp_group_dot_wait" in s:
            frames[-1][1].append(("wait", int(re.search(r"pendings = (\d+)", s).group(1))))
        elif frames and "ttng.warp_group_dot " in s:
            name = re.match(r"%([A-Za-z]+)", s).group(1)
            acc = s.split("ttng.warp_group_dot ")[1].split("{")[0].split(",")[2].strip()
            frames[-1][1].append(("dot", name, not acc.startswith("%cst")))
        depth += line.count("{") - line.count("}")
        while frames and depth <= frames[-1][0]:
            start, items, nested = frames.pop()
            if not nested and any(x[0] == "dot" for x in items):
                return items
    return []


def waits():
    print("products (warp_group_dot) and waits (warp_group_dot_wait) inside the main loop, "
          "in program order, as Triton compiles them for sm90 (float16, D = 128)")
    base = dict(PAD_D=False, UPCAST=False, HEAD_DIM=128, CAUSAL=False)
    for label, fn, const, w, st in (
            ("lesson 6 forward, 128 x 64, 4 warps, 2 stages, descriptors", ta._attn_fwd_kernel,
             dict(base, POS_SCALE=True, BLOCK_M=128, BLOCK_N=64, WS=False, LAZY=False,
                  DESC=True), 4, 2),
            ("lesson 7 dK/dV kernel, 64 x 64, 4 warps, 2 stages, descriptors",
             ta._attn_bwd_dkdv_kernel,
             dict(base, ATOMIC_DQ=False, BLOCK_M1=64, BLOCK_N1=64, DESC=True), 4, 2)):
        seq = _loop_products(_sm90_compile(fn, const, w, st).asm["ttgir"])
        print(f"{label}:")
        for item in seq:
            print(f"  wait until at most {item[1]} products are in flight" if item[0] == "wait"
                  else f"  issue {item[1]} ({'adds into its accumulator' if item[2] else 'fresh'})")


def _sm90_instead(course, files):
    """Every launch from here on compiles for sm90 instead of running (the Gluon compile
    check's stand-in); returns the compile check's module, the list that keeps each
    compiled kernel, and ``{name: module}``: the course's module ``course_utils.hopper.
    COURSE``, then each named file."""
    import importlib
    import importlib.util
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import gluon_compile_check as cc                       # first: compiled, not interpreted
    course = importlib.import_module(f"course_utils.hopper.{course}")
    from course_utils import device
    cc.JITFunction.__getitem__ = cc._compile_instead       # compile for sm90, do not run
    import triton
    built, compile_ = [], triton.compile

    def keep(*a, **k):                                     # the compiled kernels, kept
        built.append(compile_(*a, **k))
        return built[-1]
    triton.compile = keep
    torch.cuda.get_device_properties = lambda *_: cc._Props()
    device.IS_HOPPER = True
    mods = {"course": course}
    for f in files:
        spec = importlib.util.spec_from_file_location(f"variant_{Path(f).stem}", f)
        mods[Path(f).stem] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods[Path(f).stem])
    return cc, built, mods


def _instructions(sass):
    """The machine code's instructions alone (no addresses or encodings), in order."""
    return [ln.split(";")[0].split("*/", 1)[-1].strip() for ln in sass.splitlines() if ";" in ln]


def _last_build(cc, built, kernel):
    """``kernel``'s last compile: stack and spill-store bytes a thread, the performance
    losses ptxas named, and its machine code (``cuobjdump -sass``)."""
    _, _, _, stack, spilled, why = next(c for c in cc.compiled if c[0] == kernel)
    return stack, spilled, why, _cuobjdump(next(k for k in built if k.name == kernel), "-sass")


def _as_course(first, key, sass, name):
    """", machine code as the course's: same / other" for a named file's build (``first``
    keeps the course's instructions per build, the course's module coming first)."""
    code = _instructions(sass)
    first.setdefault(key, code)
    if name == "course":
        return ""
    return f", machine code as the course's: {'same' if code == first[key] else 'other'}"


def gluon_bwd(files):
    cc, built, mods = _sm90_instead("gluon_bwd", files)
    first = {}                                             # the course's instructions
    print("lesson 8's Gluon backward compiled for sm90 (Triton "
          f"{__import__('triton').__version__}): stack and spill-store bytes a thread, "
          "performance losses ptxas names (wgmma serialized, ...)")
    for name, mod in mods.items():
        for d in (64, 128):
            for dt in (torch.float16, torch.bfloat16):
                for causal in (False, True):
                    g = torch.Generator().manual_seed(d)
                    q = torch.randn(1, 4, 300, d, generator=g).to(dt)
                    k = torch.randn(1, 2, 260, d, generator=g).to(dt)
                    del cc.compiled[:], built[:]
                    mod.attention_gluon_backward(q, k, k, q.clone(), torch.zeros(1, 4, 300),
                                                 torch.ones_like(q), is_causal=causal,
                                                 enable_gqa=True)
                    stack, spilled, why, sass = _last_build(cc, built, "_attn_bwd_gluon")
                    # in the machine code: the tensor-core instructions and the waits
                    # that leave no product in flight
                    drained = len(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0\b", sass))
                    same = _as_course(first, (d, dt, causal), sass, name)
                    print(f"{name}: D={d} {str(dt)[6:]} causal={int(causal)}: stack {stack}, "
                          f"spill stores {spilled}, HGMMA {sass.count('HGMMA.')}, waits for "
                          f"none in flight {drained}, performance loss: "
                          f"{'; '.join(why) or 'none'}{same}")


def gluon_fwd(files):
    cc, built, mods = _sm90_instead("gluon_fwd", files)
    from course_utils.hopper import fp8
    first = {}                                             # the course's instructions
    print("lesson 8's Gluon forward compiled for sm90 (Triton "
          f"{__import__('triton').__version__}), float16 in the course's fastest schedule per "
          "head dim and FP8 in its FP8 schedule: stack and spill-store bytes a thread, "
          "performance losses ptxas names, instructions in the machine code")
    for name, mod in mods.items():
        split = int(getattr(mod, "_EXP2_SPLIT", 0))
        for d in (64, 128):
            for fmt in ("float16", "fp8"):
                for causal in (False, True):
                    g = torch.Generator().manual_seed(d)
                    q = torch.randn(1, 4, 300, d, generator=g).half()
                    k = torch.randn(1, 2, 260, d, generator=g).half()
                    del cc.compiled[:], built[:]
                    if fmt == "fp8":
                        mod.attention_gluon_fp8(fp8.prepare_fp8(q, k, k, kernel="gluon",
                                                                block_m=128, block_n=128),
                                                is_causal=causal, **fp8.GLUON_FP8_SCHEDULE)
                    else:
                        mod.attention_gluon(q, k, k, is_causal=causal, enable_gqa=True,
                                            **mod.FASTEST[d])
                    stack, spilled, why, sass = _last_build(cc, built, "_attn_fwd_gluon")
                    same = _as_course(first, (d, fmt, causal), sass, name)
                    print(f"{name}: _EXP2_SPLIT={split} D={d} {fmt} causal={int(causal)}: "
                          f"stack {stack}, spill stores {spilled}, "
                          f"instructions {len(_instructions(sass))}, "
                          f"MUFU.EX2 {sass.count('MUFU.EX2')}, "
                          f"tensor-core products (HGMMA, QGMMA) {sass.count('GMMA.')}, "
                          f"performance loss: {'; '.join(why) or 'none'}{same}")


def main():
    if "--waits" in sys.argv[1:]:
        return waits()
    if "--gluon-bwd" in sys.argv[1:]:
        i = sys.argv.index("--gluon-bwd")
        more = sys.argv[i + 1] if len(sys.argv) > i + 1 else ""
        return gluon_bwd([f for f in more.split(",") if f])
    if "--gluon-fwd" in sys.argv[1:]:
        i = sys.argv.index("--gluon-fwd")
        more = sys.argv[i + 1] if len(sys.argv) > i + 1 else ""
        return gluon_fwd([f for f in more.split(",") if f])
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
