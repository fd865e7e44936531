"""Lesson 9: split-KV decoding ("flash-decoding") in Triton, with GQA packing.

Two kernels, launched one after the other:

1. ``_split_kv_kernel``, grid ``(num_splits, B * Hkv)``. Program ``(c, b*Hkv+g)`` owns
   chunk ``c`` of the cache of batch element ``b`` and kv head ``g``. It loads the
   queries of *all* ``group = Hq // Hkv`` query heads that share kv head ``g`` (and all
   ``Nq`` new tokens) as one ``(group * Nq, D)`` tile, so every K and V block it reads
   serves the whole group: the cache is read from memory once, not ``group`` times.
   It runs the online softmax of lessons 2-4 over its chunk and writes the partial
   state ``(m, l, acc)`` of lesson 3 (natural-log ``m``, unnormalised ``acc``).
2. ``_merge_kernel``, grid ``(B * Hq * Nq,)``: folds the ``num_splits`` partial states
   of one output row with lesson 3's merge, ``m = max_c m_c``,
   ``l = sum_c l_c exp(m_c - m)``, ``acc = sum_c acc_c exp(m_c - m)``, then writes
   ``o = acc / l`` and ``lse = m + log l``.

With a block table the split kernel reads a **paged** cache: key ``j`` of sequence
``b`` is slot ``j % page_size`` of page ``block_table[b, j // page_size]``.

:func:`choose_num_splits` picks the number of chunks from the batch, the kv heads and
the cache length (see its docstring). On a CPU the kernels run in Triton's
interpreter with one fixed configuration; on a GPU the split kernel is autotuned.
"""
from __future__ import annotations

import functools

import torch

from course_utils import device  # sets TRITON_INTERPRET before triton is imported
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_utils.attention import AttentionState  # noqa: E402
from course_utils.constants import LN2, LOG2E  # noqa: E402
from course_utils.decoding import validate_decode_inputs, validate_paged_cache  # noqa: E402
# lesson 6's tl.dot, which takes bfloat16 through float32 in the CPU interpreter
from course_utils.triton_attention import _mm, _upcast  # noqa: E402

__all__ = ["decode_attention", "choose_num_splits", "default_num_sms", "CHUNK_ALIGN"]

_LN2 = tl.constexpr(LN2)
# chunk lengths are multiples of this, so a chunk is a whole number of K/V blocks
CHUNK_ALIGN = device.pick(cpu=16, gpu=128)
_CPU_BLOCK_N = 16


@functools.lru_cache(maxsize=None)
def default_num_sms() -> int:
    """Streaming multiprocessors of the GPU (132 on an H100 SXM); 4 on a CPU, so the
    interpreter still exercises several splits."""
    if device.HAS_GPU:
        return torch.cuda.get_device_properties(device.DEVICE).multi_processor_count
    return 4


def choose_num_splits(batch: int, kv_heads: int, cache_len: int, num_sms: int | None = None,
                      *, waves: int = 4, min_chunk: int = 512) -> int:
    """How many chunks to cut the cache into.

    Without splitting there are ``batch * kv_heads`` programs (GQA packing already puts a
    whole query-head group in one). At ``B = 1, Hkv = 8`` that is 8 programs for 132
    multiprocessors: most of the GPU idles and memory bandwidth goes unused. So:

    * aim for ``waves * num_sms`` programs in all (several resident programs per
      multiprocessor keep enough loads in flight to saturate memory);
    * but give no chunk fewer than ``min_chunk`` keys, because each chunk costs a fixed
      amount (loading Q, writing a partial state that the merge reads back);
    * and never more than one chunk per ``CHUNK_ALIGN`` keys.
    """
    for name, val in (("batch", batch), ("kv_heads", kv_heads), ("cache_len", cache_len)):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    num_sms = default_num_sms() if num_sms is None else num_sms
    if not isinstance(num_sms, int) or num_sms < 1:
        raise ValueError(f"num_sms must be a positive int, got {num_sms!r}")
    want = -(-waves * num_sms // (batch * kv_heads))
    most = max(1, cache_len // max(min_chunk, CHUNK_ALIGN))
    return max(1, min(want, most))


@triton.jit
def _split_kv_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, PART_M, PART_L, PART_ACC,
    sqb, sqh, sqn, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    ssl, sbt, sbt1, PAGE_SIZE, HKV, NQ, LMAX, CHUNK, NUM_SPLITS, qk_scale, CHUNK_KEY,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, CAUSAL: tl.constexpr, PAGED: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_N: tl.constexpr,
):
    split = tl.program_id(0)
    bg = tl.program_id(1)
    b = (bg // HKV).to(tl.int64)        # 64-bit offsets: a large cache passes 2**31 elements
    g = (bg % HKV).to(tl.int64)
    if HAS_SEQLENS:
        length = tl.load(SEQLENS + b * ssl)        # any stride: a column of a table works
    else:
        length = LMAX
    # GQA packing: packed row r is query head g*GROUP + r // NQ, new token r % NQ
    rows = tl.arange(0, BLOCK_M)
    head = g * GROUP + rows // NQ
    tok = rows % NQ
    row_ok = rows < GROUP * NQ
    dcol = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * sqb + head[:, None].to(tl.int64) * sqh + tok[:, None] * sqn
                + dcol[None, :] * sqd, mask=row_ok[:, None], other=0.0)
    last = length - NQ + tok            # bottom-right causal: last key each row may see

    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, length)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_base = K + b * skb + g * skh
    v_base = V + b * svb + g * svh
    # inside a block, 32-bit offsets; the block's first key is a 64-bit scalar offset
    # (a cache of 2**31 elements, or a packed K/V cache with a long row stride, passes
    # the 32-bit range)
    kt_off = tl.arange(0, BLOCK_N)[None, :] * skn + dcol[:, None] * skd       # (D, BLOCK_N)
    v_off = tl.arange(0, BLOCK_N)[:, None] * svn + dcol[None, :] * svd        # (BLOCK_N, D)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        if PAGED:
            # paged cache: key j lives in page block_table[b, j // PAGE_SIZE], slot j % PAGE_SIZE
            page = tl.load(BLOCK_TABLE + b * sbt + (cols // PAGE_SIZE) * sbt1, mask=col_ok,
                           other=0).to(tl.int64)
            slot = cols % PAGE_SIZE
            kt = tl.load(K + g * skh + (page * skb + slot * skn)[None, :] + dcol[:, None] * skd,
                         mask=col_ok[None, :], other=0.0)
        else:
            kt = tl.load(k_base + tl.cast(start, tl.int64) * skn + kt_off,
                         mask=col_ok[None, :], other=0.0)                  # (D, BLOCK_N)
        s = _mm(q, kt, UPCAST) * qk_scale                                  # log2 units
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= last[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with no key yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if PAGED:
            v = tl.load(V + g * svh + (page * svb + slot * svn)[:, None] + dcol[None, :] * svd,
                        mask=col_ok[:, None], other=0.0)
        else:
            v = tl.load(v_base + tl.cast(start, tl.int64) * svn + v_off,
                        mask=col_ok[:, None], other=0.0)                   # (BLOCK_N, D)
        acc = acc * alpha[:, None] + _mm(p.to(v.dtype), v, UPCAST)
        m_i = m_new

    # partial state in natural-log units, as lesson 3 writes it
    idx = ((b * HKV * GROUP + head) * NQ + tok) * NUM_SPLITS + split
    tl.store(PART_M + idx, m_i * _LN2, mask=row_ok)   # times ln 2
    tl.store(PART_L + idx, l_i, mask=row_ok)
    tl.store(PART_ACC + idx[:, None] * HEAD_DIM + dcol[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _merge_kernel(PART_M, PART_L, PART_ACC, O, LSE, NUM_SPLITS,
                  HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)   # one (b, head, token) output row
    sp = tl.arange(0, BLOCK_S)
    ok = sp < NUM_SPLITS
    m = tl.load(PART_M + row * NUM_SPLITS + sp, mask=ok, other=float("-inf"))
    l = tl.load(PART_L + row * NUM_SPLITS + sp, mask=ok, other=0.0)
    dcol = tl.arange(0, HEAD_DIM)
    acc = tl.load(PART_ACC + (row * NUM_SPLITS + sp[:, None]) * HEAD_DIM + dcol[None, :],
                  mask=ok[:, None], other=0.0)
    # lesson 3's merge of all splits at once: rescale each state to the common max
    m_all = tl.max(m, 0)
    # a row that sees no key in any chunk (a sequence shorter than its new tokens,
    # cache_seqlens 0) has m_all = -inf: subtract 0 instead, so it gets o = 0 and
    # lse = -inf rather than NaN from -inf - -inf
    m_use = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp(m - m_use)              # empty chunks (m = -inf) weigh 0
    l_all = tl.sum(l * w, 0)
    o = tl.sum(acc * w[:, None], 0) / tl.where(l_all == 0.0, 1.0, l_all)
    tl.store(O + row * HEAD_DIM + dcol, o.to(O.dtype.element_ty))
    tl.store(LSE + row, tl.where(l_all == 0.0, float("-inf"), m_all + tl.log(l_all)))


def _gpu_configs():
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bn, w, st in ((64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3), (64, 8, 4),
                              (32, 4, 4),
                              # the one that fits float32 at head dim 256: K and V tiles of
                              # 32 KiB each, two stages (the others need more than 227 KiB)
                              (32, 4, 2))]


if device.HAS_GPU:
    # CHUNK_KEY: the chunk length rounded up to a power of two, so a sweep over cache
    # lengths tunes once per octave
    _split_kv = triton.autotune(
        configs=_gpu_configs(),
        key=["CHUNK_KEY", "GROUP", "HEAD_DIM", "BLOCK_M", "CAUSAL", "PAGED"])(_split_kv_kernel)
else:
    _split_kv = _split_kv_kernel


def decode_attention(q, k_cache, v_cache, cache_seqlens=None, *, is_causal=True, alignment=None,
                     scale=None, enable_gqa=True, num_splits=None, return_lse=False,
                     return_partials=False, check_lengths=True, block_table=None):
    """Split-KV decode attention; same contract as
    :func:`course_utils.decoding.decode_attention_reference` (what it supports is its
    ``"decode"`` record in :data:`course_utils.contract.IMPLEMENTATIONS`: the
    ``causal_lower_right`` alignment only).

    ``num_splits`` overrides :func:`choose_num_splits`. With ``return_partials`` the
    per-chunk states come back too, as an :class:`AttentionState` whose ``m``, ``l``
    are ``(B, Hq, Nq, S)`` and ``acc`` is ``(B, Hq, Nq, S, D)`` (float32, unnormalised),
    so they can be folded with ``merge_states`` by hand.

    The chunks are cut from the cache's capacity ``Lmax``, so nothing is read back from
    the GPU; chunks past a sequence's length return at once. With
    ``check_lengths=False`` the values of ``cache_seqlens`` are not range-checked
    either, and the call can be captured in a CUDA graph (the way serving loops replay
    decode steps).

    **Paged cache**: with ``block_table`` (``(B, n)`` int32/int64), ``k_cache`` and
    ``v_cache`` are pools of pages of shape ``(num_pages, Hkv, page_size, D)`` and key
    ``j`` of batch element ``b`` lives in page ``block_table[b, j // page_size]`` at slot
    ``j % page_size``; ``cache_seqlens`` is then required (see
    :func:`course_utils.decoding.gather_paged_cache` for the same layout in PyTorch)."""
    paged = block_table is not None
    if paged:
        validate_paged_cache(k_cache, v_cache, block_table, q.shape[0],
                             check_values=check_lengths)
        if cache_seqlens is None:
            raise ValueError("cache_seqlens is required with block_table: a paged cache has no "
                             "implicit length")
        n_pages, page_size = block_table.shape[1], k_cache.shape[2]
        view = (q.shape[0], k_cache.shape[1], n_pages * page_size, k_cache.shape[3])
        k_val = k_cache.as_strided(view, (0, 0, 0, 0))    # shape-only views for validation
        v_val = v_cache.as_strided(view, (0, 0, 0, 0))
    else:
        k_val, v_val, page_size = k_cache, v_cache, 1
    sh = validate_decode_inputs(q, k_val, v_val, cache_seqlens, is_causal=is_causal,
                                alignment=alignment, scale=scale, enable_gqa=enable_gqa,
                                check_lengths=check_lengths, impl="decode")
    b, hq, hkv, nq, lmax, d, scale = sh[:7]
    causal = sh.is_causal
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    length = lmax
    if num_splits is None:
        num_splits = choose_num_splits(b, hkv, length)
    chunk = -(-length // min(num_splits, length))
    chunk = -(-chunk // CHUNK_ALIGN) * CHUNK_ALIGN
    num_splits = -(-length // chunk)        # drop splits that would be empty everywhere

    group = hq // hkv
    block_m = max(16, triton.next_power_of_2(group * nq))
    dev = q.device
    part_m = torch.empty(b, hq, nq, num_splits, dtype=torch.float32, device=dev)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(b, hq, nq, num_splits, d, dtype=torch.float32, device=dev)
    seqlens = q if cache_seqlens is None else cache_seqlens.to(torch.int32)
    table = block_table.to(torch.int32) if paged else seqlens
    args = (q, k_cache, v_cache, seqlens, table, part_m, part_l, part_acc,
            *q.stride(), *k_cache.stride(), *v_cache.stride(),
            seqlens.stride(0), table.stride(0), table.stride(-1), page_size, hkv, nq, lmax, chunk,
            num_splits, scale * LOG2E, triton.next_power_of_2(chunk))
    meta = dict(GROUP=group, HEAD_DIM=d, BLOCK_M=block_m,
                HAS_SEQLENS=cache_seqlens is not None, CAUSAL=bool(causal), PAGED=paged,
                UPCAST=_upcast(q))
    grid = (num_splits, b * hkv)
    if device.HAS_GPU:
        _split_kv[grid](*args, **meta)
    else:
        _split_kv[grid](*args, **meta, BLOCK_N=_CPU_BLOCK_N)

    o = torch.empty(b, hq, nq, d, dtype=q.dtype, device=dev)
    lse = torch.empty(b, hq, nq, dtype=torch.float32, device=dev)
    _merge_kernel[(b * hq * nq,)](part_m, part_l, part_acc, o, lse, num_splits,
                                  HEAD_DIM=d, BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    out = [o]
    if return_lse:
        out.append(lse)
    if return_partials:
        out.append(AttentionState(m=part_m, l=part_l, acc=part_acc))
    return out[0] if len(out) == 1 else tuple(out)
