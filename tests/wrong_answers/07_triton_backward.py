"""Wrong answers to problem set 7 (Triton backward), as learners write them."""

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
