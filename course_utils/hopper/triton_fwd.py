"""Lesson 8 (a): a Triton attention forward that feeds its tiles through the TMA.

The kernel is lesson 6's FlashAttention-2 forward with two Hopper changes:

* Q, K and V are read through **tensor descriptors** (``TensorDescriptor``): on sm90
  each ``desc.load([row, 0])`` becomes one bulk tensor copy issued by a single thread
  and completed on an mbarrier, instead of 128 threads computing addresses.
* The key loop is a ``tl.range(..., num_stages=S, warp_specialize=WS)``: ``num_stages``
  keeps S K/V tiles in flight (software pipelining); ``warp_specialize=True`` asks the
  compiler to split the loop into a producer partition (the copies) and consumer
  partitions (the matmuls and the softmax), the structure of FlashAttention-3. Where
  the installed Triton cannot warp-specialize this loop, the compile fails and
  :func:`attention_tma` reports it; the benchmark measures both settings.

Layout: the ``(B, H, N, D)`` tensors are viewed as 2-D ``(B*H*N, D)`` matrices, so
head ``bh`` starts at row ``bh * N``. A tile that runs past ``N`` reads rows of the
next head (or zeros past the end): the key columns ``>= Nk`` are masked to ``-inf``
and the output rows ``>= Nq`` are never stored, so neither changes the result.

On a CPU the kernel runs in Triton's interpreter (``num_stages`` and
``warp_specialize`` are ignored there) at tiny sizes.
"""
from __future__ import annotations

import torch

from course_utils import device  # sets TRITON_INTERPRET before triton is imported
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from course_utils.constants import LN2, LOG2E  # noqa: E402
from course_utils.contract import IMPLEMENTATIONS, validate_attention  # noqa: E402

__all__ = ["attention_tma", "SUPPORTED_HEAD_DIMS", "validate_hopper_inputs"]

_LN2 = tl.constexpr(LN2)
SUPPORTED_HEAD_DIMS = IMPLEMENTATIONS["tma"].head_dims


def validate_hopper_inputs(q, k, v, *, is_causal=False, scale=None, enable_gqa=False,
                           alignment=None, impl="tma", hardware=True):
    """The course's one validator against the record ``impl`` of
    :data:`course_utils.contract.IMPLEMENTATIONS`: the Hopper kernels need a 16-bit
    dtype (TMA and wgmma work on 2-byte or 1-byte elements) and a head dim whose row is
    a whole number of 16-byte TMA units that fits one tile."""
    return validate_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                              alignment=alignment, impl=impl, hardware=hardware)


@triton.jit
def _inner(acc, l_i, m_i, q, k_desc, v_desc, kv_row, offs_m, lo, hi, Nk, qk_scale,
           BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
           NUM_STAGES: tl.constexpr, WARP_SPEC: tl.constexpr):
    # One pass over key blocks [lo, hi): the online softmax of lessons 2-4 in base 2.
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=NUM_STAGES, warp_specialize=WARP_SPEC):
        k = k_desc.load([kv_row + start_n, 0])
        qk = tl.dot(q, k.T)
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            keep = offs_n[None, :] < Nk
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(keep, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
        else:
            # the (positive) scale commutes with the max, so each score costs one
            # fused multiply-add, as in lesson 6
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([kv_row + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_tma(q_desc, k_desc, v_desc, o_ptr, lse_ptr, qk_scale, Hq, Nq, Nk, GROUP,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, NUM_STAGES: tl.constexpr, WARP_SPEC: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    hkv = h // GROUP
    q_row = bh * Nq + start_m * BLOCK_M
    kv_row = (b * (Hq // GROUP) + hkv) * Nk
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    q = q_desc.load([q_row, 0])

    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, (start_m + 1) * BLOCK_M)
    # key blocks that need no mask: fully inside Nk and (causal) fully left of the diagonal
    full = (Nk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full = tl.minimum(full, (start_m * BLOCK_M // BLOCK_N) * BLOCK_N)
    acc, l_i, m_i = _inner(acc, l_i, m_i, q, k_desc, v_desc, kv_row, offs_m, 0, full, Nk,
                           qk_scale, BLOCK_N, False, CAUSAL, NUM_STAGES, WARP_SPEC)
    acc, l_i, m_i = _inner(acc, l_i, m_i, q, k_desc, v_desc, kv_row, offs_m, full, hi, Nk,
                           qk_scale, BLOCK_N, True, CAUSAL, NUM_STAGES, False)

    acc = acc / l_i[:, None]
    offs_d = tl.arange(0, D)
    # 64-bit: B * H * N * D passes 2**31 elements long before B * H * N rows do
    rows = bh.to(tl.int64) * Nq + offs_m
    ok = offs_m < Nq
    tl.store(o_ptr + rows[:, None] * D + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=ok[:, None])
    # natural-log LSE, as lesson 6 stores it: m is in base-2 units of the scaled score
    tl.store(lse_ptr + rows, (m_i + tl.math.log2(l_i)) * _LN2, mask=ok)


def _flat(x):
    b, h, n, d = x.shape
    return x.contiguous().reshape(b * h * n, d)


def attention_tma(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, alignment=None,
                  return_lse=False, block_m=None, block_n=None, num_stages=None,
                  warp_specialize=False, num_warps=None):
    """Attention forward with TMA tiles; SDPA's arguments and shapes ``(B, H, N, D)``.

    ``num_stages`` / ``warp_specialize`` / ``num_warps`` / ``block_m`` / ``block_n``
    expose the Hopper knobs for the ablation; the defaults are the tuned H100 setting
    (128 x 128 tiles, 8 warps, 2 stages for D = 128) or a tiny interpreter setting on CPU."""
    sh = validate_hopper_inputs(q, k, v, is_causal=is_causal, scale=scale,
                                enable_gqa=enable_gqa, alignment=alignment, impl="tma")
    for name, val in (("block_m", block_m), ("block_n", block_n), ("num_stages", num_stages),
                      ("num_warps", num_warps)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
            raise ValueError(f"{name} must be a positive int or None, got {val!r}")
    if not isinstance(warp_specialize, bool):
        raise TypeError(f"warp_specialize must be True or False, got {warp_specialize!r}")
    bm = block_m or device.pick(cpu=16, gpu=128)
    bn = block_n or device.pick(cpu=16, gpu=128 if sh.D <= 64 else 64, hopper=128)
    if is_causal and bm % bn:
        raise ValueError(f"block_m ({bm}) must be a multiple of block_n ({bn}) when is_causal")
    stages = num_stages or device.pick(cpu=1, gpu=2)
    warps = num_warps or device.pick(cpu=4, gpu=8 if bm >= 128 else 4)

    q2, k2, v2 = _flat(q), _flat(k), _flat(v)
    o = torch.empty((sh.B, sh.Hq, sh.Nq, sh.D), device=q.device, dtype=q.dtype)
    lse = torch.empty((sh.B, sh.Hq, sh.Nq), device=q.device, dtype=torch.float32)
    q_desc = TensorDescriptor.from_tensor(q2, [bm, sh.D])
    k_desc = TensorDescriptor.from_tensor(k2, [bn, sh.D])
    v_desc = TensorDescriptor.from_tensor(v2, [bn, sh.D])
    grid = (triton.cdiv(sh.Nq, bm), sh.B * sh.Hq)
    _attn_fwd_tma[grid](q_desc, k_desc, v_desc, o, lse, sh.scale * LOG2E, sh.Hq, sh.Nq, sh.Nk,
                        sh.group, D=sh.D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=is_causal,
                        NUM_STAGES=stages, WARP_SPEC=warp_specialize, num_warps=warps,
                        num_stages=stages)
    return (o, lse) if return_lse else o
