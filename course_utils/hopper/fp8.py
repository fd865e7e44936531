"""Lesson 8 (c): attention in FP8 (e4m3) with per-block scales and an optional
Hadamard rotation ("incoherent processing").

FP8 e4m3 keeps 3 mantissa bits and a largest finite value of 448. Stored alone, a
tensor with a few large entries (outlier channels) would either overflow or push the
small entries into the few subnormal steps, so every tile carries its own float32
scale: ``x ~= x8 * scale`` with ``scale = amax(|tile|) / 448``.

* Q gets one scale per ``block_m`` rows of a head, K one per ``block_n`` rows, V one
  per ``block_n`` rows too. The kernel multiplies the scores by ``sq * sk``; the V
  scale of block ``j`` is folded into the online-softmax rescaling factor
  (``acc <- acc * alpha * sv_{j-1} / sv_j + P_j V8_j``), so the inner loop keeps one
  fused ``dot`` with accumulation and the output is multiplied by the last ``sv``.
* P (values in [0, 1]) is cast to e4m3 as it is; V is stored transposed
  (``(D, Nk)`` per head) because the FP8 ``wgmma`` reads both operands K-major.
* Hadamard: with an orthogonal ``H`` (entries ``+-1/sqrt(D)``, random sign flips),
  ``(Q H)(K H)^T = Q K^T`` exactly. e4m3 is a floating-point format, so every entry
  keeps about 2^-4 relative precision whatever its size; the error of a score
  ``q . k`` is then dominated by its largest products. When Q and K have large values
  in the same channel (outlier channels), that one product's rounding error dominates
  every score; after the rotation the channel is spread over all ``D`` channels, every
  product is small, and the scores' error drops.

Two kernels read the prepared tensors: on an sm90 GPU the warp-specialised kernel of
:mod:`course_utils.hopper.gluon_fwd` in e4m3, in :data:`GLUON_FP8_SCHEDULE` (the default
where it applies, for which V^T's keys are stored in :func:`v_key_order`), elsewhere the
plain Triton kernel
below. In Triton's CPU interpreter the float32 -> fp8 casts inside the kernel do not round
exactly like the GPU, so interpreter results are compared with a looser tolerance.
"""
from __future__ import annotations

import math

import torch

from course_utils import device  # sets TRITON_INTERPRET before triton is imported
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from course_utils.attention import naive_attention  # noqa: E402
from course_utils.constants import LN2, LOG2E  # noqa: E402
from course_utils.hopper.triton_fwd import validate_hopper_inputs  # noqa: E402

_LN2 = tl.constexpr(LN2)

__all__ = ["FP8_DTYPE", "FP8_MAX", "hadamard_matrix", "quantize_fp8_blocks",
           "dequantize_fp8_blocks", "rmse", "attention_fp8", "prepare_fp8",
           "attention_fp8_prepared", "check_prepared", "fp8_kernel_for", "v_key_order",
           "fp8_error_report"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# the Gluon FP8 kernel's schedule (what measured fastest, at head dims 64 and 128, against
# two ping-pong consumers in the same runs; benchmarks/nvidia-h100-80gb-hbm3/ablation.md):
# three serial consumers of 64 rows that the warp schedulers interleave, and a ring of 3 K/V
# slots (2 were as fast at six of eight points and slower at two)
GLUON_FP8_SCHEDULE = dict(pingpong=True, consumers=3, pipeline=False, stages=3, persistent=True)
GLUON_FP8_STAGES = GLUON_FP8_SCHEDULE["stages"]


def rmse(a, b) -> float:
    """Root-mean-square error of ``a`` against ``b``, in float64."""
    return float(((a.double() - b.double()) ** 2).mean().sqrt())


def hadamard_matrix(d: int, seed: int | None = 0, device_=None) -> torch.Tensor:
    """An orthogonal ``d x d`` matrix ``diag(signs) @ Hd / sqrt(d)`` (Sylvester's
    construction, ``d`` a power of two); ``seed=None`` gives no sign flips."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1 or d & (d - 1):
        raise ValueError(f"d must be a power of two (the head dim), got {d!r}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = h / math.sqrt(d)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        signs = torch.randint(0, 2, (d,), generator=g, dtype=torch.float64) * 2 - 1
        h = signs[:, None] * h
    return h.float().to(device_ or device.DEVICE)


def quantize_fp8_blocks(x: torch.Tensor, block: int):
    """Split the rows of each head of ``x`` (``(B, H, N, D)``) into blocks of ``block``
    rows; return ``(x8, scales)`` with ``x8`` e4m3 of ``x``'s shape (rows padded with
    zeros to a multiple of ``block``) and ``scales`` float32 ``(B, H, ceil(N/block))``,
    such that ``x ~= x8.float() * scale`` of its block."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError("x must be a 4-D tensor (B, H, N, D), got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if not x.is_floating_point() or x.dtype == FP8_DTYPE:
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int (rows per scale), got {block!r}")
    b, h, n, d = x.shape
    nb = -(-n // block)
    xp = torch.zeros(b, h, nb * block, d, device=x.device, dtype=torch.float32)
    xp[:, :, :n] = x.float()
    tiles = xp.view(b, h, nb, block, d)
    amax = tiles.abs().amax(dim=(-1, -2))
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    x8 = (tiles / scales[..., None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x8.view(b, h, nb * block, d), scales


def dequantize_fp8_blocks(x8: torch.Tensor, scales: torch.Tensor, n: int | None = None):
    """Inverse of :func:`quantize_fp8_blocks` (float32), cut back to ``n`` rows."""
    b, h, npad, d = x8.shape
    nb = scales.shape[-1]
    if npad % nb:
        raise ValueError(f"x8 has {npad} rows, not a multiple of the {nb} scale blocks")
    x = x8.float().view(b, h, nb, npad // nb, d) * scales[..., None, None]
    return x.view(b, h, npad, d)[:, :, : (npad if n is None else n)]


@triton.jit
def _fp8_inner(acc, l_i, m_i, sv_prev, q, k_desc, vt_desc, ks_ptr, vs_ptr, kv_row, vt_row,
               kb0, offs_m, lo, hi, Nk, qk_scale_q,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               NUM_STAGES: tl.constexpr):
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=NUM_STAGES):
        k = k_desc.load([kv_row + start_n, 0])
        sk = tl.load(ks_ptr + kb0 + start_n // BLOCK_N)
        s = tl.dot(q, k.T) * (qk_scale_q * sk)
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            keep = offs_n[None, :] < Nk
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        sv = tl.load(vs_ptr + kb0 + start_n // BLOCK_N)
        acc = acc * (alpha * (sv_prev / sv))[:, None]
        vt = vt_desc.load([vt_row, start_n])
        acc = tl.dot(p.to(tl.float8e4nv), vt.T, acc)
        m_i = m_new
        sv_prev = sv
    return acc, l_i, m_i, sv_prev


@triton.jit
def _attn_fwd_fp8(q_desc, k_desc, vt_desc, qs_ptr, ks_ptr, vs_ptr, o_ptr, lse_ptr, qk_scale,
                  Hq, Nq, Nk, NkPad, GROUP, NQB, NKB,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, NUM_STAGES: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    bkv = b * (Hq // GROUP) + h // GROUP
    q_row = bh * (NQB * BLOCK_M) + start_m * BLOCK_M
    kv_row = bkv * NkPad
    vt_row = bkv * D
    kb0 = bkv * NKB
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    sv_prev = tl.full([], 1.0, tl.float32)
    q = q_desc.load([q_row, 0])
    qk_scale_q = qk_scale * tl.load(qs_ptr + bh * NQB + start_m)

    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, (start_m + 1) * BLOCK_M)
    full = (Nk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full = tl.minimum(full, (start_m * BLOCK_M // BLOCK_N) * BLOCK_N)
    acc, l_i, m_i, sv_prev = _fp8_inner(acc, l_i, m_i, sv_prev, q, k_desc, vt_desc, ks_ptr,
                                        vs_ptr, kv_row, vt_row, kb0, offs_m, 0, full, Nk,
                                        qk_scale_q, BLOCK_N, False, CAUSAL, NUM_STAGES)
    acc, l_i, m_i, sv_prev = _fp8_inner(acc, l_i, m_i, sv_prev, q, k_desc, vt_desc, ks_ptr,
                                        vs_ptr, kv_row, vt_row, kb0, offs_m, full, hi, Nk,
                                        qk_scale_q, BLOCK_N, True, CAUSAL, NUM_STAGES)
    acc = acc * (sv_prev / l_i)[:, None]
    offs_d = tl.arange(0, D)
    # 64-bit: B * H * N * D passes 2**31 elements long before B * H * N rows do
    rows = bh.to(tl.int64) * Nq + offs_m
    ok = offs_m < Nq
    tl.store(o_ptr + rows[:, None] * D + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=ok[:, None])
    tl.store(lse_ptr + rows, (m_i + tl.math.log2(l_i)) * _LN2, mask=ok)


def _blocks(block_m, block_n):
    bm = block_m or device.pick(cpu=16, gpu=128)
    bn = block_n or device.pick(cpu=16, gpu=128)
    for name, val in (("block_m", bm), ("block_n", bn)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 16 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {val!r}")
    return bm, bn


def fp8_kernel_for(d, block_m, block_n) -> str:
    """The faster FP8 kernel for head dim ``d`` and scale blocks ``block_m`` x ``block_n``
    on this machine: ``"gluon"`` (lesson 8's warp-specialised Gluon kernel in e4m3: an
    sm90 GPU, ``d`` in {64, 128}, ``block_m`` in {64, 128}, ``block_n`` in {64, 128, 256}) or
    ``"triton"`` (the plain kernel above: any GPU Triton compiles for, and the CPU
    interpreter)."""
    from course_utils.hopper import gluon_fwd
    ok = (gluon_fwd.GLUON_AVAILABLE and device.IS_HOPPER and d in (64, 128)
          and block_m in gluon_fwd.FP8_BLOCK_M and block_n in gluon_fwd.FP8_BLOCK_N)
    return "gluon" if ok else "triton"


def v_key_order(n: int) -> torch.Tensor:
    """The order of V^T's columns for the Gluon kernel: in each group of 32 keys, column
    ``16 b1 + 4 t + 2 b0 + e`` holds key ``16 b1 + 8 b0 + 2 t + e``, the key that the
    register of P at that operand position holds (see ``_p_operand`` in
    :mod:`course_utils.hopper.gluon_fwd`): P then enters the FP8 matmul from the
    registers its softmax left it in. ``n``: a multiple of 32."""
    if n % 32:
        raise ValueError(f"n must be a multiple of 32, got {n}")
    return torch.arange(n).view(n // 32, 2, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(n)


def prepare_fp8(q, k, v, *, hadamard=False, block_m=None, block_n=None, seed=0, kernel=None):
    """Quantise ``q, k, v`` for :func:`attention_fp8_prepared`: optional Hadamard
    rotation of Q and K, per-block e4m3 with float32 scales, V transposed (its keys in
    :func:`v_key_order` for ``kernel="gluon"``). ``kernel``: the kernel it is for, ``None``
    for :func:`fp8_kernel_for`'s choice. Returns a dict (what the kernel reads)."""
    bm, bn = _blocks(block_m, block_n)
    d = q.shape[-1]
    if kernel is None:
        kernel = fp8_kernel_for(d, bm, bn)
    if kernel not in ("gluon", "triton"):
        raise ValueError(f"kernel must be 'gluon', 'triton' or None, got {kernel!r}")
    if kernel == "gluon" and not (d in (64, 128) and bm in (64, 128) and bn in (64, 128, 256)):
        raise ValueError("the Gluon FP8 kernel takes D in (64, 128), block_m in (64, 128) and "
                         f"block_n in (64, 128, 256), got D={d}, block_m={bm}, block_n={bn}")
    if hadamard:
        hm = hadamard_matrix(d, seed=seed, device_=q.device)
        q = (q.float() @ hm)
        k = (k.float() @ hm)
    q8, qs = quantize_fp8_blocks(q, bm)
    k8, ks = quantize_fp8_blocks(k, bn)
    v8, vs = quantize_fp8_blocks(v, bn)
    vt8 = v8.transpose(-1, -2)                                  # (B, Hkv, D, NkPad)
    if kernel == "gluon":
        # v_key_order within each 32 keys, in the same copy that transposes V
        shape = vt8.shape
        vt8 = vt8.reshape(*shape[:3], -1, 2, 2, 4, 2).permute(0, 1, 2, 3, 4, 6, 5, 7)
        vt8 = vt8.reshape(shape)
    vt8 = vt8.contiguous()
    return {"q8": q8, "qs": qs.contiguous(), "k8": k8, "ks": ks.contiguous(), "vt8": vt8,
            "vs": vs.contiguous(), "block_m": bm, "block_n": bn, "Nq": q.shape[2],
            "Nk": k.shape[2], "hadamard": hadamard, "kernel": kernel}


_PREP_KEYS = ("q8", "qs", "k8", "ks", "vt8", "vs", "block_m", "block_n", "Nq", "Nk",
              "kernel")


def check_prepared(prep):
    """Check that ``prep`` is what :func:`prepare_fp8` returns and return its sizes
    ``(B, Hq, Hkv, Nq, Nk, D, NqPad, NkPad)`` (``NqPad``, ``NkPad``: each head's rows,
    padded to whole scale blocks)."""
    if not isinstance(prep, dict) or any(key not in prep for key in _PREP_KEYS):
        raise TypeError(f"prep must be the dict prepare_fp8 returns (keys {_PREP_KEYS})")
    q8, k8, vt8 = prep["q8"], prep["k8"], prep["vt8"]
    for name, t in (("q8", q8), ("k8", k8), ("vt8", vt8)):
        if not isinstance(t, torch.Tensor) or t.dtype != FP8_DTYPE or t.dim() != 4:
            raise TypeError(f"prep[{name!r}] must be a 4-D {FP8_DTYPE} tensor from prepare_fp8")
        if not t.is_contiguous():
            raise ValueError(f"prep[{name!r}] must be contiguous, as prepare_fp8 returns it")
    b, hq, nqpad, d = q8.shape
    _, hkv, nkpad, _ = k8.shape
    bm, bn, nq, nk = prep["block_m"], prep["block_n"], prep["Nq"], prep["Nk"]
    shapes = {"k8": (k8.shape, (b, hkv, nkpad, d)), "vt8": (vt8.shape, (b, hkv, d, nkpad)),
              "qs": (prep["qs"].shape, (b, hq, nqpad // bm)),
              "ks": (prep["ks"].shape, (b, hkv, nkpad // bn)),
              "vs": (prep["vs"].shape, (b, hkv, nkpad // bn))}
    for name, (got, want) in shapes.items():
        if tuple(got) != want:
            raise ValueError(f"prep[{name!r}] has shape {tuple(got)}, expected {want}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"Hkv must divide Hq, got Hq={hq}, Hkv={hkv}")
    if nqpad % bm or nkpad % bn or not (0 < nq <= nqpad < nq + bm and 0 < nk <= nkpad < nk + bn):
        raise ValueError(f"prep's Nq={nq}, Nk={nk} do not match its padded rows {nqpad}, "
                         f"{nkpad} in blocks of {bm}, {bn}")
    for name in ("qs", "ks", "vs"):
        t = prep[name]
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device != q8.device:
            raise TypeError(f"prep[{name!r}] must be contiguous float32 scales on {q8.device}")
    if k8.device != q8.device or vt8.device != q8.device:
        raise ValueError("prep's tensors must be on one device")
    return b, hq, hkv, nq, nk, d, nqpad, nkpad


def attention_fp8_prepared(prep: dict, *, is_causal=False, scale=None, return_lse=False,
                           out_dtype=torch.float16, num_stages=None, num_warps=None,
                           kernel=None):
    """Run an FP8 kernel on tensors from :func:`prepare_fp8` (the benchmark times this
    alone: in a model the quantisation is fused into the previous layer).

    ``kernel``: ``"gluon"``, ``"triton"`` or ``None``: the kernel ``prep`` was quantised
    for (V^T's key order is the kernel's). ``num_stages``: the Triton kernel's pipeline
    depth, or the Gluon kernel's K/V slots; ``num_warps``: the Triton kernel's only. The
    Gluon kernel runs :data:`GLUON_FP8_SCHEDULE`."""
    b, hq, hkv, nq, nk, d, nqpad, nkpad = check_prepared(prep)
    if kernel not in ("gluon", "triton", None):
        raise ValueError(f"kernel must be 'gluon', 'triton' or None, got {kernel!r}")
    if kernel is not None and kernel != prep["kernel"]:
        raise ValueError(f"prep was quantised for the {prep['kernel']!r} kernel (V^T's key "
                         f"order differs): pass kernel={kernel!r} to prepare_fp8")
    kernel = prep["kernel"]
    if kernel == "gluon":
        if num_warps is not None:
            raise ValueError("num_warps is the Triton kernel's: the Gluon kernel's warps are "
                             "its partitions")
        from course_utils.hopper.gluon_fwd import attention_gluon_fp8
        schedule = {**GLUON_FP8_SCHEDULE, "stages": num_stages or GLUON_FP8_STAGES}
        return attention_gluon_fp8(prep, is_causal=is_causal, scale=scale,
                                   return_lse=return_lse, out_dtype=out_dtype, **schedule)
    bm, bn = prep["block_m"], prep["block_n"]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = torch.empty((b, hq, nq, d), device=prep["q8"].device, dtype=out_dtype)
    lse = torch.empty((b, hq, nq), device=prep["q8"].device, dtype=torch.float32)
    q_desc = TensorDescriptor.from_tensor(prep["q8"].reshape(-1, d), [bm, d])
    k_desc = TensorDescriptor.from_tensor(prep["k8"].reshape(-1, d), [bn, d])
    vt_desc = TensorDescriptor.from_tensor(prep["vt8"].reshape(-1, nkpad), [d, bn])
    grid = (nqpad // bm, b * hq)
    _attn_fwd_fp8[grid](q_desc, k_desc, vt_desc, prep["qs"], prep["ks"], prep["vs"], o, lse,
                        scale * LOG2E, hq, nq, nk, nkpad, hq // hkv, nqpad // bm, nkpad // bn,
                        D=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=is_causal,
                        NUM_STAGES=num_stages or device.pick(cpu=1, gpu=3),
                        num_warps=num_warps or device.pick(cpu=4, gpu=8),
                        num_stages=num_stages or device.pick(cpu=1, gpu=3))
    return (o, lse) if return_lse else o


def attention_fp8(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, alignment=None,
                  return_lse=False, hadamard=False, block_m=None, block_n=None, seed=0,
                  kernel=None):
    """FP8 attention forward from float16 / bfloat16 ``(B, H, N, D)`` inputs: quantise
    (optionally after the Hadamard rotation), run the FP8 kernel (``kernel`` as in
    :func:`attention_fp8_prepared`), return the output in the input dtype."""
    sh = validate_hopper_inputs(q, k, v, is_causal=is_causal, scale=scale,
                                enable_gqa=enable_gqa, alignment=alignment, impl="fp8")
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be True or False, got {hadamard!r}")
    if kernel not in ("gluon", "triton", None):
        raise ValueError(f"kernel must be 'gluon', 'triton' or None, got {kernel!r}")
    prep = prepare_fp8(q, k, v, hadamard=hadamard, block_m=block_m, block_n=block_n, seed=seed,
                       kernel=kernel)
    return attention_fp8_prepared(prep, is_causal=is_causal, scale=sh.scale,
                                  return_lse=return_lse, out_dtype=q.dtype)


def fp8_error_report(q, k, v, *, is_causal=False, enable_gqa=False, fp16_forward=None,
                     block_m=None, block_n=None) -> dict:
    """RMSE of the FP8 forward (plain and with the Hadamard rotation) and of a 16-bit
    forward (``fp16_forward``, default: lesson 8's TMA kernel) against the float32
    reference, all from the same inputs."""
    if fp16_forward is None:
        from course_utils.hopper.triton_fwd import attention_tma as fp16_forward
    ref = naive_attention(q.float(), k.float(), v.float(), is_causal=is_causal,
                          enable_gqa=enable_gqa)
    out = {"fp16_vs_fp32": rmse(fp16_forward(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa),
                                ref)}
    for had in (False, True):
        o8 = attention_fp8(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa, hadamard=had,
                           block_m=block_m, block_n=block_n)
        out["fp8_hadamard_vs_fp32" if had else "fp8_vs_fp32"] = rmse(o8, ref)
    out["ref_rms"] = float(ref.double().pow(2).mean().sqrt())
    return out
