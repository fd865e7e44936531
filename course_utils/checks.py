"""Checks for learners: each one either passes quietly (one short line) or
raises :class:`CheckFailed` naming the first thing that is off, what was
expected, what was found and, when given, the most likely cause.

Every check here has a test in ``tests/test_checks.py`` that feeds it a wrong
answer and sees it fail.
"""
from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["CheckFailed", "check_close", "check_equal", "check_shape", "check_dtype",
           "check_true", "check_raises"]


class CheckFailed(AssertionError):
    """A learner-facing check failed. The message says what and why."""


def _fail(name, what, hint):
    msg = f"{name}: {what}"
    if hint:
        msg += f"\n  hint: {hint}"
    raise CheckFailed(msg)


def _passed(name, detail="", quiet=False):
    if not quiet:
        print(f"ok: {name}" + (f" ({detail})" if detail else ""))


def _as_tensor(x, name):
    if isinstance(x, torch.Tensor):
        return x.detach()
    try:
        import numpy as np
        if isinstance(x, np.ndarray):
            return torch.from_numpy(x)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, (int, float, bool, list, tuple)):
        try:
            return torch.tensor(x, dtype=torch.float64)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name}: expected numbers, got {x!r} ({e})") from None
    raise TypeError(f"{name}: expected a tensor, array, list or number, got {type(x).__name__}")


def _fmt(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.6g}" if abs(v) < 1e4 else f"{v:.4e}"


def _index(flat_i: int, shape) -> str:
    if len(shape) == 0:
        return "[]"
    idx = []
    for s in reversed(shape):
        idx.append(flat_i % s)
        flat_i //= s
    return "[" + ", ".join(str(i) for i in reversed(idx)) + "]"


def check_shape(actual, expected_shape, name: str = "output", hint: str | None = None,
                quiet: bool = False):
    """Check ``actual.shape == expected_shape``."""
    t = _as_tensor(actual, name)
    exp = tuple(expected_shape)
    if tuple(t.shape) != exp:
        _fail(name, f"shape is {tuple(t.shape)}, expected {exp}", hint)
    _passed(name, f"shape {exp}", quiet)


def check_dtype(actual, expected_dtype, name: str = "output", hint: str | None = None,
                quiet: bool = False):
    """Check ``actual.dtype == expected_dtype`` (a torch dtype)."""
    if not isinstance(actual, torch.Tensor):
        _fail(name, f"expected a torch.Tensor of dtype {expected_dtype}, got {type(actual).__name__}",
              hint)
    if actual.dtype != expected_dtype:
        _fail(name, f"dtype is {actual.dtype}, expected {expected_dtype}", hint)
    _passed(name, f"dtype {expected_dtype}", quiet)


def check_close(actual, expected, *, atol: float = 1e-5, rtol: float = 1e-5,
                name: str = "output", hint: str | None = None, quiet: bool = False):
    """Check that ``actual`` matches ``expected`` element by element:
    ``|actual - expected| <= atol + rtol * |expected|``, NaN only where NaN is
    expected, and infinities of the same sign where expected.

    On failure the message names the first differing element, the expected and
    actual values, the tolerance, how many elements differ, and ``hint``.
    """
    a = _as_tensor(actual, name)
    e = _as_tensor(expected, "expected")
    if tuple(a.shape) != tuple(e.shape):
        _fail(name, f"shape is {tuple(a.shape)}, expected {tuple(e.shape)}", hint)
    a64 = a.to(torch.float64).cpu().reshape(-1)
    e64 = e.to(torch.float64).cpu().reshape(-1)
    tol = atol + rtol * e64.abs()
    both_nan = a64.isnan() & e64.isnan()
    same_inf = a64.isinf() & e64.isinf() & (torch.sign(a64) == torch.sign(e64))
    diff = (a64 - e64).abs()
    finite_pair = torch.isfinite(a64) & torch.isfinite(e64)
    ok = both_nan | same_inf | (finite_pair & (diff <= tol))
    if bool(ok.all()):
        finite = ~(both_nan | same_inf)
        md = float(diff[finite].max()) if bool(finite.any()) else 0.0
        _passed(name, f"max |diff| {md:.2e}", quiet)
        return
    bad = (~ok).nonzero().reshape(-1)
    i = int(bad[0])
    ex, ac = float(e64[i]), float(a64[i])
    where = _index(i, tuple(e.shape))
    what = (f"element {where} differs: expected {_fmt(ex)}, got {_fmt(ac)}")
    if math.isfinite(ex) and math.isfinite(ac):
        what += f" (|diff| {abs(ex - ac):.2e} > tolerance {float(tol[i]):.2e})"
    what += f"; {len(bad)} of {a64.numel()} elements differ"
    _fail(name, what, hint)


def check_equal(actual: Any, expected: Any, name: str = "answer", hint: str | None = None,
                quiet: bool = False):
    """Check exact equality of plain values (ints, strings, tuples, dicts)."""
    if isinstance(actual, torch.Tensor) or isinstance(expected, torch.Tensor):
        raise TypeError("check_equal compares plain values; use check_close for tensors")
    if actual != expected:
        if isinstance(expected, dict) and isinstance(actual, dict):
            for k in expected:
                if k not in actual:
                    _fail(name, f"missing key {k!r} (expected {expected[k]!r})", hint)
                if actual[k] != expected[k]:
                    _fail(name, f"[{k!r}] is {actual[k]!r}, expected {expected[k]!r}", hint)
            extra = sorted(set(actual) - set(expected), key=str)
            _fail(name, f"unexpected keys {extra}", hint)
        if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
            for j, (x, y) in enumerate(zip(actual, expected)):
                if x != y:
                    _fail(name, f"item {j} is {x!r}, expected {y!r}", hint)
            _fail(name, f"has {len(actual)} items, expected {len(expected)}", hint)
        _fail(name, f"is {actual!r}, expected {expected!r}", hint)
    _passed(name, f"= {expected!r}", quiet)


def check_true(condition: bool, message: str, name: str = "check", hint: str | None = None,
               quiet: bool = False):
    """Fail with ``message`` unless ``condition`` is true."""
    if not isinstance(condition, (bool, torch.Tensor)) and condition not in (0, 1):
        raise TypeError(f"check_true needs a bool, got {type(condition).__name__}")
    if not bool(condition):
        _fail(name, message, hint)
    _passed(name, "", quiet)


def check_raises(fn, exc_type, name: str = "function", hint: str | None = None,
                 match: str | None = None, quiet: bool = False):
    """Check that calling ``fn()`` raises ``exc_type`` (whose message contains ``match``)."""
    try:
        fn()
    except exc_type as err:
        if match is not None and match not in str(err):
            _fail(name, f"raised {exc_type.__name__} but its message {str(err)!r} "
                        f"does not mention {match!r}", hint)
        _passed(name, f"raises {exc_type.__name__}", quiet)
        return
    except Exception as err:  # noqa: BLE001 - report the wrong exception type
        _fail(name, f"raised {type(err).__name__}: {err}; expected {exc_type.__name__}", hint)
    _fail(name, f"returned normally; expected it to raise {exc_type.__name__}", hint)
