"""Lessons 3 and 4: attention in plain PyTorch, from the naive reference to tiled
FlashAttention-1 and FlashAttention-2 forwards.

Shapes and defaults mirror ``torch.nn.functional.scaled_dot_product_attention``:

* ``q`` is ``(B, Hq, Nq, D)``; ``k`` and ``v`` are ``(B, Hkv, Nk, D)``; every option
  is keyword-only. ``Hkv == Hq`` is multi-head attention (MHA); with
  ``enable_gqa=True`` (as in SDPA), ``1 < Hkv < Hq`` is grouped-query attention (GQA)
  and ``Hkv == 1`` multi-query attention (MQA). Query head ``h`` reads key/value head
  ``h // group`` with ``group = Hq // Hkv``.
* ``is_causal=True`` masks the future. ``alignment="causal_upper_left"`` (the default,
  SDPA's ``is_causal``): query ``i`` sees keys ``j <= i``; ``"causal_lower_right"``
  (decoding, flash-attn): ``j <= i + Nk - Nq``. The pictures are in
  :mod:`course_utils.contract`, which validates every call.
* ``scale`` defaults to ``1 / sqrt(D)``.
* ``return_lse=True`` also returns the natural-log log-sum-exp of each score row,
  shape ``(B, Hq, Nq)``: float32 (float64 for float64 inputs).

Numerics: float16 / bfloat16 / float32 inputs are computed with float32
accumulators (float64 inputs with float64) and the output has the input dtype.
A row that sees no key at all (lower-right with ``Nq > Nk``) gives 0 and ``lse = -inf``.

The running state of one query row is ``(m, l, acc)``: the largest score seen,
the sum of ``exp(s - m)`` and the un-normalised weighted sum of value rows
``sum exp(s - m) v``. :func:`merge_states` combines two such states; it is
associative, which is why any tiling of the key axis gives the same answer.

The tiled functions never build an ``Nq x Nk`` score matrix: only ``Br x Bc``
tiles. Passing a :class:`TrafficCounter` makes them count the elements they move
between "HBM" (the full tensors) and "SRAM" (the tiles), so the lesson can put
measured traffic next to the formulas of :func:`traffic_formula`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from course_utils.contract import AttentionShape, validate_attention
from course_utils.tracker import AllocationTracker  # noqa: F401  (lessons 3-5 import it here)
from course_utils.constants import CAUSAL_LOWER_RIGHT, CAUSAL_UPPER_LEFT  # noqa: F401

__all__ = [
    "AttentionShape", "validate_attention_inputs", "naive_attention",
    "flash_attention_fa1", "flash_attention_fa2", "block_sizes_from_sram",
    "AttentionState", "merge_states", "state_from_scores", "finalize_state",
    "TrafficCounter", "traffic_formula", "tile_schedule", "visible_tile",
    "tolerance_for", "DEFAULT_BLOCK", "AllocationTracker", "fa2_variant",
    "check_attention_fn", "CAUSAL_UPPER_LEFT", "CAUSAL_LOWER_RIGHT",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Default tile sizes: big enough that the Python loop over tiles stays short on a
# CPU, small enough that long sequences are really tiled.
DEFAULT_BLOCK = 64

# --------------------------------------------------------------------------- inputs
def validate_attention_inputs(q, k, v, *, is_causal=False, scale=None, enable_gqa=False,
                              alignment=None, impl="naive") -> AttentionShape:
    """Check ``q``, ``k``, ``v`` and the options before any work: the course's one
    validator, :func:`course_utils.contract.validate_attention`. Returns an
    :class:`~course_utils.contract.AttentionShape`."""
    return validate_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                              alignment=alignment, impl=impl)


def _check_block(name, value):
    if value is None:
        return DEFAULT_BLOCK
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int (rows or columns per tile) or None, "
                        f"got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int (rows or columns per tile), "
                         f"got {value}")
    return value


def _work_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grouped(q, shape):
    """View q as (B, Hkv, group, Nq, D): query head h = kv_head * group + g, so
    kv_head = h // group, and one K/V tile broadcasts over the group."""
    return q.reshape(shape.B, shape.Hkv, shape.group, shape.Nq, shape.D)


# --------------------------------------------------------------------------- reference
def naive_attention(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, alignment=None,
                    return_lse=False):
    """Textbook attention: build the full ``Nq x Nk`` score matrix, softmax it,
    multiply by ``V``. The reference every other implementation is checked against.
    Its memory grows as ``Nq * Nk``, which is what lesson 4 is about."""
    sh = validate_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                            alignment=alignment, impl="naive")
    work = _work_dtype(q.dtype)
    qg = _grouped(q.to(work), sh)                        # (B, Hkv, G, Nq, D)
    kk = k.to(work)[:, :, None]                          # (B, Hkv, 1, Nk, D)
    vv = v.to(work)[:, :, None]
    s = (qg @ kk.transpose(-1, -2)) * sh.scale           # (B, Hkv, G, Nq, Nk)
    if sh.is_causal:
        rows = torch.arange(sh.Nq, device=q.device)[:, None]
        cols = torch.arange(sh.Nk, device=q.device)[None, :]
        s = s.masked_fill(cols > rows + sh.offset, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - _safe(lse)[..., None])          # a row with no key: p = 0, not NaN
    o = (p @ vv).reshape(sh.B, sh.Hq, sh.Nq, sh.D).to(q.dtype)
    if return_lse:
        return o, lse.reshape(sh.B, sh.Hq, sh.Nq)
    return o


# --------------------------------------------------------------------------- the state
@dataclass
class AttentionState:
    """Partial softmax-attention state of some query rows over a subset of keys.

    ``m``: the largest score seen (``-inf`` if none), ``l``: ``sum exp(s - m)``,
    ``acc``: ``sum exp(s - m) v`` (not normalised); ``m`` and ``l`` have shape
    ``(..., N)`` and ``acc`` ``(..., N, D)``. The output is ``acc / l`` and the
    log-sum-exp ``m + log(l)``."""
    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 (the papers' name)
    acc: torch.Tensor

    @property
    def output(self):
        return self.acc / self.l[..., None]

    @property
    def lse(self):
        return self.m + torch.log(self.l)


def _nonzero(l):
    # l = 0 only in a row that has seen no key: its acc is 0 too, and 0 / 1 = 0
    return torch.where(l == 0, torch.ones_like(l), l)


def _safe(m):
    # exp(x - m) with m = -inf would give NaN; a row that has seen nothing keeps
    # l = 0 and acc = 0 whatever finite shift we use, so shift by 0.
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def merge_states(a: AttentionState, b: AttentionState) -> AttentionState:
    """Combine the states of two disjoint key subsets of the same query rows.

    ``m = max(ma, mb)``; both sides are rescaled by ``exp(m_side - m)`` (always
    <= 1, so nothing overflows) and added. Associative and commutative."""
    if not (isinstance(a, AttentionState) and isinstance(b, AttentionState)):
        raise TypeError(f"merge_states takes two AttentionState, got {type(a).__name__} and "
                        f"{type(b).__name__}")
    if a.m.shape != b.m.shape or a.acc.shape != b.acc.shape or a.l.shape != a.m.shape:
        raise ValueError(f"both states must have m, l of one shape and acc of one shape, got "
                         f"m {tuple(a.m.shape)}/{tuple(b.m.shape)}, "
                         f"acc {tuple(a.acc.shape)}/{tuple(b.acc.shape)}")
    m = torch.maximum(a.m, b.m)
    ms = _safe(m)
    ca = torch.exp(a.m - ms)
    cb = torch.exp(b.m - ms)
    return AttentionState(m=m, l=a.l * ca + b.l * cb,
                          acc=a.acc * ca[..., None] + b.acc * cb[..., None])


def state_from_scores(s, v) -> AttentionState:
    """The state of one tile: scores ``s`` (..., N, n) (``-inf`` where masked) and
    the tile's value rows ``v`` (..., n, D)."""
    m = s.amax(dim=-1)
    p = torch.exp(s - _safe(m)[..., None])
    return AttentionState(m=m, l=p.sum(dim=-1), acc=p @ v)


def finalize_state(state: AttentionState):
    """``(o, lse)`` of a state that has seen every key."""
    return state.output, state.lse


# --------------------------------------------------------------------------- block sizes
def block_sizes_from_sram(M, d, rounding="floor"):
    """Tile sizes ``(Br, Bc)`` from an on-chip memory of ``M`` floats and head dim ``d``,
    as in FlashAttention-1's Algorithm 1: ``Bc = M / (4 d)`` and ``Br = min(Bc, d)``.

    The factor 4: a ``Bc x d`` tile of each of K and V and a ``Br x d`` tile of each
    of Q and O share the memory, a quarter each when ``Br = Bc``. The cap ``Br <= d``
    is for the fifth tile, the ``Br x Bc`` scores ``S_ij``: it bounds them by
    ``d * Bc <= M / 4`` numbers whatever ``d``; uncapped, ``(M / 4d)**2`` exceeds ``M``
    once ``M > 16 d**2``. The rule is a budget up to a constant (at worst the five
    tiles need ``1.25 M``), which is what the paper's O(M) analysis needs.

    The paper writes the ceiling, yet its example (M = 59, d = 3) uses Bc = 4, which
    is the floor (ceil(59 / 12) = 5). With the ceiling the four operand tiles still
    fit (2*5*3 + 2*3*3 = 48 <= 59) but the score tile does not (48 + 15 = 63 > 59);
    with the floor all five do (42 + 12 = 54). So the default rounds down, and
    ``rounding="ceil"`` gives the paper's literal formula."""
    for name, x in (("M", M), ("d", d)):
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"{name} must be a positive int, got {type(x).__name__}")
        if x <= 0:
            raise ValueError(f"{name} must be a positive int, got {x}")
    if rounding not in ("floor", "ceil"):
        raise ValueError(f"rounding must be 'floor' or 'ceil', got {rounding!r}")
    if rounding == "floor":
        bc = M // (4 * d)
        if bc < 1:
            raise ValueError(f"M={M} floats cannot hold four tiles of one row of d={d}; "
                             f"M must be at least 4 * d = {4 * d}")
    else:
        bc = -(-M // (4 * d))
    return min(bc, d), bc


# --------------------------------------------------------------------------- traffic
@dataclass
class TrafficCounter:
    """Elements moved between HBM (full tensors) and SRAM (tiles), per tensor name.

    The tiled forwards call :meth:`read` when a tile is loaded and :meth:`write`
    when one is stored. Counts are elements (not bytes), summed over batch and
    query heads; a K/V tile is counted once per query head that loads it, as one
    program per query head would."""
    reads: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)
    tiles_visited: int = 0
    tiles_skipped: int = 0

    def read(self, name, n):
        self.reads[name] = self.reads.get(name, 0) + int(n)

    def write(self, name, n):
        self.writes[name] = self.writes.get(name, 0) + int(n)

    def reset(self):
        self.reads.clear()
        self.writes.clear()
        self.tiles_visited = self.tiles_skipped = 0

    @property
    def total_reads(self):
        return sum(self.reads.values())

    @property
    def total_writes(self):
        return sum(self.writes.values())

    @property
    def total(self):
        return self.total_reads + self.total_writes

    def as_dict(self, names=("Q", "K", "V", "O", "l", "m", "lse")):
        """``{"Q reads": .., "Q writes": .., ...}`` for every tensor in ``names`` (default:
        the forward's; the backward's are ``course_utils.backward.BACKWARD_TENSORS``), in
        that order: the one traffic format of the formulas and the widgets."""
        out = {}
        for name in names:
            out[f"{name} reads"] = self.reads.get(name, 0)
            out[f"{name} writes"] = self.writes.get(name, 0)
        return out


def visible_tile(i, j, Br, Bc, Nq, is_causal, *, offset=0):
    """True when query tile ``i`` must look at key tile ``j``: always without a mask;
    with a causal mask, when the tile's first key ``j*Bc`` is at most the last key its
    last query row sees, ``min((i+1)*Br, Nq) - 1 + offset`` (absolute indices;
    ``offset`` is 0 for upper-left, ``Nk - Nq`` for lower-right alignment)."""
    if not is_causal:
        return True
    return j * Bc <= min((i + 1) * Br, Nq) - 1 + offset


def tile_schedule(order, Nq, Nk, Br, Bc, is_causal=False):
    """The (i, j, visible) triples in the order an implementation visits them:
    ``"fa2"`` query tile outer, ``"fa1"`` key/value tile outer."""
    if order not in ("fa1", "fa2"):
        raise ValueError(f"order must be 'fa1' or 'fa2', got {order!r}")
    for name, x in (("Nq", Nq), ("Nk", Nk), ("Br", Br), ("Bc", Bc)):
        _check_block(name, x)
    tr, tc = -(-Nq // Br), -(-Nk // Bc)
    pairs = ([(i, j) for i in range(tr) for j in range(tc)] if order == "fa2"
             else [(i, j) for j in range(tc) for i in range(tr)])
    return [(i, j, visible_tile(i, j, Br, Bc, Nq, is_causal)) for i, j in pairs]


def traffic_formula(order, Nq, Nk, D, Br, Bc, *, B=1, H=1, is_causal=False,
                    return_lse=False):
    """HBM elements each tiled forward moves, from the lesson's formulas.

    With ``Tr = ceil(Nq / Br)`` query tiles and ``Tc = ceil(Nk / Bc)`` key tiles, per
    query head and without a mask:

    ======  =========================  ===================================
    tensor  FA2 (query tile outer)     FA1 (key/value tile outer)
    ======  =========================  ===================================
    Q read  ``Nq D``                   ``Tc Nq D``
    K read  ``Tr Nk D``                ``Nk D``
    V read  ``Tr Nk D``                ``Nk D``
    O read  0                          ``Tc Nq D``
    O write ``Nq D``                   ``(Tc + 1) Nq D`` (zero-fill + each step)
    l, m    --                         ``Tc Nq`` reads, ``(Tc + 1) Nq`` writes each
    ======  =========================  ===================================

    With ``return_lse`` FA2 writes ``Nq`` more; FA1 reads ``l`` and ``m`` once more
    and writes ``Nq``. With the causal mask, only visible tile pairs count.
    Returns the same dict as :meth:`TrafficCounter.as_dict`, summed over ``B * H``.
    """
    if order not in ("fa1", "fa2"):
        raise ValueError(f"order must be 'fa1' or 'fa2', got {order!r}")
    for name, x in (("Nq", Nq), ("Nk", Nk), ("D", D), ("Br", Br), ("Bc", Bc), ("B", B), ("H", H)):
        _check_block(name, x)
    tr, tc = -(-Nq // Br), -(-Nk // Bc)
    rows = lambda i: min(Br, Nq - i * Br)   # noqa: E731
    cols = lambda j: min(Bc, Nk - j * Bc)   # noqa: E731
    r = dict.fromkeys(("Q", "K", "V", "O", "l", "m", "lse"), 0)
    w = dict(r)
    if not is_causal:
        # the closed forms of the table
        if order == "fa2":
            r["Q"], r["K"], r["V"], w["O"] = Nq * D, tr * Nk * D, tr * Nk * D, Nq * D
        else:
            r["Q"] = r["O"] = tc * Nq * D
            r["K"] = r["V"] = Nk * D
            w["O"] = (tc + 1) * Nq * D
            r["l"] = r["m"] = tc * Nq
            w["l"] = w["m"] = (tc + 1) * Nq
    else:
        vis = [(i, j) for i, j, ok in tile_schedule(order, Nq, Nk, Br, Bc, True) if ok]
        if order == "fa2":
            r["Q"], w["O"] = Nq * D, Nq * D
            r["K"] = r["V"] = sum(cols(j) for _, j in vis) * D
        else:
            r["K"] = r["V"] = sum(cols(j) for j in {j for _, j in vis}) * D
            n = sum(rows(i) for i, _ in vis)
            r["Q"] = r["O"] = n * D
            w["O"] = Nq * D + n * D
            r["l"] = r["m"] = n
            w["l"] = w["m"] = Nq + n
    if return_lse:
        w["lse"] = Nq
        if order == "fa1":
            r["l"] += Nq
            r["m"] += Nq
    out = {}
    for name in r:
        out[f"{name} reads"] = r[name] * B * H
        out[f"{name} writes"] = w[name] * B * H
    return out


# --------------------------------------------------------------------------- tiled forwards
def _prepare(q, k, v, is_causal, scale, Br, Bc, counter, enable_gqa=False, alignment=None,
             impl="fa2"):
    sh = validate_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                            alignment=alignment, impl=impl)
    Br = _check_block("Br", Br)
    Bc = _check_block("Bc", Bc)
    if counter is not None and not isinstance(counter, TrafficCounter):
        raise TypeError(f"counter must be a TrafficCounter or None, got {type(counter).__name__}")
    return sh, Br, Bc


def _tile_scores(q_tile, k_tile, scale, i0, j0, is_causal, offset=0):
    """Scores of one tile, ``(B, Hkv, G, rows, cols)``, masked with absolute
    positions: row r of the tile is query ``i0 + r``, column c is key ``j0 + c``."""
    s = (q_tile @ k_tile.transpose(-1, -2)) * scale
    if is_causal:
        rows = i0 + torch.arange(s.shape[-2], device=s.device)[:, None]
        cols = j0 + torch.arange(s.shape[-1], device=s.device)[None, :]
        s = s.masked_fill(cols > rows + offset, float("-inf"))
    return s


def flash_attention_fa2(q, k, v, *, is_causal=False, scale=None, enable_gqa=False,
                        alignment=None, Br=None, Bc=None, return_lse=False, counter=None):
    """FlashAttention-2 forward: the outer loop walks query tiles, the inner loop
    streams key/value tiles past a running state ``(m, l, acc)`` that stays
    "on chip"; each output tile is normalised once and written once.

    ``Br`` query rows and ``Bc`` keys per tile (default :data:`DEFAULT_BLOCK`).
    With ``counter`` (a :class:`TrafficCounter`) the HBM traffic is counted."""
    sh, Br, Bc = _prepare(q, k, v, is_causal, scale, Br, Bc, counter, enable_gqa, alignment,
                          "fa2")
    is_causal, off = sh.is_causal, sh.offset
    work = _work_dtype(q.dtype)
    qg = _grouped(q, sh)
    heads = sh.B * sh.Hq
    o = torch.empty_like(q)
    og = _grouped(o, sh)
    lse = torch.empty(sh.B, sh.Hkv, sh.group, sh.Nq, dtype=work, device=q.device)
    for i0 in range(0, sh.Nq, Br):
        i1 = min(i0 + Br, sh.Nq)
        q_tile = qg[..., i0:i1, :].to(work)                          # load Q_i
        if counter is not None:
            counter.read("Q", heads * (i1 - i0) * sh.D)
        m = torch.full(q_tile.shape[:-1], float("-inf"), dtype=work, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        for j0 in range(0, sh.Nk, Bc):
            j1 = min(j0 + Bc, sh.Nk)
            if is_causal and j0 > i1 - 1 + off:
                # every key of this tile lies after every query row: skip, no loads
                if counter is not None:
                    counter.tiles_skipped += 1
                continue
            k_tile = k[:, :, None, j0:j1].to(work)                    # load K_j
            v_tile = v[:, :, None, j0:j1].to(work)                    # load V_j
            if counter is not None:
                counter.read("K", heads * (j1 - j0) * sh.D)
                counter.read("V", heads * (j1 - j0) * sh.D)
                counter.tiles_visited += 1
            s = _tile_scores(q_tile, k_tile, sh.scale, i0, j0, is_causal, off)
            m_new = torch.maximum(m, s.amax(dim=-1))
            ms = _safe(m_new)
            p = torch.exp(s - ms[..., None])
            alpha = torch.exp(m - ms)                                 # rescale the old state
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v_tile
            m = m_new
        og[..., i0:i1, :] = (acc / _nonzero(l)[..., None]).to(q.dtype)  # store O_i once
        lse[..., i0:i1] = m + torch.log(l)
        if counter is not None:
            counter.write("O", heads * (i1 - i0) * sh.D)
            if return_lse:
                counter.write("lse", heads * (i1 - i0))
    if return_lse:
        return o, lse.reshape(sh.B, sh.Hq, sh.Nq)
    return o


def flash_attention_fa1(q, k, v, *, is_causal=False, scale=None, enable_gqa=False,
                        alignment=None, Br=None, Bc=None, return_lse=False, counter=None):
    """FlashAttention-1 forward (Algorithm 1 of the paper): the outer loop walks
    key/value tiles, which stay "on chip"; the inner loop walks query tiles and
    round-trips each one's ``O``, ``l`` and ``m`` through "HBM" at every step.
    ``O`` in HBM is kept normalised after every step, as in the paper.

    Same arguments and result as :func:`flash_attention_fa2`."""
    sh, Br, Bc = _prepare(q, k, v, is_causal, scale, Br, Bc, counter, enable_gqa, alignment,
                          "fa1")
    is_causal, off = sh.is_causal, sh.offset
    work = _work_dtype(q.dtype)
    qg = _grouped(q, sh)
    heads = sh.B * sh.Hq
    # "HBM" buffers of Algorithm 1, line 2: O = 0, l = 0, m = -inf
    o_hbm = torch.zeros(sh.B, sh.Hkv, sh.group, sh.Nq, sh.D, dtype=work, device=q.device)
    l_hbm = torch.zeros(sh.B, sh.Hkv, sh.group, sh.Nq, dtype=work, device=q.device)
    m_hbm = torch.full_like(l_hbm, float("-inf"))
    if counter is not None:
        counter.write("O", heads * sh.Nq * sh.D)
        counter.write("l", heads * sh.Nq)
        counter.write("m", heads * sh.Nq)
    for j0 in range(0, sh.Nk, Bc):
        j1 = min(j0 + Bc, sh.Nk)
        if is_causal and j0 > sh.Nq - 1 + off:
            if counter is not None:
                counter.tiles_skipped += -(-sh.Nq // Br)
            continue
        k_tile = k[:, :, None, j0:j1].to(work)                        # load K_j, V_j once
        v_tile = v[:, :, None, j0:j1].to(work)
        if counter is not None:
            counter.read("K", heads * (j1 - j0) * sh.D)
            counter.read("V", heads * (j1 - j0) * sh.D)
        for i0 in range(0, sh.Nq, Br):
            i1 = min(i0 + Br, sh.Nq)
            if is_causal and j0 > i1 - 1 + off:
                if counter is not None:
                    counter.tiles_skipped += 1
                continue
            q_tile = qg[..., i0:i1, :].to(work)                      # load Q_i, O_i, l_i, m_i
            o_i = o_hbm[..., i0:i1, :]
            l_i = l_hbm[..., i0:i1]
            m_i = m_hbm[..., i0:i1]
            if counter is not None:
                n = heads * (i1 - i0)
                counter.read("Q", n * sh.D)
                counter.read("O", n * sh.D)
                counter.read("l", n)
                counter.read("m", n)
                counter.tiles_visited += 1
            s = _tile_scores(q_tile, k_tile, sh.scale, i0, j0, is_causal, off)
            m_t = s.amax(dim=-1)                                      # tile max m~_ij
            p = torch.exp(s - _safe(m_t)[..., None])                  # P~_ij
            l_t = p.sum(dim=-1)                                       # l~_ij
            m_new = torch.maximum(m_i, m_t)
            ms = _safe(m_new)
            a_old = torch.exp(m_i - ms)
            a_new = torch.exp(m_t - ms)
            l_new = a_old * l_i + a_new * l_t
            o_new = ((l_i * a_old)[..., None] * o_i + a_new[..., None] * (p @ v_tile)) \
                / _nonzero(l_new)[..., None]
            o_hbm[..., i0:i1, :] = o_new                              # write O_i, l_i, m_i
            l_hbm[..., i0:i1] = l_new
            m_hbm[..., i0:i1] = m_new
            if counter is not None:
                counter.write("O", n * sh.D)
                counter.write("l", n)
                counter.write("m", n)
    o = o_hbm.reshape(sh.B, sh.Hq, sh.Nq, sh.D).to(q.dtype)
    if return_lse:
        if counter is not None:
            counter.read("l", heads * sh.Nq)
            counter.read("m", heads * sh.Nq)
            counter.write("lse", heads * sh.Nq)
        lse = (m_hbm + torch.log(l_hbm)).reshape(sh.B, sh.Hq, sh.Nq)
        return o, lse
    return o


# --------------------------------------------------------------------------- tolerances
def tolerance_for(dtype):
    """``(atol, rtol)`` the course uses to compare an attention output of ``dtype``
    with SDPA or :func:`naive_attention` (computed from the same inputs), in PyTorch:
    :func:`course_utils.checks.tolerance` with ``op="attention"``.

    float32: both sides accumulate in float32 in a different order, errors are a
    few 1e-7 relative; float16 / bfloat16: the output itself is rounded to 11 / 8
    significant bits (unit roundoff about 5e-4 / 4e-3)."""
    from course_utils.checks import tolerance
    return tolerance(dtype, device="cpu", op="attention")


# --------------------------------------------------------------------------- BREAK IT
def fa2_variant(q, k, v, Br=None, Bc=None, *, subtract_max=True, rescale=True,
                compute_dtype=None, trace=None):
    """The FA2 forward (no mask) with its two safety pieces as switches, for the
    BREAK IT experiments of lesson 4.

    ``subtract_max=False``: tiles use ``exp(s)`` with no shift and nothing is
    rescaled (the running max is gone altogether). ``rescale=False``: each tile is
    shifted by its own max, but the old ``l`` and ``acc`` are added without the
    factor ``exp(m_old - m_new)``. ``compute_dtype`` (default float32) is the dtype
    the exponentials and sums are computed in: pass ``torch.float16`` to see fp16
    overflow. ``trace``, a list, receives one dict per tile: ``i``, ``j``,
    ``max_s``, ``max_p``, ``max_l`` and ``p_inf`` / ``l_inf`` / ``acc_nan``."""
    sh, Br, Bc = _prepare(q, k, v, False, None, Br, Bc, None, enable_gqa=True)
    if trace is not None and not isinstance(trace, list):
        raise TypeError(f"trace must be a list or None, got {type(trace).__name__}")
    work = compute_dtype or _work_dtype(q.dtype)
    if work not in _FLOAT_DTYPES:
        raise TypeError(f"compute_dtype must be a floating torch dtype, got {work}")
    qg = _grouped(q, sh)
    o = torch.empty(sh.B, sh.Hkv, sh.group, sh.Nq, sh.D, dtype=q.dtype, device=q.device)
    for i0 in range(0, sh.Nq, Br):
        i1 = min(i0 + Br, sh.Nq)
        q_tile = qg[..., i0:i1, :].to(work)
        m = torch.full(q_tile.shape[:-1], float("-inf"), dtype=work, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        for j0 in range(0, sh.Nk, Bc):
            j1 = min(j0 + Bc, sh.Nk)
            s = (q_tile @ k[:, :, None, j0:j1].to(work).transpose(-1, -2)) * sh.scale
            v_tile = v[:, :, None, j0:j1].to(work)
            if not subtract_max:
                p = torch.exp(s)
                l = l + p.sum(dim=-1)
                acc = acc + p @ v_tile
            elif not rescale:
                m = s.amax(dim=-1)
                p = torch.exp(s - m[..., None])
                l = l + p.sum(dim=-1)
                acc = acc + p @ v_tile
            else:
                m_new = torch.maximum(m, s.amax(dim=-1))
                p = torch.exp(s - m_new[..., None])
                alpha = torch.exp(m - m_new)
                l = alpha * l + p.sum(dim=-1)
                acc = alpha[..., None] * acc + p @ v_tile
                m = m_new
            if trace is not None:
                trace.append({"i": i0 // Br, "j": j0 // Bc, "max_s": float(s.max()),
                              "max_p": float(p.max()), "max_l": float(l.max()),
                              "p_inf": bool(torch.isinf(p).any()),
                              "l_inf": bool(torch.isinf(l).any()),
                              "acc_nan": bool(torch.isnan(acc).any())})
        o[..., i0:i1, :] = (acc / l[..., None]).to(q.dtype)
    return o.reshape(sh.B, sh.Hq, sh.Nq, sh.D)


# --------------------------------------------------------------------------- checks
def check_attention_fn(fn, *, is_causal=False, gqa=False, name="your attention",
                       quiet=False, **kwargs):
    """Run a learner's ``fn(q, k, v, **kwargs)`` (plus ``is_causal=True`` when asked)
    on a few shapes, including lengths that are not multiples of a tile, and
    compare with :func:`naive_attention`. The hint names the likely mistake."""
    from course_utils.checks import check_close, check_shape
    cases = [(1, 2, 2, 37, 37, 8), (2, 2, 2, 5, 70, 4), (1, 1, 1, 1, 9, 4)]
    if gqa:
        cases += [(1, 8, 2, 20, 29, 4), (1, 4, 1, 13, 13, 8)]
    g = torch.Generator().manual_seed(1234)
    for b, hq, hkv, nq, nk, d in cases:
        q = torch.randn(b, hq, nq, d, generator=g)
        k = torch.randn(b, hkv, nk, d, generator=g) * 2.0
        v = torch.randn(b, hkv, nk, d, generator=g)
        args = dict(kwargs)
        if is_causal:
            args["is_causal"] = True
        out = fn(q, k, v, **args)
        label = f"{name} (B={b}, Hq={hq}, Hkv={hkv}, Nq={nq}, Nk={nk}, D={d})"
        check_shape(out, tuple(q.shape), name=label, quiet=True,
                    hint="the output has q's shape (B, Hq, Nq, D)")
        ref = naive_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
        hint = _diagnose(out, q, k, v, is_causal)
        check_close(out, ref, atol=1e-5, rtol=1e-5, name=label, hint=hint, quiet=True)
    if not quiet:
        print(f"ok: {name} matches naive attention on {len(cases)} shapes")


def _diagnose(out, q, k, v, is_causal):
    """Guess the mistake behind a wrong attention output."""
    out = out.detach().float()
    if torch.isnan(out).any() or torch.isinf(out).any():
        return ("the output has NaN/inf: is the running max m initialised to -inf and "
                "subtracted before exp? Does a fully masked tile divide 0 by 0?")
    if is_causal:
        plain = naive_attention(q, k, v, is_causal=False, enable_gqa=True)
        if torch.allclose(out, plain, atol=1e-5, rtol=1e-5):
            return "the output ignores the causal mask"
        return ("if only rows after the first query tile are wrong, the mask uses tile-relative "
                "indices: compare i0 + r with j0 + c (absolute positions), not r with c")
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        g = hq // hkv
        wrong = torch.arange(hq) % hkv
        alt = naive_attention(q, k[:, wrong], v[:, wrong], enable_gqa=True)
        if torch.allclose(out, alt, atol=1e-5, rtol=1e-5) and g > 1:
            return "query head h must read kv head h // (Hq // Hkv), not h % Hkv"
    return ("the values are off: when the running max grows, are both l and the accumulator "
            "multiplied by exp(m_old - m_new)? Is the output divided by l once at the end?")
