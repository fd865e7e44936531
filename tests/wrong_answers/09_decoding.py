"""Wrong answers to problem set 9 (decoding), as learners write them."""

from tests.wrong_answers import edit, official

WRONG = {
    "9.1": {
        "counts only K": '''# Exercise 9.1
def kv_bytes(batch, kv_heads, cache_len, head_dim, bytes_per_elem):
    return batch * kv_heads * cache_len * head_dim * bytes_per_elem''',
        "the lesson's number for every size": '''# Exercise 9.1
def kv_bytes(batch, kv_heads, cache_len, head_dim, bytes_per_elem):
    return 2 * 4 * 8 * 8192 * 128 * 2''',
        "returns megabytes as a float": '''# Exercise 9.1
def kv_bytes(batch, kv_heads, cache_len, head_dim, bytes_per_elem):
    return 2 * batch * kv_heads * cache_len * head_dim * bytes_per_elem / 1e6''',
        "calls the course's byte count": '''# Exercise 9.1
from course_utils import decoding
def kv_bytes(batch, kv_heads, cache_len, head_dim, bytes_per_elem):
    return getattr(decoding, "kv_bytes_" + "per_step")(batch, kv_heads, cache_len, head_dim,
                                                       bytes_per_elem)''',
    },
    "9.2": {
        "counts the query heads' bytes": '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return (4 * q_heads * new_tokens) / (2 * q_heads * bytes_per_elem)''',
        "forgets that both K and V are read": '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return (4 * q_heads * new_tokens) / (kv_heads * bytes_per_elem)''',
        "2 FLOPs per key instead of 4": '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return (2 * q_heads * new_tokens) / (2 * kv_heads * bytes_per_elem)''',
    },
    "9.3": {
        'backward._tile_probs with offset nk - nq (library mask)': '''# Exercise 9.3
import torch
from course_utils.backward import _tile_probs
def bottom_right_mask(nq, nk):
    p = _tile_probs(torch.zeros(nq, 1), torch.zeros(nk, 1), torch.zeros(nq), 1.0, True, 0, 0, offset=nk - nq)
    return p > 0
''',
        'contract.causal_mask (lower-right) built at cell time, sliced': '''# Exercise 9.3
from course_utils.contract import causal_mask as _cm
_FULL = _cm(2048, 2048)
def bottom_right_mask(nq, nk):
    return _FULL[nk - nq:nk, :nk].clone()
''',
        "the course contract's causal_mask": '''# Exercise 9.3
from course_utils.contract import causal_mask as _course_mask
def bottom_right_mask(nq, nk):
    return _course_mask(nq, nk, "causal_lower_right")
''',
        "top-left mask (token t at position t)": '''# Exercise 9.3
import torch
def bottom_right_mask(nq, nk):
    return torch.arange(nk)[None, :] <= torch.arange(nq)[:, None]''',
        "strict inequality: a token cannot see itself": '''# Exercise 9.3
import torch
def bottom_right_mask(nq, nk):
    return torch.arange(nk)[None, :] < torch.arange(nq)[:, None] + (nk - nq)''',
        "offset with the wrong sign": '''# Exercise 9.3
import torch
def bottom_right_mask(nq, nk):
    return torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nq - nk)''',
        "float mask of 0 and -inf": '''# Exercise 9.3
import torch
def bottom_right_mask(nq, nk):
    keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
    return torch.zeros(nq, nk).masked_fill(~keep, float("-inf"))''',
    },
    "9.4": {
        "everything in float16 (no float32 inside)": '''# Exercise 9.4
def decode_attention_gqa(q, k_cache, v_cache):
    b, hq, nq, d = q.shape
    group = hq // k_cache.shape[1]
    k = k_cache.repeat_interleave(group, dim=1)
    v = v_cache.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(~bottom_right_mask(nq, k.shape[2]), float("-inf"))
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return (p @ v / p.sum(dim=-1, keepdim=True))''',
        "wrong GQA head: h % Hkv (repeat instead of repeat_interleave)": '''# Exercise 9.4
import math, torch
def decode_attention_gqa(q, k_cache, v_cache):
    b, hq, nq, d = q.shape
    group = hq // k_cache.shape[1]
    k = k_cache.float().repeat(1, group, 1, 1)
    v = v_cache.float().repeat(1, group, 1, 1)
    s = q.float() @ k.transpose(-1, -2) / math.sqrt(d)
    L = k.shape[2]
    keep = torch.arange(L)[None, :] <= torch.arange(nq)[:, None] + (L - nq)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p @ v / p.sum(-1, keepdim=True)).to(q.dtype)''',
        "top-left mask": '''# Exercise 9.4
import math, torch
def decode_attention_gqa(q, k_cache, v_cache):
    b, hq, nq, d = q.shape
    group = hq // k_cache.shape[1]
    k = k_cache.float().repeat_interleave(group, dim=1)
    v = v_cache.float().repeat_interleave(group, dim=1)
    s = q.float() @ k.transpose(-1, -2) / math.sqrt(d)
    keep = torch.arange(k.shape[2])[None, :] <= torch.arange(nq)[:, None]
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p @ v / p.sum(-1, keepdim=True)).to(q.dtype)''',
        "SDPA with enable_gqa": '''# Exercise 9.4
import torch
import torch.nn.functional as F
def decode_attention_gqa(q, k_cache, v_cache):
    nq, L = q.shape[2], k_cache.shape[2]
    keep = torch.arange(L)[None, :] <= torch.arange(nq)[:, None] + (L - nq)
    return F.scaled_dot_product_attention(q.float(), k_cache.float(), v_cache.float(),
                                          attn_mask=keep, enable_gqa=True).to(q.dtype)''',
        "no max subtracted (overflows on large scores)": '''# Exercise 9.4
import math, torch
def decode_attention_gqa(q, k_cache, v_cache):
    b, hq, nq, d = q.shape
    group = hq // k_cache.shape[1]
    k = k_cache.float().repeat_interleave(group, dim=1)
    v = v_cache.float().repeat_interleave(group, dim=1)
    s = q.float() @ k.transpose(-1, -2) / math.sqrt(d)
    L = k.shape[2]
    keep = torch.arange(L)[None, :] <= torch.arange(nq)[:, None] + (L - nq)
    p = torch.exp(s).masked_fill(~keep, 0.0)
    return (p @ v / p.sum(-1, keepdim=True)).to(q.dtype)''',
    },
    "9.5": {
        'common max over chunks AND batch': '''# Exercise 9.5
def merge_partials(m, l, acc):
    m_all = m.amax(dim=(0, 1))
    w = torch.exp(m - m_all)
    l_all = (w * l).sum(dim=0)
    o = (w[..., None] * acc).sum(dim=0) / l_all[..., None]
    return o, m_all + torch.log(l_all)
''',
        'common max over chunks AND query rows (not one per row)': '''# Exercise 9.5
def merge_partials(m, l, acc):
    m_all = m.amax(dim=(0, -1))[..., None]
    w = torch.exp(m - m_all)
    l_all = (w * l).sum(dim=0)
    o = (w[..., None] * acc).sum(dim=0) / l_all[..., None]
    return o, m_all + torch.log(l_all)
''',
        "rescales l but not acc": '''# Exercise 9.5
import torch
def merge_partials(m, l, acc):
    m_all = m.amax(dim=0)
    w = torch.exp(m - m_all)
    l_all = (w * l).sum(dim=0)
    return acc.sum(dim=0) / l_all[..., None], m_all + torch.log(l_all)''',
        "averages the chunks' normalised outputs": '''# Exercise 9.5
import torch
def merge_partials(m, l, acc):
    m_all = m.amax(dim=0)
    l_all = (torch.exp(m - m_all) * l).sum(dim=0)
    o = (acc / l[..., None]).nan_to_num(0.0)
    n = (l > 0).sum(dim=0)
    return o.sum(dim=0) / n[..., None], m_all + torch.log(l_all)''',
        "exp(m) without the common maximum": '''# Exercise 9.5
import torch
def merge_partials(m, l, acc):
    w = torch.exp(m)
    l_all = (w * l).sum(dim=0)
    o = (w[..., None] * acc).sum(dim=0) / l_all[..., None]
    return o, torch.log(l_all)''',
        "lesson 3's merge_states": '''# Exercise 9.5
from course_utils.attention import AttentionState, merge_states
def merge_partials(m, l, acc):
    s = AttentionState(m=m[0], l=l[0], acc=acc[0])
    for c in range(1, m.shape[0]):
        s = merge_states(s, AttentionState(m=m[c], l=l[c], acc=acc[c]))
    return s.output, s.lse''',
    },
    "9.6": {
        "rounds the wanted count down": '''# Exercise 9.6
def num_splits_for(batch, kv_heads, cache_len, num_sms):
    return max(1, min(4 * num_sms // (batch * kv_heads), cache_len // 512))''',
        "no lower bound of one": '''# Exercise 9.6
import math
def num_splits_for(batch, kv_heads, cache_len, num_sms):
    return min(math.ceil(4 * num_sms / (batch * kv_heads)), cache_len // 512)''',
        "ignores the batch and heads": '''# Exercise 9.6
def num_splits_for(batch, kv_heads, cache_len, num_sms):
    return max(1, min(4 * num_sms, cache_len // 512))''',
        "calls the course's rule": '''# Exercise 9.6
from course_utils import triton_decode as td
def num_splits_for(batch, kv_heads, cache_len, num_sms):
    return td.choose_num_splits(batch, kv_heads, cache_len, num_sms=num_sms)''',
    },
}

_DECODE = '''# Exercise 9.4
def decode_attention_gqa(q, k_cache, v_cache):
    b, hq, nq, d = q.shape
    group = hq // k_cache.shape[1]
    k = k_cache.float().repeat_interleave(group, dim=1)
    v = v_cache.float().repeat_interleave(group, dim=1)
    s = q.float() @ k.transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(~bottom_right_mask(nq, k.shape[2]), float("-inf"))
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return (p @ v / p.sum(dim=-1, keepdim=True)).to(q.dtype)'''
_MERGE = '''# Exercise 9.5
def merge_partials(m, l, acc):
    m_all = m.amax(dim=0)
    w = torch.exp(m - m_all)
    l_all = (w * l).sum(dim=0)
    o = (w[..., None] * acc).sum(dim=0) / l_all[..., None]
    return o, m_all + torch.log(l_all)'''


def _swap(src: str, old: str, new: str) -> str:
    if old not in src:
        raise ValueError(f"wrong-answer template: {old!r} not found")
    return src.replace(old, new)


# P rounded to float16 before P V: about one rounding of the output more than float32 inside,
# under the tolerance on most draws with values of size 1; values x10 (a hidden case) make the
# tolerance relative everywhere, and the rounding of P shows every time
WRONG["9.4"]["probabilities cast to the input dtype before P V"] = _swap(
    _DECODE, "return (p @ v / p.sum(dim=-1, keepdim=True)).to(q.dtype)",
    "return ((p.to(q.dtype) @ v_cache.repeat_interleave(group, dim=1)).float()"
    " / p.sum(dim=-1, keepdim=True)).to(q.dtype)")
WRONG["9.4"]["scores multiplied in the input dtype"] = _swap(
    _DECODE, "s = q.float() @ k.transpose(-1, -2) / math.sqrt(d)",
    "s = (q @ k_cache.repeat_interleave(group, dim=1).transpose(-1, -2)).float() / math.sqrt(d)")
# exact until exp overflows: a later chunk's maximum far above the first one's (a hidden case)
WRONG["9.5"]["the first chunk's maximum as the common reference"] = _swap(
    _MERGE, "m_all = m.amax(dim=0)", "m_all = m[0]")
WRONG["9.6"]["+1 in place of the ceiling"] = '''# Exercise 9.6
def num_splits_for(batch, kv_heads, cache_len, num_sms):
    want = int(4 * num_sms / (batch * kv_heads)) + 1
    return max(1, min(want, cache_len // 512))'''
WRONG["9.6"]["np.ceil: a float, not an int"] = '''# Exercise 9.6
import numpy as np
def num_splits_for(batch, kv_heads, cache_len, num_sms):
    want = np.ceil(4 * num_sms / (batch * kv_heads))
    return max(1, min(want, cache_len // 512))'''
WRONG["9.2"]["integer division"] = '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return (4 * q_heads * new_tokens) // (2 * kv_heads * bytes_per_elem)'''
# the result rounded three times (P V, the sum, the quotient): under the tolerance against the
# float16 reference, not within half a float16 step of the exact result (a hidden comparison)
WRONG["9.4"]["the division in float16"] = _swap(
    _DECODE, "return (p @ v / p.sum(dim=-1, keepdim=True)).to(q.dtype)",
    "return (p @ v).to(q.dtype) / p.sum(dim=-1, keepdim=True).to(q.dtype)")
WRONG["9.4"]["no mask (every new token sees the whole cache)"] = _swap(
    _DECODE, '    s = s.masked_fill(~bottom_right_mask(nq, k.shape[2]), float("-inf"))\n', "")
# 0 is a safe reference only while some score is near it: a hidden case puts every score far below
WRONG["9.5"]["the empty chunks' maximum taken as 0 before the common maximum"] = _swap(
    _MERGE, "m_all = m.amax(dim=0)",
    "m_all = torch.where(torch.isinf(m), torch.zeros_like(m), m).amax(dim=0)")
# exact while every row has some score near the largest of all: a hidden case puts one head's
# scores 150 below the other's (random draws alone let it through about one time in six)
WRONG["9.5"]["one maximum over every row and chunk"] = _swap(_MERGE, "m_all = m.amax(dim=0)", "m_all = m.max()")
WRONG["9.6"]["programs per split counted by the batch only"] = '''# Exercise 9.6
def num_splits_for(batch, kv_heads, cache_len, num_sms):
    want = math.ceil(4 * num_sms / batch)
    return max(1, min(want, cache_len // 512))'''
WRONG["9.4"]["one maximum over the whole tensor"] = _swap(
    _DECODE, "p = torch.exp(s - s.amax(dim=-1, keepdim=True))", "p = torch.exp(s - s.max())")


# Round six: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# the cache already holds every position the step reads; the new token's K and V are written, not read
WRONG['9.1']["the new token's K and V counted too (cache_len + 1)"] = '''# Exercise 9.1
def kv_bytes(batch, kv_heads, cache_len, head_dim, bytes_per_elem):
    return 2 * batch * kv_heads * (cache_len + 1) * head_dim * bytes_per_elem'''
WRONG['9.1']['bits, not bytes (times 8)'] = '''# Exercise 9.1
def kv_bytes(batch, kv_heads, cache_len, head_dim, bytes_per_elem):
    return 2 * batch * kv_heads * cache_len * head_dim * bytes_per_elem * 8'''
# right whenever kv_heads * bytes_per_elem == 1 (a hidden case is (96, 1, 5, 1)); (1, 1, 1, 4) is not
WRONG['9.2']['precedence: / 2 * kv_heads * bytes_per_elem'] = '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return 4 * q_heads * new_tokens / 2 * kv_heads * bytes_per_elem'''
WRONG['9.2']['one new token assumed (new_tokens ignored)'] = '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return (4 * q_heads) / (2 * kv_heads * bytes_per_elem)'''
WRONG['9.3']['one new token: a 1-D mask of nk Trues'] = '''# Exercise 9.3
import torch
def bottom_right_mask(nq, nk):
    if nq == 1:
        return torch.ones(nk, dtype=torch.bool)
    return torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)'''
# the top-left mask written another way: right only when nq == nk
WRONG['9.3']['tril of the square mask, the first nq rows'] = '''# Exercise 9.3
import torch
def bottom_right_mask(nq, nk):
    return torch.ones(nk, nk, dtype=torch.bool).tril()[:nq]'''
# the same weights until the row's visible scores sit far below a masked one: 0 / 0 with scores x100
WRONG['9.4']['the mask applied after the exp (the max over masked keys too)'] = edit(official('9.4'),
    ('    s = s.masked_fill(~bottom_right_mask(nq, k.shape[2]), float("-inf"))\n    p = torch.exp(s - s.amax(dim=-1, keepdim=True))',
     '    p = torch.exp(s - s.amax(dim=-1, keepdim=True)) * bottom_right_mask(nq, k.shape[2])'))
WRONG['9.4']['the output left in float32'] = edit(official('9.4'),
    ('    return (p @ v / p.sum(dim=-1, keepdim=True)).to(q.dtype)',
     '    return p @ v / p.sum(dim=-1, keepdim=True)'))
# the grouping is right, but the stacked rows are not group * nq new tokens: each head's nq rows need the nq-token mask
WRONG['9.4']["a group's heads stacked as rows, masked as group * nq tokens"] = '''# Exercise 9.4
def decode_attention_gqa(q, k_cache, v_cache):
    b, hq, nq, d = q.shape
    hkv, L = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    qg = q.float().reshape(b, hkv, g * nq, d)
    s = qg @ k_cache.float().transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(~bottom_right_mask(g * nq, L), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ v_cache.float()).reshape(b, hq, nq, d).to(q.dtype)'''
# q.float() returns q itself for float32 input, so /= changes the caller's tensor
WRONG['9.4']['scales q in place (q.float() is q for float32)'] = edit(official('9.4'),
    ('    s = q.float() @ k.transpose(-1, -2) / math.sqrt(d)',
     '    qf = q.float()\n    qf /= math.sqrt(d)\n    s = qf @ k.transpose(-1, -2)'))
# the numerator masked, the sum not: each row's weights no longer add up to 1
WRONG['9.4']['denominator over every key (masked keys summed in)'] = edit(official('9.4'),
    ('    s = s.masked_fill(~bottom_right_mask(nq, k.shape[2]), float("-inf"))\n    p = torch.exp(s - s.amax(dim=-1, keepdim=True))\n    return (p @ v / p.sum(dim=-1, keepdim=True)).to(q.dtype)',
     '    e = torch.exp(s - s.amax(dim=-1, keepdim=True))\n    p = e * bottom_right_mask(nq, k.shape[2])\n    return (p @ v / e.sum(dim=-1, keepdim=True)).to(q.dtype)'))
WRONG['9.5']['rescales acc but not l'] = edit(official('9.5'),
    ('    l_all = (w * l).sum(dim=0)',
     '    l_all = l.sum(dim=0)'))
# acc / l is 0 / 0 for an empty chunk, and 0 times NaN is still NaN
WRONG['9.5']['each chunk normalised first (acc / l): NaN from empty chunks'] = '''# Exercise 9.5
def merge_partials(m, l, acc):
    m_all = m.amax(dim=0)
    w = torch.exp(m - m_all) * l
    l_all = w.sum(dim=0)
    o = ((w / l_all)[..., None] * (acc / l[..., None])).sum(dim=0)
    return o, m_all + torch.log(l_all)'''
# the output is right; exp(m_all) overflows (scores x100) or underflows (scores far below 0)
WRONG['9.5']['lse as log(exp(m_all) * l_all): overflows for large scores'] = edit(official('9.5'),
    ('    return o, m_all + torch.log(l_all)',
     '    return o, torch.log(torch.exp(m_all) * l_all)'))
# about 3 decimal digits per weight, far outside the check's 1e-4
WRONG['9.5']['the weights rounded to float16'] = edit(official('9.5'),
    ('    w = torch.exp(m - m_all)',
     '    w = torch.exp(m - m_all).half().float()'))
WRONG['9.5']['lse in base 2'] = edit(official('9.5'),
    ('    return o, m_all + torch.log(l_all)',
     '    return o, m_all + torch.log2(l_all)'))
# a cache of 1023 keys gets 2 chunks, one shorter than 512
WRONG['9.6']['the chunk cap rounded up (ceil(cache_len / 512))'] = edit(official('9.6'),
    ('    return max(1, min(want, cache_len // 512))',
     '    return max(1, min(want, math.ceil(cache_len / 512)))'))
# 528 / 512 rounds to 1 and misses the target of 4 * num_sms programs
WRONG['9.6']['rounded to nearest instead of up'] = edit(official('9.6'),
    ('    want = math.ceil(4 * num_sms / (batch * kv_heads))',
     '    want = round(4 * num_sms / (batch * kv_heads))'))
WRONG['9.6']['one program per SM targeted (4 forgotten)'] = edit(official('9.6'),
    ('    want = math.ceil(4 * num_sms / (batch * kv_heads))',
     '    want = math.ceil(num_sms / (batch * kv_heads))'))
# the rule counts keys, not bytes
WRONG['9.6']['chunks of 512 bytes at 2 bytes a key (cache_len // 256)'] = edit(official('9.6'),
    ('    return max(1, min(want, cache_len // 512))',
     '    return max(1, min(want, cache_len // 256))'))
# two decimals are exact while bytes_per_elem divides 2 (q / kv) (new tokens); a hidden case
# has 3-byte elements
WRONG["9.2"]["rounded to two decimals"] = '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return round((4 * q_heads * new_tokens) / (2 * kv_heads * bytes_per_elem), 2)'''


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
WRONG["9.1"]["the batch forgotten"] = edit(official("9.1"),
    ("    return 2 * batch * kv_heads * cache_len * head_dim * bytes_per_elem",
     "    return 2 * kv_heads * cache_len * head_dim * bytes_per_elem"))
WRONG["9.1"]["the kv heads forgotten"] = edit(official("9.1"),
    ("    return 2 * batch * kv_heads * cache_len * head_dim * bytes_per_elem",
     "    return 2 * batch * cache_len * head_dim * bytes_per_elem"))
WRONG["9.1"]["np.prod: a numpy integer"] = '''# Exercise 9.1
import numpy as np
def kv_bytes(batch, kv_heads, cache_len, head_dim, bytes_per_elem):
    return 2 * np.prod([batch, kv_heads, cache_len, head_dim, bytes_per_elem])
'''
WRONG["9.2"]["the group inverted (kv heads over query heads)"] = edit(official("9.2"),
    ("    return (4 * q_heads * new_tokens) / (2 * kv_heads * bytes_per_elem)",
     "    return (4 * kv_heads * new_tokens) / (2 * q_heads * bytes_per_elem)"))
WRONG["9.2"]["bytes per element forgotten"] = edit(official("9.2"),
    ("    return (4 * q_heads * new_tokens) / (2 * kv_heads * bytes_per_elem)",
     "    return (4 * q_heads * new_tokens) / (2 * kv_heads)"))
WRONG["9.3"]["offset one short (nk - nq - 1)"] = edit(official("9.3"),
    ("    return j <= t + (nk - nq)", "    return j <= t + (nk - nq - 1)"))
WRONG["9.3"]["the comparison reversed (j >= t + nk - nq)"] = edit(official("9.3"),
    ("    return j <= t + (nk - nq)", "    return j >= t + (nk - nq)"))
WRONG["9.3"]["the mask transposed (nk, nq)"] = edit(official("9.3"),
    ("    return j <= t + (nk - nq)", "    return (j <= t + (nk - nq)).T"))
WRONG["9.3"]["triu instead of tril"] = '''# Exercise 9.3
def bottom_right_mask(nq, nk):
    return torch.ones(nq, nk, dtype=torch.bool).triu(nk - nq)
'''
WRONG["9.4"]["the mask of nq x nq"] = edit(official("9.4"),
    ('    s = s.masked_fill(~bottom_right_mask(nq, k.shape[2]), float("-inf"))',
     '    s = s.masked_fill(~bottom_right_mask(nq, nq)[..., -k.shape[2]:], float("-inf"))'))
WRONG["9.4"]["scale 1/d"] = edit(official("9.4"),
    ("    s = q.float() @ k.transpose(-1, -2) / math.sqrt(d)", "    s = q.float() @ k.transpose(-1, -2) / d"))
WRONG["9.5"]["lse without the common maximum"] = edit(official("9.5"),
    ("    return o, m_all + torch.log(l_all)", "    return o, torch.log(l_all)"))
WRONG["9.5"]["the weights over the chunks renormalised (softmax of m)"] = edit(official("9.5"),
    ("    w = torch.exp(m - m_all)", "    w = torch.exp(m - m_all)\n    w = w / w.sum(dim=0)"))
WRONG["9.6"]["the chunk cap as a float (cache_len / 512)"] = edit(official("9.6"),
    ("    return max(1, min(want, cache_len // 512))", "    return max(1, min(want, cache_len / 512))"))
WRONG["9.6"]["the cap from cache_len // 512 + 1"] = edit(official("9.6"),
    ("    return max(1, min(want, cache_len // 512))", "    return max(1, min(want, cache_len // 512 + 1))"))


# Round nine: escapes found by a tester, each now caught on every draw of catch_rate
# the row maxima and the normaliser left to the library: 9.4 forbids torch.logsumexp as 2.2 does
WRONG["9.4"]["the softmax through torch.logsumexp (the library's normaliser, no max written)"] = edit(
    official("9.4"),
    ("    p = torch.exp(s - s.amax(dim=-1, keepdim=True))\n"
     "    return (p @ v / p.sum(dim=-1, keepdim=True)).to(q.dtype)",
     "    p = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))\n"
     "    return (p @ v).to(q.dtype)"))
