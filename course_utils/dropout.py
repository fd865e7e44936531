"""Lesson 5: attention dropout inside the tiles, as in FlashAttention-1.

Dropout on the attention probabilities zeroes each ``P[i, j]`` with probability
``p`` and scales the survivors by ``1 / (1 - p)``:

    O = (P * Z / (1 - p)) @ V,     Z[i, j] in {0, 1}, P(Z = 0) = p.

A tiled kernel never holds ``P`` whole, so it draws the mask a tile at a time.
Two things change in the loop:

* the output accumulates ``P~_ij * Z_ij / (1 - p) @ V_j``, while the running sum
  ``l`` keeps the undropped ``rowsum(P~_ij)``: dropout acts after the softmax, and
  the softmax normalises with every term;
* the backward pass needs the same ``Z`` again and does not store it (it is as
  large as ``P``). FlashAttention saves the state of its random-number generator
  instead and draws the mask again tile by tile.

Here the mask is *counter-based*: ``Z[i, j]`` is a hash of ``(seed, batch, head,
i, j)``, the idea behind Philox in CUDA's generators. Any tile of it can be drawn
in any order, by the forward or the backward, and it is the same mask; the
"saved RNG state" is the ``seed``.

``attention_dropout_reference`` builds the whole mask and the whole ``P`` in
PyTorch (autograd gives its gradients); ``flash_attention_dropout_forward`` (FA1
order: key/value tile outer) and ``flash_attention_dropout_backward`` are the
tiled versions checked against it.
"""
from __future__ import annotations

import math

import torch

from course_utils.attention import validate_attention_inputs

__all__ = ["dropout_keep_mask", "attention_dropout_reference",
           "flash_attention_dropout_forward", "flash_attention_dropout_backward"]

_M32 = 0xFFFFFFFF


def _mix32(x):
    # an integer hash on 32-bit values held in int64 (no overflow: x < 2**32, constant < 2**27)
    x = ((x >> 16) ^ x) & _M32
    x = (x * 0x45D9F3B) & _M32
    x = ((x >> 16) ^ x) & _M32
    x = (x * 0x45D9F3B) & _M32
    return ((x >> 16) ^ x) & _M32


def _check_p_seed(p, seed):
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"p must be a float in [0, 1), got {type(p).__name__}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p must be a float in [0, 1), got {p}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be a non-negative int, got {type(seed).__name__}")
    if not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an int in [0, 2**31), got {seed}")


def dropout_keep_mask(seed, B, H, rows, cols, p, device="cpu"):
    """The keep mask ``Z`` (bool, ``True`` = kept) of the score entries at query
    positions ``rows`` and key positions ``cols`` (1-D int tensors or ranges), for
    every batch and head: shape ``(B, H, len(rows), len(cols))``. Entry ``(b, h, i,
    j)`` depends only on ``(seed, b, h, i, j)``, so a tile of the mask equals the
    same slice of the whole mask."""
    _check_p_seed(p, seed)
    for name, n in (("B", B), ("H", H)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    rows = torch.as_tensor(rows, dtype=torch.int64, device=device)
    cols = torch.as_tensor(cols, dtype=torch.int64, device=device)
    b = torch.arange(B, device=device)[:, None, None, None]
    h = torch.arange(H, device=device)[None, :, None, None]
    x = _mix32(torch.full((), seed, dtype=torch.int64, device=device) * 0x9E37 + 0x7F4A)
    for part in (b, h, rows[None, None, :, None], cols[None, None, None, :]):
        x = _mix32((x ^ (part & _M32)) * 0x2C1B3 & _M32)
    u = x.to(torch.float64) / 2.0**32                       # uniform in [0, 1)
    return u >= p


def _checked(q, k, v, p, seed, is_causal, scale):
    sh = validate_attention_inputs(q, k, v, is_causal=is_causal, scale=scale)
    if sh.Hq != sh.Hkv:
        raise ValueError(f"dropout attention takes as many K/V heads as query heads "
                         f"(Hq = {sh.Hq}, Hkv = {sh.Hkv})")
    _check_p_seed(p, seed)
    return sh


def _mask_scores(s, i0, j0, is_causal):
    if not is_causal:
        return s
    r = i0 + torch.arange(s.shape[-2], device=s.device)[:, None]
    c = j0 + torch.arange(s.shape[-1], device=s.device)[None, :]
    return s.masked_fill(c > r, float("-inf"))


def attention_dropout_reference(q, k, v, p, seed, is_causal=False, scale=None):
    """``(P * Z / (1 - p)) @ V`` with the whole ``P`` and the whole mask ``Z`` of
    :func:`dropout_keep_mask`; differentiable (autograd gives the reference
    gradients). Computed in fp32 (fp64 for fp64 inputs)."""
    sh = _checked(q, k, v, p, seed, is_causal, scale)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = _mask_scores(q.to(work) @ k.to(work).transpose(-1, -2) * sh.scale, 0, 0, is_causal)
    prob = torch.softmax(s, dim=-1)
    z = dropout_keep_mask(seed, sh.B, sh.Hq, range(sh.Nq), range(sh.Nk), p, device=q.device)
    return ((prob * z / (1 - p)) @ v.to(work)).to(q.dtype)


def flash_attention_dropout_forward(q, k, v, p, seed, is_causal=False, scale=None, Br=16, Bc=16):
    """Tiled forward with dropout in FlashAttention-1's order: the outer loop loads a
    K/V tile once, the inner loop updates every query tile's ``(m, l, acc)`` (kept
    in full tensors, the "HBM" of Algorithm 1). Returns ``(o, lse)``; ``lse`` is
    the log-sum-exp of the *undropped* scores, which is all the backward needs
    besides ``seed``."""
    sh = _checked(q, k, v, p, seed, is_causal, scale)
    for name, x in (("Br", Br), ("Bc", Bc)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    m = torch.full((sh.B, sh.Hq, sh.Nq), float("-inf"), dtype=work, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(sh.B, sh.Hq, sh.Nq, sh.D, dtype=work, device=q.device)
    for j0 in range(0, sh.Nk, Bc):
        kj, vj = kw[:, :, j0:j0 + Bc], vw[:, :, j0:j0 + Bc]
        for i0 in range(0, sh.Nq, Br):
            i1 = min(i0 + Br, sh.Nq)
            if is_causal and j0 > i1 - 1:
                continue                                  # every key of the tile is hidden
            s = _mask_scores(qw[:, :, i0:i1] @ kj.transpose(-1, -2) * sh.scale, i0, j0, is_causal)
            m_old = m[:, :, i0:i1]
            m_new = torch.maximum(m_old, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            pt = torch.exp(s - safe[..., None])
            alpha = torch.exp(m_old - safe)
            z = dropout_keep_mask(seed, sh.B, sh.Hq, range(i0, i1), range(j0, j0 + kj.shape[2]), p,
                                  device=q.device)
            l[:, :, i0:i1] = alpha * l[:, :, i0:i1] + pt.sum(-1)          # undropped sum
            acc[:, :, i0:i1] = alpha[..., None] * acc[:, :, i0:i1] + (pt * z / (1 - p)) @ vj
            m[:, :, i0:i1] = m_new
    o = acc / l[..., None]
    lse = m + torch.log(l)
    return o.to(q.dtype), lse.float() if work == torch.float32 else lse


def flash_attention_dropout_backward(q, k, v, o, lse, do, p, seed, is_causal=False, scale=None,
                                     Br=16, Bc=16):
    """Gradients ``(dq, dk, dv)`` of the dropout forward, K/V tile outer (Algorithm 4
    of FlashAttention-1): each tile of ``P`` is rebuilt from ``lse`` and each tile of
    ``Z`` drawn again from ``seed``.

    ``dV_j += (P~ * Z / (1-p))^T dO_i``; the gradient reaching ``P`` is
    ``dP = (dO_i V_j^T) * Z / (1-p)``; ``dS = P * (dP - D)`` with
    ``D_i = rowsum(dO_i * O_i)`` (``O`` includes the dropout, so ``D_i = sum_j P_ij
    dP_ij`` still holds)."""
    sh = _checked(q, k, v, p, seed, is_causal, scale)
    for name, t, want in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, q.shape[:-1])):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(want):
            raise ValueError(f"{name} must be a tensor of shape {tuple(want)}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    qw, kw, vw, dow = q.to(work), k.to(work), v.to(work), do.to(work)
    lsew = lse.to(work)
    big_d = (dow * o.to(work)).sum(-1)
    dq = torch.zeros_like(qw)
    dk = torch.zeros_like(kw)
    dv = torch.zeros_like(vw)
    for j0 in range(0, sh.Nk, Bc):
        j1 = min(j0 + Bc, sh.Nk)
        kj, vj = kw[:, :, j0:j1], vw[:, :, j0:j1]
        for i0 in range(0, sh.Nq, Br):
            i1 = min(i0 + Br, sh.Nq)
            if is_causal and j0 > i1 - 1:
                continue
            qi = qw[:, :, i0:i1]
            s = _mask_scores(qi @ kj.transpose(-1, -2) * sh.scale, i0, j0, is_causal)
            pt = torch.exp(s - lsew[:, :, i0:i1, None])
            z = dropout_keep_mask(seed, sh.B, sh.Hq, range(i0, i1), range(j0, j1), p,
                                  device=q.device).to(work) / (1 - p)
            dv[:, :, j0:j1] += (pt * z).transpose(-1, -2) @ dow[:, :, i0:i1]
            dp = (dow[:, :, i0:i1] @ vj.transpose(-1, -2)) * z
            ds = pt * (dp - big_d[:, :, i0:i1, None])
            dq[:, :, i0:i1] += sh.scale * ds @ kj
            dk[:, :, j0:j1] += sh.scale * ds.transpose(-1, -2) @ qi
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
