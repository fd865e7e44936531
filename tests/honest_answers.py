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
