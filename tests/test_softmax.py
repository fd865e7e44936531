"""Softmax three ways and Welford's variance agree with torch, including
extreme logits, -inf entries and fully masked rows."""
import math

import pytest
import torch
from hypothesis import given, strategies as st

from course_utils.softmax import (exp_overflow_threshold, naive_softmax, naive_softmax_loop,
                                  online_softmax, online_softmax_loop, online_softmax_states,
                                  online_variance, safe_softmax, safe_softmax_loop, welford_update)

X6 = torch.arange(1.0, 7.0)


def _tol(dtype):
    return {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 1e-2,
            torch.float16: 2e-3}[dtype]


@st.composite
def logits(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    dim = draw(st.integers(-ndim, ndim - 1))
    scale = draw(st.sampled_from([1.0, 30.0, 1e4]))
    seed = draw(st.integers(0, 2 ** 16))
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * scale
    if draw(st.booleans()):  # sprinkle -inf, keeping at least one finite entry per row
        mask = torch.rand(shape, generator=g) < 0.3
        keep = torch.zeros(shape, dtype=torch.bool).movedim(dim, -1)
        keep[..., 0] = True
        mask &= ~keep.movedim(-1, dim)
        x = x.masked_fill(mask, -math.inf)
    dtype = draw(st.sampled_from([torch.float64, torch.float32, torch.float16, torch.bfloat16]))
    return x.to(dtype), dim, draw(st.integers(1, 4))


@given(logits())
def test_online_and_safe_match_torch(case):
    x, dim, block = case
    ref = torch.softmax(x, dim=dim)
    for got in (online_softmax(x, dim=dim, block_size=block), safe_softmax(x, dim=dim)):
        assert got.dtype == x.dtype and got.shape == x.shape
        torch.testing.assert_close(got.double(), ref.double(), atol=_tol(x.dtype), rtol=_tol(x.dtype))
        assert bool(torch.isfinite(got).all())


def test_seed_example_o_is_5_4329():
    for fn in (naive_softmax_loop, safe_softmax_loop, online_softmax_loop, online_softmax,
               safe_softmax, naive_softmax):
        a = fn(X6)
        assert round(float(a @ X6), 4) == 5.4329
        torch.testing.assert_close(a, torch.softmax(X6, -1))


def test_all_minus_inf_row_is_nan_by_default_or_zero_on_request():
    x = torch.tensor([[0.0, 1.0, -math.inf], [-math.inf, -math.inf, -math.inf]])
    ref = torch.softmax(x, dim=-1)
    for fn in (online_softmax, safe_softmax):
        got = fn(x)
        assert torch.isnan(got[1]).all() and torch.isnan(ref[1]).all()
        torch.testing.assert_close(got[0], ref[0])
        z = fn(x, fully_masked="zero")
        assert (z[1] == 0).all() and torch.allclose(z[0], ref[0])
    # along dim 0, column 2 is the fully masked one
    got = online_softmax(x, dim=0, fully_masked="zero")
    assert (got[:, 2] == 0).all() and torch.allclose(got[:, :2], torch.softmax(x[:, :2], 0))


def test_naive_overflows_where_the_lesson_says():
    t32, t16 = exp_overflow_threshold(torch.float32), exp_overflow_threshold(torch.float16)
    assert round(t32, 2) == 88.72 and round(t16, 2) == 11.09
    assert torch.isnan(naive_softmax(torch.tensor([0.0, 89.0]))).any()
    assert not torch.isnan(naive_softmax(torch.tensor([0.0, 88.0]))).any()
    assert torch.isnan(naive_softmax(torch.tensor([0.0, 11.2], dtype=torch.float16))).any()
    assert torch.isfinite(online_softmax(torch.tensor([0.0, 1e4]))).all()


@given(st.integers(1, 5), st.integers(1, 12), st.sampled_from([0, 1]), st.integers(0, 999))
def test_online_variance_matches_torch(rows, n, correction, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g, dtype=torch.float64) * 100 + 1e3
    mean, var = online_variance(x, dim=1, correction=correction)
    torch.testing.assert_close(mean, x.mean(1))
    if n - correction > 0:
        torch.testing.assert_close(var, x.var(1, correction=correction))
    else:
        assert torch.isnan(var).all()


def test_welford_recurrence_of_the_lesson():
    state = (0, 0.0, 0.0)
    xs = [2.0, 4.0, 4.0, 5.0]
    for N, v in enumerate(xs, start=1):
        prev = state
        state = welford_update(state, v)
        # (N-1) S_N^2 = (N-2) S_{N-1}^2 + (x_N - mean_N)(x_N - mean_{N-1}) ; M2 = (N-1) S^2
        assert state[2] == pytest.approx(prev[2] + (v - state[1]) * (v - prev[1]))
    assert state[1] == pytest.approx(3.75) and state[2] / 3 == pytest.approx(torch.tensor(xs).var().item())


def test_states_track_rescaling():
    st_ = online_softmax_states([3.0, 1.0, 5.0])
    assert [s["m"] for s in st_] == [3.0, 3.0, 5.0]
    assert st_[1]["scale"] == 1.0 and st_[2]["scale"] == pytest.approx(math.exp(-2.0))
    assert st_[2]["s"] == pytest.approx(sum(math.exp(v - 5.0) for v in (3.0, 1.0, 5.0)))
    assert sum(st_[2]["weights"]) == pytest.approx(1.0)


def test_bad_inputs():
    with pytest.raises(TypeError, match="floating-point"):
        online_softmax(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        safe_softmax([1.0, 2.0])
    with pytest.raises(ValueError, match="dim"):
        online_softmax(torch.zeros(2, 3), dim=2)
    with pytest.raises(ValueError, match="block_size"):
        online_softmax(torch.zeros(3), block_size=0)
    with pytest.raises(ValueError, match="fully_masked"):
        safe_softmax(torch.zeros(3), fully_masked="ignore")
    with pytest.raises(ValueError, match="1-D"):
        online_softmax_loop(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="correction"):
        online_variance(torch.zeros(3), correction=2)


# ------------------------------------------------------------------ problem-set checks

def _problem_set():
    import nbformat
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "solutions" / "02_softmax_on_the_machine.ipynb"
    nb = nbformat.read(path, as_version=4)
    setup = next(c.source for c in nb.cells if c.cell_type == "code")
    checks = {c.metadata["course"]["exercise"]: c.source for c in nb.cells
              if c.get("metadata", {}).get("course", {}).get("role") == "check"}
    return setup, checks


def _no_rescale(x):
    # keeps the running max but forgets to rescale the old sum when it grows
    m, s = torch.tensor(-math.inf), torch.tensor(0.0)
    for xi in x:
        m = torch.maximum(m, xi)
        s = s + torch.exp(xi - m)
    return m, s


def _ratio_factor(m_old, m_new):
    return torch.exp(m_old) / torch.exp(m_new)


def _welford_wrong(state, x):
    N, mean, m2 = state
    N += 1
    new_mean = mean + (x - mean) / N
    return N, new_mean, m2 + (x - mean) ** 2


def _step10(i):
    from course_utils.machine import _online_step
    return _online_step(i) + "\nMOV R3, R3"


WRONG_SET_2 = {
    "2.1": {"overflow_threshold": lambda dtype: math.log(torch.finfo(dtype).max) - 0.5},
    "2.2": {"online_max_sum": _no_rescale},
    "2.3": {"safe_trace": lambda n: __import__("course_utils.machine").machine.online_softmax_trace(n)},
    "2.4": {"online_step": _step10},
    "2.5": {"rescale_factor": _ratio_factor},
    "2.6": {"welford_step": _welford_wrong, "m2_increment_is": "b"},
}


@pytest.mark.parametrize("ex", sorted(WRONG_SET_2))
def test_problem_set_2_checks_reject_wrong_answers(ex):
    from course_utils.checks import CheckFailed
    setup, checks = _problem_set()
    assert set(checks) == set(WRONG_SET_2)
    ns = {}
    exec(setup, ns)
    try:
        ns.update(WRONG_SET_2[ex])
        with pytest.raises(CheckFailed) as e:
            exec(checks[ex], ns)
        assert len(str(e.value)) > 30
    finally:
        # the set-up cell's notebook-wide refusal ends with the notebook; here, with the test
        ns["library_refuses"].__exit__(None, None, None)
    from course_utils.machine import traces
    assert traces.safe_softmax_trace(4)   # the course's traces run again
