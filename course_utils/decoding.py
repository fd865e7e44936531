"""Lesson 9: attention of a few new tokens against a KV cache, in plain PyTorch.

While a model generates text, each step appends ``Nq`` new tokens (usually one;
a few when a draft is verified) to a cache that already holds ``L`` keys and
values. The new tokens are the *last* ``Nq`` positions of the sequence, so
new token ``t`` (0-based among the new ones) sits at absolute position
``L - Nq + t`` and may look at keys ``0 .. L - Nq + t``. That is the
``causal_lower_right`` mask (``torch.nn.attention.bias``'s name; flash-attn's
``causal=True``). ``torch.nn.functional.scaled_dot_product_attention`` with
``is_causal=True`` is ``causal_upper_left`` instead (query ``t`` sees keys
``0 .. t``), which is wrong for decoding whenever ``Nq < L``. The two agree only
when ``Nq == L``. With ``Nq = 2`` new tokens and ``L = 5`` keys (1 = visible)::

    causal_lower_right (decoding)     causal_upper_left (SDPA's is_causal)
        1 1 1 1 0                         1 0 0 0 0
        1 1 1 1 1                         1 1 0 0 0

Arguments follow :mod:`course_utils.contract`: options are keyword-only,
``is_causal=True`` with ``alignment="causal_lower_right"`` by default. Shapes follow
SDPA: ``q`` is ``(B, Hq, Nq, D)``, the caches are ``(B, Hkv, Lmax, D)`` with ``Hq`` a
multiple of ``Hkv`` (grouped-query attention: query head ``h`` reads kv head
``h // (Hq // Hkv)``). A KV cache is laid out per kv head, so, as in flash-attn's
``flash_attn_with_kvcache``, ``enable_gqa`` defaults to True here. ``cache_seqlens`` (optional,
``(B,)`` integers) says how many cache slots of each batch element are filled;
slots past it are ignored. Without it every element uses all ``Lmax`` slots.

A paged cache (pages of ``page_size`` positions handed out from one pool, listed per
sequence in a block table) is described by :func:`gather_paged_cache`, which builds the
contiguous cache it stands for.

The Triton kernel of this lesson lives in :mod:`course_utils.triton_decode`; this
module is its reference and the PyTorch model of its split-KV algorithm.
"""
from __future__ import annotations

import math

import torch

from course_utils.attention import AttentionState, merge_states, state_from_scores
from course_utils.constants import ALIGNMENTS, CAUSAL_LOWER_RIGHT, CAUSAL_UPPER_LEFT
from course_utils import contract

__all__ = [
    "validate_decode_inputs", "causal_mask", "decode_attention_reference",
    "split_kv_states", "split_kv_attention", "chunk_bounds", "kv_bytes_per_step",
    "decode_flops_per_step", "check_decode_output", "validate_paged_cache",
    "gather_paged_cache",
]

def validate_decode_inputs(q, k_cache, v_cache, cache_seqlens=None, *, is_causal=True,
                           alignment=None, scale=None, enable_gqa=True, check_lengths=True,
                           impl="decode_reference"):
    """Raise a ``TypeError``/``ValueError`` naming the bad argument, before any work:
    :func:`course_utils.contract.validate_attention` for ``q`` and the caches, then
    ``cache_seqlens``.

    ``check_lengths=False`` skips the range check of the *values* of ``cache_seqlens``,
    which reads them back to the host (a GPU sync, not allowed inside CUDA-graph
    capture). Returns the :class:`~course_utils.contract.AttentionShape` (``Nk`` is
    the cache capacity ``Lmax``).
    """
    sh = contract.validate_attention(q, k_cache, v_cache, is_causal=is_causal,
                                     alignment=alignment, scale=scale, enable_gqa=enable_gqa,
                                     impl=impl, names=("q", "k_cache", "v_cache"))
    b, nq, lmax = sh.B, sh.Nq, sh.Nk
    if cache_seqlens is None:
        if nq > lmax:
            raise ValueError(f"q has {nq} new tokens but the cache holds only {lmax}; the new "
                             "tokens must already be written into the cache (Nq <= cache length)")
    else:
        if not isinstance(cache_seqlens, torch.Tensor):
            raise TypeError("cache_seqlens must be a torch.Tensor of shape (B,) with integer "
                            f"dtype, got {type(cache_seqlens).__name__}")
        if cache_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cache_seqlens must be int32 or int64, got {cache_seqlens.dtype}")
        if tuple(cache_seqlens.shape) != (b,):
            raise ValueError(f"cache_seqlens must have shape (B,) = ({b},), "
                             f"got {tuple(cache_seqlens.shape)}")
        if cache_seqlens.device != q.device:
            raise ValueError(f"cache_seqlens must be on q's device {q.device}, "
                             f"got {cache_seqlens.device}")
        if check_lengths:
            lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
            if lo < nq or hi > lmax:
                raise ValueError(f"cache_seqlens must lie in [Nq, Lmax] = [{nq}, {lmax}] (the "
                                 f"new tokens are already in the cache), got values in [{lo}, {hi}]")
    return sh


def validate_paged_cache(k_pages, v_pages, block_table, batch=None, check_values=True):
    """Check a paged cache: ``k_pages``/``v_pages`` of shape ``(num_pages, Hkv, page_size, D)``
    and ``block_table`` of shape ``(B, n)`` (``B == batch`` unless ``batch`` is None) with
    integer page indices in ``[0, num_pages)`` (the values are read back to the host
    only if ``check_values``)."""
    for name, t in (("k_cache", k_pages), ("v_cache", v_pages)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor of pages (num_pages, Hkv, page_size, D) "
                             "when block_table is given")
    if tuple(v_pages.shape) != tuple(k_pages.shape):
        raise ValueError(f"v_cache must have the shape of k_cache {tuple(k_pages.shape)}, "
                         f"got {tuple(v_pages.shape)}")
    if not isinstance(block_table, torch.Tensor):
        raise TypeError("block_table must be a torch.Tensor of shape (B, pages per sequence), "
                        f"got {type(block_table).__name__}")
    if block_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_table must be int32 or int64, got {block_table.dtype}")
    if (block_table.dim() != 2 or block_table.shape[1] < 1
            or (batch is not None and block_table.shape[0] != batch)):
        want = "B" if batch is None else batch
        raise ValueError(f"block_table must have shape (B, n) = ({want}, n >= 1), "
                         f"got {tuple(block_table.shape)}")
    if block_table.device != k_pages.device:
        raise ValueError(f"block_table must be on the cache's device {k_pages.device}, "
                         f"got {block_table.device}")
    if check_values:
        lo, hi = int(block_table.min()), int(block_table.max())
        if lo < 0 or hi >= k_pages.shape[0]:
            raise ValueError(f"block_table entries must be page indices in [0, "
                             f"{k_pages.shape[0] - 1}], got values in [{lo}, {hi}]")


def gather_paged_cache(pages, block_table):
    """The contiguous ``(B, Hkv, n * page_size, D)`` cache that a paged cache stands for:
    position ``j`` of batch element ``b`` is slot ``j % page_size`` of page
    ``block_table[b, j // page_size]``."""
    validate_paged_cache(pages, pages, block_table, None)
    b, n = block_table.shape
    _, hkv, page_size, d = pages.shape
    return pages[block_table.long()].permute(0, 2, 1, 3, 4).reshape(b, hkv, n * page_size, d)


def causal_mask(nq: int, nk: int, alignment: str = CAUSAL_LOWER_RIGHT, device=None) -> torch.Tensor:
    """Boolean ``(nq, nk)`` mask, True where query ``t`` may see key ``j``.

    ``"causal_lower_right"``: the queries are the last ``nq`` positions,
    ``j <= nk - nq + t`` (decoding). ``"causal_upper_left"``: the queries are the first
    ``nq`` positions, ``j <= t`` (what SDPA's ``is_causal=True`` does)."""
    return contract.causal_mask(nq, nk, alignment, device=device)


def _lengths(cache_seqlens, b, lmax):
    if cache_seqlens is None:
        return [lmax] * b
    return [int(x) for x in cache_seqlens.tolist()]


def decode_attention_reference(q, k_cache, v_cache, cache_seqlens=None, *, is_causal=True,
                               alignment=None, scale=None, enable_gqa=True, return_lse=False):
    """Attention of the ``Nq`` new tokens in ``q`` against the filled part of the cache.

    Computed in float32 (float64 for float64 inputs) with an explicit mask; returns
    ``o`` of ``q``'s dtype and shape, and with ``return_lse`` also the natural-log
    ``lse`` of shape ``(B, Hq, Nq)`` (float32; float64 for float64 inputs).
    ``is_causal=True`` uses the ``causal_lower_right`` alignment (new tokens at the
    end) unless ``alignment`` says otherwise; ``is_causal=False`` lets every new token
    see the whole filled cache."""
    sh = validate_decode_inputs(q, k_cache, v_cache, cache_seqlens, is_causal=is_causal,
                                alignment=alignment, scale=scale, enable_gqa=enable_gqa)
    b, hq, hkv, nq, lmax, d, scale, group = sh[:8]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.empty_like(q)
    lse = torch.empty(b, hq, nq, dtype=work, device=q.device)
    for i, length in enumerate(_lengths(cache_seqlens, b, lmax)):
        k = k_cache[i, :, :length].to(work).repeat_interleave(group, dim=0)   # (Hq, L, D)
        v = v_cache[i, :, :length].to(work).repeat_interleave(group, dim=0)
        s = (q[i].to(work) @ k.transpose(-1, -2)) * scale                     # (Hq, Nq, L)
        if sh.is_causal:
            s = s.masked_fill(~causal_mask(nq, length, sh.causal, device=q.device),
                              float("-inf"))
        lse_i = torch.logsumexp(s, dim=-1)
        shift = torch.where(torch.isneginf(lse_i), torch.zeros_like(lse_i), lse_i)
        o[i] = (torch.exp(s - shift[..., None]) @ v).to(q.dtype)
        lse[i] = lse_i
    return (o, lse) if return_lse else o


def chunk_bounds(length: int, num_splits: int, align: int = 1):
    """Split ``range(length)`` into ``num_splits`` chunks of one size (a multiple of
    ``align``); the last chunks may be short or empty. Returns ``(chunk_len, bounds)``."""
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    if not isinstance(align, int) or align < 1:
        raise ValueError(f"align must be a positive int, got {align!r}")
    chunk = -(-length // num_splits)
    chunk = -(-chunk // align) * align
    return chunk, [(min(s * chunk, length), min((s + 1) * chunk, length))
                   for s in range(num_splits)]


def split_kv_states(q, k_cache, v_cache, num_splits, cache_seqlens=None, *, is_causal=True,
                    alignment=None, scale=None, enable_gqa=True):
    """The partial states of split-KV decoding, one per chunk of the cache.

    Returns a list of ``num_splits`` :class:`AttentionState` with ``m``, ``l`` of shape
    ``(B, Hq, Nq)`` and ``acc`` of shape ``(B, Hq, Nq, D)`` in float32 (float64 for
    float64 inputs): for chunk ``c``,
    ``m`` is the largest score in the chunk, ``l = sum exp(s - m)`` and
    ``acc = sum exp(s - m) v`` (unnormalised). A chunk with no visible key has
    ``m = -inf``, ``l = 0``, ``acc = 0``. Natural-log units, like lesson 3."""
    sh = validate_decode_inputs(q, k_cache, v_cache, cache_seqlens, is_causal=is_causal,
                                alignment=alignment, scale=scale, enable_gqa=enable_gqa,
                                impl="split_kv")
    b, hq, hkv, nq, lmax, d, scale, group = sh[:8]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    lengths = _lengths(cache_seqlens, b, lmax)
    _, bounds = chunk_bounds(max(lengths), num_splits)
    states = []
    for lo, hi in bounds:
        m = torch.full((b, hq, nq), float("-inf"), dtype=work, device=q.device)
        l = torch.zeros(b, hq, nq, dtype=work, device=q.device)
        acc = torch.zeros(b, hq, nq, d, dtype=work, device=q.device)
        for i, length in enumerate(lengths):
            end = min(hi, length)
            if end <= lo:
                continue
            k = k_cache[i, :, lo:end].to(work).repeat_interleave(group, dim=0)
            v = v_cache[i, :, lo:end].to(work).repeat_interleave(group, dim=0)
            s = (q[i].to(work) @ k.transpose(-1, -2)) * scale
            if sh.is_causal:
                pos = torch.arange(lo, end, device=q.device)
                t = torch.arange(nq, device=q.device)
                shift = length - nq if sh.causal == CAUSAL_LOWER_RIGHT else 0
                s = s.masked_fill(pos[None, :] > (shift + t)[:, None], float("-inf"))
            part = state_from_scores(s, v)        # lesson 3: the state of one tile
            m[i], l[i], acc[i] = part.m, part.l, part.acc
        states.append(AttentionState(m=m, l=l, acc=acc))
    return states


def split_kv_attention(q, k_cache, v_cache, num_splits, cache_seqlens=None, *, is_causal=True,
                       alignment=None, scale=None, enable_gqa=True, return_lse=False):
    """Flash-decoding in PyTorch: partial states per chunk, folded with lesson 3's
    ``merge_states``, then normalised once. Equal to :func:`decode_attention_reference`
    for every ``num_splits`` because the merge is associative."""
    states = split_kv_states(q, k_cache, v_cache, num_splits, cache_seqlens,
                             is_causal=is_causal, alignment=alignment, scale=scale,
                             enable_gqa=enable_gqa)
    total = states[0]
    for st in states[1:]:
        total = merge_states(total, st)
    o = total.output.to(q.dtype)
    return (o, total.lse) if return_lse else o


def kv_bytes_per_step(batch, kv_heads, cache_len, head_dim, bytes_per_elem=2):
    """Bytes of K and V one decode step must read from memory (each read once)."""
    return 2 * batch * kv_heads * cache_len * head_dim * bytes_per_elem


def decode_flops_per_step(batch, q_heads, new_tokens, cache_len, head_dim):
    """Multiply-adds of one decode step counted as 2 FLOPs each: ``q k^T`` and ``p v``."""
    return 4 * batch * q_heads * new_tokens * cache_len * head_dim


def check_decode_output(o, q, k_cache, v_cache, cache_seqlens=None, *, is_causal=True,
                        scale=None, atol=None, rtol=None, name="decode output", quiet=False):
    """Check a learner's decode attention output against the reference, with a hint
    that names the usual mistakes (mask alignment, GQA head mapping, cache lengths)."""
    from course_utils.checks import check_close, check_shape
    check_shape(o, tuple(q.shape), name=name, quiet=True,
                hint="one output row per new token and query head, like q")
    from course_utils.checks import tolerance
    ref = decode_attention_reference(q, k_cache, v_cache, cache_seqlens, is_causal=is_causal,
                                     scale=scale)
    # the precision policy, with the low-precision tolerances widened for learners'
    # kernels that keep P in 16 bits
    low = q.dtype in (torch.float16, torch.bfloat16)
    pol = tolerance(q.dtype, device=q.device)
    atol = (2e-2 if low else max(pol[0], 1e-4)) if atol is None else atol
    rtol = (2e-2 if low else max(pol[1], 1e-4)) if rtol is None else rtol
    hint = None
    o_t = o.detach().to(ref.dtype) if isinstance(o, torch.Tensor) else o
    if is_causal and q.shape[2] > 1 and q.shape[2] < k_cache.shape[2]:
        top_left = _top_left(q, k_cache, v_cache, cache_seqlens, scale)
        if torch.allclose(o_t.float(), top_left.float(), atol=atol, rtol=rtol):
            hint = ("this is the top-left causal mask (SDPA's is_causal=True); new tokens are the "
                    "LAST Nq positions, so token t sees keys 0 .. L - Nq + t")
    if hint is None:
        hint = ("check the mask (bottom-right: key j visible iff j <= L - Nq + t), the kv head "
                "of query head h (h // (Hq // Hkv)), and that slots past cache_seqlens are ignored")
    check_close(o_t, ref, atol=atol, rtol=rtol, name=name, hint=hint, quiet=quiet)


def _top_left(q, k_cache, v_cache, cache_seqlens, scale):
    b, hq, hkv, nq, lmax, d = q.shape[0], q.shape[1], k_cache.shape[1], q.shape[2], \
        k_cache.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = torch.empty_like(q)
    for i, length in enumerate(_lengths(cache_seqlens, b, lmax)):
        k = k_cache[i, :, :length].float().repeat_interleave(hq // hkv, dim=0)
        v = v_cache[i, :, :length].float().repeat_interleave(hq // hkv, dim=0)
        s = (q[i].float() @ k.transpose(-1, -2)) * scale
        s = s.masked_fill(~causal_mask(nq, length, CAUSAL_UPPER_LEFT, device=q.device), float("-inf"))
        out[i] = (torch.softmax(s, -1) @ v).to(q.dtype)
    return out
