"""The one contract every attention function of the course follows.

Arguments, as ``torch.nn.functional.scaled_dot_product_attention`` has them:
``f(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, ...)`` with ``q`` of
shape ``(B, Hq, Nq, D)`` and ``k``, ``v`` of shape ``(B, Hkv, Nk, D)``; every option
is keyword-only. ``scale`` defaults to ``1 / sqrt(D)``. ``Hq != Hkv`` (grouped-query
attention: query head ``h`` reads key/value head ``h // (Hq // Hkv)``) needs
``enable_gqa=True``, as in SDPA, and raises the error type SDPA raises otherwise.

Causal masks come in two alignments, named as ``torch.nn.attention.bias`` names them
(``alignment=`` chooses one when ``is_causal=True``). With ``Nq = 2`` and ``Nk = 5``
(1 = the query row sees the key, 0 = masked out)::

    causal_upper_left (SDPA's is_causal)    causal_lower_right (decoding, flash-attn)
        1 0 0 0 0                               1 1 1 1 0
        1 1 0 0 0                               1 1 1 1 1

and with ``Nq = 5`` and ``Nk = 2``::

    causal_upper_left                       causal_lower_right
        1 0                                     0 0
        1 1                                     0 0
        1 1                                     0 0
        1 1                                     1 0
        1 1                                     1 1

Upper-left: query ``i`` sees key ``j`` when ``j <= i``; lower-right: when
``j <= i + Nk - Nq`` (the queries are the *last* ``Nq`` positions). They agree when
``Nq == Nk``. A row that sees no key at all has output 0 and log-sum-exp ``-inf``.

Every implementation declares what it supports in one :class:`Implementation` record
of :data:`IMPLEMENTATIONS`; :func:`validate_attention` checks a call against that
record before any work or kernel launch and returns the resolved
:class:`AttentionShape`. Tests, GPU checks and benchmarks iterate over the records.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from course_utils.constants import ALIGNMENTS, CAUSAL_LOWER_RIGHT, CAUSAL_UPPER_LEFT

__all__ = ["AttentionShape", "Implementation", "IMPLEMENTATIONS", "implementation",
           "validate_attention", "GQAError", "causal_mask", "visible_keys",
           "CAUSAL_UPPER_LEFT", "CAUSAL_LOWER_RIGHT", "ALIGNMENTS", "FLOAT_DTYPES"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HALF = (torch.float16, torch.bfloat16)


class GQAError(ValueError, RuntimeError):
    """Head counts that do not fit: a ``ValueError`` like every bad shape of the course,
    and a ``RuntimeError`` like the one SDPA raises for ``Hq != Hkv`` without
    ``enable_gqa=True``."""


class AttentionShape(NamedTuple):
    """Sizes of one attention call, resolved: batch, query heads, key/value heads,
    query length, key length, head dim, softmax scale, ``group = Hq // Hkv`` and the
    causal alignment (``None`` without a mask)."""
    B: int
    Hq: int
    Hkv: int
    Nq: int
    Nk: int
    D: int
    scale: float
    group: int
    causal: Optional[str] = None

    @property
    def is_causal(self) -> bool:
        return self.causal is not None

    @property
    def offset(self) -> int:
        """Added to the query index in the causal test ``j <= i + offset``: 0 for
        upper-left, ``Nk - Nq`` for lower-right (and 0 without a mask)."""
        return self.Nk - self.Nq if self.causal == CAUSAL_LOWER_RIGHT else 0


def causal_mask(nq, nk, alignment=CAUSAL_UPPER_LEFT, *, offset=0, device=None):
    """Boolean ``(nq, nk)`` mask, True where query row ``i`` (0-based) may see key ``j``.
    ``offset`` shifts the rows: row ``i`` is query ``i + offset`` of the whole block
    (for a tile that starts at row ``offset``)."""
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")
    for name, n in (("nq", nq), ("nk", nk)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    return visible_keys(torch.arange(nq, device=device)[:, None] + offset,
                        torch.arange(nk, device=device)[None, :], nq, nk, alignment)


def visible_keys(rows, cols, nq, nk, alignment):
    """``cols <= rows + shift`` with the shift of ``alignment`` (absolute indices)."""
    shift = nk - nq if alignment == CAUSAL_LOWER_RIGHT else 0
    return cols <= rows + shift


# --------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Implementation:
    """What one attention entry point supports, declared once.

    ``dtypes``: input dtypes. ``head_dims``: the head dims it takes (``None``: any up
    to ``max_head_dim``, or any at all). ``alignments``: causal alignments it computes
    (empty: no causal mask). ``devices``: ``"any"`` (any torch device), ``"triton"``
    (the device Triton compiles for: the CPU interpreter or the GPU), ``"hopper"`` (an
    sm90 GPU). ``strides``: ``"any"``, ``"contiguous"`` (copied when not).
    ``multiple_of``: ``Nq`` and ``Nk`` must be multiples of it. ``backward``: gradients
    flow. ``kind``: ``"sdpa"`` (q, k, v, SDPA's defaults) or ``"decode"`` (q against a KV
    cache laid out per kv head, so ``enable_gqa`` defaults to True, as in flash-attn's
    ``flash_attn_with_kvcache``). Every implementation computes the non-causal case and
    takes GQA (``Hkv`` dividing ``Hq``)."""
    name: str
    module: str
    function: str
    dtypes: tuple
    alignments: tuple = ALIGNMENTS
    default_alignment: str = CAUSAL_UPPER_LEFT
    head_dims: Optional[tuple] = None
    max_head_dim: Optional[int] = None
    devices: str = "any"
    strides: str = "any"
    multiple_of: int = 1
    backward: bool = False
    kind: str = "sdpa"

    def load(self):
        """The function itself (imported on first use: Hopper modules need a GPU)."""
        return getattr(importlib.import_module(self.module), self.function)

    def runs_here(self) -> bool:
        """True when this machine can run it (CPU interpreter counts for Triton)."""
        from course_utils import device
        if self.devices == "hopper":
            return device.IS_HOPPER
        return True

    def _head_dim_ok(self, d):
        if self.head_dims is not None:
            return d in self.head_dims
        return self.max_head_dim is None or d <= self.max_head_dim

    def device_for(self):
        """The torch device its inputs must live on."""
        from course_utils import device
        return torch.device("cpu") if self.devices == "any" else device.DEVICE


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_REF = dict(dtypes=FLOAT_DTYPES, devices="any", strides="any")

IMPLEMENTATIONS = {r.name: r for r in (
    Implementation("naive", "course_utils.attention", "naive_attention", **_REF),
    Implementation("fa1", "course_utils.attention", "flash_attention_fa1", **_REF),
    Implementation("fa2", "course_utils.attention", "flash_attention_fa2", **_REF),
    Implementation("tiled_backward", "course_utils.backward", "flash_attention", backward=True,
                   **_REF),
    Implementation("triton", "course_utils.triton_attention", "triton_attention",
                   dtypes=_TRITON_DTYPES, max_head_dim=256, devices="triton", backward=True),
    Implementation("tma", "course_utils.hopper.triton_fwd", "attention_tma", dtypes=_HALF,
                   alignments=(CAUSAL_UPPER_LEFT,), head_dims=(16, 32, 64, 128),
                   devices="triton", strides="contiguous"),
    Implementation("gluon", "course_utils.hopper.gluon_fwd", "attention_gluon", dtypes=_HALF,
                   alignments=(), head_dims=(64, 128), devices="hopper", strides="contiguous",
                   multiple_of=128),
    Implementation("fp8", "course_utils.hopper.fp8", "attention_fp8", dtypes=_HALF,
                   alignments=(CAUSAL_UPPER_LEFT,), head_dims=(16, 32, 64, 128),
                   devices="triton", strides="contiguous"),
    Implementation("decode_reference", "course_utils.decoding", "decode_attention_reference",
                   default_alignment=CAUSAL_LOWER_RIGHT, kind="decode", **_REF),
    Implementation("split_kv", "course_utils.decoding", "split_kv_attention",
                   default_alignment=CAUSAL_LOWER_RIGHT, kind="decode", **_REF),
    Implementation("decode", "course_utils.triton_decode", "decode_attention",
                   dtypes=_TRITON_DTYPES, alignments=(CAUSAL_LOWER_RIGHT,),
                   default_alignment=CAUSAL_LOWER_RIGHT, head_dims=(16, 32, 64, 128, 256),
                   devices="triton", kind="decode"),
)}


def implementation(name) -> Implementation:
    """The record of ``name`` (a key of :data:`IMPLEMENTATIONS`, or a record)."""
    if isinstance(name, Implementation):
        return name
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {name!r}; "
                         f"one of {sorted(IMPLEMENTATIONS)}")
    return IMPLEMENTATIONS[name]


# --------------------------------------------------------------------------- the validator
def validate_attention(q, k, v, *, is_causal=False, alignment=None, scale=None,
                       enable_gqa=False, impl="naive", names=("q", "k", "v"),
                       hardware=True) -> AttentionShape:
    """Check one attention call before any work; return its :class:`AttentionShape`.

    ``impl`` names the entry point (a key of :data:`IMPLEMENTATIONS`) whose declared
    support is checked too. ``alignment`` (default: the implementation's) is used only
    with ``is_causal=True``. Raises ``TypeError`` for a wrong type or dtype,
    ``ValueError`` for a wrong shape, device, head dim, alignment or scale, and
    :class:`GQAError` for head counts that need (or do not allow) ``enable_gqa``.
    ``hardware=False`` leaves out the check for an sm90 GPU (``RuntimeError``), for a
    caller that checks its own options first."""
    rec = implementation(impl)
    nq_, nk_, nv_ = names
    forms = {nq_: "(B, Hq, Nq, D)", nk_: "(B, Hkv, Nk, D)", nv_: "(B, Hkv, Nk, D)"}
    for name, t in zip(names, (q, k, v)):
        form = forms[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape {form}, "
                            f"got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D with shape {form}, got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must have a floating dtype (float16, bfloat16, float32 or "
                            f"float64), got {t.dtype}")
        if any(s <= 0 for s in t.shape):
            raise ValueError(f"{name} must have every size >= 1 in {form}, "
                             f"got shape {tuple(t.shape)}")
    b, hq, nq, d = q.shape
    bk, hkv, nk, dk = k.shape
    if bk != b:
        raise ValueError(f"{nk_} has batch size {bk} but {nq_} has {b}: {nk_} must be "
                         f"(B, Hkv, Nk, D) with B = {b}")
    if dk != d:
        raise ValueError(f"{nk_} has head dim {dk} but {nq_} has {d}: {nk_} must be "
                         f"(B, Hkv, Nk, D) with D = {d}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{nv_} must have {nk_}'s shape (B, Hkv, Nk, D) = {tuple(k.shape)}, "
                         f"got {tuple(v.shape)} (check {nv_}'s batch, heads, length and head dim)")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be True or False, got {enable_gqa!r}")
    if hq != hkv:
        if not enable_gqa:
            raise GQAError(f"{nq_} has {hq} heads but {nk_} and {nv_} have {hkv}: pass "
                           f"enable_gqa=True for grouped-query attention (as in SDPA)")
        if hq % hkv != 0:
            raise GQAError(f"{nq_}'s head count Hq={hq} must be a multiple of {nk_}'s and "
                           f"{nv_}'s head count Hkv={hkv} (Hq % Hkv == 0 for GQA and MQA)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{nq_}, {nk_} and {nv_} must share one dtype, got {nq_} {q.dtype}, "
                        f"{nk_} {k.dtype}, {nv_} {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{nq_}, {nk_} and {nv_} must be on one device, got {nq_} on "
                         f"{q.device}, {nk_} on {k.device}, {nv_} on {v.device}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {is_causal!r}")
    if alignment is None:
        alignment = rec.default_alignment
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ALIGNMENTS} (the names of "
                         f"torch.nn.attention.bias), got {alignment!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a positive float or None, got {type(scale).__name__}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive finite float or None, got {scale!r}")
        scale = float(scale)
    _check_declared(rec, q, d, nq, nk, is_causal, alignment, names, hardware)
    return AttentionShape(b, hq, hkv, nq, nk, d, scale, hq // hkv,
                          alignment if is_causal else None)


def _check_declared(rec, q, d, nq, nk, is_causal, alignment, names, hardware=True):
    """What this implementation declared it supports."""
    what = rec.function
    if q.dtype not in rec.dtypes:
        raise TypeError(f"{what} takes {', '.join(str(t).replace('torch.', '') for t in rec.dtypes)}"
                        f" tensors, got {q.dtype}")
    if not rec._head_dim_ok(d):
        if rec.head_dims is not None:
            raise ValueError(f"head dim D must be one of {rec.head_dims} for {what}, got D={d}")
        raise ValueError(f"head dim D={d} is too large for {what}: D must be at most "
                         f"{rec.max_head_dim}")
    if is_causal and alignment not in rec.alignments:
        if not rec.alignments:
            raise ValueError(f"{what} computes non-causal attention only: pass "
                             f"is_causal=False")
        raise ValueError(f"{what} supports the causal alignments {rec.alignments}, "
                         f"got alignment={alignment!r}")
    if rec.multiple_of > 1:
        for name, n in (("Nq", nq), ("Nk", nk)):
            if n % rec.multiple_of:
                raise ValueError(f"{name} must be a multiple of {rec.multiple_of} for {what}, "
                                 f"got {name}={n}")
    if rec.devices != "any":
        from course_utils import device
        if rec.devices == "hopper" and hardware and not device.IS_HOPPER:
            raise RuntimeError(f"{what} needs an sm90 GPU (Hopper, e.g. H100); this machine: "
                               f"{device.describe()['device']}")
        want = device.DEVICE.type
        if q.device.type != want:
            where = ("Triton runs in the CPU interpreter on this machine"
                     if want == "cpu" else "Triton compiles for the GPU on this machine")
            raise ValueError(f"{', '.join(names)} must be on {device.DEVICE} "
                             f"(course_utils.device.DEVICE) for {what}: {where}; got {q.device}")
