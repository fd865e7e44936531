"""Wrong answers to problem set 6 (Triton forward), as learners write them."""

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
        "empty kernel, alpha * x + y in PyTorch": '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    pass


def axpy(x, y, alpha, block=64):
    return alpha * x + y''',
    },
    "6.2": {
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
