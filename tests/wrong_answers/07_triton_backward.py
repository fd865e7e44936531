"""Wrong answers to problem set 7 (Triton backward), as learners write them."""

from tests.wrong_answers import edit, official

WRONG = {
    "7.1": {
        "sums over the rows (axis 0)": '''# Exercise 7.1
@triton.jit
def row_delta(o, do):
    return tl.sum(o * do, 0)''',
        "sums the whole tile": '''# Exercise 7.1
@triton.jit
def row_delta(o, do):
    return tl.sum(tl.sum(o * do, 1), 0) + tl.zeros_like(tl.sum(o, 1))''',
        "products rounded to float16 before the sum": '''# Exercise 7.1
@triton.jit
def row_delta(o, do):
    return tl.sum((o * do).to(tl.float16), 1).to(tl.float32)''',
        "the tiles cast to float16 first": '''# Exercise 7.1
@triton.jit
def row_delta(o, do):
    return tl.sum(o.to(tl.float16) * do.to(tl.float16), 1).to(tl.float32)''',
        "adds instead of multiplying": '''# Exercise 7.1
@triton.jit
def row_delta(o, do):
    return tl.sum(o + do, 1)''',
        "a zero Delta; the template kernel's launch swapped for PyTorch": '''# Exercise 7.1
@triton.jit
def row_delta(o, do):
    return tl.sum(o * 0.0, 1)


def _delta_in_torch(o, do, delta, n, *rest, grid=None, warmup=False, **meta):
    delta.copy_((o.double() * do.double()).sum(-1).to(delta.dtype))


delta_kernel.run = _delta_in_torch''',
    },
    "7.2": {
        "forgets Delta": '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp(tl.dot(k, qT) * scale - lse[None, :])
    dv += tl.dot(pT, do)
    dsT = pT * tl.dot(v, tl.trans(do))
    dk += tl.dot(dsT, tl.trans(qT))
    return dk, dv''',
        "P not recomputed from lse (softmax of the tile)": '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    s = tl.dot(k, qT) * scale
    e = tl.exp(s - tl.max(s, 0)[None, :])
    pT = e / tl.sum(e, 0)[None, :]
    dv += tl.dot(pT, do)
    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk += tl.dot(dsT, tl.trans(qT))
    return dk, dv''',
        "the scale applied twice to dK": '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp(tl.dot(k, qT) * scale - lse[None, :])
    dv += tl.dot(pT, do)
    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk += tl.dot(dsT, tl.trans(qT)) * scale
    return dk, dv''',
        "exp2 on natural-log lse": '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp2(tl.dot(k, qT) * scale - lse[None, :])
    dv += tl.dot(pT, do)
    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk += tl.dot(dsT, tl.trans(qT))
    return dk, dv''',
    },
    "7.3": {
        "forgets Delta": '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    p = tl.exp(tl.dot(q, kT) * scale - lse[:, None])
    ds = p * tl.dot(do, vT)
    return dq + tl.dot(ds, tl.trans(kT))''',
        "does not accumulate (returns this tile only)": '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    p = tl.exp(tl.dot(q, kT) * scale - lse[:, None])
    ds = p * (tl.dot(do, vT) - delta[:, None])
    return tl.dot(ds, tl.trans(kT))''',
        "P without lse (exp of the raw scores)": '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    p = tl.exp(tl.dot(q, kT) * scale)
    ds = p * (tl.dot(do, vT) - delta[:, None])
    return dq + tl.dot(ds, tl.trans(kT))''',
    },
    "7.4": {
        "wrong GQA head: groups of strided heads (h % Hkv)": '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    b, hq, n, d = dk_per_query_head.shape
    return dk_per_query_head.reshape(b, group, hq // group, n, d).sum(1)''',
        "mean instead of sum": '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    b, hq, n, d = dk_per_query_head.shape
    return dk_per_query_head.reshape(b, hq // group, group, n, d).mean(2)''',
        "takes the first head of each group": '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    return dk_per_query_head[:, ::group].clone()''',
    },
    "7.5": {
        "forgets the recomputation of S": '''# Exercise 7.5
bwd_matmuls_7_5 = 4
ratio_7_5 = (2 + 4) / 2''',
        "counts the backward only in the ratio": '''# Exercise 7.5
bwd_matmuls_7_5 = 5
ratio_7_5 = 5 / 2''',
        "twice the forward, the usual rule of thumb": '''# Exercise 7.5
bwd_matmuls_7_5 = 4
ratio_7_5 = 3.0''',
    },
}

WRONG["7.6"] = {
    "Delta from a kernel jitted afresh from the library kernel's function": '''# Exercise 7.6
from course_utils.triton_attention import _attn_bwd_delta as _library_delta
_my_delta = triton.jit(_library_delta.fn)
def flash_backward(q, k, v, o, lse, do):
    bh, nq, d = q.shape
    delta = torch.empty(bh, nq, device=q.device, dtype=torch.float32)
    launch(_my_delta, (triton.cdiv(nq, 16), bh), o, do, delta, o.stride(0), 0, o.stride(1),
           do.stride(0), 0, do.stride(1), 1, nq, d, HEAD_DIM=triton.next_power_of_2(d), BLOCK=16)
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv''',
    "Delta in PyTorch, handed to launch as a kernel object": '''# Exercise 7.6
class _RowDot:
    def __getitem__(self, grid):
        def run(o, do, out, *rest, **meta):
            out.copy_((o * do).sum(-1))
        return run


def flash_backward(q, k, v, o, lse, do):
    delta = torch.empty(q.shape[:2], device=q.device, dtype=torch.float32)
    launch(_RowDot(), (1,), o, do, delta)
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv''',
    "Delta from the Hopper package's row_stats kernel": '''# Exercise 7.6
from course_utils.hopper.gluon_bwd import row_stats
def flash_backward(q, k, v, o, lse, do):
    bh, nq, d = q.shape
    _, delta = row_stats(o.unsqueeze(0), do.unsqueeze(0), lse.unsqueeze(0))
    delta = delta.view(bh, -1)[:, :nq].contiguous()
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv''',
    "Delta from lesson 7's library kernel (triton_attention)": '''# Exercise 7.6
from course_utils.triton_attention import _attn_bwd_delta
def flash_backward(q, k, v, o, lse, do):
    bh, nq, d = q.shape
    delta = torch.empty(bh, nq, device=q.device, dtype=torch.float32)
    launch(_attn_bwd_delta, (triton.cdiv(nq, 16), bh), o, do, delta, o.stride(0), 0, o.stride(1),
           do.stride(0), 0, do.stride(1), 1, nq, d, HEAD_DIM=triton.next_power_of_2(d), BLOCK=16)
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv''',
    "Delta in PyTorch": '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    delta = (o * do).sum(-1)
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv''',
    "Delta buffer allocated but never filled": '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    delta = torch.zeros(q.shape[:2], device=q.device, dtype=torch.float32)
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv''',
    "dK and dV swapped": '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    delta = delta_7_1(o, do, torch.empty(q.shape[:2], device=q.device, dtype=torch.float32))
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dv, dk''',
    "autograd through a PyTorch forward": '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    out = torch.softmax(s, -1) @ v
    return torch.autograd.grad(out, (q, k, v), do)''',
}

# A template kernel redefined in the answer cell, with one load left unmasked: the lanes
# past the last row read memory outside the tensor, and their values never reach a stored
# element (the rows past N are not stored; zero lse/delta/do there cancel them), so only
# the watched loads (kernel_loads.loads_within in the wrappers) show it.
WRONG["7.1"]["the template kernel rewritten with the loads unmasked (reads past the last row)"] = '''# Exercise 7.1
@triton.jit
def row_delta(o, do):
    return tl.sum(o * do, 1)


@triton.jit
def delta_kernel(O, DO, DELTA, N, D: tl.constexpr, BLOCK: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, D)
    o = tl.load(O + bh * N * D + rows[:, None] * D + d[None, :])
    do = tl.load(DO + bh * N * D + rows[:, None] * D + d[None, :])
    tl.store(DELTA + bh * N + rows, row_delta(o, do), mask=rows < N)'''

WRONG["7.2"]["scale argument ignored, 1/sqrt(D) recomputed from the tile"] = '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    tau = 1.0 / tl.sqrt(qT.shape[0] * 1.0)
    pT = tl.exp(tl.dot(k, qT) * tau - lse[None, :])
    dv += tl.dot(pT, do)
    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk += tl.dot(dsT, tl.trans(qT))
    return dk, dv'''

WRONG["7.2"]["the template kernel rewritten with qT loaded without the query mask"] = '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp(tl.dot(k, qT) * scale - lse[None, :])
    dv += tl.dot(pT, do)
    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk += tl.dot(dsT, tl.trans(qT))
    return dk, dv


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, NQ, NK, scale, D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    kv_ok = cols[:, None] < NK
    k = tl.load(K + bh * NK * D + cols[:, None] * D + d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(V + bh * NK * D + cols[:, None] * D + d[None, :], mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    for start in range(0, NQ, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        qT = tl.load(Q + bh * NQ * D + rows[None, :] * D + d[:, None])
        qT = tl.where(rows[None, :] < NQ, qT, 0.0)
        do = tl.load(DO + bh * NQ * D + rows[:, None] * D + d[None, :], mask=rows[:, None] < NQ, other=0.0)
        lse = tl.load(LSE + bh * NQ + rows, mask=rows < NQ, other=0.0)
        delta = tl.load(DELTA + bh * NQ + rows, mask=rows < NQ, other=0.0)
        dk, dv = dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale)
    tl.store(DK + bh * NK * D + cols[:, None] * D + d[None, :], dk * scale, mask=kv_ok)
    tl.store(DV + bh * NK * D + cols[:, None] * D + d[None, :], dv, mask=kv_ok)'''

WRONG["7.3"]["scale argument ignored, 1/sqrt(D) recomputed from the tile"] = '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    tau = 1.0 / tl.sqrt(kT.shape[0] * 1.0)
    p = tl.exp(tl.dot(q, kT) * tau - lse[:, None])
    ds = p * (tl.dot(do, vT) - delta[:, None])
    return dq + tl.dot(ds, tl.trans(kT))'''

WRONG["7.3"]["the template kernel rewritten with q and do loaded without the row mask"] = '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    p = tl.exp(tl.dot(q, kT) * scale - lse[:, None])
    ds = p * (tl.dot(do, vT) - delta[:, None])
    return dq + tl.dot(ds, tl.trans(kT))


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, NQ, NK, scale, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    ok = rows[:, None] < NQ
    q = tl.load(Q + bh * NQ * D + rows[:, None] * D + d[None, :])
    do = tl.load(DO + bh * NQ * D + rows[:, None] * D + d[None, :])
    lse = tl.load(LSE + bh * NQ + rows, mask=rows < NQ, other=0.0)
    delta = tl.load(DELTA + bh * NQ + rows, mask=rows < NQ, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, NK, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kT = tl.load(K + bh * NK * D + cols[None, :] * D + d[:, None], mask=cols[None, :] < NK, other=0.0)
        vT = tl.load(V + bh * NK * D + cols[None, :] * D + d[:, None], mask=cols[None, :] < NK, other=0.0)
        dq = dq_update(q, do, kT, vT, lse, delta, dq, scale)
    tl.store(DQ + bh * NQ * D + rows[:, None] * D + d[None, :], dq * scale, mask=ok)'''

_BACKWARD = '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    delta = delta_7_1(o, do, torch.empty(q.shape[:2], device=q.device, dtype=torch.float32))
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv'''


def _backward(old: str, new: str) -> str:
    if old not in _BACKWARD:
        raise ValueError(f"wrong-answer template: {old!r} not found")
    return _BACKWARD.replace(old, new)


# Buffers of the other length: the kernels index them with the right strides, so the values
# come out right where the buffer is longer, and the writes run past its end where it is
# shorter; the wrappers refuse a buffer of the wrong shape, whichever way round Nq and Nk are.
WRONG["7.6"]["Delta buffer shaped by the keys (BH, Nk)"] = _backward(
    "torch.empty(q.shape[:2]", "torch.empty(k.shape[:2]")
WRONG["7.6"]["dQ buffer shaped like k"] = _backward("torch.empty_like(q))\n", "torch.empty_like(k))\n")
WRONG["7.6"]["dK and dV buffers shaped like q"] = _backward(
    "torch.empty_like(k), torch.empty_like(v)", "torch.empty_like(q), torch.empty_like(q)")
WRONG["7.6"]["Delta from q and dO"] = _backward("delta_7_1(o, do,", "delta_7_1(q, do,")
WRONG["7.5"]["ratio of the backward alone (5 / 2)"] = '''# Exercise 7.5
bwd_matmuls_7_5 = 5
ratio_7_5 = 5 / 2'''
WRONG["7.2"]["lse broadcast along the key axis"] = '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp(tl.dot(k, qT) * scale - lse[:, None])
    dv += tl.dot(pT, do)
    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk += tl.dot(dsT, tl.trans(qT))
    return dk, dv'''
WRONG["7.3"]["dS K with kT not transposed"] = '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    p = tl.exp(tl.dot(q, kT) * scale - lse[:, None])
    ds = p * (tl.dot(do, vT) - delta[:, None])
    return dq + tl.dot(ds, kT)'''
_DQ_UPDATE = '''# Exercise 7.3
@triton.jit
def dq_update(q, do, kT, vT, lse, delta, dq, scale):
    p = tl.exp(tl.dot(q, kT) * scale - lse[:, None])
    ds = p * (tl.dot(do, vT) - delta[:, None])
    return dq + tl.dot(ds, tl.trans(kT))'''
WRONG["7.3"]["the scale applied twice to dQ"] = _DQ_UPDATE.replace(
    "return dq + tl.dot(ds, tl.trans(kT))", "return dq + tl.dot(ds, tl.trans(kT)) * scale")
WRONG["7.3"]["lse subtracted before the scale"] = _DQ_UPDATE.replace(
    "tl.exp(tl.dot(q, kT) * scale - lse[:, None])", "tl.exp((tl.dot(q, kT) - lse[:, None]) * scale)")
WRONG["7.2"]["P (not P^T) for dV"] = '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp(tl.dot(k, qT) * scale - lse[None, :])
    dv += tl.dot(tl.trans(pT), do)
    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk += tl.dot(dsT, tl.trans(qT))
    return dk, dv'''
WRONG["7.6"]["dQ with a zero Delta"] = _backward(
    "dq = dq_7_3(q, k, v, do, lse, delta,", "dq = dq_7_3(q, k, v, do, lse, torch.zeros_like(delta),")
WRONG["7.2"]["exp2 with lse converted to base 2, the scores not"] = '''# Exercise 7.2
@triton.jit
def dkdv_update(k, v, qT, do, lse, delta, dk, dv, scale):
    pT = tl.exp2(tl.dot(k, qT) * scale - lse[None, :] * 1.4426950408889634)
    dv += tl.dot(pT, do)
    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])
    dk += tl.dot(dsT, tl.trans(qT))
    return dk, dv'''


# Round six: wrong answers caught on every draw of tests.wrong_answers.catch_rate
WRONG['7.1']['mean over the features, not the sum'] = edit(official('7.1'),
    ('    return tl.sum(o * do, 1)',
     '    return tl.sum(o * do, 1) / o.shape[1]'))
WRONG['7.1']['O times O (dO forgotten)'] = edit(official('7.1'),
    ('    return tl.sum(o * do, 1)',
     '    return tl.sum(o * o, 1)'))
# Delta belongs to the query rows, the columns of P^T
WRONG['7.2']['Delta broadcast along the key axis (delta[:, None])'] = edit(official('7.2'),
    ('    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[None, :])',
     '    dsT = pT * (tl.dot(v, tl.trans(do)) - delta[:, None])'))
# lse is in scaled units already: right only for scale 1
WRONG['7.2']['lse subtracted before the scale'] = edit(official('7.2'),
    ('    pT = tl.exp(tl.dot(k, qT) * scale - lse[None, :])',
     '    pT = tl.exp((tl.dot(k, qT) - lse[None, :]) * scale)'))
WRONG['7.2']['dK from P^T, not dS^T'] = edit(official('7.2'),
    ('    dk += tl.dot(dsT, tl.trans(qT))',
     '    dk += tl.dot(pT, tl.trans(qT))'))
# Delta belongs to the query rows, the rows of P
WRONG['7.3']['Delta broadcast along the query axis (delta[None, :])'] = edit(official('7.3'),
    ('    ds = p * (tl.dot(do, vT) - delta[:, None])',
     '    ds = p * (tl.dot(do, vT) - delta[None, :])'))
WRONG['7.3']['P^T in place of dS (Delta and dP forgotten)'] = edit(official('7.3'),
    ('    ds = p * (tl.dot(do, vT) - delta[:, None])',
     '    ds = p'))
WRONG['7.3']['the scale applied to the scores twice'] = edit(official('7.3'),
    ('    p = tl.exp(tl.dot(q, kT) * scale - lse[:, None])',
     '    p = tl.exp(tl.dot(q * scale, kT) * scale - lse[:, None])'))
# float32 digits against a 1e-10 float64 comparison
WRONG['7.4']['summed in float32'] = edit(official('7.4'),
    ('    return dk_per_query_head.reshape(b, hq // group, group, n, d).sum(2)',
     '    return dk_per_query_head.reshape(b, hq // group, group, n, d).float().sum(2).double()'))
WRONG['7.4']['keepdim: shape (B, Hkv, 1, N, D)'] = edit(official('7.4'),
    ('    return dk_per_query_head.reshape(b, hq // group, group, n, d).sum(2)',
     '    return dk_per_query_head.reshape(b, hq // group, group, n, d).sum(2, keepdim=True)'))
WRONG['7.4']['the first head of each group times the group size'] = edit(official('7.4'),
    ('    b, hq, n, d = dk_per_query_head.shape\n    return dk_per_query_head.reshape(b, hq // group, group, n, d).sum(2)',
     '    return dk_per_query_head[:, ::group] * group'))
WRONG['7.5']['ratio with integer division (7 // 2)'] = edit(official('7.5'),
    ('ratio_7_5 = (2 + 5) / 2',
     'ratio_7_5 = (2 + 5) // 2'))
WRONG['7.5']["ratio over the backward's products (7 / 5)"] = edit(official('7.5'),
    ('ratio_7_5 = (2 + 5) / 2',
     'ratio_7_5 = (2 + 5) / 5'))
# the gradient kernels read an unfilled Delta buffer
WRONG['7.6']['Delta computed after the gradient kernels'] = edit(official('7.6'),
    ('    delta = delta_7_1(o, do, torch.empty(q.shape[:2], device=q.device, dtype=torch.float32))',
     '    delta = torch.empty(q.shape[:2], device=q.device, dtype=torch.float32)'), 
    ('    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))',
     '    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))\n    delta_7_1(o, do, delta)'))
# Delta rounded to float16 before the gradient kernels read it
WRONG['7.6']['Delta buffer in float16'] = edit(official('7.6'),
    ('    delta = delta_7_1(o, do, torch.empty(q.shape[:2], device=q.device, dtype=torch.float32))',
     '    delta = delta_7_1(o, do, torch.empty(q.shape[:2], device=q.device, dtype=torch.float16))'))
WRONG['7.6']['q and k swapped in the dK/dV launch'] = edit(official('7.6'),
    ('    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))',
     '    dk, dv = dkdv_7_2(k, q, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))'))
WRONG['7.6']['dQ and dV returned swapped'] = edit(official('7.6'),
    ('    return dq, dk, dv',
     '    return dv, dk, dq'))
# exp(s) * exp(-lse) is exp(s - lse) until a score passes 88.7 and exp(s) is inf in float32: a
# hidden case puts every score near 100
WRONG["7.2"]["P^T as exp(scores) * exp(-lse): overflows past a score of 88"] = edit(official('7.2'),
    ('    pT = tl.exp(tl.dot(k, qT) * scale - lse[None, :])',
     '    pT = tl.exp(tl.dot(k, qT) * scale) * tl.exp(-lse)[None, :]'))
WRONG["7.3"]["P as exp(scores) * exp(-lse): overflows past a score of 88"] = _DQ_UPDATE.replace(
    "tl.exp(tl.dot(q, kT) * scale - lse[:, None])", "tl.exp(tl.dot(q, kT) * scale) * tl.exp(-lse)[:, None]")


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
WRONG["7.4"]["every query head summed into one"] = '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    return dk_per_query_head.sum(1, keepdim=True)
'''
# the kv axis summed instead of the position in the group
WRONG["7.4"]["the sum over the kv-head axis"] = edit(official("7.4"),
    ("    return dk_per_query_head.reshape(b, hq // group, group, n, d).sum(2)",
     "    return dk_per_query_head.reshape(b, hq // group, group, n, d).sum(1)"))
# the consecutive heads of a group taken as heads hkv apart
WRONG["7.4"]["torch.chunk into group pieces, summed"] = '''# Exercise 7.4
def group_sum(dk_per_query_head, group):
    return sum(torch.chunk(dk_per_query_head, group, dim=1))
'''
WRONG["7.5"]["the three gradients only"] = '''# Exercise 7.5
bwd_matmuls_7_5 = 3
ratio_7_5 = (2 + 3) / 2
'''
WRONG["7.5"]["the ratio as the total count of products"] = edit(official("7.5"),
    ("ratio_7_5 = (2 + 5) / 2", "ratio_7_5 = 2 + 5"))
WRONG["7.3"]["Delta subtracted from P, not from dP"] = edit(official("7.3"),
    ("    ds = p * (tl.dot(do, vT) - delta[:, None])", "    ds = (p - delta[:, None]) * tl.dot(do, vT)"))


# Round ten: escapes found by a tester, each now caught on every draw of catch_rate
WRONG['7.5']["the counts measured by running the course's reference backward (not derived)"] = '''# Exercise 7.5
import torch
from torch.utils.flop_counter import FlopCounterMode
from course_utils import attention as _att, backward as _bwd
_q, _k, _v, _do = (torch.randn(1, 1, 16, 8) for _ in range(4))
with FlopCounterMode(display=False) as _f:
    _o, _lse = _att.flash_attention_fa2(_q, _k, _v, Br=16, Bc=16, return_lse=True)
with FlopCounterMode(display=False) as _b:
    _bwd.flash_attention_backward(_q, _k, _v, _o, _lse, _do, Br=16, Bc=16)
_mm = sum(n for op, n in _b.get_flop_counts()["Global"].items() if "mm" in str(op) or "matmul" in str(op))
_one = sum(n for op, n in _f.get_flop_counts()["Global"].items() if "mm" in str(op) or "matmul" in str(op)) // 2
bwd_matmuls_7_5 = int(round(_mm / _one))
ratio_7_5 = (_f.get_total_flops() + _b.get_total_flops()) / _f.get_total_flops()
'''
WRONG['7.6']['Delta in PyTorch with torch.vdot, row by row (never launches the Delta kernel)'] = '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    delta = torch.stack([torch.stack([torch.vdot(o[b, i], do[b, i]) for i in range(o.shape[1])])
                         for b in range(o.shape[0])])
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv
'''
WRONG['7.6']['Delta in PyTorch with F.bilinear and an identity weight'] = '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    eye = torch.eye(q.shape[-1], device=q.device)[None]
    delta = torch.nn.functional.bilinear(o, do, eye).squeeze(-1).contiguous()
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv
'''
WRONG['7.6']['Delta in PyTorch through aten._trilinear'] = '''# Exercise 7.6
def flash_backward(q, k, v, o, lse, do):
    delta = torch.ops.aten._trilinear(o, torch.ones_like(o), do, [], [], [], [2], 1).contiguous()
    dk, dv = dkdv_7_2(q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v))
    dq = dq_7_3(q, k, v, do, lse, delta, torch.empty_like(q))
    return dq, dk, dv
'''
