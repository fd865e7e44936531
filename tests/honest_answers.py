"""Correct answers written as learners write them, unlike the official ones, that an earlier
check took for wrong: ``tests/test_honest_answers.py`` grades them with ``course-grade``
(the official answers elsewhere) and requires full marks on every exercise.

``HONEST[stem][exercise]`` maps a short description to the full source of an answer cell.
"""

HONEST = {
    '02_softmax_on_the_machine': {
        '2.2': {
            'a running state made with x.new_full / x.new_zeros, the max kept as a view of its element': '''# Exercise 2.2
def online_max_sum(x):
    state = (x.new_tensor(float("-inf")), x.new_zeros(()))
    i = 0
    while i < x.numel():
        m, s = state
        m_new = m if m >= x[i] else x[i]
        state = (m_new, s * (m - m_new).exp() + (x[i] - m_new).exp())
        i += 1
    return state''',
        },
    },
    '04_tiled_attention': {
        '4.3': {
            'an additive causal mask (0 and -inf) over the keys a query tile sees, a slice added per key tile; exp2': '''# Exercise 4.3
LOG2E = math.log2(math.e)

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
        last = min(nk, i0 + rows) if is_causal else nk
        if is_causal:
            bias = torch.zeros(rows, last)
            bias = bias.masked_fill(~tile_visible(i0, 0, rows, last), float("-inf"))
        for j0 in range(0, last, Bc):
            kj = k[:, :, j0:min(j0 + Bc, last)].float()
            vj = v[:, :, j0:min(j0 + Bc, last)].float()
            s = (qi @ kj.transpose(-1, -2)) * (scale * LOG2E)
            if is_causal:
                s = s + bias[:, j0:j0 + kj.shape[2]]
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp2(s - m_new[..., None])
            alpha = torch.exp2(m - m_new)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + p @ vj
            m = m_new
        o[:, :, i0:i0 + Br] = (acc / l[..., None]).to(q.dtype)
    return o''',
        },
    },
    '06_triton_forward': {
        '6.3': {
            'an explicit None test, divided by ln 2': '''# Exercise 6.3
def qk_scale_for(head_dim, sm_scale=None):
    scale = 1 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    return float(scale / math.log(2))''',
        },
        '6.4': {
            '-math.inf in the kernel': '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    ref = tl.where(m_new == -math.inf, 0.0, m_new)
    alpha = tl.exp2(m - ref)
    p = tl.exp2(s - ref[:, None])
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v)''',
        },
        '6.6': {
            '-math.inf and math.log2(math.e) in the kernel, a tl.cdiv loop': '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :], mask=rows[:, None] < NQ, other=0.0)
    m = tl.full([BLOCK_M], -math.inf, tl.float32)
    l = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    n_tiles = tl.cdiv(NK, BLOCK_N)
    if CAUSAL:
        n_tiles = tl.cdiv(tl.minimum(NK, (tl.program_id(0) + 1) * BLOCK_M + NK - NQ), BLOCK_N)
    for t in range(n_tiles):
        cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.load(K + bh * NK * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < NK, other=0.0)
        v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < NK, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(cols[None, :] < NK, s, -math.inf)
        if CAUSAL:
            s = tl.where(cols[None, :] - rows[:, None] <= NK - NQ, s, -math.inf)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = alpha * l + tl.sum(p, axis=1)
        acc = alpha[:, None] * acc + tl.dot(p, v)
        m = m_new
    tl.store(O + bh * NQ * D + rows[:, None] * D + d[None, :], acc / l[:, None], mask=rows[:, None] < NQ)
    tl.store(LSE + bh * NQ + rows, m / math.log2(math.e) + tl.log(l), mask=rows < NQ)''',
        },
    },
    '07_triton_backward': {
        '7.1': {
            'tl.reduce with a combine function of its own': '''# Exercise 7.1
@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def row_delta(o, do):
    return tl.reduce(o * do, 1, _add)''',
        },
        '7.2': {
            'exp2 with math.log2(math.e) in the kernel': '''# Exercise 7.2
import math

@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp2((tl.dot(k, qT) * scale - lse[None, :]) * math.log2(math.e))
    dv += tl.dot(pT, do)
    dk += tl.dot(pT * (tl.dot(v, tl.trans(do)) - delta[None, :]), tl.trans(qT))
    return dk, dv''',
        },
        '7.3': {
            'exp2 with math.log2(math.e) in the kernel': '''# Exercise 7.3
import math

@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    p = tl.exp2((tl.dot(q, kT) * scale - lse[:, None]) * math.log2(math.e))
    return dq + tl.dot(p * (tl.dot(do, vT) - delta[:, None]), tl.trans(kT))''',
        },
    },
    '08_hopper': {
        '8.1': {
            'the slot read with a regular expression, a new schedule built from the copies': '''# Exercise 8.1
import re

def add_releases(schedule):
    fixed = copy.deepcopy(schedule)
    for wg in fixed.warpgroups:
        if wg.role == "consumer":
            out = []
            for ins in wg.program:
                out.append(ins)
                for buf in getattr(ins, "reads", ()) if isinstance(ins, sim.Op) else ():
                    kind, slot = re.fullmatch(r"([KV])\\[(\\d+)\\]", buf).groups()
                    out.append(sim.Arrive(kind.lower() + "_empty[" + slot + "]"))
            wg.program = out
    return fixed''',
        },
    },
    '09_decoding': {
        '9.4': {
            'the query heads grouped in a view, einsum, the probabilities normalised before P V': '''# Exercise 9.4
def decode_attention_gqa(q, k_cache, v_cache):
    b, hq, nq, d = q.shape
    hkv, L = k_cache.shape[1], k_cache.shape[2]
    qg = q.float().reshape(b, hkv, hq // hkv, nq, d)
    s = torch.einsum("bhgqd,bhkd->bhgqk", qg, k_cache.float()) * d ** -0.5
    s = torch.where(bottom_right_mask(nq, L), s, torch.tensor(float("-inf")))
    p = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    p = p / p.sum(dim=-1, keepdim=True)
    o = torch.einsum("bhgqk,bhkd->bhgqd", p, v_cache.float())
    return o.reshape(b, hq, nq, d).to(q.dtype)''',
        },
        '9.5': {
            'the total lse first (logsumexp of m + log l), each chunk weighted by exp(m - lse)': '''# Exercise 9.5
def merge_partials(m, l, acc):
    lse = torch.logsumexp(m + torch.log(l), dim=0)
    w = torch.exp(m - lse)
    return (w[..., None] * acc).sum(dim=0), lse''',
        },
    },
}
