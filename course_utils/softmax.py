"""Softmax three ways, and Welford's online variance (lesson 2).

* :func:`naive_softmax` computes ``exp(x) / sum(exp(x))`` in the input's own
  dtype, so it overflows where the lesson says it does;
* :func:`safe_softmax` subtracts the row max first (three passes);
* :func:`online_softmax` finds the max and the sum in one pass with the
  running state ``(m, s)`` and the rescaling ``s * exp(m_old - m_new)``, then
  normalises in a second pass.

The safe and online versions accumulate in float32 (float64 for float64
inputs) and return the input dtype, like ``torch.softmax``.

**Rows that are all -inf** (a fully masked row) have no defined softmax:
``torch.softmax`` returns NaN there. By default we do the same
(``fully_masked="nan"``); ``fully_masked="zero"`` returns zeros instead, the
convention attention kernels use for a query that may attend to nothing.

The ``*_loop`` functions are the element-by-element versions of lesson 2,
written with Python loops over a 1-D tensor.
"""
from __future__ import annotations

import math

import torch

__all__ = ["naive_softmax", "safe_softmax", "online_softmax", "online_variance",
           "welford_update", "naive_softmax_loop", "safe_softmax_loop", "online_softmax_loop",
           "online_softmax_states", "exp_overflow_threshold"]


def _check(x, dim, fully_masked="nan"):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"x: expected a floating-point tensor, got dtype {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x: expected at least one dimension, got a 0-d tensor")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim: expected an int in [{-x.dim()}, {x.dim() - 1}] for a "
                         f"{x.dim()}-d tensor, got {dim!r}")
    if fully_masked not in ("nan", "zero"):
        raise ValueError(f"fully_masked: expected 'nan' or 'zero', got {fully_masked!r}")


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _finish(p, masked_rows, fully_masked, dtype):
    fill = math.nan if fully_masked == "nan" else 0.0
    return torch.where(masked_rows, torch.full_like(p, fill), p).to(dtype)


def naive_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``exp(x) / sum(exp(x))`` in x's dtype: overflows to inf/NaN for large x
    (from x > 88.72 in float32, x > 11.09 in float16)."""
    _check(x, dim)
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def safe_softmax(x: torch.Tensor, dim: int = -1, fully_masked: str = "nan") -> torch.Tensor:
    """``exp(x - m) / sum(exp(x - m))`` with ``m`` the max along ``dim``."""
    _check(x, dim, fully_masked)
    xa = x.to(_acc_dtype(x.dtype))
    m = xa.amax(dim=dim, keepdim=True)
    masked = m == -math.inf
    e = torch.exp(xa - torch.where(masked, torch.zeros_like(m), m))
    p = e / e.sum(dim=dim, keepdim=True)
    return _finish(p, masked.expand_as(p), fully_masked, x.dtype)


def online_softmax(x: torch.Tensor, dim: int = -1, block_size: int = 1,
                   fully_masked: str = "nan") -> torch.Tensor:
    """Softmax along ``dim`` from one online pass for ``(m, s)`` and one
    normalising pass. ``block_size`` elements are folded in per update (1 =
    element by element; any size gives the same result: an element is a tile).
    """
    _check(x, dim, fully_masked)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    xa = x.to(_acc_dtype(x.dtype)).movedim(dim, -1)
    n = xa.shape[-1]
    m = torch.full(xa.shape[:-1] + (1,), -math.inf, dtype=xa.dtype)
    s = torch.zeros_like(m)
    for start in range(0, n, block_size):
        blk = xa[..., start:start + block_size]
        m_new = torch.maximum(m, blk.amax(dim=-1, keepdim=True))
        # while a row has seen only -inf, use 0 as its reference: no -inf - (-inf)
        ref = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
        s = s * torch.exp(m - ref) + torch.exp(blk - ref).sum(dim=-1, keepdim=True)
        m = m_new
    masked = m == -math.inf
    ref = torch.where(masked, torch.zeros_like(m), m)
    p = torch.exp(xa - ref) / s
    return _finish(p, masked.expand_as(p), fully_masked, x.dtype).movedim(-1, dim)


def welford_update(state: tuple, x: float) -> tuple:
    """One step of Welford's algorithm: ``(count, mean, M2)`` after seeing x.
    ``M2`` is the sum of squared deviations from the current mean."""
    count, mean, m2 = state
    count += 1
    delta = x - mean              # deviation from the old mean
    mean = mean + delta / count
    m2 = m2 + delta * (x - mean)  # old deviation times new deviation
    return count, mean, m2


def online_variance(x: torch.Tensor, dim: int = -1, correction: int = 1):
    """Mean and variance along ``dim`` in one pass (Welford), vectorised over
    the other dims. ``correction=1`` gives the sample variance (like
    ``torch.var``), 0 the population variance. Returns ``(mean, var)``."""
    _check(x, dim)
    if correction not in (0, 1):
        raise ValueError(f"correction: expected 0 or 1, got {correction!r}")
    xa = x.to(_acc_dtype(x.dtype)).movedim(dim, -1)
    state = (0, torch.zeros(xa.shape[:-1], dtype=xa.dtype), torch.zeros(xa.shape[:-1], dtype=xa.dtype))
    for i in range(xa.shape[-1]):
        state = welford_update(state, xa[..., i])
    count, mean, m2 = state
    denom = count - correction
    var = m2 / denom if denom > 0 else torch.full_like(m2, math.nan)
    return mean.to(x.dtype), var.to(x.dtype)


def _check_1d(x):
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or not x.dtype.is_floating_point \
            or x.numel() == 0:
        raise ValueError("x: expected a non-empty 1-D floating-point tensor")


def naive_softmax_loop(x: torch.Tensor) -> torch.Tensor:
    """Two loops: the denominator d = sum exp(x_i), then a_i = exp(x_i) / d."""
    _check_1d(x)
    d = torch.zeros((), dtype=x.dtype)
    for i in range(len(x)):
        d = d + torch.exp(x[i])
    a = torch.empty_like(x)
    for i in range(len(x)):
        a[i] = torch.exp(x[i]) / d
    return a


def safe_softmax_loop(x: torch.Tensor) -> torch.Tensor:
    """Three loops: the max m, the denominator of exp(x_i - m), the outputs."""
    _check_1d(x)
    m = torch.tensor(-math.inf, dtype=x.dtype)
    for i in range(len(x)):
        m = torch.maximum(m, x[i])
    d = torch.zeros((), dtype=x.dtype)
    for i in range(len(x)):
        d = d + torch.exp(x[i] - m)
    a = torch.empty_like(x)
    for i in range(len(x)):
        a[i] = torch.exp(x[i] - m) / d
    return a


def online_softmax_loop(x: torch.Tensor) -> torch.Tensor:
    """Two loops: running (m, d) with d <- d * exp(m_old - m) + exp(x_i - m),
    then the outputs."""
    _check_1d(x)
    m = torch.tensor(-math.inf, dtype=x.dtype)
    d = torch.zeros((), dtype=x.dtype)
    for i in range(len(x)):
        m_old = m
        m = torch.maximum(m, x[i])
        scale = torch.exp(m_old - m) if m_old > -math.inf else torch.zeros((), dtype=x.dtype)
        d = d * scale + torch.exp(x[i] - m)
    a = torch.empty_like(x)
    for i in range(len(x)):
        a[i] = torch.exp(x[i] - m) / d
    return a


def online_softmax_states(x) -> list[dict]:
    """The running state after each element: ``x_i``, ``m_old``, ``m``, the
    rescaling ``exp(m_old - m)``, the sum ``s`` and the weights
    ``exp(x_j - m) / s`` of the elements seen so far (plain floats)."""
    vals = [float(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]
    if not vals:
        raise ValueError("x: expected a non-empty sequence of numbers")
    out, m, s = [], -math.inf, 0.0
    for i, v in enumerate(vals):
        m_old, m = m, max(m, v)
        scale = math.exp(m_old - m) if m_old > -math.inf else 0.0
        s = s * scale + (math.exp(v - m) if m > -math.inf else 0.0)
        w = [math.exp(u - m) / s if s > 0 else math.nan for u in vals[: i + 1]]
        out.append({"i": i, "x": v, "m_old": m_old, "m": m, "scale": scale, "s": s,
                    "weights": w})
    return out


def exp_overflow_threshold(dtype: torch.dtype) -> float:
    """The x above which exp(x) overflows ``dtype``: log of its largest value."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating torch dtype, got {dtype!r}")
    return math.log(torch.finfo(dtype).max)
