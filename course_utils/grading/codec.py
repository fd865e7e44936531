"""Values as plain data, for the trip out of a graded kernel.

``encode`` runs inside the kernel (it may have been tampered with there, which
is why nothing it produces is trusted); ``decode`` runs in the grader and in
the checking kernel, and only *builds data*: it accepts an exact allow-list of
types (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
plain CPU tensors, numpy arrays, torch dtypes and devices, and lists / tagged
tuples, sets and dicts of those). It never imports a module, never looks a class or function up by
the name a record gives, and never calls anything the record names: a class or
function in a record decodes to a :class:`Named` marker, a named tuple to a
plain tuple, another dataclass to an inert :class:`Record` (which only
:func:`materialise`, in the checking kernel, makes into one of the course's own
dataclasses), any other object to :class:`Unserializable`. Blobs travel as
``torch.save`` bytes and are read back with ``torch.load(weights_only=True)``,
so a blob can hold data but never code. Whatever goes wrong while decoding
(malformed data, nesting deep enough to exhaust the stack, running out of
memory) is a :class:`CodecError`.
"""
from __future__ import annotations

import base64
import builtins
import dataclasses
import io
import math
import re
import sys

import torch

MAX_BLOB_BYTES = 32 * 1024 * 1024
# what decoding may build, counted in the bytes each tensor or array would take once
# copied (``numel * element size``), before anything is copied: a blob of a few bytes can
# hold a tensor expanded from one element to billions (stride 0), or many views of one
# storage, which the grader would otherwise materialise when it passes the value on
MAX_RECORD_TENSOR_BYTES = 2 * MAX_BLOB_BYTES      # per record
MAX_STUDENT_TENSOR_BYTES = 512 * 1024 * 1024      # per run (see :class:`Budget`)
# values (list items, dict entries, tensors, ...) one record, and all the records of
# one run, may decode to: a record can nest one list in the next twice over, which the
# saved form stores once and a decoder would copy out exponentially often
MAX_RECORD_NODES = 1_000_000
MAX_STUDENT_NODES = 4_000_000
_MAX_DEPTH = 32
_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.bool) + tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2",
                                                    "uint16", "uint32", "uint64")
                        if isinstance(getattr(torch, n, None), torch.dtype))}
_DEVICE = re.compile(r"^(cpu|cuda|meta|mps|xpu)(:\d{1,3})?$")


@dataclasses.dataclass(frozen=True)
class Record:
    """A dataclass value as plain data (the class's name, its fields and their
    values), as it arrives. :func:`materialise` turns it back into the course's
    own dataclass where one is allowed; nothing else ever builds it."""
    name: str
    fields: tuple
    values: tuple


def materialise(x, _depth=0):
    """``x`` with each tensor back on the device it was recorded on (when this machine
    has it) and each :class:`Record` made an instance of its class, when that class
    is a dataclass defined by a ``course_utils`` module already imported in this
    process (never ``course_utils.grading``). Nothing is imported; a record of any
    other class stays an :class:`Unserializable`. Used in the checking kernel, after
    the template has imported the modules whose values it passes around."""
    if _depth > _MAX_DEPTH:
        return x
    d = _depth + 1
    if isinstance(x, torch.Tensor):
        on = getattr(x, "_course_device", None)
        if on is not None:
            try:
                return x.to(on)
            except (RuntimeError, AssertionError):  # that device is not on this machine
                return x
        return x
    if isinstance(x, Record):
        values = [materialise(v, d) for v in x.values]
        mod, _, qual = x.name.partition(":")
        cls = None
        if mod.startswith("course_utils.") and not mod.startswith("course_utils.grading") \
                and mod in sys.modules and "." not in qual:
            cand = vars(sys.modules[mod]).get(qual)
            if isinstance(cand, type) and dataclasses.is_dataclass(cand) and \
                    cand.__module__ == mod and \
                    [f.name for f in dataclasses.fields(cand)] == list(x.fields):
                cls = cand
        if cls is None:
            return Unserializable(f"object of class {x.name:.120}")
        try:
            return cls(**dict(zip(x.fields, values)))
        except Exception:  # noqa: BLE001 - values that the class refuses
            return Unserializable(f"object of class {x.name:.120} with fields that do not fit it")
    if type(x) is list:
        return [materialise(v, d) for v in x]
    if type(x) is tuple:
        return tuple(materialise(v, d) for v in x)
    if type(x) is dict:
        return {k: materialise(v, d) for k, v in x.items()}
    return x


@dataclasses.dataclass(frozen=True)
class Named:
    """A class or function a record names (``kind`` is ``"type"`` or ``"function"``):
    only its name travels, and nothing is looked up by it."""
    kind: str
    name: str


class CodecError(ValueError):
    """A blob that is not the data the grader expects."""


class TooLarge(CodecError):
    """A record whose tensors would take more memory than the grader allows; unlike a
    malformed record (skipped), it fails the whole submission with this message."""


class Budget:
    """Bytes of tensor data the records of one run may still decode to."""

    def __init__(self, limit: int = MAX_STUDENT_TENSOR_BYTES, nodes: int = MAX_STUDENT_NODES):
        self.left = int(limit)
        self.nodes_left = int(nodes)


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
        out = {"__tensor__": t.clone()}
        # travels on the CPU; materialise puts it back (a tensor decoded here and encoded
        # again, on its way from the grader to the checking kernel, keeps its device too)
        on = str(x.device) if x.device.type != "cpu" else getattr(x, "_course_device", None)
        if type(on) is str:
            out["__on__"] = on
        return out
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
    if type(x) is Record:
        return {"__dataclass__": x.name, "fields": list(x.fields),
                "values": [encode(v, d) for v in x.values]}
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
    except (Exception, RecursionError, MemoryError) as e:  # noqa: BLE001 - one verdict
        raise CodecError(f"unreadable record blob ({type(e).__name__}: {e})"[:300]) from None


def decode(tree, budget: Budget | None = None, whole_run: bool = False):
    """The value an encoded tree stands for; raises :class:`CodecError` on
    anything outside the vocabulary. ``{"__unserializable__": ...}`` decodes to
    an :class:`Unserializable` marker, which no check accepts. Tensors are checked
    before anything is copied: one whose elements overlap in memory (an expanded,
    stride-0 view), or a record whose tensors add up to more than
    ``MAX_RECORD_TENSOR_BYTES`` (or to more than what ``budget`` has left, which is then
    charged), raises :class:`TooLarge`, and so does a record that decodes to more than
    ``MAX_RECORD_NODES`` values (``MAX_STUDENT_NODES`` for a run). ``whole_run``: the
    grader's own bundle of a run's records (each already within those bounds)."""
    try:
        if whole_run:   # everything the grader read from one run (each record within bounds)
            room = [MAX_STUDENT_TENSOR_BYTES + MAX_RECORD_TENSOR_BYTES,
                    MAX_STUDENT_NODES + MAX_RECORD_NODES]
            return _decode(tree, 0, room)
        nodes = MAX_RECORD_NODES if budget is None else min(MAX_RECORD_NODES, budget.nodes_left)
        room = [MAX_RECORD_TENSOR_BYTES, nodes]
        out = _decode(tree, 0, room)
        used = MAX_RECORD_TENSOR_BYTES - room[0]
        if budget is not None:
            if used > budget.left:
                raise TooLarge(f"the records of this run hold more than "
                               f"{MAX_STUDENT_TENSOR_BYTES // 2**20} MiB of tensor data, "
                               "the most the grader reads from one run")
            budget.left -= used
            budget.nodes_left -= nodes - room[1]
        return out
    except CodecError:
        raise
    except (Exception, RecursionError, MemoryError) as e:  # noqa: BLE001 - e.g. unhashable keys
        raise CodecError(f"malformed record ({type(e).__name__}: {e})"[:300]) from None


def _charge(val, room):
    """Count a decoded tensor against the record's ``room`` (a one-item list)."""
    n, size = val.numel(), val.element_size()
    nbytes = n * size
    if nbytes > room[0]:
        raise TooLarge(f"a record holds a tensor of {n} elements ({nbytes / 2**20:.0f} MiB "
                       f"once copied), over the {MAX_RECORD_TENSOR_BYTES // 2**20} MiB the "
                       "grader reads from one record")
    if n > 1:
        # elements that share memory (stride 0, an expanded view) or a view past its
        # storage: what no value the kernel encodes (a clone) ever is
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(val.shape, val.stride()))
        if n > span or (val.storage_offset() + span) * size > val.untyped_storage().nbytes():
            raise TooLarge(f"a record holds a tensor of shape {tuple(val.shape)} whose "
                           f"elements overlap in memory (strides {tuple(val.stride())}); "
                           "recorded values are never such views")
    room[0] -= nbytes


def _decode(tree, depth, room):
    if depth > _MAX_DEPTH + 2:
        raise CodecError("nesting too deep")
    room[1] -= 1
    if room[1] < 0:
        raise TooLarge(f"a record decodes to more than {MAX_RECORD_NODES} values (or the "
                       f"records of this run to more than {MAX_STUDENT_NODES}), more than "
                       "the grader reads")
    d = depth + 1
    if tree is None or type(tree) in (bool, int, float, complex, str, bytes):
        return tree
    if type(tree) is list:
        return [_decode(v, d, room) for v in tree]
    if type(tree) is not dict or len(tree) == 0 or type(next(iter(tree))) is not str:
        raise CodecError(f"unexpected {type(tree).__name__} in a record")
    tag = next(iter(tree))
    val = tree[tag]
    if tag in ("__tensor__", "__ndarray__"):
        if type(val) is not torch.Tensor or val.layout != torch.strided or \
                val.device.type != "cpu":
            raise CodecError(f"{tag} does not hold a plain CPU tensor")
        _charge(val, room)
        if tag == "__ndarray__":
            return val.numpy()
        on = tree.get("__on__")
        if type(on) is str and _DEVICE.match(on) and on != "cpu":
            val = val.detach()        # a new tensor object on the same data
            val._course_device = on   # the device it was recorded on (see materialise)
        return val
    if tag == "__dtype__":
        if type(val) is not str or val not in _DTYPES:
            raise CodecError(f"unknown dtype {val!r:.40}")
        return _DTYPES[val]
    if tag == "__device__":
        if type(val) is not str or not _DEVICE.match(val):
            raise CodecError(f"unknown device {val!r:.40}")
        return torch.device(val)
    if tag == "__tuple__":
        return tuple(_decode(v, d, room) for v in _list(val))
    if tag == "__set__":
        return {_hashable(_decode(v, d, room)) for v in _list(val)}
    if tag == "__dict__":
        out = {}
        for pair in _list(val):
            if type(pair) is not list or len(pair) != 2:
                raise CodecError("malformed dict entry")
            out[_hashable(_decode(pair[0], d, room))] = _decode(pair[1], d, room)
        return out
    if tag in ("__type__", "__func__"):
        if type(val) is not str or len(val) > 300:
            raise CodecError(f"{tag} does not hold a name")
        return Named("type" if tag == "__type__" else "function", val)
    if tag in ("__namedtuple__", "__dataclass__"):
        values = [_decode(v, d, room) for v in _list(tree.get("values"))]
        fields = _list(tree.get("fields"))
        if tag == "__namedtuple__":
            return tuple(values)
        if type(val) is str and len(val) <= 300 and len(fields) == len(values) \
                and all(type(f) is str for f in fields):
            return Record(val, tuple(fields), tuple(values))
        what = f"{val:.120}" if type(val) is str else "an unnamed class"
        return Unserializable(f"object of class {what}")
    if tag == "__unserializable__":
        return Unserializable(str(val)[:300] if type(val) is str else "a value")
    raise CodecError(f"unknown tag {tag!r:.40} in a record")


def _hashable(v):
    if isinstance(v, (list, dict, set, torch.Tensor)) or type(v).__module__ == "numpy":
        raise CodecError(f"a {type(v).__name__} cannot be a set element or dict key")
    return v


def exception_class(name):
    """The exception class a recorded ``module:qualname`` stands for, or None.
    Only built-in exceptions and the exception classes of modules already
    imported under ``course_utils`` count; nothing is imported."""
    if type(name) is not str or name.count(":") != 1:
        return None
    mod, qual = name.split(":")
    if mod == "builtins":
        cls = vars(builtins).get(qual)
    elif mod.split(".")[0] == "course_utils" and mod in sys.modules and "." not in qual:
        cls = vars(sys.modules[mod]).get(qual)
    else:
        return None
    if isinstance(cls, type) and issubclass(cls, Exception) and \
            f"{cls.__module__}:{cls.__qualname__}" == name:
        return cls
    return None


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
