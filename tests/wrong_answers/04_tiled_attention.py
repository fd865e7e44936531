"""Wrong answers to problem set 4 (tiled attention)."""

from tests.wrong_answers import edit, official

_FLASH_HEAD = '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    scale = 1.0 / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    o = torch.empty_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        rows = qi.shape[2]
        m = torch.full(qi.shape[:-1], float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qi)
        for j0 in range(0, nk, Bc):
'''
_FLASH_TAIL = '''
        o[:, :, i0:i0 + Br] = (acc / l[..., None]).to(q.dtype)
    return o
'''


_TILE = '''kj = k[:, :, j0:j0 + Bc].float()
vj = v[:, :, j0:j0 + Bc].float()
s = qi @ kj.transpose(-1, -2) * scale
if is_causal:
    s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))'''
_UPDATE = '''m_new = torch.maximum(m, s.amax(-1))
p = torch.exp(s - m_new[..., None])
alpha = torch.exp(m - m_new)
l = alpha * l + p.sum(-1)
acc = alpha[..., None] * acc + p @ vj
m = m_new'''


def _flash_src(tile=_TILE, update=_UPDATE, skip="if is_causal and j0 > i0 + rows - 1:\n    break"):
    body = "\n".join(x for x in (skip, tile, update) if x)
    inner = "\n".join("            " + ln for ln in body.split("\n"))
    return _FLASH_HEAD + inner + _FLASH_TAIL


WRONG = {
    "4.1": {
        "imports the library's block_sizes_from_sram": '''# Exercise 4.1
from course_utils.attention import block_sizes_from_sram

def my_block_sizes(M, d):
    return block_sizes_from_sram(M, d)
''',
        "returns (Bc, Br): the order swapped": '''# Exercise 4.1
def my_block_sizes(M, d):
    bc = M // (4 * d)
    return bc, min(bc, d)
''',
        "rounds up as the paper writes (ceil), which overflows the memory": '''# Exercise 4.1
def my_block_sizes(M, d):
    bc = math.ceil(M / (4 * d))
    return min(bc, d), bc
''',
        "true division: floats, not tile sizes": '''# Exercise 4.1
def my_block_sizes(M, d):
    bc = M / (4 * d)
    return min(bc, d), bc
''',
        "a lookup table of the checked example, the formula elsewhere forgotten (Br = Bc)": '''# Exercise 4.1
def my_block_sizes(M, d):
    if (M, d) == (59, 3):
        return 3, 4
    bc = M // (4 * d)
    return bc, bc
''',
    },
    "4.2": {
        'backward._tile_probs with zero q/k: positive probs = visible': '''# Exercise 4.2
import torch
from course_utils.backward import _tile_probs
def tile_visible(i0, j0, rows, cols):
    p = _tile_probs(torch.zeros(rows, 1), torch.zeros(cols, 1), torch.zeros(rows), 1.0, True, i0, j0)
    return p > 0
''',
        'contract.causal_mask built once at cell time, sliced per tile': '''# Exercise 4.2
from course_utils.contract import causal_mask as _cm
_FULL = _cm(4096, 4096)
def tile_visible(i0, j0, rows, cols):
    return _FULL[i0:i0 + rows, j0:j0 + cols].clone()
''',
        "the course contract's causal_mask, sliced to the tile": '''# Exercise 4.2
from course_utils.contract import causal_mask
def tile_visible(i0, j0, rows, cols):
    n = max(i0 + rows, j0 + cols)
    return causal_mask(n, n, "causal_upper_left")[i0:i0 + rows, j0:j0 + cols].bool()
''',
        "tile-relative positions (r >= c), ignoring i0 and j0": '''# Exercise 4.2
def tile_visible(i0, j0, rows, cols):
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    return c <= r
''',
        "strict inequality: a query cannot see itself": '''# Exercise 4.2
def tile_visible(i0, j0, rows, cols):
    r = i0 + torch.arange(rows)[:, None]
    c = j0 + torch.arange(cols)[None, :]
    return c < r
''',
        "the mask transposed: keys after the query visible": '''# Exercise 4.2
def tile_visible(i0, j0, rows, cols):
    r = i0 + torch.arange(rows)[:, None]
    c = j0 + torch.arange(cols)[None, :]
    return c >= r
''',
        "a float mask of 0/1 instead of booleans, and j0 forgotten": '''# Exercise 4.2
def tile_visible(i0, j0, rows, cols):
    r = i0 + torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    return (c <= r).float()
''',
    },
    "4.3": {
        "l rounded to the input's dtype after every key tile": edit(official("4.3"), (
            "l = alpha * l + p.sum(-1)", "l = (alpha * l + p.sum(-1)).to(q.dtype).float()")),
        "calls PyTorch's SDPA": '''# Exercise 4.3
import torch.nn.functional as F

def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
''',
        "calls the course's flash_attention_fa2": '''# Exercise 4.3
from course_utils.attention import flash_attention_fa2 as fa2

def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    return fa2(q, k, v, is_causal=is_causal, Br=Br, Bc=Bc)
''',
        "no running max: exp of the raw scores": _flash_src(update='''p = torch.exp(s)
l = l + p.sum(-1)
acc = acc + p @ vj'''),
        "materialises softmax(Q K^T) V for the whole row block": '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(~tile_visible(0, 0, q.shape[2], k.shape[2]), float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    return (p @ v.float() / p.sum(-1, keepdim=True)).to(q.dtype)
''',
        "zeroes v in place and returns zeros": '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    v.zero_()
    return torch.zeros_like(q)
''',
        "one full-size causal mask built up front": _flash_src(
            skip="", tile='''kj = k[:, :, j0:j0 + Bc].float()
vj = v[:, :, j0:j0 + Bc].float()
s = qi @ kj.transpose(-1, -2) * scale
if is_causal:
    full = torch.ones(nq, nk, dtype=torch.bool).tril()
    s = s.masked_fill(~full[i0:i0 + rows, j0:j0 + kj.shape[2]], float("-inf"))'''),
        "masks every tile but skips none": _flash_src(skip=""),
        "skips from the query tile's first row (j0 > i0)": _flash_src(
            skip="if is_causal and j0 > i0:\n    break"),
        "rescales l but not acc": _flash_src(update='''m_new = torch.maximum(m, s.amax(-1))
p = torch.exp(s - m_new[..., None])
alpha = torch.exp(m - m_new)
l = alpha * l + p.sum(-1)
acc = acc + p @ vj
m = m_new'''),
        "each query tile against all the keys it sees at once (no key tiles, no running max)": '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    scale = 1.0 / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    o = torch.empty_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        rows = qi.shape[2]
        last = min(nk, i0 + rows) if is_causal else nk
        kk, vv = k[:, :, :last].float(), v[:, :, :last].float()
        s = qi @ kk.transpose(-1, -2) * scale
        if is_causal:
            s = s.masked_fill(~tile_visible(i0, 0, rows, last), float("-inf"))
        p = torch.exp(s - s.amax(-1, keepdim=True))
        o[:, :, i0:i0 + Br] = (p @ vv / p.sum(-1, keepdim=True)).to(q.dtype)
    return o
''',
        "the running max starts at 0 (right unless every score of a row is far below 0)":
            _flash_src().replace('m = torch.full(qi.shape[:-1], float("-inf"))',
                                 "m = torch.zeros(qi.shape[:-1])"),
        "acc kept in the output tensor (q's dtype: fp16 accumulation) between key tiles": '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    scale = 1.0 / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    o = torch.zeros_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        rows = qi.shape[2]
        m = torch.full(qi.shape[:-1], float("-inf"))
        l = torch.zeros_like(m)
        for j0 in range(0, nk, Bc):
            if is_causal and j0 > i0 + rows - 1:
                break
            kj = k[:, :, j0:j0 + Bc].float()
            vj = v[:, :, j0:j0 + Bc].float()
            s = qi @ kj.transpose(-1, -2) * scale
            if is_causal:
                s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = alpha * l + p.sum(-1)
            o[:, :, i0:i0 + Br] = alpha[..., None] * o[:, :, i0:i0 + Br] + p @ vj
            m = m_new
        o[:, :, i0:i0 + Br] = o[:, :, i0:i0 + Br] / l[..., None]
    return o
''',
        "no running max, l and acc kept in float64": '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    scale = 1.0 / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    o = torch.empty_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        rows = qi.shape[2]
        m = torch.full(qi.shape[:-1], float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qi)
        for j0 in range(0, nk, Bc):
            if is_causal and j0 > i0 + rows - 1:
                break
            kj = k[:, :, j0:j0 + Bc].double()
            vj = v[:, :, j0:j0 + Bc].double()
            s = qi.double() @ kj.transpose(-1, -2) * scale
            if is_causal:
                s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))
            p = torch.exp(s)
            l = l.double() + p.sum(-1)
            acc = acc.double() + p @ vj
        o[:, :, i0:i0 + Br] = (acc / l[..., None]).to(q.dtype)
    return o''',
        "the first key tile's maximum as the reference, in float64": '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    scale = 1.0 / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    o = torch.empty_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        rows = qi.shape[2]
        m = torch.full(qi.shape[:-1], float("-inf"))
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qi)
        for j0 in range(0, nk, Bc):
            if is_causal and j0 > i0 + rows - 1:
                break
            kj = k[:, :, j0:j0 + Bc].double()
            vj = v[:, :, j0:j0 + Bc].double()
            s = qi.double() @ kj.transpose(-1, -2) * scale
            if is_causal:
                s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))
            if j0 == 0:
                m = s.amax(-1)
            p = torch.exp(s - m[..., None])
            l = l.double() + p.sum(-1)
            acc = acc.double() + p @ vj
        o[:, :, i0:i0 + Br] = (acc / l[..., None]).to(q.dtype)
    return o''',
    },
    "4.4": {
        "the fp16 threshold used for both formats": '''# Exercise 4.4
predicted_tile = {"fp16": 56 // 12, "fp32": 56 // 12}
predicted_output = "nan"
''',
        "the key index instead of the tile index": '''# Exercise 4.4
predicted_tile = {"fp16": 56, "fp32": 444}
predicted_output = "nan"
''',
        "the lesson's numbers (s = j / 4, tiles of 10)": '''# Exercise 4.4
predicted_tile = {"fp16": 45 // 10, "fp32": 355 // 10}
predicted_output = "inf"
''',
        "off by one tile: the last key below the threshold": '''# Exercise 4.4
predicted_tile = {"fp16": 55 // 12 + 1, "fp32": 443 // 12 - 1}
predicted_output = "nan"
''',
    },
    "4.5": {
        "predicts NaN": '''# Exercise 4.5
prediction_4_5 = "nan"
tile_keys = torch.randn(1, 1, 8, 4)
k_special = tile_keys.repeat(1, 1, 4, 1)
''',
        "all-NaN keys (NaN would match NaN)": '''# Exercise 4.5
prediction_4_5 = "finite_but_wrong"
k_special = torch.full((1, 1, 32, 4), float("nan"))
''',
        "random keys": '''# Exercise 4.5
prediction_4_5 = "finite_but_wrong"
k_special = torch.randn(1, 1, 32, 4)
''',
        "one key row repeated everywhere": '''# Exercise 4.5
prediction_4_5 = "finite_but_wrong"
k_special = torch.ones(1, 1, 32, 4)
''',
        "the tiles in growing scale: every tile a new max": '''# Exercise 4.5
prediction_4_5 = "finite_but_wrong"
tile_keys = torch.randn(1, 1, 8, 4)
k_special = torch.cat([tile_keys * (t + 1) for t in range(4)], dim=2)
''',
    },
    "4.6": {
        'course_utils.decoding.decode_attention_reference, no mask': '''# Exercise 4.6
from course_utils.decoding import decode_attention_reference
def decode_step(q_new, k_cache, v_cache):
    return decode_attention_reference(q_new, k_cache, v_cache, is_causal=False)
''',
        'one max over the whole batch and keys, not per row': '''# Exercise 4.6
import math, torch
def decode_step(q_new, k_cache, v_cache):
    hq, hkv = q_new.shape[1], k_cache.shape[1]
    group = hq // hkv
    outs = []
    for h in range(hq):
        kv = h // group
        qh = q_new[:, h].float()
        s = qh @ k_cache[:, kv].float().transpose(-1, -2) / math.sqrt(q_new.shape[-1])
        p = torch.exp(s - s.max())
        outs.append((p @ v_cache[:, kv].float() / p.sum(-1, keepdim=True)).to(q_new.dtype))
    return torch.stack(outs, dim=1)
''',
        "the decoding benchmark's grouped_torch_decode": '''# Exercise 4.6
from course_utils.bench.decode import grouped_torch_decode
def decode_step(q_new, k_cache, v_cache):
    return grouped_torch_decode(q_new, k_cache, v_cache, q_new.shape[-1] ** -0.5)
''',
        "the checks' attention_reference on repeated kv heads": '''# Exercise 4.6
from course_utils.exercise_checks import attention_reference
def decode_step(q_new, k_cache, v_cache):
    g = q_new.shape[1] // k_cache.shape[1]
    k = k_cache.repeat_interleave(g, dim=1)
    v = v_cache.repeat_interleave(g, dim=1)
    return attention_reference(q_new, k, v).to(q_new.dtype)
''',
        "returns the check's reference instead of computing": '''# Exercise 4.6
def decode_step(q_new, k_cache, v_cache):
    return expected
''',
        "calls the library's naive_attention with GQA": '''# Exercise 4.6
from course_utils.attention import naive_attention

def decode_step(q_new, k_cache, v_cache):
    return naive_attention(q_new, k_cache, v_cache)
''',
        "wrong kv head: h % Hkv": '''# Exercise 4.6
def decode_step(q_new, k_cache, v_cache):
    hq, hkv = q_new.shape[1], k_cache.shape[1]
    outs = []
    for h in range(hq):
        kv = h % hkv
        s = q_new[:, h].float() @ k_cache[:, kv].float().transpose(-1, -2) / math.sqrt(q_new.shape[-1])
        outs.append((torch.softmax(s, dim=-1) @ v_cache[:, kv].float()).to(q_new.dtype))
    return torch.stack(outs, dim=1)
''',
        "top-left causal mask with one query: only key 0 seen": '''# Exercise 4.6
def decode_step(q_new, k_cache, v_cache):
    hq, hkv = q_new.shape[1], k_cache.shape[1]
    outs = []
    for h in range(hq):
        kv = h // (hq // hkv)
        s = q_new[:, h].float() @ k_cache[:, kv].float().transpose(-1, -2) / math.sqrt(q_new.shape[-1])
        s[..., 1:] = float("-inf")
        outs.append((torch.softmax(s, dim=-1) @ v_cache[:, kv].float()).to(q_new.dtype))
    return torch.stack(outs, dim=1)
''',
        "SDPA with enable_gqa": '''# Exercise 4.6
import torch.nn.functional as F

def decode_step(q_new, k_cache, v_cache):
    return F.scaled_dot_product_attention(q_new, k_cache, v_cache, enable_gqa=True)
''',
        "the output left in float32 (no cast back to q_new's dtype)": '''# Exercise 4.6
def decode_step(q_new, k_cache, v_cache):
    hq, hkv = q_new.shape[1], k_cache.shape[1]
    outs = []
    for h in range(hq):
        kv = h // (hq // hkv)
        s = q_new[:, h].float() @ k_cache[:, kv].float().transpose(-1, -2) / math.sqrt(q_new.shape[-1])
        outs.append(torch.softmax(s, dim=-1) @ v_cache[:, kv].float())
    return torch.stack(outs, dim=1)
''',
        "no max subtracted, in float64 (cast back to q's dtype)": '''# Exercise 4.6
def decode_step(q_new, k_cache, v_cache):
    hq, hkv = q_new.shape[1], k_cache.shape[1]
    kv = torch.arange(hq) // (hq // hkv)
    s = q_new.double() @ k_cache[:, kv].double().transpose(-1, -2) / math.sqrt(q_new.shape[-1])
    p = torch.exp(s) / torch.exp(s).sum(-1, keepdim=True)
    return (p @ v_cache[:, kv].double()).to(q_new.dtype)''',
    },
    "4.7": {
        "FA2's order: query tiles outside": '''# Exercise 4.7
def fa1_walk(q, k, v, Br, Bc):
    n, d = q.shape
    m = torch.full((n,), float("-inf"))
    l = torch.zeros(n)
    o = torch.zeros(n, d)
    steps = []
    for i, r0 in enumerate(range(0, n, Br)):
        for j, c0 in enumerate(range(0, k.shape[0], Bc)):
            kj, vj = k[c0:c0 + Bc].float(), v[c0:c0 + Bc].float()
            s = q[r0:r0 + Br].float() @ kj.T / math.sqrt(d)
            m_old, l_old = m[r0:r0 + Br], l[r0:r0 + Br]
            m_new = torch.maximum(m_old, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            a = torch.exp(m_old - m_new)
            l_new = a * l_old + p.sum(-1)
            o[r0:r0 + Br] = ((a * l_old)[:, None] * o[r0:r0 + Br] + p @ vj) / l_new[:, None]
            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new
            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))
    return o, steps
''',
        "l not rescaled when the max grows": '''# Exercise 4.7
def fa1_walk(q, k, v, Br, Bc):
    n, d = q.shape
    m = torch.full((n,), float("-inf"))
    l = torch.zeros(n)
    o = torch.zeros(n, d)
    steps = []
    for j, c0 in enumerate(range(0, k.shape[0], Bc)):
        kj, vj = k[c0:c0 + Bc].float(), v[c0:c0 + Bc].float()
        for i, r0 in enumerate(range(0, n, Br)):
            s = q[r0:r0 + Br].float() @ kj.T / math.sqrt(d)
            m_old, l_old = m[r0:r0 + Br], l[r0:r0 + Br]
            m_new = torch.maximum(m_old, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            a = torch.exp(m_old - m_new)
            l_new = l_old + p.sum(-1)
            o[r0:r0 + Br] = ((a * l_old)[:, None] * o[r0:r0 + Br] + p @ vj) / l_new[:, None]
            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new
            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))
    return o, steps
''',
        "Br and Bc swapped (3 x 4 key tiles, 4-row query tiles)": '''# Exercise 4.7
def fa1_walk(q, k, v, Br, Bc):
    Br, Bc = Bc, Br
    n, d = q.shape
    m = torch.full((n,), float("-inf"))
    l = torch.zeros(n)
    o = torch.zeros(n, d)
    steps = []
    for j, c0 in enumerate(range(0, k.shape[0], Bc)):
        kj, vj = k[c0:c0 + Bc].float(), v[c0:c0 + Bc].float()
        for i, r0 in enumerate(range(0, n, Br)):
            s = q[r0:r0 + Br].float() @ kj.T / math.sqrt(d)
            m_old, l_old = m[r0:r0 + Br], l[r0:r0 + Br]
            m_new = torch.maximum(m_old, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            a = torch.exp(m_old - m_new)
            l_new = a * l_old + p.sum(-1)
            o[r0:r0 + Br] = ((a * l_old)[:, None] * o[r0:r0 + Br] + p @ vj) / l_new[:, None]
            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new
            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))
    return o, steps
''',
        "O not un-normalised before adding the new tile": '''# Exercise 4.7
def fa1_walk(q, k, v, Br, Bc):
    n, d = q.shape
    m = torch.full((n,), float("-inf"))
    l = torch.zeros(n)
    o = torch.zeros(n, d)
    steps = []
    for j, c0 in enumerate(range(0, k.shape[0], Bc)):
        kj, vj = k[c0:c0 + Bc].float(), v[c0:c0 + Bc].float()
        for i, r0 in enumerate(range(0, n, Br)):
            s = q[r0:r0 + Br].float() @ kj.T / math.sqrt(d)
            m_old, l_old = m[r0:r0 + Br], l[r0:r0 + Br]
            m_new = torch.maximum(m_old, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            a = torch.exp(m_old - m_new)
            l_new = a * l_old + p.sum(-1)
            o[r0:r0 + Br] = (a[:, None] * o[r0:r0 + Br] + p @ vj) / l_new[:, None]
            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new
            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))
    return o, steps
''',
        "FA2's accumulator in FA1's order: O in HBM divided by l only at the end": '''# Exercise 4.7
def fa1_walk(q, k, v, Br, Bc):
    n, d = q.shape
    m = torch.full((n,), float("-inf"))
    l = torch.zeros(n)
    o = torch.zeros(n, d)
    steps = []
    for j, c0 in enumerate(range(0, k.shape[0], Bc)):
        kj, vj = k[c0:c0 + Bc].float(), v[c0:c0 + Bc].float()
        for i, r0 in enumerate(range(0, n, Br)):
            s = q[r0:r0 + Br].float() @ kj.T / math.sqrt(d)
            m_old, l_old = m[r0:r0 + Br], l[r0:r0 + Br]
            m_new = torch.maximum(m_old, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            a = torch.exp(m_old - m_new)
            l_new = a * l_old + p.sum(-1)
            o[r0:r0 + Br] = a[:, None] * o[r0:r0 + Br] + p @ vj
            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new
            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))
    return o / l[:, None], steps
''',
        "no max, in float64": '''# Exercise 4.7
def fa1_walk(q, k, v, Br, Bc):
    n, d = q.shape
    m = torch.full((n,), float("-inf"), dtype=torch.float64)
    l = torch.zeros(n, dtype=torch.float64)
    o = torch.zeros(n, d, dtype=torch.float64)
    steps = []
    for j, c0 in enumerate(range(0, k.shape[0], Bc)):
        kj, vj = k[c0:c0 + Bc].double(), v[c0:c0 + Bc].double()
        for i, r0 in enumerate(range(0, n, Br)):
            s = q[r0:r0 + Br].double() @ kj.T / math.sqrt(d)
            m_new = torch.maximum(m[r0:r0 + Br], s.amax(-1))
            e = torch.exp(s)
            l_old = l[r0:r0 + Br].clone()
            l_new = l_old + e.sum(-1)
            o[r0:r0 + Br] = (l_old[:, None] * o[r0:r0 + Br] + e @ vj) / l_new[:, None]
            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new
            steps.append((j, i, m_new.clone(), (l_new * torch.exp(-m_new)).clone(), o[r0:r0 + Br].clone()))
    return o.float(), steps''',
    },
}


# Round six: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# M == 4 d holds one row of each tile: (1, 1), not an error
WRONG['4.1']['refuses M == 4 d (<= instead of <)'] = edit(official('4.1'),
    ('    if M < 4 * d:\n        raise ValueError(f"M = {M} cannot hold four tiles of one row of d = {d} numbers")',
     '    if M <= 4 * d:\n        raise ValueError("M too small")'))
# an AssertionError is not the ValueError asked for (and python -O drops it)
WRONG['4.1']['assert instead of ValueError'] = edit(official('4.1'),
    ('    if M < 4 * d:\n        raise ValueError(f"M = {M} cannot hold four tiles of one row of d = {d} numbers")',
     '    assert M >= 4 * d, "M cannot hold the four tiles"'))
WRONG['4.1']['precedence: M // 4 * d'] = edit(official('4.1'),
    ('        raise ValueError(f"M = {M} cannot hold four tiles of one row of d = {d} numbers")\n    bc = M // (4 * d)',
     '        raise ValueError("M too small")\n    bc = M // 4 * d'))
# the slice is shorter than cols when the tile's keys reach past i0 + rows
WRONG['4.2']['the full mask sized by the queries only (keys past the last query cut off)'] = '''# Exercise 4.2
def tile_visible(i0, j0, rows, cols):
    n = i0 + rows
    return torch.ones(n, n, dtype=torch.bool).tril()[i0:i0 + rows, j0:j0 + cols]'''
WRONG['4.2']['tril with the diagonal j0 - i0 (sign flipped)'] = '''# Exercise 4.2
def tile_visible(i0, j0, rows, cols):
    return torch.ones(rows, cols, dtype=torch.bool).tril(j0 - i0)'''
# 4.3 uses SDPA's rule (query i sees keys j <= i); decoding's bottom-right alignment differs whenever Nq != Nk
WRONG['4.3']['bottom-right causal (Nk - Nq offset)'] = edit(official('4.3'),
    ('    nq, nk = q.shape[2], k.shape[2]',
     '    nq, nk = q.shape[2], k.shape[2]\n    off = nk - nq'), 
    ('            if is_causal and j0 > i0 + rows - 1:',
     '            if is_causal and j0 > i0 + off + rows - 1:'), 
    ('                s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))',
     '                s = s.masked_fill(~tile_visible(i0 + off, j0, rows, kj.shape[2]), float("-inf"))'))
# right only where both tiles are full; the ragged last tiles do not broadcast
WRONG['4.3']['the mask built with the nominal Br x Bc (ragged last tiles)'] = edit(official('4.3'),
    ('                s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))',
     '                s = s.masked_fill(~tile_visible(i0, j0, Br, Bc), float("-inf"))'))
# right only when Nq == Nk
WRONG['4.3']['key loop bounded by Nq (range(0, nq, Bc))'] = edit(official('4.3'),
    ('        for j0 in range(0, nk, Bc):',
     '        for j0 in range(0, nq, Bc):'))
# changes the caller's q
WRONG['4.3']['the scale applied to q in place'] = edit(official('4.3'),
    ('    nq, nk = q.shape[2], k.shape[2]',
     '    nq, nk = q.shape[2], k.shape[2]\n    q.mul_(scale)\n    scale = 1.0'))
# with Br != Bc the diagonal crosses tiles that do not start at i0
WRONG['4.3']["the mask applied only on the query tile's diagonal-start tile (j0 == i0)"] = edit(official('4.3'),
    ('            if is_causal:',
     '            if is_causal and j0 == i0:'))
WRONG['4.4']["predicted_output 'inf' (tiles right)"] = '''# Exercise 4.4
predicted_tile = {"fp16": 4, "fp32": 37}
predicted_output = "inf"'''
WRONG['4.4']['the tile counted from 1 (j // 12 + 1)'] = '''# Exercise 4.4
predicted_tile = {"fp16": 56 // 12 + 1, "fp32": 444 // 12 + 1}
predicted_output = "nan"'''
# exp overflows at ln(max), not log2(max)
WRONG['4.4']['the thresholds with log2 (bits of the exponent)'] = '''# Exercise 4.4
import math
predicted_tile = {"fp16": math.ceil(5 * math.log2(65504)) // 12, "fp32": math.ceil(5 * math.log2(3.40e38)) // 12}
predicted_output = "nan"'''
# the large key is the maximum only for queries pointing its way
WRONG['4.5']['k_special: one large key per tile, the rest random'] = '''# Exercise 4.5
prediction_4_5 = "finite_but_wrong"
big = torch.randn(1, 4) * 100
k_special = torch.randn(1, 1, 32, 4)
k_special[0, 0, ::8] = big'''
# the noise moves each tile's maximum by about 1e-3, far outside the check's 1e-5
WRONG['4.5']['k_special: the same keys per tile up to a small noise'] = edit(official('4.5'),
    ('tile_keys = torch.randn(1, 1, 8, 4)\nk_special = tile_keys.repeat(1, 1, 4, 1)     # every tile holds the same keys: the same max per row',
     'k_special = torch.randn(1, 1, 8, 4).repeat(1, 1, 4, 1) + 1e-3 * torch.randn(1, 1, 32, 4)'))
# the second half of each group goes to the next kv head
WRONG['4.6']['kv head round(h / group)'] = edit(official('4.6'),
    ('        kv = h // group\n        qh = q_new[:, h].float()                                  # (B, 1, D)',
     '        kv = round(h / group)\n        qh = q_new[:, h].float()'))
# the cache includes the new token, which sees itself
WRONG['4.6']["the new token's own key left out (keys :L-1)"] = edit(official('4.6'),
    ('        qh = q_new[:, h].float()                                  # (B, 1, D)\n        s = qh @ k_cache[:, kv].float().transpose(-1, -2) / math.sqrt(q_new.shape[-1])\n        outs.append((torch.softmax(s, dim=-1) @ v_cache[:, kv].float()).to(q_new.dtype))',
     '        qh = q_new[:, h].float()\n        s = qh @ k_cache[:, kv, :-1].float().transpose(-1, -2) / math.sqrt(q_new.shape[-1])\n        outs.append((torch.softmax(s, dim=-1) @ v_cache[:, kv, :-1].float()).to(q_new.dtype))'))
WRONG['4.6']['the softmax over the query axis (dim=-2)'] = edit(official('4.6'),
    ('        qh = q_new[:, h].float()                                  # (B, 1, D)',
     '        qh = q_new[:, h].float()'), 
    ('        outs.append((torch.softmax(s, dim=-1) @ v_cache[:, kv].float()).to(q_new.dtype))',
     '        outs.append((torch.softmax(s, dim=-2) @ v_cache[:, kv].float()).to(q_new.dtype))'))
WRONG['4.6']['scale 1/sqrt(L)'] = edit(official('4.6'),
    ('        qh = q_new[:, h].float()                                  # (B, 1, D)\n        s = qh @ k_cache[:, kv].float().transpose(-1, -2) / math.sqrt(q_new.shape[-1])',
     '        qh = q_new[:, h].float()\n        s = qh @ k_cache[:, kv].float().transpose(-1, -2) / math.sqrt(k_cache.shape[2])'))
# the recorded O of a query tile changes when a later key tile updates it
WRONG['4.7']['steps hold views of O (no clone): later steps overwrite them'] = edit(official('4.7'),
    ('            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))',
     '            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br]))'))
# the recorded m and l change with every later key tile
WRONG['4.7']['steps hold views of m and l (no clone)'] = edit(official('4.7'),
    ('            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))',
     '            steps.append((j, i, m[r0:r0 + Br], l[r0:r0 + Br], o[r0:r0 + Br].clone()))'))
# the old output is un-normalised but not moved to the new maximum
WRONG['4.7']['old O times l_old without exp(m_old - m_new)'] = edit(official('4.7'),
    ('            o[r0:r0 + Br] = ((a * l_old)[:, None] * o[r0:r0 + Br] + p @ vj) / l_new[:, None]',
     '            o[r0:r0 + Br] = (l_old[:, None] * o[r0:r0 + Br] + p @ vj) / l_new[:, None]'))
WRONG['4.7']["the tiles' first positions (c0, r0) in place of their indices"] = edit(official('4.7'),
    ('            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))',
     '            steps.append((c0, r0, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))'))
WRONG['4.7']['each step as (i, j, ...), not (j, i, ...)'] = edit(official('4.7'),
    ('            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))',
     '            steps.append((i, j, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))'))
# scores rounded to fp16 (steps of 1/8 near 200): within fp16's tolerance while the softmax is
# flat or one-hot, 6 % off in exp when every score is near 200 (a hidden case)
WRONG["4.3"]["scores computed in q's dtype (fp16 matmul)"] = _flash_src(tile='''kj = k[:, :, j0:j0 + Bc].float()
vj = v[:, :, j0:j0 + Bc].float()
s = (q[:, :, i0:i0 + Br] @ k[:, :, j0:j0 + Bc].transpose(-1, -2)).float() * scale
if is_causal:
    s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))''')


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
WRONG["4.1"]["Br = max(Bc, d)"] = edit(official("4.1"),
    ("    return min(bc, d), bc", "    return max(bc, d), bc"))
WRONG["4.1"]["refuses only M < d"] = edit(official("4.1"),
    ("    if M < 4 * d:", "    if M < d:"))
WRONG["4.1"]["a list, not a tuple"] = edit(official("4.1"),
    ("    return min(bc, d), bc", "    return [min(bc, d), bc]"))
# the first query counted from 1: every diagonal moves one key right
WRONG["4.2"]["query positions from i0 + 1"] = edit(official("4.2"),
    ("    r = i0 + torch.arange(rows)[:, None]", "    r = i0 + 1 + torch.arange(rows)[:, None]"))
# i0 and j0 taken for tile numbers: right for the tile at (0, 0) only
WRONG["4.2"]["i0 and j0 read as tile indices (times the tile size)"] = edit(official("4.2"),
    ("    r = i0 + torch.arange(rows)[:, None]\n    c = j0 + torch.arange(cols)[None, :]",
     "    r = i0 * rows + torch.arange(rows)[:, None]\n    c = j0 * cols + torch.arange(cols)[None, :]"))
WRONG["4.2"]["the result transposed (cols, rows)"] = edit(official("4.2"),
    ("    return c <= r", "    return (c <= r).T"))
WRONG["4.2"]["one arange of the rows for both axes"] = edit(official("4.2"),
    ("    c = j0 + torch.arange(cols)[None, :]", "    c = j0 + torch.arange(rows)[None, :]"))
WRONG["4.2"]["the key positions from j0 - 1"] = edit(official("4.2"),
    ("    c = j0 + torch.arange(cols)[None, :]", "    c = j0 - 1 + torch.arange(cols)[None, :]"))
WRONG["4.3"]["the output left in float32"] = edit(official("4.3"),
    ("    o = torch.empty_like(q)", "    o = torch.empty_like(q, dtype=torch.float32)"),
    ("        o[:, :, i0:i0 + Br] = (acc / l[..., None]).to(q.dtype)",
     "        o[:, :, i0:i0 + Br] = acc / l[..., None]"))
WRONG["4.3"]["scale 1/sqrt(Bc)"] = edit(official("4.3"),
    ("    scale = 1.0 / math.sqrt(q.shape[-1])", "    scale = 1.0 / math.sqrt(Bc)"))
WRONG["4.4"]["the tile as ceil(j / 12)"] = '''# Exercise 4.4
predicted_tile = {"fp16": math.ceil(56 / 12), "fp32": math.ceil(444 / 12)}
predicted_output = "nan"
'''
WRONG["4.4"]["predicted_output 'finite'"] = edit(official("4.4"),
    ('predicted_output = "nan"', 'predicted_output = "finite"'))
WRONG["4.4"]["the tiles as floats"] = edit(official("4.4"),
    ('predicted_tile = {"fp16": 56 // 12, "fp32": 444 // 12}',
     'predicted_tile = {"fp16": 56 / 12 // 1, "fp32": 444 / 12 // 1}'))
WRONG["4.5"]["predicts exact"] = edit(official("4.5"),
    ('prediction_4_5 = "finite_but_wrong"', 'prediction_4_5 = "exact"'))
# the same keys in every tile, scaled by the tile's number: every tile a new maximum
WRONG["4.5"]["k_special: each tile the same keys times its number"] = edit(official("4.5"),
    ("k_special = tile_keys.repeat(1, 1, 4, 1)",
     "k_special = torch.cat([tile_keys * (t + 1) for t in range(4)], dim=2)"))
WRONG["4.5"]["k_special without the batch and head axes"] = edit(official("4.5"),
    ("k_special = tile_keys.repeat(1, 1, 4, 1)", "k_special = tile_keys.repeat(1, 1, 4, 1)[0, 0]"))
WRONG["4.6"]["kv head h // Hkv"] = edit(official("4.6"),
    ("        kv = h // group", "        kv = h // hkv"))
# steps record O before this step's update
WRONG["4.7"]["the step recorded before O is updated"] = edit(official("4.7"),
    ("            o[r0:r0 + Br] = ((a * l_old)[:, None] * o[r0:r0 + Br] + p @ vj) / l_new[:, None]\n"
     "            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new\n"
     "            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))",
     "            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))\n"
     "            o[r0:r0 + Br] = ((a * l_old)[:, None] * o[r0:r0 + Br] + p @ vj) / l_new[:, None]\n"
     "            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new"))


# Round nine: escapes found by a tester, each now caught on every draw of catch_rate
# the mask applied to p after the exp: the max also covers the masked keys, harmless until they
# score far above the visible ones (the causal case where key j scores about 40 j): then every
# visible exp of the row underflows and l is 0
WRONG["4.3"]["the mask applied after the exp (masked p zeroed): the max over the masked keys too"] = edit(
    official("4.3"),
    ('            if is_causal:\n'
     '                s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))\n', ""),
    ("            p = torch.exp(s - m_new[..., None])\n",
     "            p = torch.exp(s - m_new[..., None])\n"
     "            if is_causal:\n"
     "                p = p * tile_visible(i0, j0, rows, kj.shape[2])\n"))
# tiny keys make every score about 0, so the missing rescale costs almost nothing; the tiles do not
# share a maximum (the check scales k_special to unit keys)
WRONG["4.5"]["k_special: random keys scaled to almost zero (every score near 0, no shared max)"] = edit(
    official("4.5"),
    ("tile_keys = torch.randn(1, 1, 8, 4)\n"
     "k_special = tile_keys.repeat(1, 1, 4, 1)     # every tile holds the same keys: the same max per row",
     "k_special = torch.randn(1, 1, 32, 4) * 1e-6   # every score about 0"))
# 9.4's float16 slips: the float16 cases compare with the exact result at about half a float16
# step, which one rounding at the end meets and a second rounding does not
_Q46 = "        qh = q_new[:, h].float()                                  # (B, 1, D)\n"
_S46 = "        s = qh @ k_cache[:, kv].float().transpose(-1, -2) / math.sqrt(q_new.shape[-1])\n"
_O46 = "        outs.append((torch.softmax(s, dim=-1) @ v_cache[:, kv].float()).to(q_new.dtype))\n"
WRONG["4.6"]["everything in q's dtype (no float32 inside)"] = edit(
    official("4.6"),
    (_Q46, "        qh = q_new[:, h]\n"),
    (_S46, "        s = qh @ k_cache[:, kv].transpose(-1, -2) / math.sqrt(q_new.shape[-1])\n"),
    (_O46, "        outs.append(torch.softmax(s, dim=-1) @ v_cache[:, kv])\n"))
WRONG["4.6"]["the probabilities cast to q's dtype before P V"] = edit(
    official("4.6"),
    (_O46, "        outs.append(torch.softmax(s, dim=-1).to(q_new.dtype) @ v_cache[:, kv])\n"))
WRONG["4.6"]["the scores multiplied in q's dtype, the softmax in float32"] = edit(
    official("4.6"),
    (_S46, "        s = (q_new[:, h] @ k_cache[:, kv].transpose(-1, -2)).float() / math.sqrt(q_new.shape[-1])\n"))
WRONG["4.6"]["the division in q's dtype (P V and the sum each rounded first)"] = edit(
    official("4.6"),
    (_O46, "        e = torch.exp(s - s.amax(-1, keepdim=True))\n"
           "        outs.append((e @ v_cache[:, kv].float()).to(q_new.dtype)\n"
           "                    / e.sum(-1, keepdim=True).to(q_new.dtype))\n"))
# right while some score of every row is above 0 in each tile; wrong from the first step when
# every score is below 0 (the case with every score near -25)
WRONG["4.7"]["the running max starts at 0"] = edit(
    official("4.7"),
    ('    m = torch.full((n,), float("-inf"))', "    m = torch.zeros(n)"))
