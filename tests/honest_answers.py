"""Correct answers written as learners write them, unlike the official ones: those that an
earlier check took for wrong, and a few in styles no other entry covers (state kept in a
namedtuple or a dataclass, recursion, in-place updates, Triton kernels with tl.range,
early returns, constexpr flags and helpers of their own). ``tests/test_honest_answers.py``
grades them with ``course-grade`` (the official answers elsewhere) and requires full marks
on every exercise.

``HONEST[stem][exercise]`` maps a short description to the full source of an answer cell.
"""

HONEST = {
    '01_register_machine': {
        '1.2': {
            'the tour c00, c10, c11, c01 (down the first column, then back up the second)': '''# Exercise 1.2
trace_full = """
LOAD a[0][0], R0
LOAD b[0][0], R1
MAC_Z R0, R1, R2
LOAD a[0][1], R0
LOAD b[1][0], R1
MAC R0, R1, R2, R2
STORE R2, c[0][0]
LOAD a[1][1], R0
MAC_Z R0, R1, R2
LOAD a[1][0], R0
LOAD b[0][0], R1
MAC R0, R1, R2, R2
STORE R2, c[1][0]
LOAD b[0][1], R1
MAC_Z R0, R1, R2
LOAD a[1][1], R0
LOAD b[1][1], R1
MAC R0, R1, R2, R2
STORE R2, c[1][1]
LOAD a[0][1], R0
MAC_Z R0, R1, R2
LOAD a[0][0], R0
LOAD b[0][1], R1
MAC R0, R1, R2, R2
STORE R2, c[0][1]
"""''',
        },
    },
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
            'a namedtuple state updated by a helper': '''# Exercise 2.2
from collections import namedtuple

Running = namedtuple("Running", ["m", "s"])

def _fold(st, xi):
    m = torch.maximum(st.m, xi)
    return Running(m, st.s * torch.exp(st.m - m) + torch.exp(xi - m))

def online_max_sum(x):
    st = Running(x.new_tensor(-math.inf), x.new_tensor(0.0))
    for xi in x:
        st = _fold(st, xi)
    return st.m, st.s''',
            'a dataclass state with a method that folds one element': '''# Exercise 2.2
from dataclasses import dataclass

@dataclass
class OnlineState:
    m: torch.Tensor
    s: torch.Tensor

    def push(self, xi):
        m_new = torch.maximum(self.m, xi)
        self.s = self.s * torch.exp(self.m - m_new) + torch.exp(xi - m_new)
        self.m = m_new

def online_max_sum(x):
    st = OnlineState(torch.tensor(-math.inf, dtype=x.dtype), torch.tensor(0.0, dtype=x.dtype))
    for xi in x:
        st.push(xi)
    return st.m, st.s''',
        },
    },
    '03_softmax_to_attention': {
        '3.3': {
            'torch.split into tiles, folded by recursion from the last': '''# Exercise 3.3
def tiled_row_attention(x, vals, B):
    xs, vs = torch.split(x, B, dim=1), torch.split(vals, B, dim=0)

    def fold(t):
        st = state_from_scores(xs[t], vs[t])
        return st if t == len(xs) - 1 else merge_states(st, fold(t + 1))

    total = fold(0)
    return total.acc / total.l.unsqueeze(-1)''',
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
            'torch.split into key tiles in a while loop, running state in a dict, in-place updates': '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    scale = q.shape[-1] ** -0.5
    nq, nk = q.shape[2], k.shape[2]
    out = torch.empty_like(q)
    k_tiles = torch.split(k, Bc, dim=2)
    v_tiles = torch.split(v, Bc, dim=2)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float() * scale
        rows = qi.shape[2]
        st = {"m": torch.full(qi.shape[:-1], -math.inf),
              "l": torch.zeros(qi.shape[:-1]),
              "acc": torch.zeros(qi.shape)}
        t = 0
        while t < len(k_tiles):
            j0 = t * Bc
            if is_causal and j0 > i0 + rows - 1:
                break                       # this tile and every later one lie after the last row
            kj, vj = k_tiles[t].float(), v_tiles[t].float()
            s = torch.matmul(qi, kj.transpose(-2, -1))
            if is_causal:
                s = torch.where(tile_visible(i0, j0, rows, kj.shape[2]), s, -math.inf)
            m_new = torch.maximum(st["m"], s.amax(dim=-1))
            alpha = torch.exp(st["m"] - m_new)
            p = torch.exp(s - m_new.unsqueeze(-1))
            st["l"].mul_(alpha).add_(p.sum(dim=-1))
            st["acc"].mul_(alpha.unsqueeze(-1)).add_(p @ vj)
            st["m"] = m_new
            t += 1
        out[:, :, i0:i0 + Br] = (st["acc"] / st["l"].unsqueeze(-1)).to(q.dtype)
    return out''',
        },
    },
    '06_triton_forward': {
        '6.1': {
            'an early return for a program past the end, 64-bit offsets': '''# Exercise 6.1
@triton.jit
def axpy_kernel(X, Y, OUT, alpha, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    if pid * BLOCK >= n:
        return
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(OUT + offs, alpha * tl.load(X + offs, mask=m) + tl.load(Y + offs, mask=m), mask=m)''',
        },
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
            'clamped row and key indices instead of masked loads, natural-log lse, tl.range over tile indices': '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    feat = tl.arange(0, D)
    safe_rows = tl.minimum(rows, NQ - 1)           # every address stays inside Q
    q = tl.load(Q + bh * NQ * D + safe_rows[:, None] * D + feat[None, :])
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    hi = NK
    if CAUSAL:
        hi = tl.minimum(NK, (start_m + 1) * BLOCK_M + NK - NQ)
    for j in tl.range(0, tl.cdiv(hi, BLOCK_N)):
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        safe_cols = tl.minimum(cols, NK - 1)
        k = tl.load(K + bh * NK * D + safe_cols[:, None] * D + feat[None, :])
        v = tl.load(V + bh * NK * D + safe_cols[:, None] * D + feat[None, :])
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        ok = cols[None, :] < NK
        if CAUSAL:
            ok = (cols[None, :] - rows[:, None] <= NK - NQ) & ok
        qk = tl.where(ok, qk, -float("inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        ref = tl.where(m_ij > float("-inf"), m_ij, 0.0)
        p = tl.where(ok, tl.exp2(qk - ref[:, None]), 0.0)
        alpha = tl.exp2(m_i - ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_ij
    out = acc / l_i[:, None]
    keep = rows < NQ
    tl.store(O + bh * NQ * D + rows[:, None] * D + feat[None, :], out.to(O.dtype.element_ty),
             mask=keep[:, None])
    lse = m_i * 0.6931471805599453 + tl.log(l_i)
    tl.store(LSE + bh * NQ + rows, lse, mask=keep)''',
            'two loops (whole tiles, then the diagonal band), a jit helper and a constexpr flag': '''# Exercise 6.6 (2 points)
@triton.jit
def _step(q, k_ptrs, v_ptrs, start, rows, m_i, l_i, acc, NQ, NK, qk_scale,
          BAND: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    cols = start + tl.arange(0, BLOCK_N)
    col_ok = cols < NK
    k = tl.load(k_ptrs + start * D, mask=col_ok[:, None], other=0.0)
    v = tl.load(v_ptrs + start * D, mask=col_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if BAND:
        s = tl.where((rows[:, None] + (NK - NQ) >= cols[None, :]) & col_ok[None, :], s, float("-inf"))
    else:
        s = tl.where(col_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    base = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - base[:, None])
    alpha = tl.exp2(m_i - base)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p, v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    row_ok = rows < NQ
    q = tl.load(Q + (bh * NQ + rows[:, None]) * D + d[None, :], mask=row_ok[:, None], other=0.0)
    key = tl.arange(0, BLOCK_N)
    k_ptrs = K + (bh * NK + key[:, None]) * D + d[None, :]
    v_ptrs = V + (bh * NK + key[:, None]) * D + d[None, :]
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if CAUSAL:
        # key tiles that end left of the first row's diagonal need no causal mask
        first_diag = pid_m * BLOCK_M + NK - NQ
        whole = tl.maximum(first_diag, 0) // BLOCK_N * BLOCK_N
        whole = tl.minimum(whole, NK)
        for start in range(0, whole, BLOCK_N):
            m_i, l_i, acc = _step(q, k_ptrs, v_ptrs, start, rows, m_i, l_i, acc, NQ, NK, qk_scale,
                                  False, BLOCK_N, D)
        end = tl.minimum(NK, (pid_m + 1) * BLOCK_M + NK - NQ)
        for start in range(whole, end, BLOCK_N):
            m_i, l_i, acc = _step(q, k_ptrs, v_ptrs, start, rows, m_i, l_i, acc, NQ, NK, qk_scale,
                                  True, BLOCK_N, D)
    else:
        for start in range(0, NK, BLOCK_N):
            m_i, l_i, acc = _step(q, k_ptrs, v_ptrs, start, rows, m_i, l_i, acc, NQ, NK, qk_scale,
                                  False, BLOCK_N, D)
    tl.store(O + (bh * NQ + rows[:, None]) * D + d[None, :], acc / l_i[:, None], mask=row_ok[:, None])
    tl.store(LSE + bh * NQ + rows, (m_i + tl.log2(l_i)) / 1.4426950408889634, mask=row_ok)''',
            'the loop runs to NK and an if skips the tiles past the band; a finite -1e30 for masked scores': '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    m_block = tl.program_id(0)
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    NEG: tl.constexpr = -1.0e30
    q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :], mask=(rows < NQ)[:, None], other=0.0)
    m = tl.full([BLOCK_M], NEG, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    last_key = (m_block + 1) * BLOCK_M - 1 + NK - NQ       # the last row's diagonal key
    for start in range(0, NK, BLOCK_N):
        if (not CAUSAL) or start <= last_key:
            cols = start + tl.arange(0, BLOCK_N)
            k = tl.load(K + bh * NK * D + cols[:, None] * D + d[None, :], mask=(cols < NK)[:, None], other=0.0)
            v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=(cols < NK)[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            ok = cols[None, :] < NK
            if CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + NK - NQ)
            s = tl.where(ok, s, NEG)
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.where(ok, tl.exp2(s - m_new[:, None]), 0.0)
            alpha = tl.exp2(m - m_new)
            l = l * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v)
            m = m_new
    out_ptr = O + bh * NQ * D + rows[:, None] * D + d[None, :]
    tl.store(out_ptr, acc / l[:, None], mask=(rows < NQ)[:, None])
    tl.store(LSE + bh * NQ + rows, (m + tl.log2(l)) * 0.6931471805599453, mask=rows < NQ)''',
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
            'the tensor method .sum(axis=1)': '''# Exercise 7.1
@triton.jit
def row_delta(o, do):
    prod = do * o
    return prod.sum(axis=1)''',
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
            'exp2 with a module-level constexpr log2(e), tl.dot with the accumulator argument': '''# Exercise 7.2
LOG2E_72 = tl.constexpr(1.4426950408889634)

@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    sT = tl.dot(k, qT)
    pT = tl.math.exp2((sT * scale - lse[None, :]) * LOG2E_72)
    dv = tl.dot(pT.to(do.dtype), do, dv)
    dpT = tl.dot(v, tl.trans(do))
    dsT = pT * (dpT - delta[None, :])
    dk = tl.dot(dsT, tl.trans(qT), dk)
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
        '7.4': {
            'index_add_ of every query head into its kv head': '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    b, hq, n, d = dk_per_query_head.shape
    out = dk_per_query_head.new_zeros(b, hq // group, n, d)
    owner = torch.arange(hq) // group
    return out.index_add_(1, owner, dk_per_query_head)''',
        },
        '7.6': {
            'new_empty buffers kept in a dict, the wrappers called with keywords': '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    buf = {
        "delta": lse.new_empty(lse.shape),
        "dq": q.new_empty(q.shape),
        "dk": k.new_empty(k.shape),
        "dv": v.new_empty(v.shape),
    }
    delta_7_1(o, do, out=buf["delta"])
    dkdv_7_2(q, k, v, do, lse, buf["delta"], dk=buf["dk"], dv=buf["dv"])
    dq_7_3(q, k, v, do, lse, buf["delta"], dq=buf["dq"])
    return buf["dq"], buf["dk"], buf["dv"]''',
        },
    },
    '09_decoding': {
        '9.4': {
            'a loop over query heads with torch.bmm, outputs stacked': '''# Exercise 9.4
def _one_head(qh, kh, vh, mask):
    # qh (B, Nq, d), kh, vh (B, L, d), all float32
    s = torch.bmm(qh, kh.transpose(1, 2)) / math.sqrt(qh.shape[-1])
    s.masked_fill_(~mask, -math.inf)
    s.sub_(s.amax(-1, keepdim=True))
    p = s.exp_()
    return torch.bmm(p, vh).div_(p.sum(-1, keepdim=True))


def decode_attention_gqa(q, k_cache, v_cache):
    hq, hkv = q.shape[1], k_cache.shape[1]
    mask = bottom_right_mask(q.shape[2], k_cache.shape[2])
    heads = [_one_head(q[:, h].float(), k_cache[:, h // (hq // hkv)].float(),
                       v_cache[:, h // (hq // hkv)].float(), mask) for h in range(hq)]
    return torch.stack(heads, dim=1).to(q.dtype)''',
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
            'einsum for the weighted sum, torch.where guarding the empty chunks': '''# Exercise 9.5
def merge_partials(m, l, acc):
    m_max = torch.amax(m, dim=0)
    w = torch.where(torch.isneginf(m), torch.zeros_like(m), torch.exp(m - m_max))
    denom = torch.einsum("s...,s...->...", w, l)
    numer = torch.einsum("s...,s...d->...d", w, acc)
    return numer / denom.unsqueeze(-1), m_max + denom.log()''',
            'the total lse first (logsumexp of m + log l), each chunk weighted by exp(m - lse)': '''# Exercise 9.5
def merge_partials(m, l, acc):
    lse = torch.logsumexp(m + torch.log(l), dim=0)
    w = torch.exp(m - lse)
    return (w[..., None] * acc).sum(dim=0), lse''',
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
}


# A third round: styles the entries above do not cover (Python branches per score, exp2 with
# log2(e), log-domain running states (a running lse, logaddexp merges), key tiles visited last to
# first, the output kept normalised after every tile, float64 intermediates cast back, pointers
# advanced per tile, keep_dims columns, Fractions, addmm/einsum/baddbmm), merged into HONEST.
_ROUND3 = {
    '03_softmax_to_attention': {
        '3.1': {
            'branches in Python: a masked score returns copies, a new max rescales the old sums and adds weight 1': '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = state
    if torch.isneginf(x):
        return m.clone(), den.clone(), num.clone()
    if x <= m:
        w = torch.exp(x - m)
        return m.clone(), den + w, num + w * v
    r = torch.exp(m - x)          # 0 when nothing was seen yet (m = -inf)
    return x.clone(), den * r + 1, num * r + v''',
            'exp2 with log2(e), the safe reference from torch.where with a Python 0.0': '''# Exercise 3.1
LOG2E = math.log2(math.e)

def attention_update(state, x, v):
    m, den, num = state
    m_new = torch.maximum(m, x)
    ref = torch.where(m_new == -math.inf, 0.0, m_new)
    scale_old = torch.exp2((m - ref) * LOG2E)
    w = torch.exp2((x - ref) * LOG2E)
    return m_new, scale_old * den + w, scale_old * num + w * v''',
            'in-place updates on fresh clones, an early return while only -inf was seen': '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = state
    m_new = torch.max(m, x)
    new_den, new_num = den.clone(), num.clone()
    if m_new == float("-inf"):
        return m_new, new_den, new_num
    r = (m - m_new).exp()
    w = (x - m_new).exp()
    new_den.mul_(r).add_(w)
    new_num.mul_(r).add_(w * v)
    return m_new, new_den, new_num''',
            'the update computed in float64, every state tensor cast back to the scores dtype': '''# Exercise 3.1
def attention_update(state, x, v):
    dt = x.dtype
    m, den, num = (t.double() for t in state)
    xd, vd = x.double(), v.double()
    m_new = torch.maximum(m, xd)
    shift = m_new.nan_to_num(neginf=0.0)
    r, w = torch.exp(m - shift), torch.exp(xd - shift)
    return m_new.to(dt), (r * den + w).to(dt), (r * num + w * vd).to(dt)''',
        },
        '3.2': {
            'the larger side keeps factor 1, the other exp of the (non-positive) gap; the NaN of two empty sides zeroed with nan_to_num': '''# Exercise 3.2
def merge(a, b):
    (ma, da, na), (mb, db, nb_) = a, b
    a_big = ma >= mb
    gap = torch.where(a_big, mb - ma, ma - mb)           # <= 0, NaN when both are -inf
    small = torch.exp(gap).nan_to_num(nan=0.0)
    one = torch.ones_like(small)
    ca = torch.where(a_big, one, small)
    cb = torch.where(a_big, small, one)
    return torch.maximum(ma, mb), ca * da + cb * db, ca.unsqueeze(1) * na + cb.unsqueeze(1) * nb_''',
            'both states stacked, weights exp(m - max) over the stack, empty rows masked': '''# Exercise 3.2
def merge(a, b):
    ms = torch.stack([a[0], b[0]])                 # (2, R)
    dens = torch.stack([a[1], b[1]])
    nums = torch.stack([a[2], b[2]])               # (2, R, d)
    m = ms.amax(dim=0)
    w = torch.exp(ms - m).masked_fill(torch.isneginf(ms), 0.0)
    return m, (w * dens).sum(0), (w[..., None] * nums).sum(0)''',
        },
    },
    '04_tiled_attention': {
        '4.3': {
            'key tiles visited last to first, a safe reference for rows that see nothing in the first tile visited': '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    scale = 1.0 / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    o = torch.empty_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        rows = qi.shape[2]
        end = min(nk, i0 + rows) if is_causal else nk
        m = torch.full(qi.shape[:-1], float("-inf"))
        l = torch.zeros(qi.shape[:-1])
        acc = torch.zeros(qi.shape)
        for j0 in reversed(range(0, end, Bc)):
            kj = k[:, :, j0:j0 + Bc].float()
            vj = v[:, :, j0:j0 + Bc].float()
            s = (qi @ kj.transpose(-1, -2)) * scale
            if is_causal:
                s = torch.where(tile_visible(i0, j0, rows, kj.shape[2]), s, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            ref = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - ref)
            p = torch.exp(s - ref[..., None])
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + p @ vj
            m = m_new
        o[:, :, i0:i0 + Br] = (acc / l[..., None]).to(q.dtype)
    return o''',
            'the output kept normalised after every tile (o, m, l), einsum scores, an arange causal mask': '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    B, H, nq, D = q.shape
    nk = k.shape[2]
    tau = D ** -0.5
    out = q.new_empty(q.shape)
    i0 = 0
    while i0 < nq:
        i1 = min(i0 + Br, nq)
        qi = q[:, :, i0:i1].to(torch.float32)
        m = qi.new_full((B, H, i1 - i0), -math.inf)
        l = qi.new_zeros((B, H, i1 - i0))
        oi = qi.new_zeros((B, H, i1 - i0, D))
        qpos = torch.arange(i0, i1)
        j0 = 0
        while j0 < nk and not (is_causal and j0 >= i1):
            j1 = min(j0 + Bc, nk)
            kj = k[:, :, j0:j1].to(torch.float32)
            vj = v[:, :, j0:j1].to(torch.float32)
            s = torch.einsum("bhqd,bhkd->bhqk", qi, kj) * tau
            if is_causal:
                s = s.masked_fill(torch.arange(j0, j1)[None, :] > qpos[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new.unsqueeze(-1))
            l_new = torch.exp(m - m_new) * l + p.sum(-1)
            oi = ((torch.exp(m - m_new) * l).unsqueeze(-1) * oi + p @ vj) / l_new.unsqueeze(-1)
            m, l = m_new, l_new
            j0 = j1
        out[:, :, i0:i1] = oi.to(out.dtype)
        i0 = i1
    return out''',
            'scale and log2(e) folded into the float32 query tile, exp2, in-place l and acc, baddbmm over flattened heads': '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    B, H, nq, D = q.shape
    nk = k.shape[2]
    c = math.log2(math.e) / math.sqrt(D)
    qf = q.reshape(B * H, nq, D)
    kf = k.reshape(B * H, nk, D)
    vf = v.reshape(B * H, nk, D)
    out = torch.empty(B * H, nq, D, dtype=q.dtype)
    for i0 in range(0, nq, Br):
        qi = qf[:, i0:i0 + Br].float() * c
        rows = qi.shape[1]
        m = torch.full((B * H, rows), -math.inf)
        l = torch.zeros(B * H, rows)
        acc = torch.zeros(B * H, rows, D)
        stop = min(nk, i0 + rows) if is_causal else nk
        for j0 in range(0, stop, Bc):
            kj = kf[:, j0:j0 + Bc].float()
            s = torch.bmm(qi, kj.transpose(1, 2))
            if is_causal:
                s.masked_fill_(~tile_visible(i0, j0, rows, kj.shape[1]), -math.inf)
            m_new = torch.maximum(m, s.amax(dim=2))
            alpha = torch.exp2(m - m_new)
            s.sub_(m_new[:, :, None]).exp2_()
            l.mul_(alpha).add_(s.sum(dim=2))
            acc.mul_(alpha[:, :, None]).baddbmm_(s, vf[:, j0:j0 + Bc].float())
            m = m_new
        out[:, i0:i0 + Br] = (acc / l[:, :, None]).to(q.dtype)
    return out.reshape(B, H, nq, D)''',
            'log domain: a running lse per row (logsumexp of the tile, logaddexp), the output kept normalised': '''# Exercise 4.3
def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
    scale = 1.0 / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    o = torch.empty_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        rows = qi.shape[2]
        lse = torch.full(qi.shape[:-1], float("-inf"))
        oi = torch.zeros_like(qi)
        for j0 in range(0, nk, Bc):
            if is_causal and j0 >= i0 + rows:
                break
            kj, vj = k[:, :, j0:j0 + Bc].float(), v[:, :, j0:j0 + Bc].float()
            s = qi @ kj.transpose(-1, -2) * scale
            if is_causal:
                s = s.masked_fill(~tile_visible(i0, j0, rows, kj.shape[2]), float("-inf"))
            lse_new = torch.logaddexp(lse, torch.logsumexp(s, dim=-1))
            ref = torch.where(torch.isneginf(lse_new), torch.zeros_like(lse_new), lse_new)
            oi = torch.exp(lse - ref)[..., None] * oi + torch.exp(s - ref[..., None]) @ vj
            lse = lse_new
        o[:, :, i0:i0 + Br] = oi.to(q.dtype)
    return o''',
        },
        '4.6': {
            'kv heads repeated with repeat_interleave, one batched softmax over every head': '''# Exercise 4.6
def decode_step(q_new, k_cache, v_cache):
    group = q_new.shape[1] // k_cache.shape[1]
    k = k_cache.float().repeat_interleave(group, dim=1)        # (B, Hq, L, D)
    v = v_cache.float().repeat_interleave(group, dim=1)
    s = q_new.float() @ k.transpose(-2, -1) * q_new.shape[-1] ** -0.5
    return (torch.softmax(s, dim=-1) @ v).to(q_new.dtype)''',
            'query heads grouped in a view, exp(s - logsumexp(s)) in float64, cast back': '''# Exercise 4.6
def decode_step(q_new, k_cache, v_cache):
    B, hq, _, D = q_new.shape
    hkv, L = k_cache.shape[1], k_cache.shape[2]
    qg = q_new.double().view(B, hkv, hq // hkv, D)                     # one row per query head
    s = torch.einsum("bhgd,bhld->bhgl", qg, k_cache.double()) / math.sqrt(D)
    p = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))
    o = torch.einsum("bhgl,bhld->bhgd", p, v_cache.double())
    return o.reshape(B, hq, 1, D).to(q_new.dtype)''',
        },
        '4.7': {
            "the paper's update: each tile's own max m~ and sum l~, both sides rescaled to m_new": '''# Exercise 4.7
def fa1_walk(q, k, v, Br, Bc):
    n, d = q.shape
    m = torch.full((n,), float("-inf"))
    l = torch.zeros(n)
    o = torch.zeros(n, d)
    steps = []
    Tc, Tr = -(-k.shape[0] // Bc), -(-n // Br)
    for j in range(Tc):
        Kj = k[j * Bc:(j + 1) * Bc].float()
        Vj = v[j * Bc:(j + 1) * Bc].float()
        for i in range(Tr):
            rows = slice(i * Br, (i + 1) * Br)
            S = q[rows].float() @ Kj.T / math.sqrt(d)
            m_t = S.max(dim=1).values                      # this tile's own max
            P_t = torch.exp(S - m_t[:, None])
            l_t = P_t.sum(dim=1)
            m_i, l_i, O_i = m[rows], l[rows], o[rows]
            m_new = torch.maximum(m_i, m_t)
            c_old, c_new = torch.exp(m_i - m_new), torch.exp(m_t - m_new)
            l_new = c_old * l_i + c_new * l_t
            O_new = ((l_i * c_old)[:, None] * O_i + c_new[:, None] * (P_t @ Vj)) / l_new[:, None]
            o[rows], m[rows], l[rows] = O_new, m_new, l_new
            steps.append((j, i, m_new.clone(), l_new.clone(), O_new.clone()))
    return o, steps''',
        },
    },
    '05_backward_pass': {
        '5.5': {
            'no helpers: torch.addmm with alpha=scale for dQ and dK, P from exp2 with log2(e)': '''# Exercise 5.5 (2 points)
LOG2E = 1.4426950408889634

def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    p = torch.exp2((scale * (q_i @ k_j.T) - lse_i.unsqueeze(1)) * LOG2E)
    dv_new = torch.addmm(dv_j, p.T, do_i)
    ds = p * (do_i @ v_j.T - D_i.unsqueeze(1))
    dq_new = torch.addmm(dq_i, ds, k_j, alpha=scale)
    dk_new = torch.addmm(dk_j, ds.T, q_i, alpha=scale)
    return dq_new, dk_new, dv_new''',
            'P transposed first (keys along the rows), einsum products': '''# Exercise 5.5 (2 points)
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    pT = torch.exp(torch.einsum("kd,qd->kq", k_j, q_i) * scale - lse_i[None, :])    # (Bc, Br)
    dpT = torch.einsum("kd,qd->kq", v_j, do_i)
    dsT = pT * (dpT - D_i[None, :])
    dv = dv_j + torch.einsum("kq,qd->kd", pT, do_i)
    dk = dk_j + scale * torch.einsum("kq,qd->kd", dsT, q_i)
    dq = dq_i + scale * torch.einsum("kq,kd->qd", dsT, k_j)
    return dq, dk, dv''',
        },
    },
    '06_triton_forward': {
        '6.4': {
            'tl.math.exp2, tl.dot with the rescaled accumulator as its acc argument': '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    row_max = tl.max(s, axis=1)
    m_new = tl.where(row_max > m, row_max, m)
    alpha = tl.math.exp2(m - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_new = alpha * l + tl.sum(p, axis=1)
    acc = tl.dot(p, v, acc * alpha[:, None])
    return m_new, l_new, acc''',
            'natural exp of the base-2 differences times ln 2': '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    LN2: tl.constexpr = 0.6931471805599453
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp((m - m_new) * LN2)
    p = tl.exp((s - m_new[:, None]) * LN2)
    return m_new, alpha * l + tl.sum(p, 1), alpha[:, None] * acc + tl.dot(p, v)''',
            'the tile max with keep_dims, a 2-D running max squeezed back with tl.max': '''# Exercise 6.4
@triton.jit
def online_update(m, l, acc, s, v):
    m2 = tl.maximum(m[:, None], tl.max(s, axis=1, keep_dims=True))     # (BLOCK_M, 1)
    p = tl.exp2(s - m2)
    alpha2 = tl.exp2(m[:, None] - m2)
    acc = acc * alpha2 + tl.dot(p, v)
    l = l * tl.max(alpha2, axis=1) + tl.sum(p, axis=1)
    return tl.max(m2, axis=1), l, acc''',
        },
        '6.5': {
            'a tuple indexed by two comparisons': '''# Exercise 6.5
def tile_kind(r0, r1, c0, c1, offset=0):
    reaches_first_diag = c1 >= r0 + offset      # not off-band
    past_last_diag = c0 > r1 + offset           # skipped
    return ("off-band", "on-band", "skipped")[int(reaches_first_diag) + int(past_last_diag)]''',
        },
        '6.6': {
            'pointers advanced by BLOCK_N rows per tile (the tutorial style), a while loop, q pre-scaled by qk_scale': '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_ptrs = Q + off_bh * NQ * D + offs_m[:, None] * D + offs_d[None, :]
    k_ptrs = K + off_bh * NK * D + offs_n[:, None] * D + offs_d[None, :]
    v_ptrs = V + off_bh * NK * D + offs_n[:, None] * D + offs_d[None, :]
    q = tl.load(q_ptrs, mask=offs_m[:, None] < NQ, other=0.0)
    q = q * qk_scale
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    hi = NK
    if CAUSAL:
        hi = tl.minimum(NK, (start_m + 1) * BLOCK_M + NK - NQ)
    start_n = 0
    while start_n < hi:
        cols = start_n + offs_n
        k = tl.load(k_ptrs, mask=cols[:, None] < NK, other=0.0)
        v = tl.load(v_ptrs, mask=cols[:, None] < NK, other=0.0)
        qk = tl.dot(q, tl.trans(k))
        valid = cols[None, :] < NK
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None] + (NK - NQ))
        qk = tl.where(valid, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_ij
        k_ptrs += BLOCK_N * D
        v_ptrs += BLOCK_N * D
        start_n += BLOCK_N
    acc = acc / l_i[:, None]
    o_ptrs = O + off_bh * NQ * D + offs_m[:, None] * D + offs_d[None, :]
    tl.store(o_ptrs, acc, mask=offs_m[:, None] < NQ)
    tl.store(LSE + off_bh * NQ + offs_m, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=offs_m < NQ)''',
            'natural-log scores inside the loop (qk_scale times ln 2), tl.exp, lse = m + log l': '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    r = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    f = tl.arange(0, D)
    tau = qk_scale * 0.6931471805599453          # back to natural-log units: tau = qk_scale * ln 2
    q = tl.load(Q + head * NQ * D + r[:, None] * D + f[None, :], mask=r[:, None] < NQ, other=0.0)
    m = tl.zeros([BLOCK_M], tl.float32) + float("-inf")
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    n_end = NK
    if CAUSAL:
        n_end = tl.minimum(NK, pid * BLOCK_M + BLOCK_M + NK - NQ)
    for j in range(0, tl.cdiv(n_end, BLOCK_N)):
        c = j * BLOCK_N + tl.arange(0, BLOCK_N)
        kv_mask = c[:, None] < NK
        k = tl.load(K + head * NK * D + c[:, None] * D + f[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + head * NK * D + c[:, None] * D + f[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * tau
        if CAUSAL:
            s = tl.where((c[None, :] < NK) & (c[None, :] <= r[:, None] + NK - NQ), s, float("-inf"))
        else:
            s = tl.where(c[None, :] < NK, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        p = tl.exp(s - safe[:, None])
        corr = tl.exp(m - safe)
        l = corr * l + tl.sum(p, 1)
        acc = corr[:, None] * acc + tl.dot(p, v)
        m = m_new
    tl.store(O + head * NQ * D + r[:, None] * D + f[None, :], acc / l[:, None], mask=r[:, None] < NQ)
    tl.store(LSE + head * NQ + r, m + tl.log(l), mask=r < NQ)''',
            'a running base-2 lse in place of l (log2 of 2^a + 2^b by hand), the output kept normalised': '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    rmask = rows < NQ
    q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :], mask=rmask[:, None], other=0.0)
    lse2 = tl.full([BLOCK_M], float("-inf"), tl.float32)      # log2 of the sum so far
    o = tl.zeros([BLOCK_M, D], tl.float32)                      # normalised output so far
    end = NK
    if CAUSAL:
        end = tl.minimum(NK, (tl.program_id(0) + 1) * BLOCK_M + NK - NQ)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        cmask = cols < NK
        k = tl.load(K + bh * NK * D + cols[:, None] * D + d[None, :], mask=cmask[:, None], other=0.0)
        v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=cmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        vis = cmask[None, :]
        if CAUSAL:
            vis = vis & (cols[None, :] <= rows[:, None] + NK - NQ)
        s = tl.where(vis, s, float("-inf"))
        mx = tl.maximum(lse2, tl.max(s, 1))
        ref = tl.where(mx == float("-inf"), 0.0, mx)
        tot = tl.exp2(lse2 - ref) + tl.sum(tl.exp2(s - ref[:, None]), 1)
        new = ref + tl.log2(tot)
        safe = tl.where(new == float("-inf"), 0.0, new)
        o = o * tl.exp2(lse2 - safe)[:, None] + tl.dot(tl.exp2(s - safe[:, None]), v)
        lse2 = new
    tl.store(O + bh * NQ * D + rows[:, None] * D + d[None, :], o, mask=rmask[:, None])
    tl.store(LSE + bh * NQ + rows, lse2 / 1.4426950408889634, mask=rmask)''',
            'm and l kept as (BLOCK_M, 1) columns (keep_dims), reshaped for the lse store': '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]      # (BLOCK_M, 1)
    d = tl.arange(0, D)[None, :]
    q = tl.load(Q + bh * NQ * D + rows * D + d, mask=rows < NQ, other=0.0)
    m = tl.full([BLOCK_M, 1], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M, 1], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    end = NK
    if CAUSAL:
        end = tl.minimum(NK, (tl.program_id(0) + 1) * BLOCK_M + NK - NQ)
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kcol = keys[:, None]
        k = tl.load(K + bh * NK * D + kcol * D + d, mask=kcol < NK, other=0.0)
        v = tl.load(V + bh * NK * D + kcol * D + d, mask=kcol < NK, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        keep = keys[None, :] < NK
        if CAUSAL:
            keep = keep & (keys[None, :] <= rows + NK - NQ)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1, keep_dims=True))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - base)
        p = tl.exp2(s - base)
        l = l * alpha + tl.sum(p, axis=1, keep_dims=True)
        acc = acc * alpha + tl.dot(p, v)
        m = m_new
    tl.store(O + bh * NQ * D + rows * D + d, acc / l, mask=rows < NQ)
    lse = tl.reshape((m + tl.log2(l)) * 0.6931471805599453, [BLOCK_M])
    r1 = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(LSE + bh * NQ + r1, lse, mask=r1 < NQ)''',
            'key tiles visited from the end of the band back to the first, a safe reference for rows with nothing visible yet': '''# Exercise 6.6 (2 points)
@triton.jit
def fa2_fwd_kernel(Q, K, V, O, LSE, NQ, NK, qk_scale, CAUSAL: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :], mask=rows[:, None] < NQ, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    end = NK
    if CAUSAL:
        end = tl.minimum(NK, (tl.program_id(0) + 1) * BLOCK_M + NK - NQ)
    n_tiles = tl.cdiv(end, BLOCK_N)
    for t in range(0, n_tiles):
        start = (n_tiles - 1 - t) * BLOCK_N                  # the last tile of the band first
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + bh * NK * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < NK, other=0.0)
        v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < NK, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        ok = cols[None, :] < NK
        if CAUSAL:
            ok = ok & (cols[None, :] <= rows[:, None] + NK - NQ)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - ref)
        p = tl.exp2(s - ref[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(O + bh * NQ * D + rows[:, None] * D + d[None, :], acc / l[:, None], mask=rows[:, None] < NQ)
    tl.store(LSE + bh * NQ + rows, (m + tl.log2(l)) * 0.6931471805599453, mask=rows < NQ)''',
        },
    },
    '07_triton_backward': {
        '7.2': {
            'P (queries along the rows) built first and transposed for both products': '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    q = tl.trans(qT)                                     # (BLOCK_M, D)
    p = tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None])
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    dv = dv + tl.dot(tl.trans(p), do)
    dk = dk + tl.dot(tl.trans(ds), q)
    return dk, dv''',
            'exp2 of the score and lse both multiplied by log2(e) (a scaled k)': '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    LOG2E: tl.constexpr = 1.4426950408889634
    pT = tl.exp2(tl.dot(k * (scale * LOG2E), qT) - (lse * LOG2E)[None, :])
    dpT = tl.dot(v, tl.trans(do))
    new_dv = dv + tl.dot(pT, do)
    new_dk = dk + tl.dot(pT * dpT - pT * delta[None, :], tl.trans(qT))
    return new_dk, new_dv''',
            'the scores shifted by lse before the scale is applied: exp(scale * (S - lse / scale))': '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp((tl.dot(k, qT) - (lse / scale)[None, :]) * scale)
    dv += tl.dot(pT, do)
    dk += tl.dot(pT * (tl.dot(v, tl.trans(do)) - delta[None, :]), tl.trans(qT))
    return dk, dv''',
        },
        '7.3': {
            'exp2 with the scale and log2(e) folded into one factor, lse converted to base 2': '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    c = scale * 1.4426950408889634
    p = tl.exp2(tl.dot(q, kT) * c - lse[:, None] * 1.4426950408889634)
    dp = tl.dot(do, vT)
    ds = p * dp - p * delta[:, None]
    return dq + tl.dot(ds, tl.trans(kT))''',
            'dQ^T accumulated as K^T dS^T and transposed back': '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    s = tl.dot(q, kT)
    p = tl.exp(s * scale - lse[:, None])
    ds = p * (tl.dot(do, vT) - delta[:, None])
    return dq + tl.trans(tl.dot(kT, tl.trans(ds)))''',
            'tl.dot with dq as the accumulator argument, P from a scaled q': '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    p = tl.exp(tl.dot(q * scale, kT) - lse[:, None])
    dp = tl.dot(do, vT)
    return tl.dot(p * (dp - delta[:, None]), tl.trans(kT), dq)''',
        },
        '7.4': {
            'a list of slices of consecutive heads, each summed, stacked': '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    hq = dk_per_query_head.shape[1]
    return torch.stack([dk_per_query_head[:, h0:h0 + group].sum(dim=1) for h0 in range(0, hq, group)],
                       dim=1)''',
            'einsum with a 0/1 matrix that maps query heads to kv heads': '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    hq = dk_per_query_head.shape[1]
    owner = torch.arange(hq) // group
    onehot = (owner[None, :] == torch.arange(hq // group)[:, None]).to(dk_per_query_head.dtype)
    return torch.einsum("kh,bhnd->bknd", onehot, dk_per_query_head)''',
        },
    },
    '08_hopper': {
        '8.3': {
            'multiplied by the reciprocal 448 / amax, the scale a Python float from .item()': '''# Exercise 8.3
def quantize_block(x):
    amax = x.abs().max().item()
    scale = amax / 448.0
    return (x * (448.0 / amax)).to(torch.float8_e4m3fn), scale''',
            'torch.amax of the absolute values, the division in float64 before the cast': '''# Exercise 8.3
def quantize_block(x):
    scale = torch.amax(torch.abs(x)) / fp8.FP8_MAX
    x8 = (x.double() / scale.double()).to(fp8.FP8_DTYPE)
    return x8, scale''',
        },
    },
    '09_decoding': {
        '9.2': {
            'an exact Fraction of the two counts, converted to float': '''# Exercise 9.2
from fractions import Fraction

def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    flops = Fraction(4 * q_heads * new_tokens)          # per cached position, per head dim, per batch row
    cache_bytes = Fraction(2 * kv_heads * bytes_per_elem)
    return float(flops / cache_bytes)''',
            'the full counts with B = L = d = 1, the group size divided first': '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    B = L = d = 1                    # they cancel in the ratio
    group = q_heads / kv_heads
    flops = 4 * d * B * kv_heads * group * new_tokens * L
    nbytes = 2 * B * kv_heads * L * d * bytes_per_elem
    return flops / nbytes''',
            'two FLOPs per byte per query head in a group and draft token: 2 * group * tokens / bytes': '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return 2.0 * (q_heads / kv_heads) * new_tokens / bytes_per_elem''',
        },
        '9.3': {
            'torch.tril of a ones matrix with diagonal nk - nq': '''# Exercise 9.3
def bottom_right_mask(nq, nk):
    return torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)''',
            'each row built from how many keys token t sees': '''# Exercise 9.3
def bottom_right_mask(nq, nk):
    seen = torch.arange(nk - nq + 1, nk + 1)            # token t sees nk - nq + t + 1 keys
    return torch.arange(nk).unsqueeze(0) < seen.unsqueeze(1)''',
        },
        '9.5': {
            'logaddexp folded over the chunks (functools.reduce), weights exp(m - lse)': '''# Exercise 9.5
import functools

def merge_partials(m, l, acc):
    chunk_lse = m + torch.log(l)                  # -inf for an empty chunk
    lse = functools.reduce(torch.logaddexp, chunk_lse.unbind(0))
    w = torch.exp(m - lse)
    return (w.unsqueeze(-1) * acc).sum(0), lse''',
            'the global max first, then a loop adding each rescaled chunk, masked_fill for the empty ones': '''# Exercise 9.5
def merge_partials(m, l, acc):
    m_max = m.max(dim=0).values
    l_tot = torch.zeros_like(l[0])
    acc_tot = torch.zeros_like(acc[0])
    for c in range(m.shape[0]):
        w = torch.exp(m[c] - m_max).masked_fill(torch.isneginf(m[c]), 0.0)
        l_tot += w * l[c]
        acc_tot += w[..., None] * acc[c]
    return acc_tot / l_tot[..., None], m_max + l_tot.log()''',
            'merged in float64, the results cast back to the inputs dtype': '''# Exercise 9.5
def merge_partials(m, l, acc):
    dt = acc.dtype
    m64, l64, acc64 = m.double(), l.double(), acc.double()
    top = m64.amax(0, keepdim=True)
    w = torch.where(torch.isneginf(m64), 0.0, torch.exp(m64 - top))
    den = (w * l64).sum(0)
    o = (w.unsqueeze(-1) * acc64).sum(0) / den.unsqueeze(-1)
    return o.to(dt), (top.squeeze(0) + torch.log(den)).to(m.dtype)''',
            'every chunk normalised on its own (acc / l), then weighted by its share exp(m - max) l / total': '''# Exercise 9.5
def merge_partials(m, l, acc):
    m_max = m.amax(dim=0)
    w = torch.exp(m - m_max) * l                  # each chunk's share, measured from the global max
    total = w.sum(dim=0)
    o_chunk = torch.where(l[..., None] > 0, acc / l.clamp_min(1e-30)[..., None], torch.zeros_like(acc))
    o = ((w / total)[..., None] * o_chunk).sum(dim=0)
    return o, m_max + torch.log(total)''',
        },
    },
}

for _stem, _exercises in _ROUND3.items():
    for _ex, _answers in _exercises.items():
        HONEST.setdefault(_stem, {}).setdefault(_ex, {}).update(_answers)
del _stem, _exercises, _ex, _answers

# Round eight: right answers in styles the wrong answers of round eight sit close to
_ROUND8 = {
    '00_setup': {
        '0.1': {
            "the dtype's itemsize": '''# Exercise 0.1
def score_bytes(B, H, N, dtype):
    return B * H * N * N * dtype.itemsize''',
        },
        '0.2': {
            'k.mT, times d ** -0.5': '''# Exercise 0.2
def scaled_scores(q, k):
    return q @ k.mT * q.shape[-1] ** -0.5''',
        },
    },
    '01_register_machine': {
        '1.6': {
            'the outputs visited column by column': '''# Exercise 1.6
def no_reuse_trace_t(n):
    lines = []
    for j in range(n):
        for i in range(n):
            for k in range(n):
                lines.append(f"LOAD b[{j}][{k}], R1")
                lines.append(f"LOAD a[{i}][{k}], R0")
                lines.append("MAC_Z R1, R0, R2" if k == 0 else "MAC R1, R0, R2, R2")
            lines.append(f"STORE R2, c[{i}][{j}]")
    return "\\n".join(lines)''',
        },
    },
    '02_softmax_on_the_machine': {
        '2.5': {
            "the NaN of -inf - (-inf) replaced by 0 after exp": '''# Exercise 2.5
def rescale_factor(m_old, m_new):
    return torch.exp(m_old - m_new).nan_to_num(nan=0.0)''',
        },
        '2.6': {
            'M2 grown by delta^2 (N - 1) / N': '''# Exercise 2.6 (2 points)
def welford_step(state, x):
    n, mean, m2 = state
    delta = x - mean
    n += 1
    m2 += delta * delta * (n - 1) / n
    mean += delta / n
    return (n, mean, m2)

m2_increment_is = "b"''',
        },
    },
    '03_softmax_to_attention': {
        '3.4': {
            'math.ceil of a true division for the tile counts': '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    Tr, Tc = math.ceil(N / Br), math.ceil(N / Bc)
    kv = N * d * 2
    return Tr * kv, kv, (2 * Tc + 1) * N * d''',
        },
    },
    '04_tiled_attention': {
        '4.2': {
            'tril of a ones tile with the diagonal i0 - j0': '''# Exercise 4.2
def tile_visible(i0, j0, rows, cols):
    return torch.ones(rows, cols, dtype=torch.bool).tril(diagonal=i0 - j0)''',
        },
        '4.5': {
            'every tile a permutation of the same eight keys': '''# Exercise 4.5
prediction_4_5 = "finite_but_wrong"
base = torch.randn(8, 4)
k_special = torch.cat([base[torch.randperm(8)] for _ in range(4)])[None, None]''',
        },
    },
    '05_backward_pass': {
        '5.4': {
            'dK as the transpose of Q^T dS': '''# Exercise 5.4
def grads_through_scores(ds, q, k, scale):
    dq = torch.matmul(ds, k) * scale
    dk = (q.transpose(-2, -1) @ ds).transpose(-2, -1) * scale
    return dq, dk''',
        },
    },
    '07_triton_backward': {
        '7.4': {
            'strided slices, one per position in the group, summed': '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    return sum(dk_per_query_head[:, r::group] for r in range(group))''',
        },
    },
}

for _stem, _exercises in _ROUND8.items():
    for _ex, _answers in _exercises.items():
        HONEST.setdefault(_stem, {}).setdefault(_ex, {}).update(_answers)
del _stem, _exercises, _ex, _answers
