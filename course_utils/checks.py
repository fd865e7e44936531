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
           "check_true", "check_raises", "tolerance", "compute_precision", "UNIT_ROUNDOFF",
           "TOLERANCE_OPS"]

# --------------------------------------------------------------------------- precision policy
# The course's policy for float32 on a GPU: Triton's tl.dot multiplies float32 operands
# as TF32 (10 explicit mantissa bits, like float16, with float32's range) and
# accumulates in float32. That is what fast kernels do, so the course's kernels keep it.
# A kernel that needs float32 products passes input_precision="ieee" to tl.dot. In
# the CPU interpreter tl.dot is computed in full float32. Every tolerance below is
# derived from the unit roundoff of the arithmetic the operation really runs in.
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "tf32": 2.0 ** -11,
                 "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}

# Tolerance of one attention-sized result (inputs of magnitude about 1), per precision:
# float64 and float32 allow for a different summation order over thousands of terms;
# TF32, float16 and bfloat16 allow 8 unit roundoffs (rounding the operands of both
# products of attention, S = Q K^T and O = P V, and the output).
_BASE = {"float64": 1e-10, "float32": 2e-5, "tf32": 8 * 2.0 ** -11,
         "float16": 2e-3, "bfloat16": 2e-2}
# op: what is compared. "dot" is one dot product of length k per element: rounding
# errors of its k terms add up like a random walk, so the tolerance grows as sqrt(k).
TOLERANCE_OPS = ("elementwise", "dot", "attention", "backward")
_OP_FACTOR = {"elementwise": 1.0, "dot": 1.0, "attention": 1.0, "backward": 2.0}
_DOT_OPS = ("dot", "attention", "backward")


def _dtype_name(dtype):
    names = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
             torch.bfloat16: "bfloat16"}
    if dtype not in names:
        raise TypeError(f"dtype must be torch.float64, float32, float16 or bfloat16, got {dtype!r}")
    return names[dtype]


def _device_type(device):
    if device is None:
        from course_utils import device as dev
        return dev.DEVICE.type
    if isinstance(device, torch.Tensor):
        return device.device.type
    if isinstance(device, str):
        return torch.device(device).type
    if isinstance(device, torch.device):
        return device.type
    raise TypeError(f"device must be a torch.device, a string, a tensor or None, got "
                    f"{type(device).__name__}")


def compute_precision(dtype, *, device=None, op="dot", input_precision=None) -> str:
    """The arithmetic an operation on ``dtype`` inputs runs in under the course's policy:
    ``"tf32"`` for the products of a float32 ``tl.dot`` on a GPU (unless
    ``input_precision="ieee"``), otherwise the dtype's own name."""
    if op not in TOLERANCE_OPS:
        raise ValueError(f"op must be one of {TOLERANCE_OPS}, got {op!r}")
    if input_precision not in (None, "tf32", "ieee"):
        raise ValueError(f"input_precision must be None, 'tf32' or 'ieee', got {input_precision!r}")
    name = _dtype_name(dtype)
    if (name == "float32" and op in _DOT_OPS and _device_type(device) == "cuda"
            and input_precision != "ieee"):
        return "tf32"
    if name == "float32" and input_precision == "tf32":
        return "tf32"
    return name


def tolerance(dtype, *, device=None, op="attention", k=None, input_precision=None,
              magnitude=1.0):
    """``(atol, rtol)`` for comparing a result computed from ``dtype`` inputs on
    ``device`` (default: the course's device) with a float32 or float64 reference.

    ``op``: ``"elementwise"``, ``"dot"`` (each element one dot product of length
    ``k``), ``"attention"`` (a softmax-weighted average: its error does not grow with
    the lengths) or ``"backward"`` (attention gradients, twice the attention
    tolerance). ``magnitude``: the size of the compared values (default 1, the
    course's random inputs); absolute errors scale with it, so ``atol`` does.
    Under the policy a float32 ``tl.dot`` runs in TF32 on a GPU, so its tolerance is
    TF32's; pass ``input_precision="ieee"`` when the kernel does."""
    prec = compute_precision(dtype, device=device, op=op, input_precision=input_precision)
    rtol = _BASE[prec] * _OP_FACTOR[op]
    atol = rtol
    if op == "dot":
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"op='dot' needs k, the length of the dot products (a positive "
                             f"int), got {k!r}")
        atol *= math.sqrt(k)     # a sum of k unit-size terms is about sqrt(k) in size
    elif k is not None:
        raise ValueError(f"k (the dot-product length) is used with op='dot' only, got op={op!r}")
    if isinstance(magnitude, bool) or not isinstance(magnitude, (int, float)) or not magnitude > 0:
        raise ValueError(f"magnitude must be a positive number, got {magnitude!r}")
    return atol * magnitude, rtol


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


def check_close(actual, expected, *, atol: float | None = None, rtol: float | None = None,
                name: str = "output", hint: str | None = None, quiet: bool = False,
                dtype=None, device=None, op: str = "attention", k: int | None = None,
                input_precision: str | None = None, magnitude: float = 1.0):
    """Check that ``actual`` matches ``expected`` element by element:
    ``|actual - expected| <= atol + rtol * |expected|``, NaN only where NaN is
    expected, and infinities of the same sign where expected.

    The tolerance: ``atol``/``rtol`` when given; otherwise, with ``dtype`` (the dtype
    the result was computed from), :func:`tolerance` of ``dtype``, ``device`` (default:
    ``actual``'s device), ``op``, ``k``, ``input_precision`` and ``magnitude``;
    otherwise 1e-5.

    On failure the message names the first differing element, the expected and
    actual values, the tolerance, how many elements differ, and ``hint``.
    """
    if dtype is not None:
        where = device if device is not None else (
            actual if isinstance(actual, torch.Tensor) else None)
        d_atol, d_rtol = tolerance(dtype, device=where, op=op, k=k,
                                   input_precision=input_precision, magnitude=magnitude)
        atol = d_atol if atol is None else atol
        rtol = d_rtol if rtol is None else rtol
    atol = 1e-5 if atol is None else atol
    rtol = 1e-5 if rtol is None else rtol
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
