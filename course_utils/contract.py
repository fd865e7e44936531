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
:class:`AttentionShape`. Tests, GPU checks and benchmarks iterate over the records:
:func:`cases` expands a record's declarations (dtypes, head dims, causal settings,
GQA, memory layouts) crossed with the sizes each caller chooses (tiny on a CPU, real
on a GPU), so a new declaration adds cases everywhere and an undeclared combination
never appears.
"""
from __future__ import annotations

import importlib
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Optional

import torch

from course_utils.constants import ALIGNMENTS, CAUSAL_LOWER_RIGHT, CAUSAL_UPPER_LEFT

__all__ = ["AttentionShape", "Implementation", "IMPLEMENTATIONS", "implementation",
           "implementations",
           "validate_attention", "GQAError", "causal_mask", "visible_keys", "Case", "cases",
           "LAYOUTS", "CAUSAL_UPPER_LEFT", "CAUSAL_LOWER_RIGHT", "ALIGNMENTS", "FLOAT_DTYPES"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HALF = (torch.float16, torch.bfloat16)
# memory layouts of a (B, H, N, D) argument: "bhnd" is contiguous; "bnhd" is a
# (B, N, H, D) tensor viewed through .transpose(1, 2) (heads interleaved, as a
# projection's output is before it is reshaped), so its strides are not the default
LAYOUTS = ("bhnd", "bnhd")
# head dims tried for a record that takes any head dim (up to its maximum): powers of
# two and two that a kernel must pad (48, 80)
EXAMPLE_HEAD_DIMS = (16, 32, 48, 64, 80, 128, 256)


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
    ``flash_attn_with_kvcache``; the ``Nq`` new tokens are the last of the cache, so
    ``Nq <= Nk``). ``gqa``: takes ``Hq != Hkv`` (``Hkv`` dividing ``Hq``; with
    ``False`` only ``Hq == Hkv``). ``returns_lse``: takes ``return_lse=True`` and
    returns ``(o, lse)``. ``interpreter_dtypes``: the dtypes it takes in Triton's CPU
    interpreter when fewer than ``dtypes`` (the interpreter computes the others wrong
    for that kernel; ``None``: all of them). Every implementation computes the
    non-causal case and takes every layout of :data:`LAYOUTS` (``strides`` says whether
    it reads them in place or copies them)."""
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
    gqa: bool = True
    returns_lse: bool = True
    interpreter_dtypes: Optional[tuple] = None

    def load(self):
        """The function itself (imported on first use: Hopper modules need a GPU)."""
        return getattr(importlib.import_module(self.module), self.function)

    def runs_here(self) -> bool:
        """True when this machine can run it (CPU interpreter counts for Triton)."""
        from course_utils import device
        if self.devices == "hopper":
            return device.IS_HOPPER
        return True

    def takes_head_dim(self, d) -> bool:
        """True when head dim ``d`` is declared (one of ``head_dims``, or at most
        ``max_head_dim``)."""
        if self.head_dims is not None:
            return d in self.head_dims
        return self.max_head_dim is None or d <= self.max_head_dim

    def device_for(self):
        """The torch device its inputs must live on."""
        from course_utils import device
        return torch.device("cpu") if self.devices == "any" else device.DEVICE

    def interpreted(self) -> bool:
        """True when its Triton kernels run in the CPU interpreter on this machine."""
        from course_utils import device
        return self.devices != "any" and device.INTERPRET

    def dtypes_for(self, interpreter=None) -> tuple:
        """The dtypes it takes in Triton's CPU interpreter (``interpreter=True``), on a
        GPU (``False``) or on this machine (``None``)."""
        if interpreter is None:
            interpreter = self.interpreted()
        if interpreter and self.interpreter_dtypes is not None:
            return tuple(self.interpreter_dtypes)
        return tuple(self.dtypes)

    # what a caller iterates over: the declared values of each axis of a case
    def settings(self) -> tuple:
        """Causal settings it computes: ``None`` (no mask) and each declared alignment."""
        return (None,) + tuple(self.alignments)

    def example_head_dims(self) -> tuple:
        """Its declared head dims, or those of :data:`EXAMPLE_HEAD_DIMS` it takes."""
        if self.head_dims is not None:
            return tuple(self.head_dims)
        return tuple(d for d in EXAMPLE_HEAD_DIMS if self.takes_head_dim(d))

    def refusal(self, *, dtype, D, Nq, Nk, Hq, Hkv, alignment=None,
                interpreter=None) -> Optional[Exception]:
        """The error :func:`validate_attention` raises for a call outside this record's
        declarations (``alignment``: ``None`` for no mask; ``interpreter``: as in
        :meth:`dtypes_for`), or ``None`` when it is declared. Shapes, devices and
        hardware are checked by the validator itself."""
        what = self.function
        names = lambda ts: ", ".join(str(t).replace("torch.", "") for t in ts)  # noqa: E731
        if dtype not in self.dtypes:
            return TypeError(f"{what} takes {names(self.dtypes)} tensors, got {dtype}")
        if dtype not in self.dtypes_for(interpreter):
            return TypeError(f"{what} takes {names(self.dtypes_for(interpreter))} tensors in "
                             f"Triton's CPU interpreter, got {dtype} (the interpreter computes "
                             f"this kernel wrong in {str(dtype).replace('torch.', '')}; a GPU "
                             f"takes {names(self.dtypes)})")
        if not self.takes_head_dim(D):
            if self.head_dims is not None:
                return ValueError(f"head dim D must be one of {self.head_dims} for {what}, "
                                  f"got D={D}")
            return ValueError(f"head dim D={D} is too large for {what}: D must be at most "
                              f"{self.max_head_dim}")
        if alignment is not None and alignment not in self.alignments:
            if not self.alignments:
                return ValueError(f"{what} computes non-causal attention only: pass "
                                  f"is_causal=False")
            return ValueError(f"{what} supports the causal alignments {self.alignments}, "
                              f"got alignment={alignment!r}")
        if Hq != Hkv and not self.gqa:
            return GQAError(f"{what} needs as many query heads as key/value heads "
                            f"(no grouped-query attention), got Hq={Hq}, Hkv={Hkv}")
        if self.multiple_of > 1:
            for name, n in (("Nq", Nq), ("Nk", Nk)):
                if n % self.multiple_of:
                    return ValueError(f"{name} must be a multiple of {self.multiple_of} for "
                                      f"{what}, got {name}={n}")
        return None

    def declares(self, case: "Case", interpreter=None) -> bool:
        """True when ``case`` lies inside what this record declares (and, for a
        ``"decode"`` record, its new tokens fit in the cache: ``Nq <= Nk``);
        ``interpreter`` as in :meth:`dtypes_for`."""
        if case.layout not in LAYOUTS or (self.kind == "decode" and case.Nq > case.Nk):
            return False
        return self.refusal(dtype=case.dtype, D=case.D, Nq=case.Nq, Nk=case.Nk, Hq=case.Hq,
                            Hkv=case.Hkv, alignment=case.alignment,
                            interpreter=interpreter) is None


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_REF = dict(dtypes=FLOAT_DTYPES, devices="any", strides="any")

IMPLEMENTATIONS = {r.name: r for r in (
    Implementation("naive", "course_utils.attention", "naive_attention", **_REF),
    Implementation("fa1", "course_utils.attention", "flash_attention_fa1", **_REF),
    Implementation("fa2", "course_utils.attention", "flash_attention_fa2", **_REF),
    Implementation("tiled_backward", "course_utils.backward", "flash_attention", backward=True,
                   returns_lse=False, **_REF),
    Implementation("triton", "course_utils.triton_attention", "triton_attention",
                   dtypes=_TRITON_DTYPES, max_head_dim=256, devices="triton", backward=True),
    # bfloat16 tiles loaded through a tensor descriptor reach tl.dot as wrong values in
    # the CPU interpreter (pointer loads are fine): float16 only there
    Implementation("tma", "course_utils.hopper.triton_fwd", "attention_tma", dtypes=_HALF,
                   alignments=(CAUSAL_UPPER_LEFT,), head_dims=(16, 32, 64, 128),
                   devices="triton", strides="contiguous",
                   interpreter_dtypes=(torch.float16,)),
    Implementation("gluon", "course_utils.hopper.gluon_fwd", "attention_gluon", dtypes=_HALF,
                   head_dims=(64, 128), devices="hopper", strides="contiguous"),
    # an FP8 tl.dot needs K >= 32: Q K^T reduces over the head dim
    Implementation("fp8", "course_utils.hopper.fp8", "attention_fp8", dtypes=_HALF,
                   alignments=(CAUSAL_UPPER_LEFT,), head_dims=(32, 64, 128),
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


def implementations(*, package=None, kind=None, devices=None, backward=None) -> list:
    """The records that match every filter given: ``package`` (their module lives in it,
    e.g. ``"course_utils.hopper"``), ``kind``, ``devices`` (one value or a tuple),
    ``backward``. The order is that of :data:`IMPLEMENTATIONS`."""
    if isinstance(devices, str):
        devices = (devices,)
    return [r for r in IMPLEMENTATIONS.values()
            if (package is None or r.module == package or r.module.startswith(package + "."))
            and (kind is None or r.kind == kind)
            and (devices is None or r.devices in devices)
            and (backward is None or r.backward == backward)]


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
    _check_declared(rec, q, k, d, nq, nk, is_causal, alignment, names, hardware)
    return AttentionShape(b, hq, hkv, nq, nk, d, scale, hq // hkv,
                          alignment if is_causal else None)


def _check_declared(rec, q, k, d, nq, nk, is_causal, alignment, names, hardware=True):
    """What this implementation declared it supports."""
    what = rec.function
    err = rec.refusal(dtype=q.dtype, D=d, Nq=nq, Nk=nk, Hq=q.shape[1], Hkv=k.shape[1],
                      alignment=alignment if is_causal else None)
    if err is not None:
        raise err
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


# --------------------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    """One call of an implementation: its sizes, dtype, causal setting (``alignment``
    ``None``: no mask) and memory layout (one of :data:`LAYOUTS`)."""
    impl: str
    B: int
    Hq: int
    Hkv: int
    Nq: int
    Nk: int
    D: int
    dtype: torch.dtype
    alignment: Optional[str] = None
    layout: str = "bhnd"

    @property
    def is_causal(self) -> bool:
        return self.alignment is not None

    @property
    def size(self) -> tuple:
        """``(B, Hq, Hkv, Nq, Nk)``, the part a caller chooses."""
        return (self.B, self.Hq, self.Hkv, self.Nq, self.Nk)

    def options(self) -> dict:
        """Keyword arguments of the call: the causal setting, and ``enable_gqa=True``
        (every entry point takes it, with ``Hq == Hkv`` too)."""
        return dict(is_causal=self.is_causal, alignment=self.alignment, enable_gqa=True)

    @property
    def id(self) -> str:
        """A short readable name (pytest ids, GPU check lines)."""
        dt = str(self.dtype).replace("torch.", "")
        mask = {None: "full", CAUSAL_UPPER_LEFT: "upper_left",
                CAUSAL_LOWER_RIGHT: "lower_right"}[self.alignment]
        return (f"{self.impl}-{dt}-D{self.D}-B{self.B}-H{self.Hq}x{self.Hkv}-"
                f"N{self.Nq}x{self.Nk}-{mask}-{self.layout}")

    def tensor(self, shape, *, device=None, generator=None):
        """A standard normal ``(B, H, N, D)`` tensor of this case's dtype and layout
        (drawn in float32 on the CPU from ``generator``, so a seed gives the same values
        on every machine)."""
        b, h, n, d = shape
        dev = implementation(self.impl).device_for() if device is None else device
        if self.layout == "bnhd":
            x = torch.randn(b, n, h, d, generator=generator)
            return x.to(dev, self.dtype).transpose(1, 2)
        return torch.randn(b, h, n, d, generator=generator).to(dev, self.dtype)

    def inputs(self, *, seed=0, device=None, requires_grad=False):
        """``q, k, v`` of this case (``device``: default, where its record runs)."""
        g = torch.Generator().manual_seed(seed)
        return tuple(self.tensor(s, device=device, generator=g).requires_grad_(requires_grad)
                     for s in ((self.B, self.Hq, self.Nq, self.D),
                               (self.B, self.Hkv, self.Nk, self.D),
                               (self.B, self.Hkv, self.Nk, self.D)))


def _pairwise(axes):
    """Rows of the product of ``axes`` (lists) in which every pair of values of two
    different axes appears at least once; greedy, deterministic."""
    rows = list(itertools.product(*axes))
    if len(axes) < 2:
        return rows
    pairs = lambda row: {(i, row[i], j, row[j])  # noqa: E731
                         for i, j in itertools.combinations(range(len(axes)), 2)}
    todo = set().union(*(pairs(r) for r in rows))
    chosen = []
    while todo:
        best = max(rows, key=lambda r: len(pairs(r) & todo))   # first best: deterministic
        chosen.append(best)
        todo -= pairs(best)
    return chosen


def cases(impl, sizes: Iterable[tuple], *, dtypes=None, head_dims=None, settings=None,
          layouts=None, cover="pairs", keep: Optional[Callable[[Case], bool]] = None,
          interpreter=None):
    """The calls that test (or time) ``impl``, from what its record declares.

    ``sizes``: ``(B, Hq, Hkv, Nq, Nk)`` tuples, the caller's choice (tiny on a CPU, real
    on a GPU). The other axes default to the record's declarations: its dtypes (those of
    :meth:`~Implementation.dtypes_for` ``interpreter``: this machine by default, ``False``
    for a GPU),
    :meth:`~Implementation.example_head_dims`, :meth:`~Implementation.settings` (no mask
    and each alignment) and :data:`LAYOUTS`. A caller may narrow an axis by passing
    values; a value the record does not declare is dropped, never tried.

    ``cover="all"``: every combination of every size with every axis value.
    ``cover="pairs"``: every pair of values of two axes (dtype with head dim, head dim
    with causal setting, ...) appears at least once, each combination takes the next
    size that fits it, and every size is used at least once: far fewer calls than the
    product, for real sizes on a GPU.

    A case is kept only when the record declares it (GQA sizes for a record without
    ``gqa``, lengths that are not a multiple of ``multiple_of``, ``Nq > Nk`` for
    decoding are left out) and ``keep(case)`` (when given) is true. Raises
    ``ValueError`` when no size fits a declared value, so nothing declared goes
    untried silently."""
    rec = implementation(impl)
    if cover not in ("pairs", "all"):
        raise ValueError(f"cover must be 'pairs' or 'all', got {cover!r}")
    sizes = [tuple(s) for s in sizes]
    for s in sizes:
        if len(s) != 5 or not all(isinstance(x, int) and x >= 1 for x in s):
            raise ValueError(f"each size must be (B, Hq, Hkv, Nq, Nk) of positive ints, got {s}")
    if not sizes:
        raise ValueError("sizes must name at least one (B, Hq, Hkv, Nq, Nk)")
    pick = lambda given, declared: [x for x in (declared if given is None else given)  # noqa: E731
                                    if x in declared]
    axes = [pick(dtypes, rec.dtypes_for(interpreter)),
            [d for d in (rec.example_head_dims() if head_dims is None else head_dims)
             if rec.takes_head_dim(d)],
            pick(settings, rec.settings()),
            pick(layouts, LAYOUTS)]
    names = ("dtypes", "head dims", "causal settings", "layouts")
    for name, axis in zip(names, axes):
        if not axis:
            raise ValueError(f"{rec.name} declares none of the {name} asked for")

    def make(size, combo):
        c = Case(rec.name, *size, D=combo[1], dtype=combo[0], alignment=combo[2],
                 layout=combo[3])
        return c if rec.declares(c, interpreter) and (keep is None or keep(c)) else None

    out = []
    if cover == "all":
        for size in sizes:
            for combo in itertools.product(*axes):
                c = make(size, combo)
                if c is not None:
                    out.append(c)
    else:
        combos = _pairwise(axes)
        nxt, used = 0, set()
        for combo in combos:
            for t in range(len(sizes)):
                c = make(sizes[(nxt + t) % len(sizes)], combo)
                if c is not None:
                    out.append(c)
                    used.add(c.size)
                    nxt = (nxt + t + 1) % len(sizes)
                    break
        for size in sizes:                      # every size at least once
            if size in used:
                continue
            for t in range(len(combos)):
                c = make(size, combos[(len(out) + t) % len(combos)])
                if c is not None:
                    out.append(c)
                    used.add(size)
                    break
    for name, axis, get in zip(names, axes, (lambda c: c.dtype, lambda c: c.D,
                                             lambda c: c.alignment, lambda c: c.layout)):
        missing = [x for x in axis if x not in {get(c) for c in out}]
        if missing:
            raise ValueError(f"no size of {sizes} fits {rec.name} with {name} {missing}")
    return out
