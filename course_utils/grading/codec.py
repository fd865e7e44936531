"""Values as plain data, for the trip out of a graded kernel.

``encode`` runs inside the kernel (it may have been tampered with there, which
is why nothing it produces is trusted); ``decode`` runs in the grader and
accepts only a fixed vocabulary: ``None``, ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes``, CPU tensors, and lists / tagged dicts of those.
Blobs travel as ``torch.save`` bytes and are read back with
``torch.load(weights_only=True)``, so a blob can hold data but never code.
Classes and functions are named, never shipped: ``decode`` resolves a name
only in ``builtins``, ``course_utils``, ``torch``, ``math`` or ``numpy``.
"""
from __future__ import annotations

import base64
import dataclasses
import importlib
import io
import math

import torch

MAX_BLOB_BYTES = 32 * 1024 * 1024
_RESOLVABLE = ("builtins", "course_utils", "torch", "math", "numpy")
_MAX_DEPTH = 32


class CodecError(ValueError):
    """A blob that is not the data the grader expects."""


# --------------------------------------------------------------------------- kernel side
def _name_of(obj) -> str | None:
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None)
    if not mod or not qual or "<" in qual or mod == "__main__":
        return None
    return f"{mod}:{qual}"


def encode(x, _depth=0):
    """Turn ``x`` into a tree of plain values (see the module docstring)."""
    if _depth > _MAX_DEPTH:
        return {"__unserializable__": "nesting too deep"}
    d = _depth + 1
    if x is None:
        return None
    if isinstance(x, (bool, int, float, complex, str, bytes)):
        if type(x) in (bool, int, float, complex, str, bytes):
            return x
        return encode(type(x).__mro__[-2](x), d) if not isinstance(x, bool) else bool(x)
    if isinstance(x, torch.Tensor):
        t = x.detach().to("cpu")
        if type(t) is not torch.Tensor:
            t = t.as_subclass(torch.Tensor)
        return {"__tensor__": t.clone()}
    if isinstance(x, torch.dtype):
        return {"__dtype__": str(x).replace("torch.", "")}
    if isinstance(x, torch.device):
        return {"__device__": str(x)}
    if isinstance(x, torch.Size):
        return {"__tuple__": [int(v) for v in x]}
    try:
        import numpy as np
        if isinstance(x, np.ndarray):
            if x.dtype == object:
                return {"__unserializable__": "numpy array of Python objects"}
            return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(x).copy())}
        if isinstance(x, np.generic):
            return encode(x.item(), d)
    except ImportError:  # pragma: no cover - numpy ships with torch
        pass
    if isinstance(x, type):
        name = _name_of(x)
        return {"__type__": name} if name else {"__unserializable__": f"class {x.__name__}"}
    if callable(x) and (type(x).__name__ in ("function", "builtin_function_or_method")):
        name = _name_of(x)
        return {"__func__": name} if name else {"__unserializable__": f"function {x!r:.80}"}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {"__namedtuple__": _name_of(type(x)), "fields": list(x._fields),
                "values": [encode(v, d) for v in x]}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = [f.name for f in dataclasses.fields(x)]
        return {"__dataclass__": _name_of(type(x)), "fields": fields,
                "values": [encode(getattr(x, f), d) for f in fields]}
    if isinstance(x, list):
        return [encode(v, d) for v in x]
    if isinstance(x, tuple):
        return {"__tuple__": [encode(v, d) for v in x]}
    if isinstance(x, (set, frozenset)):
        items = [encode(v, d) for v in x]
        return {"__set__": sorted(items, key=repr)}
    if isinstance(x, dict):
        return {"__dict__": [[encode(k, d), encode(v, d)] for k, v in x.items()]}
    return {"__unserializable__": f"{type(x).__name__}: {_safe_repr(x)}"}


def _safe_repr(x) -> str:
    try:
        return repr(x)[:120]
    except Exception:  # noqa: BLE001 - a hostile __repr__
        return "<unprintable>"


def dumps(x) -> str:
    """Encode ``x`` and pack it as base64 text (``torch.save`` bytes)."""
    buf = io.BytesIO()
    torch.save(encode(x), buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# --------------------------------------------------------------------------- grader side
def loads(text: str, max_bytes: int = MAX_BLOB_BYTES):
    """Unpack base64 text made by :func:`dumps` into the raw (still encoded) tree."""
    if not isinstance(text, str):
        raise CodecError(f"a record blob must be text, got {type(text).__name__}")
    if len(text) > max_bytes * 4 // 3 + 8:
        raise CodecError(f"a record blob of {len(text)} characters is over the "
                         f"{max_bytes} byte limit")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        return torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any malformed blob is the same verdict
        raise CodecError(f"unreadable record blob ({type(e).__name__}: {e})"[:300]) from None


def resolve(name: str):
    """Import ``module:qualname`` if the module is one the grader trusts."""
    if not isinstance(name, str) or ":" not in name:
        raise CodecError(f"not a qualified name: {name!r}")
    mod, qual = name.split(":", 1)
    if mod.split(".")[0] not in _RESOLVABLE:
        raise CodecError(f"{name}: the grader only resolves names from "
                         f"{', '.join(_RESOLVABLE)}")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def decode(tree, _depth=0):
    """The value an encoded tree stands for; raises :class:`CodecError` on
    anything outside the vocabulary. ``{"__unserializable__": ...}`` decodes to
    an :class:`Unserializable` marker, which no check accepts."""
    if _depth > _MAX_DEPTH + 2:
        raise CodecError("nesting too deep")
    d = _depth + 1
    if tree is None or type(tree) in (bool, int, float, complex, str, bytes):
        return tree
    if type(tree) is list:
        return [decode(v, d) for v in tree]
    if type(tree) is not dict or len(tree) == 0:
        raise CodecError(f"unexpected {type(tree).__name__} in a record")
    tag = next(iter(tree))
    val = tree[tag]
    if tag in ("__tensor__", "__ndarray__"):
        if type(val) is not torch.Tensor:
            raise CodecError(f"{tag} does not hold a tensor")
        if tag == "__ndarray__":
            return val.numpy()
        return val
    if tag == "__dtype__":
        dt = getattr(torch, str(val), None)
        if not isinstance(dt, torch.dtype):
            raise CodecError(f"unknown dtype {val!r}")
        return dt
    if tag == "__device__":
        return torch.device(str(val))
    if tag == "__tuple__":
        return tuple(decode(v, d) for v in _list(val))
    if tag == "__set__":
        return {decode(v, d) for v in _list(val)}
    if tag == "__dict__":
        out = {}
        for pair in _list(val):
            if type(pair) is not list or len(pair) != 2:
                raise CodecError("malformed dict entry")
            out[decode(pair[0], d)] = decode(pair[1], d)
        return out
    if tag in ("__type__", "__func__"):
        return resolve(val)
    if tag in ("__namedtuple__", "__dataclass__"):
        values = [decode(v, d) for v in _list(tree.get("values"))]
        fields = _list(tree.get("fields"))
        cls = None
        if isinstance(val, str) and val.split(":")[0].split(".")[0] == "course_utils":
            try:
                cls = resolve(val)
            except (CodecError, ImportError, AttributeError):
                cls = None
        if cls is None:
            return tuple(values) if tag == "__namedtuple__" else Unserializable(
                f"object of class {val}")
        try:
            if tag == "__namedtuple__":
                return cls(*values)
            return cls(**dict(zip(fields, values)))
        except Exception:  # noqa: BLE001 - fields that do not fit the class
            return Unserializable(f"object of class {val} with fields that do not fit it")
    if tag == "__unserializable__":
        return Unserializable(str(val))
    raise CodecError(f"unknown tag {tag!r} in a record")


def _list(v):
    if type(v) is not list:
        raise CodecError("malformed record: expected a list")
    return v


class Unserializable:
    """Stands for a value that could not leave the kernel as data."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self):
        return f"<value that cannot be graded: {self.what}>"

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__


def is_finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
