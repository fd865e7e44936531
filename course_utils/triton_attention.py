"""Lessons 6 and 7: FlashAttention-2 in Triton, forward and backward.

Entry point: :func:`triton_attention` ``(q, k, v, *, is_causal=False, scale=None,
enable_gqa=False, alignment=None, return_lse=False)``, shaped like
``torch.nn.functional.scaled_dot_product_attention``: ``q`` is ``(B, Hq, Nq, D)``, ``k``
and ``v`` are ``(B, Hkv, Nk, D)``; ``Hq != Hkv`` (GQA, MQA) needs ``enable_gqa=True``.
``is_causal`` uses SDPA's ``causal_upper_left`` mask (query ``i`` sees keys ``j <= i``) or,
with ``alignment="causal_lower_right"``, flash-attn's (``j <= i + Nk - Nq``): the kernels
add that offset in their one causal comparison (pictures in :mod:`course_utils.contract`).
It is differentiable through :class:`TritonAttention`, an ``autograd.Function``.

Forward, :func:`_attn_fwd`, grid ``(ceil(Nq / BLOCK_M), B * Hq)``: one program owns one
query tile, keeps the running state ``(m, l, acc)`` of lesson 3 in registers and streams
the key/value tiles past it. Scores are kept in base 2: ``log2(e)`` is folded into the
scale once (``qk_scale = scale * log2(e)``), so every exponential is an ``exp2``. The
key loop is split in two: tiles that need no mask at all (every key visible to every
row of the tile: "off-band") run without a single comparison; the few tiles that cut
through the causal diagonal or the end of the sequence ("on-band") run with masks.
It writes ``O`` and the natural-log ``lse`` of each row. The kernel also takes a
diagonal offset (key ``j`` visible to query ``i`` when ``j <= i + DIAG``; 0 is SDPA's
top-left mask, ``Nk - Nq`` the bottom-right one): a row that then sees no key at all gets
``o = 0`` and ``lse = -inf``. Tile origins are 64-bit (``b``, ``h`` and the tile's first
row times its stride), offsets inside a tile 32-bit, so tensors past 2**31 elements and
views with long row strides (a packed QKV tensor) work. Causal query tiles start longest
first. Autotuning is keyed by the next power of two of the lengths.

Backward, three kernels (lesson 5's formulas, with ``P = exp2(qk_scale * S - lse * log2 e)``):

1. :func:`_attn_bwd_delta`: ``Delta_i = rowsum(dO_i * O_i)``;
2. :func:`_attn_bwd_dkdv`, KV-stationary, grid ``(ceil(Nk / BLOCK_N1), B * Hkv)``: one
   program holds one key/value tile and walks over the query tiles of every query head
   of its group, accumulating ``dV = P^T dO`` and ``dK = scale * dS^T Q`` in registers;
   summing over the group happens here, so GQA needs no atomics;
3. :func:`_attn_bwd_dq`, Q-stationary, grid ``(ceil(Nq / BLOCK_M2), B * Hq)``: one
   program holds one query tile and walks over the key tiles: ``dQ = scale * dS K``.

Seven matrix products per (query tile, key tile) pair (``S`` and ``dP`` are computed in
both kernels) and K/V read twice, but no atomics. The alternative, ``bwd="atomic_dq"``
(FlashAttention-2's), runs the dK/dV kernel alone with ``ATOMIC_DQ``: each program also
adds ``scale * dS K`` for the query tile in hand into a float32 dQ with ``tl.atomic_add``,
or, where its tiles come through tensor descriptors (sm90), hands the whole tile to the TMA
unit for one bulk reduce-add (five products, K/V read once; dQ not bitwise reproducible on
a GPU).

Sizes: any ``Nq`` and ``Nk`` (edges masked), head dims 16, 32, 64, 128 and 256 natively;
other head dims up to 256 are padded inside the kernel to the next power of two (masked
loads, so nothing is copied). Inputs may be strided (any strides; nothing is copied).

Dtypes: float16 and bfloat16 with float32 accumulators; the output has the input dtype
and ``lse`` is float32. float32 inputs are accepted: the matrix products then run as
TF32 on a GPU's tensor cores (about three significant digits, like PyTorch with
``allow_tf32``) and exactly in the CPU interpreter. float64 raises ``TypeError``.

Configurations: in the CPU interpreter one fixed small configuration; on a GPU each
kernel is autotuned over a few tile shapes (set ``COURSE_TRITON_AUTOTUNE=0`` for one
fixed GPU configuration, which compiles faster).
"""
from __future__ import annotations

import math
import os

import torch

from course_utils import device  # sets TRITON_INTERPRET before triton is imported
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_utils.constants import LN2, LOG2E  # noqa: E402
from course_utils.contract import IMPLEMENTATIONS, validate_attention  # noqa: E402

__all__ = ["triton_attention", "triton_attention_forward", "triton_attention_backward",
           "TritonAttention", "SUPPORTED_HEAD_DIMS", "MAX_HEAD_DIM", "LOG2E",
           "padded_head_dim", "fwd_configs", "bwd_configs", "length_bucket", "BWD_DESIGNS"]

_LOG2E = tl.constexpr(LOG2E)
_LN2 = tl.constexpr(LN2)
# how far (base 2) a row's maximum may grow before LAZY rescales: p stays below 2**8
_LAZY_TAU = tl.constexpr(8.0)
# the fused backward adds each dQ tile into global memory in one bulk reduction by the TMA
# unit where its tiles come through descriptors; Triton's interpreter has no such
# reduction, so there the same descriptor tiles add theirs with per-element atomics
_TMA_REDUCE = tl.constexpr(not device.INTERPRET)
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
MAX_HEAD_DIM = IMPLEMENTATIONS["triton"].max_head_dim

_AUTOTUNE = device.HAS_GPU and os.environ.get("COURSE_TRITON_AUTOTUNE", "1") != "0"


def padded_head_dim(d: int) -> int:
    """The power of two (at least 16, the smallest ``tl.dot`` size) a head dim runs as."""
    return max(16, 1 << (int(d) - 1).bit_length())


# --------------------------------------------------------------------------- configs
def fwd_configs():
    """Tile shapes tried for the forward: (BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    if device.INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    # measured on an H100 (benchmarks/<device>/ablation.md): with pointer loads, 128 x 128
    # tiles with 8 warps and 3 stages win at D = 128, 128 x 64 with 8 warps at D = 64;
    # 4-warp and 2-stage variants never won. 64 x 64 stays for head dim 256 (see _fits).
    shapes = [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 2)]
    if not _AUTOTUNE:
        shapes = [(64, 64, 4, 2)]
    # last, for rows of 1 KiB (float32 at head dim 256), which nothing above holds in
    # shared memory (64 x 64 tiles in two stages need 320 KiB; an H100 has 227 KiB)
    shapes.append(_SMALL["fwd"])
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in shapes]
    if _AUTOTUNE and device.CAPABILITY is not None and device.CAPABILITY >= (9, 0):
        # with K and V through tensor descriptors (DESC), a 128 x 64 tile fits one
        # warpgroup's registers, and in two stages two programs share a multiprocessor:
        # on an H200 the fastest shape at head dim 128 (benchmarks/<device>/ablation.md).
        # With pointer loads the same shape spills. Tried only where _desc_ok holds.
        configs.insert(0, triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "DESC": True},
                                        num_warps=4, num_stages=2))
    return configs


# the one tile shape of each kernel for rows of 1 KiB or more (see _fits)
_SMALL = {"fwd": (32, 32, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)}


def _zero_dq(nargs):
    """Zero the float32 dQ of the atomic backward before every launch, the autotuner's
    trial runs included: the kernel adds into it, so a second run would double it."""
    nargs["DQ"].zero_()


def bwd_configs(kernel: str):
    """Tile shapes tried for the backward kernels ``'dkdv'`` and ``'dq'`` and for the
    fused ``'atomic_dq'`` kernel (the dK/dV kernel that also adds dQ atomically)."""
    if kernel not in ("dkdv", "dq", "atomic_dq"):
        raise ValueError(f"kernel must be 'dkdv', 'dq' or 'atomic_dq', got {kernel!r}")
    hook = _zero_dq if kernel == "atomic_dq" else None
    if device.INTERPRET:
        blocks = {"dkdv": {"BLOCK_M1": 16, "BLOCK_N1": 32},
                  "atomic_dq": {"BLOCK_M1": 16, "BLOCK_N1": 32},
                  "dq": {"BLOCK_M2": 32, "BLOCK_N2": 16}}[kernel]
        return [triton.Config(blocks, num_warps=4, num_stages=1, pre_hook=hook)]
    # measured on an H100 (benchmarks/<device>/bwd_config_probe.json): with deeper
    # pipelines (3 stages for the 8-warp shapes, 5 for 32 x 128) and 64 x 64 dQ tiles
    # on offer the autotuner took one of them at 13 of 16 kernel-points, and the whole
    # backward ran 2 % slower to 14 % faster (+5 % median)
    if kernel in ("dkdv", "atomic_dq"):           # the fused kernel is the dK/dV kernel
        shapes = [(32, 128, 4, 3), (32, 128, 4, 5), (64, 128, 8, 2), (64, 128, 8, 3),
                  (32, 64, 4, 3), (32, 64, 4, 2)]
        names = ("BLOCK_M1", "BLOCK_N1")
    else:
        shapes = [(128, 32, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3),
                  (64, 32, 4, 2)]
        names = ("BLOCK_M2", "BLOCK_N2")
    if not _AUTOTUNE:
        shapes = shapes[-1:]
    shapes.append(_SMALL["dq" if kernel == "dq" else "dkdv"])
    configs = [triton.Config(dict(zip(names, (m, n))), num_warps=w, num_stages=s,
                             pre_hook=hook) for m, n, w, s in shapes]
    if kernel in ("dkdv", "atomic_dq") and _AUTOTUNE and device.CAPABILITY is not None \
            and device.CAPABILITY >= (9, 0):
        # on an H200 (benchmarks/<device>/ablation.md), reading Q and dO through tensor
        # descriptors changed these shapes' speed by -3 % to +21 %; more than 1 % slower
        # only in the one-warpgroup shapes at head dim 64 without the mask. So they are
        # offered both ways (where _desc_ok holds, see _fits) and the autotuner picks.
        # 64 x 64 with one warpgroup only through descriptors: two programs share a
        # multiprocessor (99 KiB of shared memory each), so one computes while the other
        # waits. On an H200 at head dim 128 it ran 1.00-1.10x the 64 x 128 two-warpgroup
        # shape (0.995x at one point), though it spills there; with pointer loads it spills
        # nearly three times as much and ran at 0.63-0.65x its speed.
        # The fused kernel's descriptor shapes also add each dQ tile in one bulk reduction
        # by the TMA unit (_TMA_REDUCE); on an H200 the autotuner took one at one of four
        # head-dim-128 points (1.03x its pointer shapes there).
        configs[-1:-1] = [triton.Config(dict(zip(names, (m, n)), DESC=True), num_warps=w,
                                        num_stages=s, pre_hook=hook)
                          for m, n, w, s in ((64, 64, 4, 2), (64, 128, 8, 3), (64, 128, 8, 2),
                                             (32, 128, 4, 3), (32, 128, 4, 5))]
    return configs


def _is_small(c) -> bool:
    return tuple(c.kwargs.values()) + (c.num_warps, c.num_stages) in set(_SMALL.values())


def _fits(configs, named_args, **kwargs):
    """The tile shapes that hold the head dim's rows in shared memory: rows of 1 KiB
    or more (float32 at head dim 256) get only the small single-stage shape; rows of
    512 bytes (head dim 256 in 16 bits, 128 in float32) drop the shapes larger than
    64 x 64 x 2 and those with more than three stages; without autotuning (two shapes
    listed), the first that fits. Descriptor shapes (``DESC``) only when the call's
    ``DESC_OK`` says its tensors can be read that way."""
    d = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    q = named_args.get("Q")
    row = (d or 0) * (q.element_size() if hasattr(q, "element_size") else 2)
    if row >= 512 or not kwargs.get("DESC_OK", named_args.get("DESC_OK")):
        # the descriptor shape only where it may run, and not for rows of 512 bytes
        # (its one warpgroup would hold a 128 x 256 float32 accumulator: spills)
        configs = [c for c in configs if not c.kwargs.get("DESC")]
    small = [c for c in configs if _is_small(c)]
    rest = [c for c in configs if not _is_small(c)]
    if row >= 1024 or not rest:
        return small[:1] or configs[-1:]
    if row >= 512:
        rest = [c for c in rest if math.prod(v for k, v in c.kwargs.items()
                                             if k.startswith("BLOCK")) <= 64 * 64 * 2
                and c.num_stages <= 3] or rest[-1:]
    return rest if _AUTOTUNE else rest[:1]


def _tuned(configs, key):
    if device.INTERPRET:
        return lambda fn: triton.autotune(configs=configs, key=key)(fn)
    def bench(fn, quantiles=None, **_):
        # keys are length buckets, so tuning is rare: time long enough that the
        # run-to-run spread (several per cent on an H100) does not pick the config
        import triton.testing
        return triton.testing.do_bench(fn, warmup=10, rep=60, quantiles=quantiles)
    return lambda fn: triton.autotune(configs=configs, key=key, do_bench=bench,
                                      prune_configs_by={"early_config_prune": _fits})(fn)


# --------------------------------------------------------------------------- forward
# Lengths, head counts and the true head dim change from call to call; compiling a
# variant for each (Triton specialises ints divisible by 16, or equal to 1) would only
# add compile time, so they are not specialised. Strides still are.
def _jit(fn):
    import inspect
    names = [n for n in ("HQ", "HKV", "GROUP", "NQ", "NK", "D", "DIAG", "CAUSAL_OFF",
                         "NQ_BUCKET", "NK_BUCKET", "DESC_OK")
             if n in inspect.signature(fn).parameters]
    return triton.jit(do_not_specialize=names)(fn)


@triton.jit
def _mm(a, b, UPCAST: tl.constexpr):
    """``tl.dot``. Triton's CPU interpreter multiplies bfloat16 operands as raw 16-bit
    integers, so there (``UPCAST``) the operands go in as float32: the products of two
    bfloat16 numbers are exact in float32, so the result is the same."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr):
    """``acc + a @ b`` as one ``tl.dot(a, b, acc)``: the tensor cores add into the
    accumulator they already hold, so no separate tile-wide addition is needed."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, k_off, v_off, skn, svn, offs_m, offs_n, offs_d,
               D, NK, DIAG, lo, hi, qk_scale,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               PAD_D: tl.constexpr, UPCAST: tl.constexpr, POS_SCALE: tl.constexpr,
               WS: tl.constexpr = False, LAZY: tl.constexpr = False,
               DESC: tl.constexpr = False):
    """Stream key/value tiles ``[lo, hi)`` past the running state of one query tile.
    ``MASKED=False``: every key of every tile is visible, so no comparison is made.
    ``WS``: ask Triton to warp-specialise the loop (loads in warps of their own); off,
    because on an H100 with Triton 3.6 it bought nothing for this kernel
    (benchmarks/<device>/ablation.md).
    ``LAZY``: in the unmasked tiles, keep the running maximum (and skip rescaling ``acc``
    and ``l``) unless some row's maximum grew by more than ``_LAZY_TAU`` (base 2), as
    FlashAttention-4 does; the probabilities then stay below ``2**_LAZY_TAU``, and the
    final ``acc / l`` is the same because both were summed against the same maximum. Off,
    because on an H200 the one decision per tile (a maximum across all the warps, every key
    tile) cost more than the multiplications it saved: 4-10 % slower in the autotuner's
    tiles (benchmarks/<device>/ablation.md; lesson 6 shows the measurement).

    ``k_base``/``v_base`` point at the head's first key; the tile at ``start_n`` starts
    ``start_n * stride`` elements further, a 64-bit scalar, while the offsets inside a
    tile (``k_off``, ``v_off``) stay small 32-bit numbers computed once.
    ``DESC``: ``k_base``/``v_base`` are the head's tensor descriptors instead, and a tile
    is one ``load([start_n, 0])``: rows past the keys and columns past the head dim come
    back as zeros, so no mask is needed (see :func:`_attn_fwd_kernel`)."""
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        if DESC:
            k = k_base.load([start_n, 0])
        else:
            k_ptrs = k_base + tl.cast(start_n, tl.int64) * skn + k_off
            v_ptrs = v_base + tl.cast(start_n, tl.int64) * svn + v_off
            if MASKED:
                ok = (start_n + offs_n)[:, None] < NK
                if PAD_D:
                    ok = ok & (offs_d[None, :] < D)
                k = tl.load(k_ptrs, mask=ok, other=0.0)
            elif PAD_D:
                k = tl.load(k_ptrs, mask=offs_d[None, :] < D, other=0.0)
            else:
                k = tl.load(k_ptrs)
        qk = _mm(q, tl.trans(k), UPCAST)                    # raw scores Q K^T
        if MASKED:
            cols = start_n + offs_n
            visible = cols[None, :] < NK
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + DIAG)
            s = tl.where(visible, qk * qk_scale, float("-inf"))   # base-2 units
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # a row that has seen no visible key yet keeps m = -inf; subtracting 0
            # instead keeps exp2(-inf - -inf) = NaN out of p and alpha
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_use[:, None])
            alpha = tl.exp2(m_i - m_use)
        else:
            # the scale is folded into the max (a positive factor commutes with max), so
            # qk * qk_scale - m is one fused multiply-add per score
            if POS_SCALE:
                m_blk = tl.max(qk, 1) * qk_scale
            else:
                m_blk = tl.min(qk, 1) * qk_scale
            if LAZY:
                if tl.max(m_blk - m_i, 0) > _LAZY_TAU:       # one decision for the tile
                    m_new = tl.maximum(m_i, m_blk)
                    alpha = tl.exp2(m_i - m_new)
                    acc = acc * alpha[:, None]
                    l_i = l_i * alpha
                    m_i = m_new
                p = tl.exp2(qk * qk_scale - m_i[:, None])
            else:
                m_new = tl.maximum(m_i, m_blk)
                p = tl.exp2(qk * qk_scale - m_new[:, None])
                alpha = tl.exp2(m_i - m_new)
        if DESC:
            v = v_base.load([start_n, 0])
        elif MASKED:
            v = tl.load(v_ptrs, mask=ok, other=0.0)
        elif PAD_D:
            v = tl.load(v_ptrs, mask=offs_d[None, :] < D, other=0.0)
        else:
            v = tl.load(v_ptrs)
        if LAZY and not MASKED:
            l_i = l_i + tl.sum(p, 1)
            acc = _mma(p.to(v.dtype), v, acc, UPCAST)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = _mma(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
            m_i = m_new
    return acc, l_i, m_i


@_jit
def _attn_fwd_kernel(Q, K, V, O, LSE,
                     sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                     HQ, GROUP, NQ, NK, D, DIAG, qk_scale, NQ_BUCKET, NK_BUCKET,
                     HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
                     UPCAST: tl.constexpr, POS_SCALE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr = False,
                     LAZY: tl.constexpr = False, DESC: tl.constexpr = False, DESC_OK=0):
    # strides along the head dim are 1: the wrapper passes them as such (see _inner_contig).
    # With CAUSAL, key j is visible to query i when j <= i + DIAG (DIAG = 0: SDPA's
    # top-left mask; DIAG = NK - NQ: the bottom-right mask of decoding).
    # the causal split below starts the masked tiles at a multiple of BLOCK_N
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "BLOCK_M must be a multiple of BLOCK_N")
    pid_m = tl.program_id(0)
    if CAUSAL:
        # longest rows first: the last query tiles see the most keys, so they start
        # first and the short tiles fill the gaps at the end of the grid
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = (bh % HQ).to(tl.int64)
    kvh = h // GROUP
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < NQ
    if PAD_D:
        row_ok = row_ok & (offs_d[None, :] < D)
    # 64-bit tile origins (b, h, first row); 32-bit offsets inside the tile
    q_tile = b * sqb + h * sqh + tl.cast(start_m, tl.int64) * sqn
    in_q = tl.arange(0, BLOCK_M)[:, None] * sqn + offs_d[None, :]
    q = tl.load(Q + q_tile + in_q, mask=row_ok, other=0.0)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    if DESC:
        # DESC (a tile shape the autotuner may pick on sm90 when DESC_OK, see
        # _desc_ok): K and V tiles come through tensor descriptors of this head, which
        # the TMA unit fills without per-thread address arithmetic. The registers that
        # saves let one warpgroup hold a 128-row tile, two programs a multiprocessor.
        k_base = tl.make_tensor_descriptor(k_base, shape=[NK, D], strides=[skn, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        v_base = tl.make_tensor_descriptor(v_base, shape=[NK, D], strides=[svn, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
    k_off = offs_n[:, None] * skn + offs_d[None, :]
    v_off = offs_n[:, None] * svn + offs_d[None, :]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    nk_full = NK - NK % BLOCK_N                      # keys in whole, in-range tiles
    # causal: row i sees keys j <= i + DIAG (0: upper-left, Nk - Nq: lower-right)
    if CAUSAL:
        # off-band: keys <= start_m + DIAG are visible to every row of this tile
        mid = tl.maximum(tl.minimum((start_m + DIAG + 1) // BLOCK_N * BLOCK_N, nk_full), 0)
        # on-band ends after the last key the tile's last row sees
        hi = tl.maximum(tl.minimum(start_m + BLOCK_M + DIAG, NK), mid)
    else:
        mid = nk_full
        hi = NK
    acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, k_off, v_off, skn, svn,
                               offs_m, offs_n, offs_d, D, NK, DIAG, 0, mid, qk_scale,
                               BLOCK_N, False, CAUSAL, PAD_D, UPCAST, POS_SCALE, WS, LAZY,
                               DESC)
    acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, k_off, v_off, skn, svn,
                               offs_m, offs_n, offs_d, D, NK, DIAG, mid, hi, qk_scale,
                               BLOCK_N, True, CAUSAL, PAD_D, UPCAST, POS_SCALE, WS, LAZY,
                               DESC)
    # a row that sees no key at all: output 0 and lse -inf (SDPA gives NaN there)
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    o_tile = b * sob + h * soh + tl.cast(start_m, tl.int64) * son
    tl.store(O + o_tile + tl.arange(0, BLOCK_M)[:, None] * son + offs_d[None, :],
             o.to(O.dtype.element_ty), mask=row_ok)
    # natural-log lse, the same convention as lessons 3-5
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_i)) * _LN2)
    tl.store(LSE + bh.to(tl.int64) * NQ + offs_m, lse, mask=offs_m < NQ)


_FWD_KEY = ["NQ_BUCKET", "NK_BUCKET", "HEAD_DIM", "CAUSAL", "PAD_D", "DESC_OK"]
_attn_fwd = _tuned(fwd_configs(), _FWD_KEY)(_attn_fwd_kernel)


def length_bucket(n: int) -> int:
    """The autotuner's key for a length: the next power of two, so a sweep over N
    tunes once per octave instead of once per N."""
    return triton.next_power_of_2(max(1, int(n)))


# --------------------------------------------------------------------------- backward
@_jit
def _attn_bwd_delta(O, DO, DELTA, sob, soh, son, sdb, sdh, sdn, HQ, NQ, D,
                    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """``Delta_i = sum_d dO[i, d] * O[i, d]`` for one block of rows, in float32."""
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = (bh % HQ).to(tl.int64)
    start = tl.program_id(0) * BLOCK
    offs_m = start + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = (offs_m[:, None] < NQ) & (offs_d[None, :] < D)
    row0 = tl.cast(start, tl.int64)
    in_t = tl.arange(0, BLOCK)[:, None]
    o = tl.load(O + b * sob + h * soh + row0 * son + in_t * son + offs_d[None, :], mask=ok,
                other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + row0 * sdn + in_t * sdn + offs_d[None, :], mask=ok,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * NQ + offs_m, delta, mask=offs_m < NQ)


@triton.jit
def _load_tile(ptrs, rows_ok, d_ok, MASKED: tl.constexpr, PAD_D: tl.constexpr):
    """A backward tile through pointers: zeros for rows past the end (``rows_ok``, only
    ``MASKED`` tiles have such rows) and for columns past the true head dim (``d_ok``,
    only with ``PAD_D``); an unmasked load where neither can happen."""
    if MASKED:
        if PAD_D:
            return tl.load(ptrs, mask=rows_ok & d_ok, other=0.0)
        return tl.load(ptrs, mask=rows_ok, other=0.0)
    if PAD_D:
        return tl.load(ptrs, mask=d_ok, other=0.0)
    return tl.load(ptrs)


@triton.jit
def _add_tile(ptrs, x, rows_ok, d_ok, MASKED: tl.constexpr, PAD_D: tl.constexpr):
    """Add the tile ``x`` into global memory through pointers with relaxed atomics (other
    programs add into the same rows; no ordering is needed), masked as :func:`_load_tile`
    loads."""
    if MASKED:
        if PAD_D:
            tl.atomic_add(ptrs, x, mask=rows_ok & d_ok, sem="relaxed")
        else:
            tl.atomic_add(ptrs, x, mask=rows_ok, sem="relaxed")
    elif PAD_D:
        tl.atomic_add(ptrs, x, mask=d_ok, sem="relaxed")
    else:
        tl.atomic_add(ptrs, x, sem="relaxed")


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, sqn, sdn, sdqn,
                offs_n, offs_d, D, NQ, lo, hi, qk_scale, scale,
                BLOCK_M1: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                PAD_D: tl.constexpr, UPCAST: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                DESC: tl.constexpr = False):
    """Add the query tiles ``[lo, hi)`` into one key/value tile's ``dK`` and ``dV``.

    Works on transposed tiles (keys along rows): ``S^T = K Q^T``, ``P^T``, ``dP^T = V dO^T``.
    Query rows past ``NQ`` load as zeros, so their ``dO`` and ``Q`` add nothing.
    ``ATOMIC_DQ``: also add this key tile's share of ``dQ``, ``scale * dS K``, into the
    float32 buffer at ``dq_base`` with atomic adds (a fifth product; no dQ kernel).
    ``DESC``: ``q_base``/``do_base`` are the query head's tensor descriptors; a tile is one
    ``load([start_m, 0])`` that comes back zero past ``NQ`` and past the head dim. With
    ``ATOMIC_DQ`` on a GPU ``dq_base`` is then dQ's descriptor too: one bulk reduce-add a
    tile (``_TMA_REDUCE``)."""
    offs_m = tl.arange(0, BLOCK_M1)
    qT_off = offs_m[None, :] * sqn + offs_d[:, None]                 # (D, BLOCK_M1): Q^T
    do_off = offs_m[:, None] * sdn + offs_d[None, :]                 # (BLOCK_M1, D)
    dq_off = offs_m[:, None] * sdqn + offs_d[None, :]
    for start_m in range(lo, hi, BLOCK_M1):
        rows = start_m + offs_m
        if MASKED:
            lse = tl.load(lse_base + rows, mask=rows < NQ, other=0.0)
            delta = tl.load(delta_base + rows, mask=rows < NQ, other=0.0)
        else:
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        if DESC:
            qT = tl.trans(q_base.load([start_m, 0]))
            do = do_base.load([start_m, 0])
        else:
            q_ptrs = q_base + tl.cast(start_m, tl.int64) * sqn + qT_off    # 64-bit tile origin
            do_ptrs = do_base + tl.cast(start_m, tl.int64) * sdn + do_off
            qT = _load_tile(q_ptrs, rows[None, :] < NQ, offs_d[:, None] < D, MASKED, PAD_D)
            do = _load_tile(do_ptrs, rows[:, None] < NQ, offs_d[None, :] < D, MASKED, PAD_D)
        sT = _mm(k, qT, UPCAST) * qk_scale                                # (BLOCK_N1, BLOCK_M1)
        pT = tl.exp2(sT - (lse * _LOG2E)[None, :])
        if MASKED:
            if CAUSAL:
                pT = tl.where(rows[None, :] >= offs_n[:, None], pT, 0.0)
        dv += _mm(pT.to(do.dtype), do, UPCAST)
        dpT = _mm(v, tl.trans(do), UPCAST)
        dsT = (pT * (dpT - delta[None, :])).to(qT.dtype)
        dk += _mm(dsT, tl.trans(qT), UPCAST)
        if ATOMIC_DQ:
            # other key tiles add into the same rows
            dq = _mm(tl.trans(dsT), k, UPCAST) * scale                    # (BLOCK_M1, D)
            if DESC and _TMA_REDUCE:
                # one bulk reduction of the whole tile through shared memory (the TMA
                # unit adds it into global memory; rows past NQ are dropped)
                dq_base.atomic_add([start_m, 0], dq)
            else:
                dq_ptrs = dq_base + tl.cast(start_m, tl.int64) * sdqn + dq_off
                _add_tile(dq_ptrs, dq, rows[:, None] < NQ, offs_d[None, :] < D, MASKED, PAD_D)
    return dk, dv


@_jit
def _attn_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
                          sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn,
                          sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, sdqb, sdqh, sdqn,
                          HQ, HKV, GROUP, NQ, NK, D, qk_scale, scale, CAUSAL_OFF,
                          NQ_BUCKET, NK_BUCKET,
                          HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
                          UPCAST: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                          BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                          DESC: tl.constexpr = False, DESC_OK=0):
    # ATOMIC_DQ: the fused backward; also adds dQ into the float32 DQ (zeroed before the
    # launch) with atomics. Otherwise DQ is not touched and the dQ kernel computes it.
    # DESC (tile shapes the autotuner may pick on sm90 when DESC_OK): the query tiles of Q
    # and dO come through tensor descriptors of each query head, as K and V do in the
    # forward; no per-thread pointers or masks for them.
    # the causal band below walks BLOCK_N1 query rows in steps of BLOCK_M1
    tl.static_assert(BLOCK_N1 % BLOCK_M1 == 0, "BLOCK_N1 must be a multiple of BLOCK_M1")
    pid_n = tl.program_id(0)
    bkv = tl.program_id(1)
    b = (bkv // HKV).to(tl.int64)
    kvh = (bkv % HKV).to(tl.int64)
    start_n = pid_n * BLOCK_N1
    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_n[:, None] < NK
    if PAD_D:
        ok = ok & (offs_d[None, :] < D)
    row0 = tl.cast(start_n, tl.int64)
    in_t = tl.arange(0, BLOCK_N1)[:, None]
    k = tl.load(K + b * skb + kvh * skh + row0 * skn + in_t * skn + offs_d[None, :], mask=ok,
                other=0.0)
    v = tl.load(V + b * svb + kvh * svh + row0 * svn + in_t * svn + offs_d[None, :], mask=ok,
                other=0.0)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
    nq_full = NQ - NQ % BLOCK_M1
    for g in range(GROUP):                       # every query head that reads this kv head
        h = kvh * GROUP + g
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdb + h * sdh
        dq_base = DQ + b * sdqb + h * sdqh
        if DESC:
            q_base = tl.make_tensor_descriptor(q_base, shape=[NQ, D], strides=[sqn, 1],
                                               block_shape=[BLOCK_M1, HEAD_DIM])
            do_base = tl.make_tensor_descriptor(do_base, shape=[NQ, D], strides=[sdn, 1],
                                                block_shape=[BLOCK_M1, HEAD_DIM])
            if ATOMIC_DQ and _TMA_REDUCE:
                dq_base = tl.make_tensor_descriptor(dq_base, shape=[NQ, D], strides=[sdqn, 1],
                                                    block_shape=[BLOCK_M1, HEAD_DIM])
        row_base = (b * HQ + h) * NQ
        if CAUSAL:
            # on-band: query rows start_n - CAUSAL_OFF .. + BLOCK_N1 - 1 cut the diagonal
            # (widened to whole query tiles)
            band_lo = tl.maximum(start_n - CAUSAL_OFF, 0) // BLOCK_M1 * BLOCK_M1
            band_hi = (tl.maximum(start_n + BLOCK_N1 - CAUSAL_OFF, 0) + BLOCK_M1 - 1) \
                // BLOCK_M1 * BLOCK_M1
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, LSE + row_base,
                                 DELTA + row_base, dq_base, sqn, sdn, sdqn, offs_n - CAUSAL_OFF,
                                 offs_d, D, NQ, band_lo, tl.minimum(band_hi, NQ), qk_scale,
                                 scale, BLOCK_M1, True, True, PAD_D, UPCAST, ATOMIC_DQ, DESC)
            lo = band_hi                         # below the band every key is visible
        else:
            lo = 0
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, LSE + row_base, DELTA + row_base,
                             dq_base, sqn, sdn, sdqn, offs_n, offs_d, D, NQ, lo, nq_full,
                             qk_scale, scale, BLOCK_M1, False, False, PAD_D, UPCAST, ATOMIC_DQ,
                             DESC)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, LSE + row_base, DELTA + row_base,
                             dq_base, sqn, sdn, sdqn, offs_n, offs_d, D, NQ,
                             tl.maximum(lo, nq_full), NQ, qk_scale, scale, BLOCK_M1, True, False,
                             PAD_D, UPCAST, ATOMIC_DQ, DESC)
    tl.store(DK + b * sdkb + kvh * sdkh + row0 * sdkn + in_t * sdkn + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=ok)
    tl.store(DV + b * sdvb + kvh * sdvh + row0 * sdvn + in_t * sdvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=ok)


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, skn, svn, offs_m, offs_d, D, NK, lo, hi,
              qk_scale, BLOCK_N2: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              PAD_D: tl.constexpr, UPCAST: tl.constexpr, DESC: tl.constexpr = False):
    """Add the key tiles ``[lo, hi)`` into one query tile's ``dQ``. Keys past ``NK`` load
    as zeros: their ``dS`` is multiplied by a zero row of ``K`` and adds nothing.
    ``DESC``: ``k_base``/``v_base`` are the key/value head's tensor descriptors."""
    offs_n = tl.arange(0, BLOCK_N2)
    kT_off = offs_n[None, :] * skn + offs_d[:, None]                 # (D, BLOCK_N2): K^T
    vT_off = offs_n[None, :] * svn + offs_d[:, None]
    for start_n in range(lo, hi, BLOCK_N2):
        cols = start_n + offs_n
        if DESC:
            kT = tl.trans(k_base.load([start_n, 0]))
            vT = tl.trans(v_base.load([start_n, 0]))
        else:
            kT_ptrs = k_base + tl.cast(start_n, tl.int64) * skn + kT_off  # 64-bit tile origin
            vT_ptrs = v_base + tl.cast(start_n, tl.int64) * svn + vT_off
            kT = _load_tile(kT_ptrs, cols[None, :] < NK, offs_d[:, None] < D, MASKED, PAD_D)
            vT = _load_tile(vT_ptrs, cols[None, :] < NK, offs_d[:, None] < D, MASKED, PAD_D)
        s = _mm(q, kT, UPCAST) * qk_scale
        p = tl.exp2(s - lse2[:, None])
        if MASKED:
            if CAUSAL:
                p = tl.where(cols[None, :] <= offs_m[:, None], p, 0.0)
        dp = _mm(do, vT, UPCAST)
        ds = p * (dp - delta[:, None])
        dq += _mm(ds.to(kT.dtype), tl.trans(kT), UPCAST)
    return dq


@_jit
def _attn_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                        sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn,
                        sdqb, sdqh, sdqn,
                        HQ, GROUP, NQ, NK, D, qk_scale, scale, CAUSAL_OFF, NQ_BUCKET,
                        NK_BUCKET,
                        HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
                        UPCAST: tl.constexpr,
                        BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
                        DESC: tl.constexpr = False, DESC_OK=0,
                        LONGEST_FIRST: tl.constexpr = False):
    # DESC: K and V tiles through tensor descriptors of the key/value head (sm90, DESC_OK)
    # the causal split below starts the masked key tiles at start_m
    tl.static_assert(BLOCK_M2 % BLOCK_N2 == 0, "BLOCK_M2 must be a multiple of BLOCK_N2")
    pid_m = tl.program_id(0)
    if CAUSAL and LONGEST_FIRST:
        # the forward's order (the last query tiles see the most keys, so they start
        # first); on an H200 the autotuned backward was 0.97x / 1.01x with it (4k / 16k,
        # one run of benchmarks/dq_order_probe.py), so it is off: grid order
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = (bh % HQ).to(tl.int64)
    kvh = h // GROUP
    start_m = pid_m * BLOCK_M2
    offs_m = start_m + tl.arange(0, BLOCK_M2)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_m[:, None] < NQ
    if PAD_D:
        ok = ok & (offs_d[None, :] < D)
    row0 = tl.cast(start_m, tl.int64)
    in_t = tl.arange(0, BLOCK_M2)[:, None]
    q = tl.load(Q + b * sqb + h * sqh + row0 * sqn + in_t * sqn + offs_d[None, :], mask=ok,
                other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + row0 * sdn + in_t * sdn + offs_d[None, :], mask=ok,
                 other=0.0)
    row_ok = offs_m < NQ
    lse2 = tl.load(LSE + bh.to(tl.int64) * NQ + offs_m, mask=row_ok, other=0.0) * _LOG2E
    delta = tl.load(DELTA + bh.to(tl.int64) * NQ + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    if DESC:
        k_base = tl.make_tensor_descriptor(k_base, shape=[NK, D], strides=[skn, 1],
                                           block_shape=[BLOCK_N2, HEAD_DIM])
        v_base = tl.make_tensor_descriptor(v_base, shape=[NK, D], strides=[svn, 1],
                                           block_shape=[BLOCK_N2, HEAD_DIM])
    dq = tl.zeros([BLOCK_M2, HEAD_DIM], tl.float32)
    nk_full = NK - NK % BLOCK_N2
    if CAUSAL:
        mid = tl.minimum(tl.maximum(start_m + CAUSAL_OFF, 0) // BLOCK_N2 * BLOCK_N2, nk_full)
        hi = tl.minimum(start_m + BLOCK_M2 + CAUSAL_OFF, NK)
    else:
        mid = nk_full
        hi = NK
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, skn, svn, offs_m + CAUSAL_OFF, offs_d,
                   D, NK, 0, mid, qk_scale, BLOCK_N2, False, CAUSAL, PAD_D, UPCAST, DESC)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, skn, svn, offs_m + CAUSAL_OFF, offs_d,
                   D, NK, mid, hi, qk_scale, BLOCK_N2, True, CAUSAL, PAD_D, UPCAST, DESC)
    tl.store(DQ + b * sdqb + h * sdqh + row0 * sdqn + in_t * sdqn + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=ok)


_KEY = ["NQ_BUCKET", "NK_BUCKET", "HEAD_DIM", "CAUSAL", "PAD_D", "DESC_OK"]
_attn_bwd_dkdv = _tuned(bwd_configs("dkdv"), _KEY)(_attn_bwd_dkdv_kernel)
# the same kernel with ATOMIC_DQ=True, tuned on its own (its configs zero DQ first)
_attn_bwd_atomic = _tuned(bwd_configs("atomic_dq"), _KEY)(_attn_bwd_dkdv_kernel)
_attn_bwd_dq = _tuned(bwd_configs("dq"), _KEY)(_attn_bwd_dq_kernel)


# --------------------------------------------------------------------------- host side
def _validate(q, k, v, is_causal, scale, enable_gqa, alignment):
    """The course's one validator against the ``"triton"`` record of
    :data:`course_utils.contract.IMPLEMENTATIONS` (dtypes float16, bfloat16, float32;
    head dims up to 256; the device Triton runs on; both causal alignments)."""
    return validate_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                              alignment=alignment, impl="triton")


def _upcast(t):
    return device.INTERPRET and t.dtype == torch.bfloat16


def _inner_contig(t):
    """The kernels assume stride 1 along the head dim (one 16-byte vector per load);
    any other layout is copied once. Every other stride is passed as it is."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _grid_rows(n, meta_key):
    return lambda meta: (triton.cdiv(n, meta[meta_key]),)


def _launch_fwd(q, k, v, sh, causal, diag=0):
    """Launch the forward kernel on validated inputs; return ``(o, lse)``. With
    ``causal``, key ``j`` is visible to query ``i`` when ``j <= i + diag`` (``diag=0``:
    SDPA's top-left mask; ``diag = Nk - Nq``: the bottom-right mask). A row that sees
    no key gets ``o = 0`` and ``lse = -inf``."""
    q, k, v = _inner_contig(q), _inner_contig(k), _inner_contig(v)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((sh.B, sh.Hq, sh.Nq), dtype=torch.float32, device=q.device)
    hd = padded_head_dim(sh.D)
    desc_ok = _desc_ok(k, v)
    if desc_ok:
        triton.set_allocator(_scratch)

    def grid(meta):
        return (triton.cdiv(sh.Nq, meta["BLOCK_M"]), sh.B * sh.Hq)

    _attn_fwd[grid](q, k, v, o, lse,
                    q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                    v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                    sh.Hq, sh.group, sh.Nq, sh.Nk, sh.D, int(diag), sh.scale * LOG2E,
                    length_bucket(sh.Nq), length_bucket(sh.Nk),
                    HEAD_DIM=hd, CAUSAL=bool(causal), PAD_D=hd != sh.D,
                    UPCAST=_upcast(q), POS_SCALE=sh.scale >= 0, DESC_OK=int(desc_ok))
    return o, lse


def _tma_readable(t) -> bool:
    """Whether the TMA unit can read tiles of the ``(B, H, N, D)`` tensor ``t`` through a
    descriptor per head: 16-bit elements, a 16-byte aligned start, the last stride 1,
    every other stride and the row itself a multiple of 16 bytes."""
    es = t.element_size()
    return (t.dtype in (torch.float16, torch.bfloat16) and t.data_ptr() % 16 == 0
            and t.stride(3) == 1 and t.shape[3] * es % 16 == 0
            and all(t.stride(i) * es % 16 == 0 for i in range(3)))


def _desc_ok(k, v) -> bool:
    """Whether a kernel may read tiles of these two tensors (the forward's K and V, the
    backward's Q and dO or K and V) through tensor descriptors (``DESC``): an sm90 GPU or
    newer, autotuning on, and both tensors :func:`_tma_readable`. Anything else keeps the
    pointer loads."""
    return (_AUTOTUNE and k.is_cuda and device.CAPABILITY is not None
            and device.CAPABILITY >= (9, 0) and _tma_readable(k) and _tma_readable(v))


def _dq_desc(desc_ok: bool, row_bytes: int) -> bool:
    """Whether the dQ kernel reads K and V through descriptors: whenever it may
    (``desc_ok``, rows under 512 bytes). On an H200, in every tile shape the autotuner
    tries, that ran at 0.998x to 1.08x the pointer loads without the mask and 1.08x to
    1.49x with it (benchmarks/<device>/ablation.md), so it is not left to the autotuner."""
    return bool(desc_ok) and row_bytes < 512


def _scratch(size: int, alignment: int, stream):
    """Global memory for the descriptors a kernel makes on the device."""
    return torch.empty(size, dtype=torch.int8, device=torch.device("cuda",
                                                                   torch.cuda.current_device()))


def triton_attention_forward(q, k, v, *, is_causal=False, scale=None, enable_gqa=False,
                             alignment=None):
    """Run the forward kernel; return ``(o, lse)`` (``lse``: natural log, float32,
    ``(B, Hq, Nq)``). No autograd: see :func:`triton_attention`."""
    sh = _validate(q, k, v, is_causal, scale, enable_gqa, alignment)
    return _launch_fwd(q, k, v, sh, sh.is_causal, sh.offset)


def check_saved(q, o, lse, do):
    """What a backward takes besides Q, K, V: the forward's ``o`` (q's shape), ``lse``
    (``(B, Hq, Nq)``) and the incoming ``do`` (q's shape), floating point, on q's device;
    a clear error before any launch otherwise."""
    for name, t, shape in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor of shape {tuple(shape)}, "
                            f"got {type(t).__name__}")
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} must be a tensor of shape {tuple(shape)}, "
                             f"got {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; put every "
                             "tensor on one device")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")


BWD_DESIGNS = ("three_kernels", "atomic_dq")


def _check_bwd(bwd):
    if not isinstance(bwd, str):
        raise TypeError(f"bwd must be one of {', '.join(map(repr, BWD_DESIGNS))}, "
                        f"got {type(bwd).__name__} {bwd!r}")
    if bwd not in BWD_DESIGNS:
        raise ValueError(f"bwd must be one of {', '.join(map(repr, BWD_DESIGNS))}, got {bwd!r}")


def triton_attention_backward(q, k, v, o, lse, do, *, is_causal=False, scale=None,
                              enable_gqa=False, alignment=None, bwd="three_kernels"):
    """Gradients ``(dq, dk, dv)`` from the forward's ``o`` and ``lse`` and the incoming
    ``do``. ``bwd`` picks the design (both start with the Delta preprocess):

    * ``"three_kernels"`` (default): the KV-stationary dK/dV kernel, then the
      Q-stationary dQ kernel: seven matrix products per (query tile, key tile) pair,
      K and V read twice, every output written by exactly one program, deterministic;
    * ``"atomic_dq"``: one fused KV-stationary kernel that also adds each key tile's
      share of dQ into a float32 buffer with atomic adds (on sm90, for the tile shapes
      that read through descriptors, one bulk add a tile by the TMA unit; five products,
      K and V read once); dQ is converted to the input dtype afterwards. On a GPU the
      order in which the key tiles' shares arrive varies from run to run, so dQ is not
      bitwise reproducible (float32 addition is not associative); dK and dV are.
    """
    _check_bwd(bwd)
    sh = _validate(q, k, v, is_causal, scale, enable_gqa, alignment)
    check_saved(q, o, lse, do)
    q, k, v, o, do = (_inner_contig(t) for t in (q, k, v, o, do))
    lse = lse.float().contiguous()
    hd = padded_head_dim(sh.D)
    pad = hd != sh.D
    causal = sh.is_causal
    delta = torch.empty_like(lse)
    atomic = bwd == "atomic_dq"
    # the atomic kernel accumulates dQ in float32 (zeroed by its configs' pre_hook)
    dq = torch.empty(q.shape, dtype=torch.float32 if atomic else q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    block = 64 if device.HAS_GPU else 32
    # dK/dV may read Q and dO through descriptors, dQ K and V (the DESC tile shapes)
    desc_ok = _desc_ok(q, do) and _desc_ok(k, v)
    if desc_ok:
        triton.set_allocator(_scratch)
    _attn_bwd_delta[(triton.cdiv(sh.Nq, block), sh.B * sh.Hq)](
        o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1),
        do.stride(2), sh.Hq, sh.Nq, sh.D, HEAD_DIM=hd, BLOCK=block)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))

    def grid_kv(meta):
        return (triton.cdiv(sh.Nk, meta["BLOCK_N1"]), sh.B * sh.Hkv)

    kernel = _attn_bwd_atomic if atomic else _attn_bwd_dkdv
    kernel[grid_kv](q, k, v, do, lse, delta, dk, dv, dq, *strides,
                    dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1),
                    dv.stride(2), dq.stride(0), dq.stride(1), dq.stride(2),
                    sh.Hq, sh.Hkv, sh.group, sh.Nq, sh.Nk, sh.D, sh.scale * LOG2E,
                    sh.scale, sh.offset, length_bucket(sh.Nq), length_bucket(sh.Nk),
                    HEAD_DIM=hd, CAUSAL=causal, PAD_D=pad, UPCAST=_upcast(q),
                    ATOMIC_DQ=atomic, DESC_OK=int(desc_ok))
    if atomic:
        return dq.to(q.dtype), dk, dv

    def grid_q(meta):
        return (triton.cdiv(sh.Nq, meta["BLOCK_M2"]), sh.B * sh.Hq)

    _attn_bwd_dq[grid_q](q, k, v, do, lse, delta, dq, *strides,
                         dq.stride(0), dq.stride(1), dq.stride(2),
                         sh.Hq, sh.group, sh.Nq, sh.Nk, sh.D, sh.scale * LOG2E, sh.scale,
                         sh.offset, length_bucket(sh.Nq), length_bucket(sh.Nk), HEAD_DIM=hd,
                         CAUSAL=causal, PAD_D=pad, UPCAST=_upcast(q), DESC_OK=int(desc_ok),
                         DESC=_dq_desc(desc_ok, hd * q.element_size()))
    return dq, dk, dv


class TritonAttention(torch.autograd.Function):
    """``forward`` runs the fused forward and saves ``(q, k, v, o, lse)``; ``backward``
    runs the backward design ``bwd`` (see :func:`triton_attention_backward`). ``lse`` is
    returned but not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, enable_gqa=False, alignment=None,
                bwd="three_kernels"):
        o, lse = triton_attention_forward(q, k, v, is_causal=is_causal, scale=scale,
                                          enable_gqa=enable_gqa, alignment=alignment)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.opts = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                        alignment=alignment, bwd=bwd)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = triton_attention_backward(q, k, v, o, lse, do, **ctx.opts)
        return dq, dk, dv, None, None, None, None, None


def triton_attention(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, alignment=None,
                     return_lse=False, bwd="three_kernels"):
    """Fused FlashAttention-2 in Triton: ``softmax(scale * Q K^T [+ causal mask]) V``.

    ``q``: ``(B, Hq, Nq, D)``; ``k``, ``v``: ``(B, Hkv, Nk, D)``; ``Hq != Hkv`` needs
    ``enable_gqa=True``; ``is_causal`` with ``alignment`` ``"causal_upper_left"``
    (default, SDPA's) or ``"causal_lower_right"``; ``scale``: default ``1 / sqrt(D)``.
    Returns ``o`` (the input dtype), or ``(o, lse)`` with ``return_lse=True`` (``lse``:
    natural log, float32, ``(B, Hq, Nq)``, not differentiable). Gradients flow to
    ``q``, ``k`` and ``v``, computed by the backward design ``bwd``: ``"three_kernels"``
    (default) or ``"atomic_dq"`` (fused, dQ added atomically, so not bitwise
    reproducible on a GPU; see :func:`triton_attention_backward`). Bad inputs raise
    ``TypeError``/``ValueError`` before any launch.
    """
    _check_bwd(bwd)
    _validate(q, k, v, is_causal, scale, enable_gqa, alignment)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be True or False, got {return_lse!r}")
    o, lse = TritonAttention.apply(q, k, v, is_causal, scale, enable_gqa, alignment, bwd)
    return (o, lse) if return_lse else o
