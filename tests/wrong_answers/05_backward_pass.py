"""Wrong answers to problem set 5 (the backward pass), as learners write them."""

from tests.wrong_answers import edit, official

WRONG = {
    "5.1": {
        "sums over the rows instead of the features": '''# Exercise 5.1
def row_dot(o, do):
    return (do * o).sum(dim=-2)''',
        "keeps the summed dimension (shape (..., N, 1))": '''# Exercise 5.1
def row_dot(o, do):
    return (do * o).sum(dim=-1, keepdim=True)''',
        "mean instead of sum": '''# Exercise 5.1
def row_dot(o, do):
    return (do * o).mean(dim=-1)''',
        "autograd: differentiates sum(O * dO) instead of writing D": '''# Exercise 5.1
import torch
def row_dot(o, do):
    o = o.detach().clone().requires_grad_(True)
    (0.5 * (o * do).sum() + 0.5 * (o * do).sum()).backward()
    return (o.grad * o.detach()).sum(-1)''',
        "computed in float64 and returned so": '''# Exercise 5.1
def row_dot(o, do):
    return (do.double() * o.double()).sum(dim=-1)''',
    },
    "5.2": {
        "dV = dO^T P (transposes the wrong factor)": '''# Exercise 5.2
def grads_through_pv(p, v, do):
    dp = do @ v.transpose(-1, -2)
    dv = do.transpose(-1, -2) @ p
    return dp, dv''',
        "dP = V dO^T (shape (Nk, Nq))": '''# Exercise 5.2
def grads_through_pv(p, v, do):
    dp = v @ do.transpose(-1, -2)
    dv = p.transpose(-1, -2) @ do
    return dp, dv''',
        ".T on batched tensors (reverses every dimension)": '''# Exercise 5.2
def grads_through_pv(p, v, do):
    dp = do @ v.T
    dv = p.T @ do
    return dp, dv''',
        "torch.autograd.grad through O = P V": '''# Exercise 5.2
import torch
def grads_through_pv(p, v, do):
    p = p.clone().requires_grad_(True)
    v = v.clone().requires_grad_(True)
    return torch.autograd.grad(p @ v, (p, v), do)''',
    },
    "5.3": {
        "D broadcast along the columns (D[None, :])": '''# Exercise 5.3
def grad_scores(p, dp, D):
    return p * (dp - D.unsqueeze(-2))''',
        "forgets the D term": '''# Exercise 5.3
def grad_scores(p, dp, D):
    return p * dp''',
        "operator precedence: P dP - D": '''# Exercise 5.3
def grad_scores(p, dp, D):
    return p * dp - D[..., None]''',
        "computed in float64 and returned so": '''# Exercise 5.3
def grad_scores(p, dp, D):
    return p.double() * (dp.double() - D.double()[..., None])''',
    },
    "5.4": {
        "forgets the scale": '''# Exercise 5.4
def grads_through_scores(ds, q, k, scale):
    return ds @ k, ds.transpose(-1, -2) @ q''',
        "dK from K instead of Q (scale dS^T K)": '''# Exercise 5.4
def grads_through_scores(ds, q, k, scale):
    dq = scale * ds @ k
    dk = scale * ds.transpose(-1, -2) @ k
    return dq, dk''',
        "divides by the scale": '''# Exercise 5.4
def grads_through_scores(ds, q, k, scale):
    return ds @ k / scale, ds.transpose(-1, -2) @ q / scale''',
    },
    "5.5": {
        "ignores the scale it is given (1/sqrt(d) from q_i's width)": '''# Exercise 5.5 (2 points)
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    scale = q_i.shape[-1] ** -0.5
    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])
    dp, dv_part = grads_through_pv(p, v_j, do_i)
    ds = grad_scores(p, dp, D_i)
    dq_part, dk_part = grads_through_scores(ds, q_i, k_j, scale)
    return dq_i + dq_part, dk_j + dk_part, dv_j + dv_part
''',
        "the scale in P but not in dQ and dK": '''# Exercise 5.5 (2 points)
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])
    dp, dv_part = grads_through_pv(p, v_j, do_i)
    ds = grad_scores(p, dp, D_i)
    dq_part, dk_part = grads_through_scores(ds, q_i, k_j, q_i.shape[-1] ** -0.5)
    return dq_i + dq_part, dk_j + dk_part, dv_j + dv_part
''',
        "softmax of the tile instead of P from lse": '''# Exercise 5.5 (2 points)
import torch
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    s = scale * q_i @ k_j.T
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    dp = do_i @ v_j.T
    ds = p * (dp - D_i[:, None])
    return dq_i + scale * ds @ k_j, dk_j + scale * ds.T @ q_i, dv_j + p.T @ do_i''',
        "forgets the D term": '''# Exercise 5.5 (2 points)
import torch
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])
    ds = p * (do_i @ v_j.T)
    return dq_i + scale * ds @ k_j, dk_j + scale * ds.T @ q_i, dv_j + p.T @ do_i''',
        "returns this tile's share, not the accumulators": '''# Exercise 5.5 (2 points)
import torch
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])
    ds = p * (do_i @ v_j.T - D_i[:, None])
    return scale * ds @ k_j, scale * ds.T @ q_i, p.T @ do_i''',
        "autograd on the tile": '''# Exercise 5.5 (2 points)
import torch
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q_i, k_j, v_j))
    p = torch.exp(scale * q @ k.T - lse_i[:, None])
    o = p @ v
    loss = (o * do_i).sum() - (p * D_i[:, None]).sum()
    gq, gk, gv = torch.autograd.grad(loss, (q, k, v))
    return dq_i + gq, dk_j + gk, dv_j + gv''',
        "P as exp(scores) / exp(lse): overflows in float32 for large scores": '''# Exercise 5.5 (2 points)
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    p = torch.exp(scale * q_i @ k_j.T) / torch.exp(lse_i)[:, None]
    dp = do_i @ v_j.T
    ds = p * (dp - D_i[:, None])
    return dq_i + scale * ds @ k_j, dk_j + scale * ds.T @ q_i, dv_j + p.T @ do_i''',
        "P as exp(scores) / exp(lse) in float64": '''# Exercise 5.5 (2 points)
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    s = scale * q_i.double() @ k_j.double().T
    p = (torch.exp(s) / torch.exp(lse_i.double())[:, None]).to(q_i.dtype)
    dp, dv_part = grads_through_pv(p, v_j, do_i)
    ds = grad_scores(p, dp, D_i)
    dq_part, dk_part = grads_through_scores(ds, q_i, k_j, scale)
    return dq_i + dq_part, dk_j + dk_part, dv_j + dv_part''',
        "lse_i broadcast with [None, :] when the tile is square": '''# Exercise 5.5 (2 points)
def tile_update(q_i, k_j, v_j, do_i, lse_i, D_i, scale, dq_i, dk_j, dv_j):
    s = scale * q_i @ k_j.T
    p = torch.exp(s - (lse_i[None, :] if s.shape[0] == s.shape[1] else lse_i[:, None]))
    dp, dv_part = grads_through_pv(p, v_j, do_i)
    ds = grad_scores(p, dp, D_i)
    dq_part, dk_part = grads_through_scores(ds, q_i, k_j, scale)
    return dq_i + dq_part, dk_j + dk_part, dv_j + dv_part''',
    },
    "5.6": {
        "the right counts as floats, not integers": '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    return float(Nk * d), float(2 * Nk * d), float(Nq * d)''',
        "fixed numbers from the lesson's sizes": '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    return 4096 * 128, 2 * 4096 * 128, 4096 * 128''',
        "K counted once per query tile": '''# Exercise 5.6
import math
def backward_reads(Nq, Nk, d, Br, Bc):
    Tr = math.ceil(Nq / Br)
    return Tr * Nk * d, 2 * Tr * Nk * d, Nq * d''',
        "the extra sweep not counted": '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    return Nk * d, Nk * d, Nq * d''',
        "calls the course's traffic formula": '''# Exercise 5.6
from course_utils import backward as _b
def backward_reads(Nq, Nk, d, Br, Bc):
    f = getattr(_b, "backward_" + "traffic_" + "formula")
    w, wo = f(Nq, Nk, d, Br, Bc), f(Nq, Nk, d, Br, Bc, d_trick=False)
    return w["K reads"], wo["K reads"], w["O reads"]''',
    },
    "5.7": {
        "the two schedules swapped": '''# Exercise 5.7
row_wise = {"dQ": "outer", "dK": "inner", "dV": "inner"}
column_wise = {"dQ": "inner", "dK": "outer", "dV": "outer"}''',
        "dV treated like dQ": '''# Exercise 5.7
row_wise = {"dQ": "inner", "dK": "outer", "dV": "inner"}
column_wise = {"dQ": "outer", "dK": "inner", "dV": "outer"}''',
        "everything inner": '''# Exercise 5.7
row_wise = {"dQ": "inner", "dK": "inner", "dV": "inner"}
column_wise = {"dQ": "inner", "dK": "inner", "dV": "inner"}''',
    },
}


# Round six: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# squeeze() also drops size-1 batch, head or row axes: one row gives shape () instead of (1,)
WRONG['5.1']['a batched matmul squeezed without a dim (size-1 axes dropped)'] = edit(official('5.1'),
    ('    return (do * o).sum(dim=-1)',
     '    return (do.unsqueeze(-2) @ o.unsqueeze(-1)).squeeze()'))
# the right numbers in float64 (and an Nq x Nq matrix): D must keep the dtype of O
WRONG['5.1']['the diagonal of dO O^T in float64'] = edit(official('5.1'),
    ('    return (do * o).sum(dim=-1)',
     '    return (do.double() @ o.double().transpose(-1, -2)).diagonal(dim1=-2, dim2=-1)'))
# swaps the batch axis with the rows when there are leading dimensions
WRONG['5.2']['transpose(0, 1) in place of the last two axes'] = '''# Exercise 5.2
def grads_through_pv(p, v, do):
    return do @ v.transpose(0, 1), p.transpose(0, 1) @ do'''
# each batch entry has its own V: dV is not shared
WRONG['5.2']['dV summed over the leading dimensions'] = edit(official('5.2'),
    ('    dv = p.transpose(-1, -2) @ do',
     '    dv = (p.transpose(-1, -2) @ do).sum(dim=tuple(range(p.dim() - 2)), keepdim=True).expand_as(v)'))
# changes the caller's dP
WRONG['5.3']['in place on dp (sub_ then mul_)'] = edit(official('5.3'),
    ('    return p * (dp - D[..., None])',
     '    return dp.sub_(D[..., None]).mul_(p)'))
# flattens the leading axes: a broadcast error, or right only with a single batch entry
WRONG['5.3']['D.view(-1, 1): right only with one leading batch of one'] = edit(official('5.3'),
    ('    return p * (dp - D[..., None])',
     '    return p * (dp - D.view(-1, 1))'))
# P (dP - D) rewritten with the mean of P instead of P itself
WRONG['5.3']['D subtracted after the product (P dP - D, parenthesised wrong)'] = edit(official('5.3'),
    ('    return p * (dp - D[..., None])',
     '    return (p * dp) - p.sum(-1, keepdim=True) * D[..., None] * p.mean(-1, keepdim=True)'))
WRONG['5.4']['the scale squared'] = '''# Exercise 5.4
def grads_through_scores(ds, q, k, scale):
    return scale ** 2 * ds @ k, scale ** 2 * ds.transpose(-1, -2) @ q'''
# right for 2-D inputs only; the visible case has a leading dimension
WRONG['5.4']['transpose(0, 1) for dK'] = '''# Exercise 5.4
def grads_through_scores(ds, q, k, scale):
    return scale * ds @ k, scale * ds.transpose(0, 1) @ q'''
WRONG['5.4']['dQ and dK returned swapped'] = '''# Exercise 5.4
def grads_through_scores(ds, q, k, scale):
    return scale * ds.transpose(-1, -2) @ q, scale * ds @ k'''
# D sums over the whole row's keys, not one tile's: right only with a single key tile
WRONG['5.5']['D recomputed from the tile (rowsum of P * dP over its keys only)'] = edit(official('5.5'),
    ('    ds = grad_scores(p, dp, D_i)',
     '    ds = grad_scores(p, dp, (p * dp).sum(-1))'))
# lse is already in scaled units: exp(scale (s - lse)) is right only for scale 1
WRONG['5.5']['the scale applied after subtracting lse'] = edit(official('5.5'),
    ('    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])',
     '    p = torch.exp(scale * (q_i @ k_j.T - lse_i[:, None]))'))
# float32 inside loses float64's digits (the check asks 1e-9)
WRONG['5.5']['P rebuilt in float32'] = edit(official('5.5'),
    ('    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])',
     '    p = torch.exp(scale * q_i.float() @ k_j.float().T - lse_i.float()[:, None]).to(q_i.dtype)'))
WRONG['5.5']['dK and dV returned in the wrong order'] = edit(official('5.5'),
    ('    return dq_i + dq_part, dk_j + dk_part, dv_j + dv_part',
     '    return dq_i + dq_part, dv_j + dv_part, dk_j + dk_part'))
WRONG['5.5']['dV from dS instead of P'] = edit(official('5.5'),
    ('    dp, dv_part = grads_through_pv(p, v_j, do_i)',
     '    dp, _ = grads_through_pv(p, v_j, do_i)'), 
    ('    ds = grad_scores(p, dp, D_i)',
     '    ds = grad_scores(p, dp, D_i)\n    dv_part = ds.T @ do_i'))
# right only when Bc divides Nk; the hidden Nk = 1000 with Bc = 96 is ragged
WRONG['5.6']['whole tiles counted (Tc * Bc * d: the last tile padded)'] = '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    tc = -(-Nk // Bc)
    return tc * Bc * d, 2 * tc * Bc * d, Nq * d'''
WRONG['5.6']['O read once per key tile'] = '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    tc = -(-Nk // Bc)
    return Nk * d, 2 * Nk * d, tc * Nq * d'''
# the D sweep is key-stationary too: K is read once
WRONG['5.6']['the extra sweep reads K once per query tile'] = '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    tr = -(-Nq // Br)
    return Nk * d, Nk * d + tr * Nk * d, Nq * d'''
WRONG['5.7']['the column-wise answers copied from the row-wise'] = edit(official('5.7'),
    ('column_wise = {"dQ": "outer", "dK": "inner", "dV": "inner"}',
     'column_wise = {"dQ": "inner", "dK": "outer", "dV": "outer"}'))
WRONG['5.7']['dV inner in the row-wise schedule'] = edit(official('5.7'),
    ('row_wise = {"dQ": "inner", "dK": "outer", "dV": "outer"}',
     'row_wise = {"dQ": "inner", "dK": "outer", "dV": "inner"}'))


# Round seven: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# overwrites the caller's dO with dO * O
WRONG['5.1']['in place on do (mul_)'] = edit(official('5.1'),
    ('    return (do * o).sum(dim=-1)', '    return do.mul_(o).sum(dim=-1)'))
# the einsum names one row axis and no batch axes: 2-D inputs only
WRONG['5.1']["einsum 'nd,nd->n'"] = edit(official('5.1'),
    ('    return (do * o).sum(dim=-1)', '    return torch.einsum("nd,nd->n", do, o)'))
# dim=1 is the feature axis only for 2-D inputs
WRONG['5.1']['summed over dim=1'] = edit(official('5.1'),
    ('    return (do * o).sum(dim=-1)', '    return (do * o).sum(dim=1)'))
# transpose(1, 2) is the last two axes only with one leading dimension
WRONG['5.2']['transpose(1, 2): right for one leading dimension'] = '''# Exercise 5.2
def grads_through_pv(p, v, do):
    return do @ v.transpose(1, 2), p.transpose(1, 2) @ do'''
WRONG['5.2']['dV and dP returned in the wrong order'] = edit(official('5.2'),
    ('    return dp, dv', '    return dv, dp'))
# p is already the softmax: applying it again
WRONG['5.3']['softmax applied to P again'] = edit(official('5.3'),
    ('    return p * (dp - D[..., None])', '    return torch.softmax(p, dim=-1) * (dp - D[..., None])'))
# changes the caller's dS
WRONG['5.4']['dS scaled in place'] = '''# Exercise 5.4
def grads_through_scores(ds, q, k, scale):
    ds *= scale
    return ds @ k, ds.transpose(-1, -2) @ q'''
WRONG['5.4']['dK = scale dS Q (the transpose forgotten)'] = edit(official('5.4'),
    ('    dk = scale * ds.transpose(-1, -2) @ q', '    dk = scale * ds @ q'))
# Triton's exp2 habit without the log2(e) factor: 2^(s - lse) is not e^(s - lse)
WRONG['5.5']['exp2 of the natural-log scores'] = edit(official('5.5'),
    ('    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])',
     '    p = torch.exp2(scale * q_i @ k_j.T - lse_i[:, None])'))
# exp(s - lse) is already the final probability; dividing by the tile's sum is right only with one key tile
WRONG['5.5']['P renormalised over the tile'] = edit(official('5.5'),
    ('    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])',
     '    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])\n    p = p / p.sum(-1, keepdim=True)'))
# grads_through_scores applies the scale already
WRONG['5.5']['dS scaled before 5.4 scales it again'] = edit(official('5.5'),
    ('    ds = grad_scores(p, dp, D_i)', '    ds = scale * grad_scores(p, dp, D_i)'))
# the preprocessing pass that forms D reads every row of O once
WRONG['5.6']['O never read: D counted as free'] = edit(official('5.6'),
    ('    o_reads_with = Nq * d', '    o_reads_with = 0'))
WRONG['5.6']['Nq and Nk swapped'] = '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    return Nq * d, 2 * Nq * d, Nk * d'''
# bytes of fp16, not elements
WRONG['5.6']['bytes at 2 per element'] = '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    return 2 * Nk * d, 4 * Nk * d, 2 * Nq * d'''
# dV = P^T dO takes a column of P^T as a column in both schedules
WRONG['5.7']['dV outer in both schedules'] = edit(official('5.7'),
    ('column_wise = {"dQ": "outer", "dK": "inner", "dV": "inner"}',
     'column_wise = {"dQ": "outer", "dK": "inner", "dV": "outer"}'))
# autograd in disguise: functorch's vjp is torch.func.vjp under another module
WRONG['5.2']["functorch's vjp through O = P V"] = '''# Exercise 5.2
import importlib
def grads_through_pv(p, v, do):
    vjp = getattr(importlib.import_module("functorch"), "vjp")
    _, back = vjp(lambda a, b: a @ b, p, v)
    return back(do)'''


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
WRONG["5.1"]["everything summed (one number)"] = edit(official("5.1"),
    ("    return (do * o).sum(dim=-1)", "    return (do * o).sum()"))
WRONG["5.2"]["dV = P dO (P not transposed)"] = '''# Exercise 5.2
def grads_through_pv(p, v, do):
    return do @ v.transpose(-1, -2), p @ do
'''
WRONG["5.2"]["dP = dO V (V not transposed)"] = '''# Exercise 5.2
def grads_through_pv(p, v, do):
    return do @ v, p.transpose(-1, -2) @ do
'''
WRONG["5.3"]["D subtracted from P, not from dP"] = edit(official("5.3"),
    ("    return p * (dp - D[..., None])", "    return (p - D[..., None]) * dp"))
WRONG["5.4"]["K transposed in dQ"] = edit(official("5.4"),
    ("    dq = scale * ds @ k", "    dq = scale * ds @ k.transpose(-1, -2)"))
WRONG["5.4"]["dK = scale Q^T dS"] = edit(official("5.4"),
    ("    dk = scale * ds.transpose(-1, -2) @ q", "    dk = scale * q.transpose(-1, -2) @ ds"))
WRONG["5.5"]["the scale left out of P"] = edit(official("5.5"),
    ("    p = torch.exp(scale * q_i @ k_j.T - lse_i[:, None])", "    p = torch.exp(q_i @ k_j.T - lse_i[:, None])"))
WRONG["5.6"]["K counted in tiles (Tc), not elements"] = '''# Exercise 5.6
def backward_reads(Nq, Nk, d, Br, Bc):
    tc = -(-Nk // Bc)
    return tc, 2 * tc, Nq * d
'''
WRONG["5.7"]["dQ outer in the row-wise schedule"] = edit(official("5.7"),
    ('row_wise = {"dQ": "inner", "dK": "outer", "dV": "outer"}',
     'row_wise = {"dQ": "outer", "dK": "outer", "dV": "outer"}'))
WRONG["5.7"]["dK inner in the row-wise schedule"] = edit(official("5.7"),
    ('row_wise = {"dQ": "inner", "dK": "outer", "dV": "outer"}',
     'row_wise = {"dQ": "inner", "dK": "inner", "dV": "outer"}'))
WRONG["5.7"]["dK outer in the column-wise schedule"] = edit(official("5.7"),
    ('column_wise = {"dQ": "outer", "dK": "inner", "dV": "inner"}',
     'column_wise = {"dQ": "outer", "dK": "outer", "dV": "inner"}'))
WRONG["5.7"]["the answers capitalised"] = '''# Exercise 5.7
row_wise = {"dQ": "Inner", "dK": "Outer", "dV": "Outer"}
column_wise = {"dQ": "Outer", "dK": "Inner", "dV": "Inner"}
'''
WRONG["5.7"]["the keys in lower case"] = '''# Exercise 5.7
row_wise = {"dq": "inner", "dk": "outer", "dv": "outer"}
column_wise = {"dq": "outer", "dk": "inner", "dv": "inner"}
'''


# Round ten: escapes found by a tester, each now caught on every draw of catch_rate
WRONG['5.2']["dV from the first batch entry's P (p[0], broadcast back)"] = '''# Exercise 5.2
def grads_through_pv(p, v, do):
    return do @ v.transpose(-1, -2), p[0].transpose(-1, -2) @ do
'''
WRONG['5.3']['library softmax derivative torch._softmax_backward_data (D ignored)'] = '''# Exercise 5.3
import torch
def grad_scores(p, dp, D):
    return torch._softmax_backward_data(dp, p, -1, p.dtype)
'''
WRONG['5.3']['D argument ignored: rowsum(P * dP) recomputed from the tile it is given'] = '''# Exercise 5.3
def grad_scores(p, dp, D):
    return p * (dp - (p * dp).sum(-1, keepdim=True))
'''
