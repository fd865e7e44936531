"""The shared checks of problem sets 0-4: each fails on the wrong answer it exists for."""
import math

import pytest
import torch

from course_utils.checks import CheckFailed
from course_utils.exercise_checks import (check_attention_case, check_fa1_walk, check_sealed,
                                          fa1_walk_reference, flop_budget, run_one_pass, seal)
from course_utils.guards import ForbiddenCall


def test_sealed_values_are_checked_without_being_shown(capsys):
    s = seal(37)
    check_sealed(37, s, kind=int, name="tile")
    with pytest.raises(CheckFailed) as e:
        check_sealed(36, s, kind=int, name="tile", hint="solve for j")
    assert "37" not in str(e.value) and "solve for j" in str(e.value)
    with pytest.raises(CheckFailed, match="expected an int"):
        check_sealed(37.0, s, kind=int)
    with pytest.raises(CheckFailed, match="allowed answers"):
        check_sealed("maybe", seal("nan"), choices=("nan", "inf"))
    t = seal(math.log(65504.0), tol=1e-3)
    check_sealed(11.0899, t, tol=1e-3)
    with pytest.raises(CheckFailed):
        check_sealed(11.1, t, tol=1e-3)
    d = seal({"a": "fa1", "b": "fa2"})
    check_sealed({"b": "fa2", "a": "fa1"}, d)
    with pytest.raises(CheckFailed):
        check_sealed({"a": "fa2", "b": "fa2"}, d)


def test_flop_budget_fails_inside_the_work():
    a = torch.randn(8, 8)
    with flop_budget(2 * 8 * 8 * 8, "{spent} > {limit}"):
        a @ a
    with pytest.raises(CheckFailed, match=r"1024 > 1000"):
        with flop_budget(1000, "{spent} > {limit}"):
            a @ a


def _online(x):
    m, s = torch.tensor(-math.inf), torch.tensor(0.0)
    for xi in x:
        m_new = torch.maximum(m, xi)
        s = s * torch.exp(m - m_new) + torch.exp(xi - m_new)
        m = m_new
    return m, s


def test_one_pass_reads():
    x = torch.randn(40)
    m, s = run_one_pass(_online, x)
    assert torch.allclose(s, torch.exp(x - x.max()).sum())
    with pytest.raises(CheckFailed, match="in one operation"):
        run_one_pass(lambda t: (t.max(), torch.exp(t - t.max()).sum()), x)
    with pytest.raises(CheckFailed, match="second pass"):
        run_one_pass(lambda t: (max(t), sum(torch.exp(v) for v in t)), x)
    with pytest.raises(CheckFailed, match="tolist"):
        run_one_pass(lambda t: t.tolist(), x)
    with pytest.raises(CheckFailed, match="in place"):
        run_one_pass(lambda t: t[0].mul_(2), x)
    with pytest.raises(ForbiddenCall):
        run_one_pass(lambda t: torch.logsumexp(t, 0), x, forbid=["logsumexp"])


def test_one_pass_state_made_like_the_input_is_no_read():
    # a learner's running state made with x.new_zeros / torch.full_like(x, ...) reads the
    # input's dtype and shape, none of its elements
    def online(x):
        state = (x.new_full((), float("-inf")), x.new_zeros(()))
        i = 0
        while i < x.numel():
            m, s = state
            m_new = m if m >= x[i] else x[i]
            state = (m_new, s * (m - m_new).exp() + (x[i] - m_new).exp())
            i += 1
        return state
    x = torch.randn(40)
    m, s = run_one_pass(online, x)
    assert torch.allclose(s, torch.exp(x - x.max()).sum())
    torch.testing.assert_close(run_one_pass(lambda t: torch.zeros_like(t).sum(), x),
                               torch.tensor(0.0))
    with pytest.raises(CheckFailed, match="in one operation"):
        run_one_pass(lambda t: torch.zeros_like(t) + t, x)
    # views of every element kept, then gone over again: a second pass still
    def views_twice(t):
        views = list(t)
        m = max(views)
        return m, sum(torch.exp(v - m) for v in views)
    with pytest.raises(CheckFailed, match="second pass"):
        run_one_pass(views_twice, x)


def _flash(q, k, v, is_causal=False, Br=4, Bc=4, skip=True, running_max=True, m0=-math.inf,
           acc_dtype=torch.float32):
    # acc_dtype None: the accumulator kept in the inputs' dtype
    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    o = torch.empty_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        rows = qi.shape[2]
        m = torch.full(qi.shape[:-1], m0)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qi, dtype=acc_dtype or q.dtype)
        for j0 in range(0, nk, Bc):
            if skip and is_causal and j0 > i0 + rows - 1:
                break
            kj, vj = k[:, :, j0:j0 + Bc].float(), v[:, :, j0:j0 + Bc].float()
            s = qi @ kj.transpose(-1, -2) / math.sqrt(d)
            if is_causal:
                r = i0 + torch.arange(rows)[:, None]
                c = j0 + torch.arange(kj.shape[2])[None, :]
                s = s.masked_fill(c > r, -math.inf)
            m_new = torch.maximum(m, s.amax(-1)) if running_max else torch.zeros_like(m)
            p = torch.exp(s - m_new[..., None])
            a = torch.exp(m - m_new) if running_max else torch.ones_like(m)
            l = a * l + p.sum(-1)
            acc = (a[..., None] * acc + p @ vj).to(acc.dtype)
            m = m_new
        o[:, :, i0:i0 + Br] = (acc / l[..., None]).to(q.dtype)
    return o


def test_attention_case_passes_a_tiled_forward_and_fails_the_shortcuts():
    kw = dict(B=1, H=1, nq=9, nk=21, D=3, Br=4, Bc=5)
    check_attention_case(_flash, is_causal=True, quiet=True, **kw)
    check_attention_case(_flash, logit_scale=30.0, quiet=True, **kw)
    with pytest.raises(CheckFailed, match="skip|FLOPs"):
        check_attention_case(lambda *a, **k: _flash(*a, **k, skip=False), is_causal=True, **kw)
    with pytest.raises(CheckFailed, match="not finite|inf"):
        check_attention_case(lambda *a, **k: _flash(*a, **k, running_max=False),
                             logit_scale=30.0, **kw)
    with pytest.raises(CheckFailed, match="score matrix"):
        check_attention_case(lambda q, k, v, **_: torch.softmax(q @ k.transpose(-1, -2), -1) @ v,
                             forbid=(), **kw)
    with pytest.raises(ForbiddenCall):
        check_attention_case(
            lambda q, k, v, is_causal, **_: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=is_causal), **kw)


def _query_tiles_only(q, k, v, is_causal=False, Br=4, Bc=4):
    # tiles the queries, then takes each tile's softmax over every key it sees at once
    nq, nk = q.shape[2], k.shape[2]
    o = torch.empty_like(q)
    for i0 in range(0, nq, Br):
        qi = q[:, :, i0:i0 + Br].float()
        last = min(nk, i0 + qi.shape[2]) if is_causal else nk
        s = qi @ k[:, :, :last].float().transpose(-1, -2) / math.sqrt(q.shape[-1])
        if is_causal:
            r = i0 + torch.arange(qi.shape[2])[:, None]
            s = s.masked_fill(torch.arange(last)[None, :] > r, -math.inf)
        p = torch.exp(s - s.amax(-1, keepdim=True))
        o[:, :, i0:i0 + Br] = (p @ v[:, :, :last].float() / p.sum(-1, keepdim=True)).to(q.dtype)
    return o


def test_attention_case_fails_query_tiles_without_key_tiles_and_a_max_started_at_zero():
    kw = dict(B=1, H=2, nq=9, nk=21, D=3, Br=4, Bc=5)
    for causal in (False, True):
        with pytest.raises(CheckFailed, match="keys it sees at once"):
            check_attention_case(_query_tiles_only, is_causal=causal, **kw)
    # scores far below zero: the same output, but a max started at 0 underflows to 0 / 0
    check_attention_case(_flash, score_offset=-300.0, quiet=True, **kw)
    check_attention_case(lambda *a, **k: _flash(*a, **k, m0=0.0), quiet=True, **kw)
    with pytest.raises(CheckFailed, match="not finite|nan"):
        check_attention_case(lambda *a, **k: _flash(*a, **k, m0=0.0), score_offset=-300.0, **kw)
    # fp16 values near 2000 under a flat softmax: an fp16 accumulator overflows
    half = dict(kw, nk=300, D=8, Bc=16, dtype=torch.float16, logit_scale=0.1, value_offset=2000.0)
    check_attention_case(_flash, quiet=True, **half)

    with pytest.raises(CheckFailed, match="not finite|inf"):
        check_attention_case(lambda *a, **k: _flash(*a, **k, acc_dtype=None), **half)
    # a query tile's causal mask made over every key at once (boolean), then sliced per key
    # tile: a tiled algorithm still, so it passes
    def masked_per_query_tile(q, k, v, is_causal=False, Br=4, Bc=4):
        nq, nk = q.shape[2], k.shape[2]
        o = torch.empty_like(q)
        for i0 in range(0, nq, Br):
            rows = min(Br, nq - i0)
            allowed = torch.arange(nk)[None, :] <= i0 + torch.arange(rows)[:, None]   # (rows, nk)
            qi = q[:, :, i0:i0 + rows].float()
            m = torch.full(qi.shape[:-1], -math.inf)
            l, acc = torch.zeros_like(m), torch.zeros_like(qi)
            for j0 in range(0, min(nk, i0 + rows) if is_causal else nk, Bc):
                s = qi @ k[:, :, j0:j0 + Bc].float().transpose(-1, -2) / math.sqrt(q.shape[-1])
                if is_causal:
                    s = s.masked_fill(~allowed[:, j0:j0 + Bc], -math.inf)
                m_new = torch.maximum(m, s.amax(-1))
                p = torch.exp(s - m_new[..., None])
                a = torch.exp(m - m_new)
                l, acc, m = a * l + p.sum(-1), a[..., None] * acc + p @ v[:, :, j0:j0 + Bc].float(), m_new
            o[:, :, i0:i0 + rows] = (acc / l[..., None]).to(q.dtype)
        return o
    for causal in (False, True):
        check_attention_case(masked_per_query_tile, is_causal=causal, quiet=True, **kw)

    # the same as an additive float mask (0 and -inf) over every key the tile sees, a slice of
    # it added to each key tile's scores: tiled too
    def biased_per_query_tile(q, k, v, is_causal=False, Br=4, Bc=4, hide=-math.inf):
        nq, nk = q.shape[2], k.shape[2]
        o = torch.empty_like(q)
        for i0 in range(0, nq, Br):
            rows = min(Br, nq - i0)
            last = min(nk, i0 + rows) if is_causal else nk
            bias = torch.zeros(rows, last)
            if is_causal:
                bias = bias.masked_fill(
                    torch.arange(last)[None, :] > i0 + torch.arange(rows)[:, None], hide)
            qi = q[:, :, i0:i0 + rows].float()
            m = torch.full(qi.shape[:-1], -math.inf)
            l, acc = torch.zeros_like(m), torch.zeros_like(qi)
            for j0 in range(0, last, Bc):
                kj = k[:, :, j0:min(j0 + Bc, last)].float()
                s = qi @ kj.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias[:, j0:j0 + kj.shape[2]]
                m_new = torch.maximum(m, s.amax(-1))
                p = torch.exp(s - m_new[..., None])
                a = torch.exp(m - m_new)
                l, m = a * l + p.sum(-1), m_new
                acc = a[..., None] * acc + p @ v[:, :, j0:j0 + kj.shape[2]].float()
            o[:, :, i0:i0 + rows] = (acc / l[..., None]).to(q.dtype)
        return o
    for causal in (False, True):
        check_attention_case(biased_per_query_tile, is_causal=causal, quiet=True, **kw)
    for hide in (-1e9, torch.finfo(torch.float32).min):
        check_attention_case(lambda *a, **k: biased_per_query_tile(*a, **k, hide=hide),
                             is_causal=True, quiet=True, **kw)

    # a zero tensor over every key, filled with each key tile's scores, then gone over again
    # as a whole row of scores: caught when it is read
    def filled_then_read(q, k, v, is_causal=False, Br=4, Bc=4):
        nq, nk = q.shape[2], k.shape[2]
        o = torch.empty_like(q)
        for i0 in range(0, nq, Br):
            qi = q[:, :, i0:i0 + Br].float()
            s = torch.zeros(*qi.shape[:-1], nk)
            for j0 in range(0, nk, Bc):
                s[..., j0:j0 + Bc] = qi @ k[:, :, j0:j0 + Bc].float().transpose(-1, -2) / math.sqrt(q.shape[-1])
            if is_causal:
                s[..., :, :] = s.masked_fill(torch.arange(nk) > i0 + torch.arange(qi.shape[2])[:, None], -math.inf)
            m = s.amax(-1, keepdim=True)
            acc = torch.zeros_like(qi)
            l = torch.zeros(qi.shape[:-1])
            for j0 in range(0, nk, Bc):
                p = torch.exp(s[..., j0:j0 + Bc] - m)
                l, acc = l + p.sum(-1), acc + p @ v[:, :, j0:j0 + Bc].float()
            o[:, :, i0:i0 + Br] = (acc / l[..., None]).to(q.dtype)
        return o
    with pytest.raises(CheckFailed, match="wrote scores into a tensor of shape"):
        check_attention_case(filled_then_read, **kw)
    # one query: a (1, Nk) vector of key positions is not taken for the score matrix
    check_attention_case(
        lambda q, k, v, **a: (_flash(q, k, v, **a) + 0 * torch.arange(k.shape[2])[None, :].sum()),
        B=1, H=1, nq=1, nk=13, D=3, Br=4, Bc=3, is_causal=True, quiet=True)


def test_fa1_walk_reference_and_check():
    q, k, v = (torch.randn(5, 3) for _ in range(3))
    o, steps = fa1_walk_reference(q, k, v, 3, 4)
    assert [s[:2] for s in steps] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    want = torch.softmax(q.double() @ k.double().T / math.sqrt(3), -1) @ v.double()
    assert torch.allclose(o, want)
    with pytest.raises(ForbiddenCall):
        check_fa1_walk(lambda q, k, v, Br, Bc: fa1_walk_reference(q, k, v, Br, Bc), 5, 3, M=59)
    with pytest.raises(CheckFailed, match="step"):
        check_fa1_walk(lambda q, k, v, Br, Bc: (torch.zeros(5, 3), []), 5, 3, M=59)
    # the same draws as the check's: steps without O's rows, and an O in HBM left
    # unnormalised until the end (FA2's accumulator in FA1's order), fail
    q, k, v = _draws(5)
    o, steps = fa1_walk_reference(q, k, v, 3, 4)
    check_fa1_walk(lambda *_: (o, steps), 5, 3, M=59, generator=_seeded(5), quiet=True)
    with pytest.raises(CheckFailed, match=r"\(j, i, m_i, l_i, o_i\)"):
        check_fa1_walk(lambda *_: (o, [s[:4] for s in steps]), 5, 3, M=59, generator=_seeded(5))
    unnormalised = [(j, i, m, l, oi * l[:, None]) for j, i, m, l, oi in steps]
    with pytest.raises(CheckFailed, match="O in HBM is normalised"):
        check_fa1_walk(lambda *_: (o, unnormalised), 5, 3, M=59, generator=_seeded(5))


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


def _draws(seed, n=5, d=3):
    g = _seeded(seed)
    return tuple(torch.randn(n, d, generator=g) for _ in range(3))
