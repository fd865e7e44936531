"""The attention backward pass, tiled in plain PyTorch (lesson 5).

Given the forward's output ``O`` and its per-row log-sum-exp ``lse`` (natural
log, so ``P = exp(scale * Q K^T - lse)``), the gradients of a scalar loss are

    dV = P^T dO            dP = dO V^T
    D_i = rowsum(dO * O)   dS = P * (dP - D)        (D broadcast along each row)
    dQ = scale * dS K      dK = scale * dS^T Q

:func:`flash_attention_backward` evaluates them tile by tile and never holds a
tensor the size of ``P`` (``Nq x Nk``): only ``Br x Bc`` tiles of ``S``, ``P``,
``dP`` and ``dS`` exist at any time.

Schedule: one pass with the key/value tiles in the outer loop (FlashAttention's
Algorithm 4). For each ``K_j, V_j`` tile the loop walks down the query tiles,
keeps ``dK_j`` and ``dV_j`` in local float32 accumulators (they are complete when
the inner loop ends: each tile row of ``dK``/``dV`` is an inner product over the
queries) and adds each tile's share of ``dQ_i = scale * dS_ij K_j`` into a float32
``dQ`` buffer in main memory. We chose it over the two-pass split (one loop for
``dK, dV`` with key tiles outside, a second for ``dQ`` with query tiles outside)
because it recomputes ``S`` and ``P`` once instead of twice and loads every
``K, V`` tile exactly once, which is the point the lesson makes with counted
traffic. Its cost is the read-modify-write of ``dQ_i`` in the inner loop; on a
GPU, where the key tiles run in parallel, those updates become atomic adds,
and that is why GPU kernels (lesson 7) often split ``dQ`` off again.

``d_trick=False`` runs the same loop without the precomputed ``D_i =
rowsum(dO * O)``: ``D_i = rowsum(P * dP)`` then needs the whole row of ``P`` and
``dP`` before any ``dS`` of that row can be formed, so an extra sweep over all
key/value tiles computes it first, and every ``K, V`` tile is loaded twice.

GQA: query head ``h`` reads key/value head ``h // group``; the ``group`` query
heads that share a key/value head all add into its ``dK`` and ``dV``.
"""
from __future__ import annotations

import torch

from .attention import (DEFAULT_BLOCK, TrafficCounter, flash_attention_fa2, naive_attention,
                        tile_schedule, visible_tile)
from .contract import validate_attention
from .tracker import AllocationTracker

__all__ = [
    "flash_attention_backward",
    "FlashAttentionFunction",
    "flash_attention",
    "attention_backward_reference",
    "autograd_reference",
    "backward_traffic_formula",
    "BACKWARD_TENSORS",
    "AllocationTracker",
]


# --------------------------------------------------------------------------- inputs

def _check_block(value, name):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int or None, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int or None, got {value}")
    return value


def _check_grad_inputs(q, k, v, o, lse, do, is_causal, scale, Br, Bc, counter, d_trick,
                       enable_gqa=False, alignment=None):
    """Validate everything before any work; returns the sizes and the resolved tiles."""
    sh = validate_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                            alignment=alignment, impl="tiled_backward")
    B, Hq, Hkv, Nq, Nk, D, scale, group = sh[:8]
    out_shape = (B, Hq, Nq, D)
    for name, t in (("o", o), ("do", do)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (B, Hq, Nq, D) = {out_shape}, "
                            f"got {type(t).__name__}")
        if tuple(t.shape) != out_shape:
            raise ValueError(f"{name} must have shape (B, Hq, Nq, D) = {out_shape}, "
                             f"got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; "
                             "put every tensor on one device")
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor of shape (B, Hq, Nq) = {(B, Hq, Nq)}, "
                        f"got {type(lse).__name__}")
    if tuple(lse.shape) != (B, Hq, Nq):
        raise ValueError(f"lse must have shape (B, Hq, Nq) = {(B, Hq, Nq)} (one natural-log "
                         f"log-sum-exp per query row), got {tuple(lse.shape)}")
    if not lse.is_floating_point():
        raise TypeError(f"lse must be a floating-point tensor, got {lse.dtype}")
    if lse.device != q.device:
        raise ValueError(f"lse is on {lse.device} but q is on {q.device}")
    Br = _check_block(Br, "Br")
    Bc = _check_block(Bc, "Bc")
    if counter is not None and not isinstance(counter, TrafficCounter):
        raise TypeError(f"counter must be a TrafficCounter or None, got {type(counter).__name__}")
    if not isinstance(d_trick, bool):
        raise TypeError(f"d_trick must be True or False, got {d_trick!r}")
    return (sh, DEFAULT_BLOCK if Br is None else Br, DEFAULT_BLOCK if Bc is None else Bc)


def _acc_dtype(*tensors):
    """float32 accumulators, float64 when any input is float64 (for gradcheck)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


# --------------------------------------------------------------------------- traffic

def _read(counter, name, tile, per=1):
    """A tile loaded from main memory ("HBM") into the tile buffers ("SRAM")."""
    if counter is not None:
        counter.read(name, tile.numel() * per)
    return tile


def _write(counter, name, tile, per=1):
    if counter is not None:
        counter.write(name, tile.numel() * per)


# the tensors the backward moves, in the order its traffic is reported
BACKWARD_TENSORS = ("Q", "K", "V", "O", "dO", "lse", "D", "dQ", "dK", "dV")


def backward_traffic_formula(Nq, Nk, D, Br, Bc, *, B=1, H=1, is_causal=False, d_trick=True):
    """Elements :func:`flash_attention_backward` moves, per tensor, from the lesson's formulas.

    Counted as :class:`~course_utils.attention.TrafficCounter` counts the forwards: summed
    over ``B * H`` query heads, a K/V tile once per query head that uses it. With
    ``Tc = ceil(Nk / Bc)`` and no mask, per query head:

    ===============  ==========================  ==================================
    tensor           with the D trick            without it
    ===============  ==========================  ==================================
    K, V reads       ``Nk D``                    ``2 Nk D``
    Q reads          ``Tc Nq D``                 ``2 Tc Nq D``
    dO reads         ``Nq D + Tc Nq D``          ``2 Tc Nq D``
    O reads          ``Nq D``                    0
    lse reads        ``Tc Nq``                   ``2 Tc Nq``
    D reads/writes   ``Tc Nq`` / ``Nq``          ``2 Tc Nq`` / ``Tc Nq``
    dQ reads/writes  ``Tc Nq D`` each            ``Tc Nq D`` each
    dK, dV writes    ``Nk D``                    ``Nk D``
    ===============  ==========================  ==================================

    With the causal mask only visible tile pairs count (and key tiles no query sees are
    never loaded). Returns the format of :meth:`TrafficCounter.as_dict` and of
    :func:`~course_utils.attention.traffic_formula`: ``{"K reads": .., "K writes": .., ...}``
    for every name of :data:`BACKWARD_TENSORS`, so
    ``counter.as_dict(BACKWARD_TENSORS) == backward_traffic_formula(...)``.
    """
    for name, x in (("Nq", Nq), ("Nk", Nk), ("D", D), ("Br", Br), ("Bc", Bc), ("B", B), ("H", H)):
        if x is None:
            raise TypeError(f"{name} must be a positive int, got None")
        _check_block(x, name)
    if not isinstance(is_causal, bool) or not isinstance(d_trick, bool):
        raise TypeError(f"is_causal and d_trick must be True or False, got {is_causal!r}, {d_trick!r}")
    sched = [(i, j) for i, j, ok in tile_schedule("fa1", Nq, Nk, Br, Bc, is_causal) if ok]
    rows = sum(min(Br, Nq - i * Br) for i, _ in sched)            # query rows summed over pairs
    keys = sum(min(Bc, Nk - j * Bc) for j in {j for _, j in sched})  # keys of loaded K/V tiles
    sweeps = 1 if d_trick else 2
    r = {"K": sweeps * keys * D, "V": sweeps * keys * D, "Q": sweeps * rows * D,
         "lse": sweeps * rows, "D": sweeps * rows, "dQ": rows * D}
    w = {"dQ": rows * D, "dK": Nk * D if not is_causal else keys * D,
         "dV": Nk * D if not is_causal else keys * D}
    if d_trick:
        r["O"], r["dO"], w["D"] = Nq * D, Nq * D + rows * D, Nq
    else:
        r["O"], r["dO"], w["D"] = 0, 2 * rows * D, rows
    n = B * H
    out = {}
    for name in BACKWARD_TENSORS:
        out[f"{name} reads"] = r.get(name, 0) * n
        out[f"{name} writes"] = w.get(name, 0) * n
    return out


# --------------------------------------------------------------------------- the pass

def _tile_probs(q_i, k_j, lse_i, scale, causal, row0, col0, offset=0):
    """Recompute ``P_ij = exp(scale * Q_i K_j^T - lse_i)`` for one tile.

    ``q_i``: (B, Hkv, g, br, D), ``k_j``: (B, Hkv, 1, bc, D), ``lse_i``: (B, Hkv, g, br).
    Causal masking: query row r sees key columns c <= r + offset (``offset`` 0 is
    upper-left alignment, ``Nk - Nq`` lower-right).
    """
    s = torch.matmul(q_i, k_j.transpose(-1, -2)) * scale
    if causal:
        rows = torch.arange(row0, row0 + q_i.shape[-2], device=s.device)[:, None]
        cols = torch.arange(col0, col0 + k_j.shape[-2], device=s.device)[None, :]
        s = s.masked_fill(cols > rows + offset, float("-inf"))
    # a row with lse = -inf has no visible key at all: its probabilities are 0, not NaN
    lse_i = lse_i[..., None]
    p = torch.exp(s - torch.where(torch.isinf(lse_i), torch.zeros_like(lse_i), lse_i))
    return torch.where(torch.isinf(lse_i), torch.zeros_like(p), p)


def flash_attention_backward(q, k, v, o, lse, do, *, is_causal=False, scale=None,
                             enable_gqa=False, alignment=None, Br=None, Bc=None, counter=None,
                             d_trick=True):
    """Gradients ``(dq, dk, dv)`` of attention, computed tile by tile.

    Arguments follow :func:`course_utils.attention.flash_attention_fa2`: ``q`` is
    ``(B, Hq, Nq, D)``, ``k`` and ``v`` are ``(B, Hkv, Nk, D)`` with ``Hq`` a multiple
    of ``Hkv`` (GQA); ``o`` and ``do`` are ``(B, Hq, Nq, D)``; ``lse`` is the forward's
    ``(B, Hq, Nq)`` log-sum-exp of the scaled, masked scores (natural log).
    ``Br``/``Bc`` are the query/key tile sizes (default ``DEFAULT_BLOCK``).
    ``counter``, a :class:`~course_utils.attention.TrafficCounter`, counts every
    element moved between main memory and the tiles (see :func:`backward_traffic_formula`).
    ``d_trick=False`` computes ``D_i`` from ``P`` and ``dP`` in an extra sweep, so
    every ``K``/``V`` tile is loaded twice.

    Accumulation is in float32 (float64 for float64 inputs); the gradients come
    back in the dtypes of ``q``, ``k`` and ``v``. No tensor of ``Nq x Nk``
    elements per head is ever created: only ``Br x Bc`` tiles.
    """
    sh, Br, Bc = _check_grad_inputs(q, k, v, o, lse, do, is_causal, scale, Br, Bc, counter,
                                    d_trick, enable_gqa, alignment)
    B, Hq, Hkv, Nq, Nk, D, scale, g = sh[:8]
    is_causal, off = sh.is_causal, sh.offset
    acc = _acc_dtype(q, k, v, o, do)
    dev = q.device

    # Query-side tensors viewed as (B, Hkv, group, N, .): query head h = kv_head * group + r,
    # so one K/V tile broadcasts over its whole group of query heads.
    qg = q.reshape(B, Hkv, g, Nq, D)
    og = o.reshape(B, Hkv, g, Nq, D)
    dog = do.reshape(B, Hkv, g, Nq, D)
    lseg = lse.reshape(B, Hkv, g, Nq)

    dq_acc = torch.zeros(B, Hkv, g, Nq, D, dtype=acc, device=dev)   # float32 dQ in main memory
    dk = torch.zeros(B, Hkv, Nk, D, dtype=acc, device=dev)
    dv = torch.zeros(B, Hkv, Nk, D, dtype=acc, device=dev)

    def key_tiles():
        for j0 in range(0, Nk, Bc):
            if is_causal and j0 > Nq - 1 + off:
                return  # causal: no query row sees these keys; their dK, dV stay 0
            yield j0, min(j0 + Bc, Nk)

    def query_tiles(j0):
        for i0 in range(0, Nq, Br):
            if visible_tile(i0 // Br, j0 // Bc, Br, Bc, Nq, is_causal, offset=off):
                if counter is not None:
                    counter.tiles_visited += 1
                yield i0, min(i0 + Br, Nq)
            elif counter is not None:
                counter.tiles_skipped += 1

    if d_trick:
        # Preprocessing: D_i = rowsum(dO_i * O_i), from two (Nq, D) tensors; no P needed.
        Dg = torch.empty(B, Hkv, g, Nq, dtype=acc, device=dev)
        for i0 in range(0, Nq, Br):
            i1 = min(i0 + Br, Nq)
            o_i = _read(counter, "O", og[..., i0:i1, :]).to(acc)
            do_i = _read(counter, "dO", dog[..., i0:i1, :]).to(acc)
            Dg[..., i0:i1] = (do_i * o_i).sum(-1)
            _write(counter, "D", Dg[..., i0:i1])
    else:
        # Without the trick D_i = rowsum(P_i: * dP_i:) needs whole rows of P and dP, so a
        # first sweep over every K/V tile has to finish before the first dS can be formed.
        Dg = torch.zeros(B, Hkv, g, Nq, dtype=acc, device=dev)
        for j0, j1 in key_tiles():
            k_j = _read(counter, "K", k[:, :, j0:j1], g).to(acc)[:, :, None]
            v_j = _read(counter, "V", v[:, :, j0:j1], g).to(acc)[:, :, None]
            for i0, i1 in query_tiles(j0):
                q_i = _read(counter, "Q", qg[..., i0:i1, :]).to(acc)
                do_i = _read(counter, "dO", dog[..., i0:i1, :]).to(acc)
                lse_i = _read(counter, "lse", lseg[..., i0:i1]).to(acc)
                d_part = _read(counter, "D", Dg[..., i0:i1])
                p = _tile_probs(q_i, k_j, lse_i, scale, is_causal, i0, j0, off)
                dp = torch.matmul(do_i, v_j.transpose(-1, -2))
                Dg[..., i0:i1] = d_part + (p * dp).sum(-1)
                _write(counter, "D", Dg[..., i0:i1])

    # Main pass: K/V tiles outside, query tiles inside (Algorithm 4 of FlashAttention).
    for j0, j1 in key_tiles():
        k_j = _read(counter, "K", k[:, :, j0:j1], g).to(acc)[:, :, None]   # (B, Hkv, 1, bc, D)
        v_j = _read(counter, "V", v[:, :, j0:j1], g).to(acc)[:, :, None]
        dk_j = torch.zeros(B, Hkv, j1 - j0, D, dtype=acc, device=dev)       # on-chip accumulators
        dv_j = torch.zeros(B, Hkv, j1 - j0, D, dtype=acc, device=dev)
        for i0, i1 in query_tiles(j0):
            q_i = _read(counter, "Q", qg[..., i0:i1, :]).to(acc)             # (B, Hkv, g, br, D)
            do_i = _read(counter, "dO", dog[..., i0:i1, :]).to(acc)
            lse_i = _read(counter, "lse", lseg[..., i0:i1]).to(acc)          # (B, Hkv, g, br)
            D_i = _read(counter, "D", Dg[..., i0:i1])

            p = _tile_probs(q_i, k_j, lse_i, scale, is_causal, i0, j0, off)      # (B, Hkv, g, br, bc)
            # dV_j += P^T dO_i, summed over the query heads that share this V head
            dv_j += torch.matmul(p.transpose(-1, -2), do_i).sum(2)
            dp = torch.matmul(do_i, v_j.transpose(-1, -2))                   # dP = dO V^T
            ds = p * (dp - D_i[..., None])                                   # dS = P * (dP - D)
            # dQ_i += scale * dS K_j: a read-modify-write of the float32 dQ in main memory
            dq_i = _read(counter, "dQ", dq_acc[..., i0:i1, :])
            dq_acc[..., i0:i1, :] = dq_i + scale * torch.matmul(ds, k_j)
            _write(counter, "dQ", dq_acc[..., i0:i1, :])
            # dK_j += scale * dS^T Q_i, summed over the group
            dk_j += scale * torch.matmul(ds.transpose(-1, -2), q_i).sum(2)
        dk[:, :, j0:j1] = dk_j
        dv[:, :, j0:j1] = dv_j
        _write(counter, "dK", dk_j, g)
        _write(counter, "dV", dv_j, g)

    dq = dq_acc.reshape(B, Hq, Nq, D).to(q.dtype)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


# --------------------------------------------------------------------------- autograd

class FlashAttentionFunction(torch.autograd.Function):
    """Tiled forward (``flash_attention_fa2``, which saves ``O`` and ``lse``) paired with
    the tiled backward above, so ``loss.backward()`` never builds ``P``.

    ``FlashAttentionFunction.apply(q, k, v, is_causal, scale, Br, Bc, enable_gqa,
    alignment)``; prefer :func:`flash_attention`, which validates its arguments first.
    The saved ``lse`` has the accumulator dtype (float64 for float64 inputs), so
    float64 gradients are as accurate as float64 allows.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None, Br=None, Bc=None, enable_gqa=False,
                alignment=None):
        o, lse = flash_attention_fa2(q, k, v, is_causal=is_causal, scale=scale, Br=Br, Bc=Bc,
                                     enable_gqa=enable_gqa, alignment=alignment, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale, ctx.Br, ctx.Bc = is_causal, scale, Br, Bc
        ctx.enable_gqa, ctx.alignment = enable_gqa, alignment
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do.contiguous(),
                                              is_causal=ctx.is_causal, scale=ctx.scale,
                                              enable_gqa=ctx.enable_gqa, alignment=ctx.alignment,
                                              Br=ctx.Br, Bc=ctx.Bc)
        needs = ctx.needs_input_grad
        return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
                None, None, None, None, None, None)


def flash_attention(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, alignment=None,
                    Br=None, Bc=None):
    """Differentiable tiled attention: ``softmax(scale * Q K^T [+ causal mask]) V``.

    Same arguments as ``flash_attention_fa2``; gradients flow through
    :func:`flash_attention_backward`. Bad inputs raise before any work.
    """
    validate_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                       alignment=alignment, impl="tiled_backward")
    _check_block(Br, "Br")
    _check_block(Bc, "Bc")
    return FlashAttentionFunction.apply(q, k, v, is_causal, scale, Br, Bc, enable_gqa, alignment)


# --------------------------------------------------------------------------- references

def attention_backward_reference(q, k, v, do, *, is_causal=False, scale=None, enable_gqa=False,
                                 alignment=None):
    """The backward written as whole-matrix formulas (materialises ``P``, ``dP``, ``dS``).

    This is the derivation of lesson 5 in code, for checking the tiled version:
    ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)``,
    ``dQ = scale dS K``, ``dK = scale dS^T Q``; with GQA the query heads of a group
    add into their shared ``dK`` and ``dV``. Computed in float64.
    """
    sh = validate_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                            alignment=alignment)
    B, Hq, Hkv, Nq, Nk, D, scale, group = sh[:8]
    f = torch.float64
    kk = k.to(f).repeat_interleave(group, dim=1)
    vv = v.to(f).repeat_interleave(group, dim=1)
    qq, dd = q.to(f), do.to(f)
    s = scale * qq @ kk.transpose(-1, -2)
    if sh.is_causal:
        mask = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).triu(1 + sh.offset)
        s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = p @ vv
    dv = p.transpose(-1, -2) @ dd
    dp = dd @ vv.transpose(-1, -2)
    Drow = (dd * o).sum(-1, keepdim=True)
    ds = p * (dp - Drow)
    dq = scale * ds @ kk
    dk = scale * ds.transpose(-1, -2) @ qq

    def fold(t):  # sum the group of query heads into their key/value head
        return t.reshape(B, Hkv, group, Nk, t.shape[-1]).sum(2)
    return dq.to(q.dtype), fold(dk).to(k.dtype), fold(dv).to(v.dtype)


def autograd_reference(q, k, v, do, *, is_causal=False, scale=None, enable_gqa=False,
                       alignment=None):
    """``(dq, dk, dv)`` from PyTorch autograd through ``naive_attention``."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = naive_attention(*leaves, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                          alignment=alignment)
    return torch.autograd.grad(out, leaves, do)
