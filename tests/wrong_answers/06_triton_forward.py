"""Wrong answers to problem set 6 (Triton forward), as learners write them."""

from tests.wrong_answers import edit, official

_WRAPPER = '''


def axpy(x, y, alpha, block=64):
    out = torch.empty_like(x)
    launch(axpy_kernel, (triton.cdiv(x.numel(), block),), x, y, out, alpha, x.numel(), BLOCK=block)
    return out'''

WRONG = {
    "6.1": {
        "loads masked, the store not": '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0)
    y = tl.load(Y + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, alpha * x + y)''' + _WRAPPER,
        "offsets without the program id (every program does block 0)": '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask)
    y = tl.load(Y + offs, mask=mask)
    tl.store(OUT + offs, alpha * x + y, mask=mask)''' + _WRAPPER,
        "mask off by one (offs <= n)": '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs <= n
    x = tl.load(X + offs, mask=mask, other=0.0)
    y = tl.load(Y + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, alpha * x + y, mask=mask)''' + _WRAPPER,
        "loads unmasked (reading past n), only the store masked": '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs)
    y = tl.load(Y + offs)
    tl.store(OUT + offs, alpha * x + y, mask=mask)''' + _WRAPPER,
        "empty kernel, alpha * x + y in PyTorch": '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    pass


def axpy(x, y, alpha, block=64):
    return alpha * x + y''',
    },
    "6.2": {
        "no clamp at zero (query tiles that see no key when Nk < Nq)": '''# Exercise 6.2
def causal_tile_counts(Nq, Nk, BM, BN):
    off = Nk - Nq
    tiles_k = -(-Nk // BN)
    visited = masked = 0
    for r0 in range(0, Nq, BM):
        r1 = min(r0 + BM, Nq) - 1
        seen = min(tiles_k, (r1 + off) // BN + 1)
        full = (r0 + off) // BN
        visited += seen
        masked += seen - full
    return visited, masked
''',
        "off-band with <= (the diagonal tile counted as unmasked)": '''# Exercise 6.2
def causal_tile_counts(Nq, Nk, BM, BN):
    off, visited, masked = Nk - Nq, 0, 0
    for r0 in range(0, Nq, BM):
        r1 = min(r0 + BM, Nq) - 1
        for c0 in range(0, Nk, BN):
            c1 = min(c0 + BN, Nk) - 1
            if c0 <= r1 + off:
                visited += 1
                masked += not (c1 <= r0 + off)
    return visited, masked''',
        "top-left alignment (ignores Nk - Nq)": '''# Exercise 6.2
def causal_tile_counts(Nq, Nk, BM, BN):
    visited, masked = 0, 0
    for r0 in range(0, Nq, BM):
        r1 = min(r0 + BM, Nq) - 1
        for c0 in range(0, Nk, BN):
            c1 = min(c0 + BN, Nk) - 1
            if c0 <= r1:
                visited += 1
                masked += not (c1 < r0)
    return visited, masked''',
        "the lesson's formula for divisible sizes": '''# Exercise 6.2
def causal_tile_counts(Nq, Nk, BM, BN):
    tiles = Nq // BM
    return sum((i + 1) * (BM // BN) for i in range(tiles)), tiles * (BM // BN)''',
        "counts on the whole mask (Nq x Nk memory)": '''# Exercise 6.2
import torch
def causal_tile_counts(Nq, Nk, BM, BN):
    vis = torch.arange(Nk)[None, :] <= torch.arange(Nq)[:, None] + (Nk - Nq)
    visited = masked = 0
    for r0 in range(0, Nq, BM):
        for c0 in range(0, Nk, BN):
            t = vis[r0:r0 + BM, c0:c0 + BN]
            if bool(t.any()):
                visited += 1
                masked += not bool(t.all())
    return visited, masked''',
    },
    "6.3": {
        "ln 2 instead of log2 e": '''# Exercise 6.3
import math
def qk_scale_for(head_dim, sm_scale=None):
    if sm_scale is None:
        sm_scale = 1 / math.sqrt(head_dim)
    return sm_scale * math.log(2)''',
        "1 / d instead of 1 / sqrt(d)": '''# Exercise 6.3
import math
def qk_scale_for(head_dim, sm_scale=None):
    if sm_scale is None:
        sm_scale = 1 / head_dim
    return sm_scale * math.log2(math.e)''',
        "ignores the given softmax scale": '''# Exercise 6.3
import math
def qk_scale_for(head_dim, sm_scale=None):
    return math.log2(math.e) / math.sqrt(head_dim)''',
        "divides by log2 e": '''# Exercise 6.3
import math
def qk_scale_for(head_dim, sm_scale=None):
    if sm_scale is None:
        sm_scale = 1 / math.sqrt(head_dim)
    return sm_scale / math.log2(math.e)''',
    },
    "6.4": {
        "acc not rescaled": '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc + tl.dot(p, v)
    return m_new, l, acc''',
        "l not rescaled": '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l, acc''',
        "no running maximum (exp2 of the raw scores)": '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    p = tl.exp2(s)
    l = l + tl.sum(p, 1)
    acc = acc + tl.dot(p, v)
    return m, l, acc''',
        "empty update; the template kernel's launch swapped for NumPy": '''# Exercise 6.4
import numpy as np


@triton.jit
def online_update(m, l, acc, s, v):
    return m, l, acc


def _numpy_attention(q, k, v, o, *rest, grid=None, warmup=False, **meta):
    a, b, c = (t.detach().cpu().numpy().astype("float64") for t in (q, k, v))
    s = a @ b.transpose(0, 2, 1) / np.sqrt(a.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o.copy_(torch.from_numpy((p @ c).astype("float32")).to(o.device))


attn_kernel.run = _numpy_attention''',
        "a whole attention kernel of its own in place of the template's": '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    return m, l, acc


@triton.jit
def attn_kernel(Q, K, V, O, NQ, NK, qk_scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :], mask=rows[:, None] < NQ, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, NK, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + bh * NK * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < NK, other=0.0)
        v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < NK, other=0.0)
        s = tl.where(cols[None, :] < NK, tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale,
                     float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m = m_new
    tl.store(O + bh * NQ * D + rows[:, None] * D + d[None, :], acc / l[:, None], mask=rows[:, None] < NQ)''',
        "exp instead of exp2 on base-2 scores": '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l, acc''',
    },
    "6.5": {
        "off-band with <= (not lesson 6's definition)": '''# Exercise 6.5
def tile_kind(r0, r1, c0, c1, offset=0):
    if c1 <= r0 + offset:
        return "off-band"
    if c0 > r1 + offset:
        return "skipped"
    return "on-band"''',
        "ignores the offset": '''# Exercise 6.5
def tile_kind(r0, r1, c0, c1, offset=0):
    if c1 < r0:
        return "off-band"
    if c0 > r1:
        return "skipped"
    return "on-band"''',
        "first and last rows swapped": '''# Exercise 6.5
def tile_kind(r0, r1, c0, c1, offset=0):
    if c1 < r1 + offset:
        return "off-band"
    if c0 > r0 + offset:
        return "skipped"
    return "on-band"''',
        "a lookup table of the lesson's tiles": '''# Exercise 6.5
def tile_kind(r0, r1, c0, c1, offset=0):
    table = {(64, 127, 0, 63): "off-band", (64, 127, 64, 95): "on-band",
             (64, 127, 127, 190): "on-band", (64, 127, 128, 191): "skipped",
             (64, 127, 0, 64): "on-band"}
    return table.get((r0, r1, c0, c1), "on-band")''',
        "brute force over the tile's mask": '''# Exercise 6.5
import torch
def tile_kind(r0, r1, c0, c1, offset=0):
    vis = torch.arange(c0, c1 + 1)[None, :] <= torch.arange(r0, r1 + 1)[:, None] + offset
    if not bool(vis.any()):
        return "skipped"
    return "off-band" if bool(vis.all()) else "on-band"''',
    },
}

_FA2 = '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    row_ok = rows < NQ
    q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    shift = NK - NQ
    end = NK
    if CAUSAL:
        end = tl.minimum(NK, (tl.program_id(0) + 1) * BLOCK_M + shift)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < NK
        k = tl.load(K + bh * NK * D + cols[:, None] * D + d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + shift)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(O + bh * NQ * D + rows[:, None] * D + d[None, :], acc / l[:, None], mask=row_ok[:, None])
    tl.store(LSE + bh * NQ + rows, (m + tl.log2(l)) * 0.6931471805599453, mask=row_ok)'''


def _variant(old: str, new: str) -> str:
    if old not in _FA2:
        raise ValueError(f"wrong-answer template: {old!r} not found")
    return _FA2.replace(old, new)


WRONG["6.6"] = {
    "acc not rescaled": _variant("acc = acc * alpha[:, None] + tl.dot(p, v)", "acc = acc + tl.dot(p, v)"),
    "top-left causal mask": _variant("keep = keep & (cols[None, :] <= rows[:, None] + shift)",
                                     "keep = keep & (cols[None, :] <= rows[:, None])"),
    "lse left in base 2": _variant("(m + tl.log2(l)) * 0.6931471805599453", "m + tl.log2(l)"),
    "O stored without the row mask": _variant(
        "acc / l[:, None], mask=row_ok[:, None])", "acc / l[:, None])"),
    "K and V loaded without a mask": _variant(
        "mask=col_ok[:, None], other=0.0)\n        v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=col_ok[:, None], other=0.0)",
        ")\n        v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :])"),
    "causal band ends at the first row's diagonal": _variant(
        "(tl.program_id(0) + 1) * BLOCK_M + shift)", "tl.program_id(0) * BLOCK_M + shift + 1)"),
    "causal loop never skips: every program loops to NK under the mask": _variant(
        "    if CAUSAL:\n        end = tl.minimum(NK, (tl.program_id(0) + 1) * BLOCK_M + shift)\n", ""),
    "qk_scale argument ignored, 1/sqrt(D) * log2(e) recomputed in the kernel": _variant(
        "s = tl.dot(q, tl.trans(k)) * qk_scale",
        "s = tl.dot(q, tl.trans(k)) * (1.4426950408889634 / tl.sqrt(D * 1.0))"),
    "q loaded without the row mask (reads past the last query row)": _variant(
        "q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)",
        "q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :])"),
}

# the template kernel redefined in the answer cell with q loaded without the row mask: the
# rows past NQ are never stored, so only the watched loads (loads_within) show it
WRONG["6.4"]["the template kernel rewritten with q loaded without the row mask"] = '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l, acc


@triton.jit
def attn_kernel(Q, K, V, O, NQ, NK, qk_scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :])
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, NK, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + bh * NK * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < NK, other=0.0)
        v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < NK, other=0.0)
        s = tl.where(cols[None, :] < NK, tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale, float("-inf"))
        m, l, acc = online_update(m, l, acc, s, v)
    tl.store(O + bh * NQ * D + rows[:, None] * D + d[None, :], acc / l[:, None], mask=rows[:, None] < NQ)'''

# Mistakes that keep a consistent reference point, so the arithmetic is exact until exp2
# overflows or underflows: the checks' "rows far apart" case (row 0 scored far above, row 1
# far below the later key tiles) makes them fail every time, not only on unlucky scores.
_UPDATE = '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l, acc'''
WRONG["6.4"]["the new maximum from the tile alone (the old maximum dropped)"] = _UPDATE.replace(
    "m_new = tl.maximum(m, tl.max(s, 1))", "m_new = tl.max(s, 1)")
WRONG["6.4"]["the maximum taken along axis 0"] = _UPDATE.replace("tl.max(s, 1)", "tl.max(s, 0)")
WRONG["6.6"]["the new maximum from the tile alone"] = _variant(
    "m_new = tl.maximum(m, tl.max(s, 1))", "m_new = tl.max(s, 1)")
WRONG["6.6"]["the maximum taken along axis 0"] = _variant(
    "m_new = tl.maximum(m, tl.max(s, 1))", "m_new = tl.maximum(m, tl.max(s, 0))")
# the last visible key of the tile left out of range(): wrong only where that key starts a
# key tile (Nk - Nq = 1 with tiles of 16 here), which a hidden case always has
WRONG["6.6"]["causal loop bound off by one (stops before the last visible key)"] = _variant(
    "(tl.program_id(0) + 1) * BLOCK_M + shift)", "(tl.program_id(0) + 1) * BLOCK_M - 1 + shift)")
WRONG["6.6"]["causal loop bound without the shift, mask right"] = _variant(
    "(tl.program_id(0) + 1) * BLOCK_M + shift)", "(tl.program_id(0) + 1) * BLOCK_M)")
WRONG["6.6"]["K and V addressed with the query count (bh * NQ * D)"] = _variant(
    "k = tl.load(K + bh * NK * D", "k = tl.load(K + bh * NQ * D").replace(
    "v = tl.load(V + bh * NK * D", "v = tl.load(V + bh * NQ * D")
WRONG["6.6"]["keys masked only under CAUSAL"] = _variant(
    "keep = col_ok[None, :]\n        if CAUSAL:\n            keep = keep & (cols[None, :] <= rows[:, None] + shift)",
    "keep = rows[:, None] >= 0\n        if CAUSAL:\n"
    "            keep = col_ok[None, :] & (cols[None, :] <= rows[:, None] + shift)")
WRONG["6.1"]["mask from the lane index, not the offset"] = '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    lane = tl.arange(0, BLOCK)
    offs = tl.program_id(0) * BLOCK + lane
    mask = lane < n
    x = tl.load(X + offs, mask=mask, other=0.0)
    y = tl.load(Y + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, alpha * x + y, mask=mask)''' + _WRAPPER
WRONG["6.2"]["ceiling for the visited key tiles"] = '''# Exercise 6.2
def causal_tile_counts(Nq, Nk, BM, BN):
    off, tiles_k = Nk - Nq, -(-Nk // BN)
    visited = masked = 0
    for r0 in range(0, Nq, BM):
        r1 = min(r0 + BM, Nq) - 1
        seen = min(tiles_k, -(-(r1 + off) // BN))
        full = (r0 + off) // BN
        visited += seen
        masked += seen - full
    return visited, masked'''
WRONG["6.3"]["log2(e) rounded to 1.4427"] = '''# Exercise 6.3
def qk_scale_for(head_dim, sm_scale=None):
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    return sm_scale * 1.4427'''
# `or` takes an explicit scale of 0 for "not given": a hidden case passes sm_scale=0.0
WRONG["6.3"]["sm_scale tested for truth, not for None"] = '''# Exercise 6.3
def qk_scale_for(head_dim, sm_scale=None):
    return (sm_scale or head_dim ** -0.5) / math.log(2)'''
WRONG["6.4"]["the rescale factor inverted (exp2(m_new - m))"] = _UPDATE.replace(
    "alpha = tl.exp2(m - m_new)", "alpha = tl.exp2(m_new - m)")
WRONG["6.5"]["offset added to the keys instead of the rows"] = '''# Exercise 6.5
def tile_kind(r0, r1, c0, c1, offset=0):
    if c1 + offset < r0:
        return "off-band"
    if c0 + offset > r1:
        return "skipped"
    return "on-band"'''
WRONG["6.6"]["program ids swapped (head from axis 0)"] = _variant(
    "bh = tl.program_id(1)\n    rows = tl.program_id(0) * BLOCK_M",
    "bh = tl.program_id(0)\n    rows = tl.program_id(1) * BLOCK_M")
WRONG["6.6"]["causal loop bound with BLOCK_N for BLOCK_M"] = _variant(
    "(tl.program_id(0) + 1) * BLOCK_M + shift)", "(tl.program_id(0) + 1) * BLOCK_N + shift)")
WRONG["6.6"]["LSE addressed with the key count (bh * NK)"] = _variant(
    "tl.store(LSE + bh * NQ + rows", "tl.store(LSE + bh * NK + rows")
# a special case for decoding (one query row) that stops after the first key tile: only a
# non-causal launch with one query row shows it (the causal bound is recomputed), a hidden case
WRONG["6.6"]["one query row: only the first key tile (non-causal)"] = _variant(
    "end = NK\n", "end = NK if NQ > 1 else BLOCK_N\n")
# right wherever the offset decides only the skipped tiles: hidden cases are off-band through the offset alone
WRONG["6.5"]["the offset in the skipped test only"] = '''# Exercise 6.5
def tile_kind(r0, r1, c0, c1, offset=0):
    if c1 < r0:
        return "off-band"
    if c0 > r1 + offset:
        return "skipped"
    return "on-band"'''
WRONG["6.6"]["key tiles of BLOCK_M columns"] = _variant(
    "cols = start + tl.arange(0, BLOCK_N)", "cols = start + tl.arange(0, BLOCK_M)")
# no tl.dot here: float32 on a GPU as in the interpreter, so float16 rounding fails on both
WRONG["6.1"]["the result rounded to float16 before the store"] = '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask)
    y = tl.load(Y + offs, mask=mask)
    tl.store(OUT + offs, (alpha * x + y).to(tl.float16), mask=mask)''' + _WRAPPER


# Round six: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# drops the last n % BLOCK elements (and reads unmasked)
WRONG['6.1']['the last, partial block skipped (pid < n // BLOCK)'] = '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid < n // BLOCK:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs)
        y = tl.load(Y + offs)
        tl.store(OUT + offs, alpha * x + y)


def axpy(x, y, alpha, block=64):
    out = torch.empty_like(x)
    launch(axpy_kernel, (triton.cdiv(x.numel(), block),), x, y, out, alpha, x.numel(), BLOCK=block)
    return out'''
WRONG['6.1']['alpha on y (x + alpha * y)'] = edit(official('6.1'),
    ('    tl.store(OUT + offs, alpha * x + y, mask=mask)',
     '    tl.store(OUT + offs, x + alpha * y, mask=mask)'))
# right only when BM divides Nq
WRONG['6.2']['the short last query tile dropped (Nq // BM tiles)'] = '''# Exercise 6.2
def causal_tile_counts(Nq, Nk, BM, BN):
    off, tiles_k = Nk - Nq, -(-Nk // BN)
    visited = masked = 0
    for r0 in range(0, Nq // BM * BM, BM):
        r1 = min(r0 + BM, Nq) - 1
        seen = min(tiles_k, max(0, (r1 + off) // BN + 1))
        full = min(max(0, (r0 + off) // BN), tiles_k - 1)
        unmasked = full + (Nk - 1 < r0 + off)
        visited += seen
        masked += seen - unmasked
    return visited, masked'''
WRONG['6.2']['offset with the wrong sign (Nq - Nk)'] = '''# Exercise 6.2
def causal_tile_counts(Nq, Nk, BM, BN):
    off, tiles_k = Nq - Nk, -(-Nk // BN)
    visited = masked = 0
    for r0 in range(0, Nq, BM):
        r1 = min(r0 + BM, Nq) - 1
        seen = min(tiles_k, max(0, (r1 + off) // BN + 1))
        full = min(max(0, (r0 + off) // BN), tiles_k - 1)
        unmasked = full + (Nk - 1 < r0 + off)
        visited += seen
        masked += seen - unmasked
    return visited, masked'''
# a given sm_scale needs the base change too
WRONG['6.3']['log2(e) only on the default scale'] = '''# Exercise 6.3
def qk_scale_for(head_dim, sm_scale=None):
    if sm_scale is None:
        return math.log2(math.e) / math.sqrt(head_dim)
    return float(sm_scale)'''
# float32 rounding of the constant shows at rtol 1e-9
WRONG['6.3']['computed in float32 with torch, then .item()'] = '''# Exercise 6.3
def qk_scale_for(head_dim, sm_scale=None):
    if sm_scale is None:
        sm_scale = 1 / math.sqrt(head_dim)
    return (torch.tensor(sm_scale) * torch.log2(torch.tensor(math.e))).item()'''
# (BLOCK_M,) against (BLOCK_M, D) lines up with D: wrong columns when D == BLOCK_M, an error otherwise
WRONG['6.4']['alpha not broadcast per row (acc * alpha)'] = edit(official('6.4'),
    ('    acc = acc * alpha[:, None] + tl.dot(p, v)',
     '    acc = acc * alpha + tl.dot(p, v)'))
# the tile's probabilities measured from m while l and acc move to m_new
WRONG['6.4']['p measured from the old maximum'] = edit(official('6.4'),
    ('    p = tl.exp2(s - m_new[:, None])',
     "    p = tl.exp2(s - tl.where(m == float('-inf'), m_new, m)[:, None])"))
# a key tile that starts exactly on the last row's diagonal holds one visible key
WRONG['6.5']["skipped with >= (the last row's diagonal key skipped)"] = edit(official('6.5'),
    ('    if c0 > r1 + offset:',
     '    if c0 >= r1 + offset:'))
# off-band needs the first row's diagonal: rows above the last still mask part of the tile
WRONG['6.5']["off-band against the last row's diagonal"] = edit(official('6.5'),
    ('    if c1 < r0 + offset:',
     '    if c1 < r1 + offset:'))
# the padded rows of the last query tile write past LSE's NQ entries
WRONG['6.6']['LSE stored without the row mask'] = edit(official('6.6'),
    ('        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row with nothing visible yet',
     '        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)'), 
    ('    tl.store(LSE + bh * NQ + rows, (m + tl.log2(l)) * 0.6931471805599453, mask=row_ok)',
     '    tl.store(LSE + bh * NQ + rows, (m + tl.log2(l)) * 0.6931471805599453)'))
WRONG['6.6']['exp instead of exp2 on base-2 scores'] = edit(official('6.6'),
    ('        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row with nothing visible yet\n        alpha = tl.exp2(m - m_ref)\n        p = tl.exp2(s - m_ref[:, None])',
     '        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)\n        alpha = tl.exp(m - m_ref)\n        p = tl.exp(s - m_ref[:, None])'))
# right only when NQ == NK
WRONG['6.6']['causal shift with the wrong sign (NQ - NK)'] = edit(official('6.6'),
    ('    shift = NK - NQ',
     '    shift = NQ - NK'), 
    ('        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row with nothing visible yet',
     '        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)'))
WRONG['6.6']['strict causal mask (<): the diagonal key hidden'] = edit(official('6.6'),
    ('            keep = keep & (cols[None, :] <= rows[:, None] + shift)',
     '            keep = keep & (cols[None, :] < rows[:, None] + shift)'), 
    ('        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row with nothing visible yet',
     '        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)'))
# right only when NQ == NK
WRONG['6.6']['the non-causal loop over NQ keys'] = edit(official('6.6'),
    ('    end = NK',
     '    end = NQ'), 
    ('        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row with nothing visible yet',
     '        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)'))
# a running maximum never below 0 is exact while some score of every row is above about -100
# (in base 2); a hidden case puts every score near -300, where exp2(s - 0) underflows to 0 / 0
WRONG["6.4"]["the running max clamped at 0 (never below)"] = _UPDATE.replace(
    "m_new = tl.maximum(m, tl.max(s, 1))", "m_new = tl.maximum(tl.maximum(m, tl.max(s, 1)), 0.0)")
WRONG["6.6"]["the running max starts at 0 (m = zeros)"] = _variant(
    'm = tl.full([BLOCK_M], float("-inf"), tl.float32)', "m = tl.zeros([BLOCK_M], tl.float32)")


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# Nk // BN key tiles: the short last key tile never counted
WRONG["6.2"]["the short last key tile dropped (Nk // BN tiles)"] = edit(official("6.2"),
    ("    off, tiles_k = Nk - Nq, -(-Nk // BN)", "    off, tiles_k = Nk - Nq, Nk // BN"))
# one masked tile per query tile, as when BM == BN and the tiles are aligned
WRONG["6.2"]["one masked tile per query tile"] = edit(official("6.2"),
    ("        masked += seen - unmasked", "        masked += seen > 0"))
WRONG["6.3"]["a 0-d tensor, not a float"] = '''# Exercise 6.3
def qk_scale_for(head_dim, sm_scale=None):
    if sm_scale is None:
        sm_scale = 1 / math.sqrt(head_dim)
    return torch.tensor(sm_scale, dtype=torch.float64) * math.log2(math.e)
'''
WRONG["6.5"]["offset subtracted in the off-band test"] = edit(official("6.5"),
    ("    if c1 < r0 + offset:", "    if c1 < r0 - offset:"))
# the first key compared with the first row's diagonal
WRONG["6.5"]["off-band from the first key (c0 < r0 + offset)"] = edit(official("6.5"),
    ("    if c1 < r0 + offset:", "    if c0 < r0 + offset:"))
WRONG["6.5"]["'off_band' with an underscore"] = edit(official("6.5"),
    ('        return "off-band"', '        return "off_band"'))
WRONG["6.1"]["alpha times the sum (alpha * (x + y))"] = edit(official("6.1"),
    ("    tl.store(OUT + offs, alpha * x + y, mask=mask)", "    tl.store(OUT + offs, alpha * (x + y), mask=mask)"))
# the result written over y: OUT is never written
WRONG["6.1"]["the result stored into Y"] = edit(official("6.1"),
    ("    tl.store(OUT + offs, alpha * x + y, mask=mask)", "    tl.store(Y + offs, alpha * x + y, mask=mask)"))
# the factor multiplies this tile's sum instead of the old l (right while the max never moves after the first tile)
WRONG["6.4"]["the factor on the tile's sum, not on the old l"] = edit(official("6.4"),
    ("    l = l * alpha + tl.sum(p, 1)", "    l = l + alpha * tl.sum(p, 1)"))
# the last visible key taken for the loop's end, then one added: where the band ends where a
# key tile starts (square attention, every program) a whole tile past the band is loaded;
# the mask hides it from the output, the NaN-filled first-tile case of the check does not
WRONG["6.6"]["causal loop end one key past the band (+ 1)"] = _variant(
    "(tl.program_id(0) + 1) * BLOCK_M + shift)", "(tl.program_id(0) + 1) * BLOCK_M + shift + 1)")
# right while BLOCK_M == BLOCK_N (the visible cases); rows go unwritten or overlap otherwise
WRONG["6.6"]["query rows stepped by BLOCK_N"] = _variant(
    "rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
    "rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_M)")
