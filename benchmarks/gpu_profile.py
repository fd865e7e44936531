"""Where the time goes: one launch of each attention kernel under Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section LaunchStats \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_tensor.*pct_of_peak_sustained_active" \
        -o prof -f python benchmarks/gpu_profile.py
    python benchmarks/gpu_profile.py --report prof.ncu-rep

The first command warms every kernel up (the autotuner picks its tile shapes outside
the profiled range), then profiles exactly one call of each: the lesson-6 forward, the
lesson-7 backward (its three kernels), the lesson-6 forward with lazy rescaling
(``--only lesson6_fwd,lesson6_fwd_lazy``), the best lesson-8 Gluon forward, the FP8
forward and cuDNN's attention through SDPA, all at B=2, H=16, N=8192, D=128, float16,
non-causal, and the lesson-8 Gluon backward alone at D = 64 and D = 128 (``--only
gluon_bwd_d64,gluon_bwd_d128``; ``gluon_bwd_d128_bf16`` the same in bfloat16). The
second command prints, per kernel: time, tensor-pipe and SM utilisation, registers per
thread, and the four largest warp-stall reasons. With ``--section SourceCounters`` in the
first, ``--source prof.ncu-rep`` lists, per kernel, the machine instructions where the
warps were sampled most and the instructions executed per opcode (``--top N`` rows each).
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def workloads():
    import torch

    from course_utils import device
    from course_utils.triton_attention import triton_attention

    g = torch.Generator(device=device.DEVICE).manual_seed(0)
    q, k, v = (torch.randn(2, 16, 8192, 128, device=device.DEVICE, dtype=torch.float16,
                           generator=g).requires_grad_() for _ in range(3))
    do = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            triton_attention(q, k, v, enable_gqa=True)

    def fwd_causal():
        with torch.no_grad():
            triton_attention(q, k, v, is_causal=True)

    def bwd():
        o = triton_attention(q, k, v, enable_gqa=True)
        torch.autograd.grad(o, (q, k, v), do)

    def cudnn():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with torch.no_grad(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def fwd_lazy():
        # lesson 6's kernel with its LAZY switch, in the tile shape the autotuner picks at
        # D = 128 (128 x 128, 8 warps, 3 stages), launched directly
        from course_utils import triton_attention as ta
        b, h, n, d = q.shape
        o, lse = torch.empty_like(q), torch.empty(b, h, n, device=q.device)
        st = [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3]]
        ta._attn_fwd_kernel[(n // 128, b * h)](
            q, k, v, o, lse, *st, h, 1, n, n, d, 0, d ** -0.5 * ta.LOG2E, ta.length_bucket(n),
            ta.length_bucket(n), HEAD_DIM=d, CAUSAL=False, PAD_D=False, UPCAST=False,
            POS_SCALE=True, BLOCK_M=128, BLOCK_N=128, LAZY=True, num_warps=8, num_stages=3)

    work = {"lesson6_fwd": fwd, "lesson6_fwd_causal": fwd_causal, "lesson6_fwd_lazy": fwd_lazy,
            "lesson7_fwd_bwd": bwd, "sdpa_cudnn": cudnn}
    try:
        from course_utils.hopper.gluon_fwd import attention_gluon
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        work["gluon_pingpong_s3"] = lambda: attention_gluon(qd, kd, vd, pingpong=True, stages=3, enable_gqa=True)
        from course_utils.hopper.fp8 import attention_fp8_prepared, prepare_fp8
        prep = prepare_fp8(qd, kd, vd, hadamard=True)
        # on sm90: the Gluon ping-pong kernel on e4m3 tiles
        work["fp8_hadamard"] = lambda: attention_fp8_prepared(prep, out_dtype=qd.dtype)
        # the Gluon backward alone at both head dims (its forward run once, outside)
        from course_utils.hopper.gluon_bwd import attention_gluon_backward
        from course_utils.triton_attention import triton_attention_forward
        for d, dt, tag in ((64, torch.float16, ""), (128, torch.float16, ""),
                           (128, torch.bfloat16, "_bf16")):
            qb, kb, vb, dob = (torch.randn(2, 16, 8192, d, device=device.DEVICE,
                                           dtype=dt, generator=g)
                               for _ in range(4))
            ob, lseb = triton_attention_forward(qb, kb, vb)
            work[f"gluon_bwd_d{d}{tag}"] = (
                lambda qb=qb, kb=kb, vb=vb, ob=ob, lseb=lseb, dob=dob:
                attention_gluon_backward(qb, kb, vb, ob, lseb, dob))
    except Exception as e:  # a machine without Gluon still profiles the rest
        print(f"lesson-8 kernels left out: {type(e).__name__}: {e}")
    return work


def profile(only=None):
    import torch
    work = workloads()
    if only:
        work = {name: work[name] for name in only}
    for fn in work.values():          # compile and autotune outside the profiled range
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    for name, fn in work.items():
        torch.cuda.nvtx.range_push(name)
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        torch.cuda.nvtx.range_pop()
    print("profiled: " + ", ".join(work))


STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")


def _num(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def report(rep):
    """One block per profiled kernel from the raw metrics of a saved report."""
    out = subprocess.run(["ncu", "--import", rep, "--csv", "--page", "raw"],
                         capture_output=True, text=True, check=True).stdout
    Path(rep).with_suffix(".csv").write_text(out)
    rows = list(csv.reader(io.StringIO(out)))
    head, units, body = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(head)}

    def get(r, name):
        return _num(r[col[name]]) if name in col else None

    for r in body:
        name = r[col["Kernel Name"]][:70]
        t = get(r, "gpu__time_duration.sum")
        unit = units[col["gpu__time_duration.sum"]] if "gpu__time_duration.sum" in col else ""
        sm = get(r, "sm__throughput.avg.pct_of_peak_sustained_elapsed")
        regs = get(r, "launch__registers_per_thread")
        tensor = [(h, get(r, h)) for h in ("sm__pipe_tensor_cycles_active.avg."
                                           "pct_of_peak_sustained_active",) if get(r, h)]
        stalls = sorted(((v, STALL.match(h).group(1)) for h in head if STALL.match(h)
                         for v in [_num(r[col[h]])] if v), reverse=True)[:4]
        print(f"{name}\n    time {t} {unit}, SM throughput {sm}%, registers/thread {regs}")
        for h, v in tensor:
            print(f"    {h} = {v:.1f}%")
        if stalls:
            print("    stalls (warps per issued instruction): "
                  + ", ".join(f"{n} {v:.2f}" for v, n in stalls))


def source(rep, top=25):
    """Where a saved report's kernels spent their warps' time, per machine instruction
    (``ncu ... --section SourceCounters``): for each kernel, the sampled stall reasons
    summed per opcode, the most-sampled instructions, then the instruction mix (warp
    instructions executed per opcode). ``rep`` is the .ncu-rep (its
    source page is exported to a .source.csv beside it) or such a .csv itself."""
    if str(rep).endswith(".csv"):
        out = Path(rep).read_text()
    else:
        out = subprocess.run(["ncu", "--import", rep, "--csv", "--page", "source",
                              "--print-source", "sass"], capture_output=True, text=True,
                             check=True).stdout
        Path(rep).with_suffix(".source.csv").write_text(out)
    rows = [r for r in csv.reader(io.StringIO(out)) if r]
    starts = [i for i, r in enumerate(rows) if r[0] == "Kernel Name"]
    for n, k in enumerate(starts):
        head = rows[k + 1]
        col = {name: i for i, name in enumerate(head)}
        end = starts[n + 1] if n + 1 < len(starts) else len(rows)
        body = [r for r in rows[k + 2:end] if len(r) == len(head)]
        samp = "Warp Stall Sampling (All Samples)"
        if samp not in col:
            print("no sampling column in:", head[:12])
            continue
        reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
        total = sum(_num(r[col[samp]]) or 0 for r in body) or 1
        by_op = {}
        for r in body:
            op = re.sub(r"^@!?U?P\w+\s+", "", r[col["Source"]].strip()).split(" ")[0]
            for h in reasons:
                by_op[(op.split(".")[0], h[6:])] = (by_op.get((op.split(".")[0], h[6:]), 0)
                                                    + (_num(r[col[h]]) or 0))
        print(f"kernel {n} ({rows[k][1]}): {len(body)} instructions, {total:.0f} samples")
        print("  share of samples by opcode and stall reason:")
        for (op, h), v in sorted(by_op.items(), key=lambda x: -x[1])[:top]:
            print(f"  {100 * v / total:5.1f}%  {op:12s} {h}")
        print("  most-sampled instructions:")
        for r in sorted(body, key=lambda r: -(_num(r[col[samp]]) or 0))[:top]:
            v = _num(r[col[samp]]) or 0
            print(f"  {100 * v / total:5.1f}%  {r[col['Source']].strip()[:90]}")
        execd = "Instructions Executed"
        if execd in col:
            # warp-level instructions executed, per opcode with its modifiers (the
            # instruction mix: which conversions, which spills)
            mix = {}
            for r in body:
                op = re.sub(r"^@!?U?P\w+\s+", "", r[col["Source"]].strip()).split(" ")[0]
                mix[op] = mix.get(op, 0) + (_num(r[col[execd]]) or 0)
            n_all = sum(mix.values()) or 1
            print(f"  instructions executed: {n_all:.0f}; the most frequent opcodes:")
            for op, v in sorted(mix.items(), key=lambda x: -x[1])[:top]:
                print(f"  {100 * v / n_all:5.1f}%  {v:14.0f}  {op}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", metavar="REP", help="summarise a saved .ncu-rep instead")
    ap.add_argument("--only", default=None, help="comma-separated workloads (default: all)")
    ap.add_argument("--source", metavar="REP",
                    help="stall reasons per machine instruction of a saved report "
                         "(SourceCounters), or of its exported .source.csv")
    ap.add_argument("--top", type=int, default=25,
                    help="with --source: how many rows each of its lists shows")
    args = ap.parse_args()
    if args.source:
        source(args.source, top=args.top)
    elif args.report:
        report(args.report)
    else:
        profile(args.only and args.only.split(","))
