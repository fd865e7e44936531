"""Checks shared by the problem sets of lessons 0-4, built on :mod:`course_utils.guards`.

Every failure is raised *while the answer runs* where it is about how the answer works
(a forbidden call, a second pass, work on tiles a causal loop must skip, an ``Nq x Nk``
tensor), so ``course-grade``, which replays each recorded call and what it raised, gives
the same verdict as the learner's own notebook.

* :func:`seal` / :func:`check_sealed` - compare a value with one the check cell does not
  show (a digest), so a visible check never holds the answer, and a failure never
  prints it.
* :func:`flop_budget` - fail as soon as an answer has spent more matrix-product FLOPs
  than the work the exercise allows (a causal loop that skips nothing).
* :func:`single_pass` - fail as soon as an answer reads a tensor a second time, or reads
  more than one element of it in one operation (a one-pass loop over the elements).
* :func:`check_attention_case` - one case of a tiled attention exercise: fresh inputs,
  a float64 reference computed first, the library's attention forbidden, no ``Nq x Nk``
  tensor nor the scores of a query tile against more keys than one key tile, key tiles
  after the diagonal poisoned and their FLOPs not allowed, NaN/inf failing, then the
  comparison.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import sys
import tracemalloc

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from course_utils import guards
from course_utils.checks import CheckFailed, check_close, check_shape

__all__ = ["seal", "check_sealed", "flop_budget", "single_pass", "attention_reference",
           "fa1_walk_reference", "check_fa1_walk", "run_one_pass",
           "check_attention_case", "causal_flops"]

_SALT = "course-flash-attention"


# ---------------------------------------------------------------------------------------
# Sealed expected values
# ---------------------------------------------------------------------------------------

def _canon(value, tol):
    if isinstance(value, bool):
        return [f"b:{value}"]
    if isinstance(value, int) and tol is None:
        return [f"i:{value}"]
    if isinstance(value, (int, float)):
        if tol is None:
            return [f"f:{float(value)!r}"]
        if not math.isfinite(value):
            return [f"f:{value}"]
        q = round(float(value) / tol)
        return [f"q:{tol!r}:{q + d}" for d in (-1, 0, 1)]
    if isinstance(value, str):
        return [f"s:{value.strip().lower()}"]
    if isinstance(value, (tuple, list)):
        parts = [_canon(v, tol)[len(_canon(v, tol)) // 2] for v in value]
        return ["t:" + "|".join(parts)]
    if isinstance(value, dict):
        parts = [f"{k}={_canon(value[k], tol)[len(_canon(value[k], tol)) // 2]}"
                 for k in sorted(value, key=str)]
        return ["d:" + "|".join(parts)]
    raise TypeError(f"cannot seal a {type(value).__name__}")


def seal(value, tol: float | None = None) -> str:
    """A digest of ``value`` (int, float, str, bool, or tuples/lists/dicts of them).
    Floats are sealed on a grid of ``tol`` so that :func:`check_sealed` accepts
    anything within about ``tol``."""
    text = _canon(value, tol)[len(_canon(value, tol)) // 2]
    return hashlib.sha256((_SALT + text).encode()).hexdigest()[:20]


def check_sealed(actual, sealed: str, *, name: str = "answer", tol: float | None = None,
                 kind: type | tuple | None = None, choices=None, hint: str | None = None,
                 quiet: bool = False):
    """Check ``actual`` against a value sealed with :func:`seal`, never showing it.
    ``kind`` is the type expected (a wrong type fails with what was expected);
    ``choices`` lists the allowed answers (anything else fails with the list)."""
    if choices is not None and actual not in list(choices):
        raise CheckFailed(f"{name}: {actual!r} is not one of the allowed answers {list(choices)!r}")
    if kind is not None:
        if kind in (int, float) or kind == (int, float):
            ok = isinstance(actual, (int, float)) and not isinstance(actual, bool)
            if kind is int:
                ok = isinstance(actual, int) and not isinstance(actual, bool)
        else:
            ok = isinstance(actual, kind)
        if not ok:
            want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            article = "an" if want[0] in "aeiou" else "a"
            raise CheckFailed(f"{name}: expected {article} {want}, got {type(actual).__name__} "
                              f"({actual!r})")
    if isinstance(actual, torch.Tensor):
        raise CheckFailed(f"{name}: expected a Python number, got a tensor; use .item()")
    try:
        cands = _canon(actual, tol)
    except TypeError:
        raise CheckFailed(f"{name}: expected a number, text or a dict of them, got "
                          f"{type(actual).__name__}") from None
    ok = any(hashlib.sha256((_SALT + c).encode()).hexdigest()[:20] == sealed for c in cands)
    if not ok:
        raise CheckFailed(f"{name}: {actual!r} is not right." + (f"\n  hint: {hint}" if hint else ""))
    if not quiet:
        print(f"ok: {name}")


# ---------------------------------------------------------------------------------------
# How an answer works: FLOPs, passes
# ---------------------------------------------------------------------------------------

_MM = {"mm": None, "bmm": None, "addmm": None, "baddbmm": None, "matmul": None, "dot": None,
       "mv": None, "addmv": None, "addbmm": None}


def _mm_flops(base, args, out) -> int:
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    if not outs:
        return 0
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if base in ("addmm", "baddbmm", "addmv", "addbmm"):
        tensors = tensors[1:]
    if not tensors:
        return 0
    inner = tensors[0].shape[-1] if tensors[0].dim() else 1
    return 2 * outs[0].numel() * int(inner)


class _FlopBudget(TorchDispatchMode):
    def __init__(self, limit, message):
        super().__init__()
        self.limit, self.message, self.spent = limit, message, 0

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        base = guards._aten_base(func)
        if base in _MM:
            self.spent += _mm_flops(base, args, out)
        if self.spent > self.limit:
            raise CheckFailed(self.message.format(spent=self.spent, limit=self.limit))
        return out


@contextlib.contextmanager
def flop_budget(limit: int, message: str):
    """Fail (inside the answer) once its matrix products exceed ``limit`` FLOPs.
    ``message`` may use ``{spent}`` and ``{limit}``."""
    mode = _FlopBudget(int(limit), message)
    with mode:
        yield mode


class _NoCopyOut(TorchFunctionMode):
    def __init__(self, x, name):
        super().__init__()
        self.x, self.name = x, name

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        fname = getattr(func, "__name__", "")
        if fname in ("tolist", "numpy", "__array__") \
                and args and isinstance(args[0], torch.Tensor) and args[0].numel() > 1 and \
                _shares(args[0], self.x) and not _from_grader():
            raise CheckFailed(f"{self.name}: your function copied the whole input out at once "
                              f"(.{fname}()); this exercise is one loop over the elements, each "
                              "read once.")
        return func(*args, **(kwargs or {}))


def _from_grader() -> bool:
    """True when the op comes from the grader's recorder (it copies a call's arguments
    before and after the call), not from the answer: the first frame outside torch and
    this module decides."""
    f = sys._getframe(2)
    for _ in range(60):
        if f is None:
            return False
        mod = str(f.f_globals.get("__name__", ""))
        if not (mod == "torch" or mod.startswith("torch.") or mod == __name__
                or mod in ("contextlib", "course_utils.guards")):
            return mod.startswith("course_utils.grading")
        f = f.f_back
    return False


def _shares(t, x) -> bool:
    try:
        return t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001
        return False


_VIEWS = {"unbind", "select", "slice", "alias", "view", "as_strided", "detach", "expand",
          "unsqueeze", "squeeze", "reshape", "_reshape_alias", "t", "transpose", "permute",
          "split", "split_with_sizes", "chunk", "narrow", "lift_fresh", "_unsafe_view",
          "unfold"}
# new tensors shaped or typed like the input: they read its shape and dtype, none of its
# elements (x.new_zeros(()) for a running sum, torch.full_like(x[0], -inf) for a max)
_METADATA_ONLY = {"new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided",
                  "empty_like", "zeros_like", "ones_like", "full_like"}


def _held_by_answer() -> int:
    """Bytes of live Python allocations traced by ``tracemalloc`` that were made outside
    torch and the course (torch's own caches while it dispatches are not the answer's)."""
    import os
    skip = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, guards)) + \
        (tracemalloc.__file__,)
    snap = tracemalloc.take_snapshot()
    return sum(t.size for t in snap.traces if not t.traceback[0].filename.startswith(skip))


# how many earlier elements an answer may read again between two new ones: the running
# max kept as a view of the element it came from (a second pass reads them all again)
_HELD_REREADS = 2


class _SinglePass(TorchDispatchMode):
    def __init__(self, x, name, max_state_bytes=None):
        super().__init__()
        self.ptr = x.untyped_storage().data_ptr()
        self.base, self.item, self.n = x.storage_offset(), x.element_size(), x.numel()
        self.high, self.name = -1, name
        # earlier elements read again since the last new one (at most _HELD_REREADS of them)
        self.held = set()
        # Python memory held at the first read; what the answer holds beyond it grows with
        # the number of elements read only if it keeps them (a copy to go over again)
        self.max_state_bytes, self.held0 = max_state_bytes, None
        # measured a quarter of the way in (the first reads fill torch's and Python's
        # caches) and at the last element
        self.warm = self.n // 4
        self.marks = sorted({self.warm, self.n - 1})

    def _check_memory(self, at):
        if self.max_state_bytes is None or not tracemalloc.is_tracing() or \
                not self.marks or at < self.marks[0]:
            return
        while self.marks and at >= self.marks[0]:
            self.marks.pop(0)
        gc.collect()            # garbage awaiting the collector is not state
        now = _held_by_answer()
        if self.held0 is None:
            self.held0 = now
        elif now - self.held0 > self.max_state_bytes:
            raise CheckFailed(
                f"{self.name}: by element {at} of {self.n} your function held "
                f"{(now - self.held0) // 1024} KiB more than at element {self.warm}: it "
                "keeps the elements it has read (a list of copies, to go over them again). "
                "A one-pass algorithm keeps only a few running numbers, whatever the length.")

    def _span(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return None
        try:
            if t.untyped_storage().data_ptr() != self.ptr or t.numel() == 0:
                return None
        except Exception:  # noqa: BLE001
            return None
        lo = t.storage_offset()
        hi = lo + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        return lo - self.base, hi - self.base, t.numel()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        base = guards._aten_base(func)
        if base not in _VIEWS and base not in _METADATA_ONLY:
            for t in tree_flatten((args, kwargs or {}))[0]:
                span = self._span(t)
                if span is None:
                    continue
                lo, hi, n = span
                if _from_grader():
                    break
                if n > 1:
                    raise CheckFailed(
                        f"{self.name}: your function read {n} elements of the input in one "
                        f"operation (aten.{base}). This exercise is one loop: read each element "
                        "once, in order, and update the running values.")
                if lo < self.high:
                    if n == 1 and (lo in self.held or len(self.held) < _HELD_REREADS):
                        # an element read before, kept as running state (m = x[i] as the
                        # max so far): read again between two new elements, not a pass
                        self.held.add(lo)
                        continue
                    raise CheckFailed(
                        f"{self.name}: your function went back to element {lo} after reading "
                        f"element {self.high}: that is a second pass over the input. Keep a "
                        "running max and a running sum, and update both as each element arrives.")
                if hi > self.high:
                    self.held = set()
                self.high = max(self.high, hi)
                self._check_memory(lo)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def single_pass(x: torch.Tensor, name: str = "answer", max_state_bytes: int | None = None):
    """While active, reading ``x`` a second time, or more than one element of it in one
    operation, or copying it out whole, fails inside the answer (an element kept as running
    state, like a max that is a view of the element it came from, may be read again between
    two new elements). With ``max_state_bytes``,
    so does holding (in Python objects, traced by ``tracemalloc``) more than that many bytes
    beyond what was held at the read of element ``len(x) // 4``: the answer kept the
    elements it read. Give ``x`` enough elements that a copy of the last three quarters
    exceeds it."""
    reads = _SinglePass(x, name, max_state_bytes)
    tracing = max_state_bytes is not None and not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start()
    try:
        with _NoCopyOut(x, name), reads:
            yield
    finally:
        if tracing:
            tracemalloc.stop()


def run_one_pass(fn, x: torch.Tensor, *, forbid=(), exercise_id=None, asks=None,
                 name="answer", max_state_bytes: int | None = None):
    """Call ``fn(x)`` on a copy of the 1-D tensor ``x`` under :func:`single_pass` (with
    ``max_state_bytes``) and the ``forbid`` groups; fail if it changed its input. Returns
    ``fn``'s result."""
    if not callable(fn):
        raise CheckFailed(f"{name}: expected a function, got {type(fn).__name__}")
    xc = x.detach().clone()
    with single_pass(xc, name, max_state_bytes), \
            guards.forbid(*forbid, exercise=exercise_id, asks=asks):
        out = fn(xc)
    if not guards._same(xc, x):
        raise CheckFailed(f"{name}: your function changed its input in place")
    return out


# ---------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------

def attention_reference(q, k, v, is_causal=False):
    """Attention in float64 from the score matrix (SDPA's top-left causal rule);
    the check computes it before the answer runs."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        nq, nk = q.shape[-2], k.shape[-2]
        keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None]
        s = s.masked_fill(~keep, float("-inf"))
    s = s - s.amax(-1, keepdim=True)
    p = s.exp()
    return (p / p.sum(-1, keepdim=True)) @ v64


def causal_flops(B, H, nq, nk, D, Br, Bc, is_causal) -> int:
    """FLOPs of Q K^T and P V over the key tiles a tiled loop must visit."""
    tiles = 0
    for i0 in range(0, nq, Br):
        rows = min(Br, nq - i0)
        for j0 in range(0, nk, Bc):
            if is_causal and j0 > i0 + rows - 1:
                continue
            tiles += rows * min(Bc, nk - j0)
    return 2 * 2 * B * H * tiles * D


FORBID_ATTENTION = ("sdpa", "softmax", "reference-attention")


def _row_block_tails(nq, nk, D, Br, Bc, is_causal):
    """``(rows, keys)`` shapes of the scores of one query tile against every key it sees
    at once (more keys than one tile of ``Bc``): an answer that tiles the queries only.
    A one-row tile and a key count equal to ``D`` are left out (a vector of positions, an
    ``(rows, D)`` accumulator would look the same)."""
    tails = set()
    for i0 in range(0, nq, Br):
        rows = min(Br, nq - i0)
        seen = min(nk, i0 + rows) if is_causal else nk
        if rows > 1 and seen > Bc and seen != D:
            tails.add((rows, seen))
    return [(r, c, f"the scores of a tile of {r} queries against all {c} keys it sees at "
                   f"once, more than one tile of {Bc} keys") for r, c in sorted(tails)]


def check_attention_case(fn, *, B, H, nq, nk, D, is_causal=False, dtype=torch.float32,
                         logit_scale=1.0, score_offset=0.0, score_ramp=0.0, value_offset=0.0,
                         Br=16, Bc=16,
                         name="your attention",
                         exercise_id=None, asks="write the tiled forward yourself",
                         forbid=FORBID_ATTENTION, generator=None, pass_tiles=True,
                         atol=None, rtol=None, quiet=False):
    """One case of a tiled-attention exercise (see the module docstring).
    ``score_offset`` adds about that much to every score (the output is the same): far
    below zero, an exponential measured from a fixed number instead of the running max
    underflows to 0 / 0. ``score_ramp`` makes key j's score with every query about
    ``score_ramp * j``: a row of scores then spans more than the range of exp even in
    float64 (709), so an exponential of the raw scores, or one measured from a fixed
    number (the first key tile's maximum), overflows whatever the precision it is
    computed in. ``value_offset`` adds that much to every value: in fp16 with a
    flat softmax over many keys, an accumulator kept in the input's dtype overflows."""
    g = generator
    q = torch.randn(B, H, nq, D, generator=g) * logit_scale
    k = torch.randn(B, H, nk, D, generator=g)
    v = torch.randn(B, H, nk, D, generator=g)
    if logit_scale > 1:
        # large logits must overflow an exponential without the running max on every
        # draw: key 0 (visible to every query) gets a score of 120 with the last query
        qi = q[:, :, -1, :]
        k[:, :, 0, :] = qi * (120.0 * D ** 0.5 / (qi * qi).sum(-1, keepdim=True))
    if score_offset:
        # feature 0 of every query times feature 0 of every key is score_offset * sqrt(D)
        c = math.sqrt(abs(score_offset) * math.sqrt(D))
        q[..., 0] = c
        k[..., 0] = math.copysign(c, score_offset)
    if score_ramp:
        # feature 0 of every query times feature 0 of key j is score_ramp * j * sqrt(D)
        c = D ** 0.25
        q[..., 0] = c
        k[..., 0] = torch.arange(nk, dtype=k.dtype) * (score_ramp * math.sqrt(D) / c)
    v = v + value_offset
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    want = attention_reference(q, k, v, is_causal=is_causal)          # before the answer runs
    kk, vv = k.clone(), v.clone()
    first_unused = nk
    if is_causal and pass_tiles:
        # key tiles that start after the last query are never visible: poison them
        first_unused = next((j0 for j0 in range(0, nk, Bc) if j0 > nq - 1), nk)
        kk[..., first_unused:, :] = float("nan")
        vv[..., first_unused:, :] = float("nan")
    label = (f"{name} (B={B}, H={H}, Nq={nq}, Nk={nk}, D={D}, "
             f"{'causal' if is_causal else 'no mask'}, {str(dtype).replace('torch.', '')}"
             f"{f', logits x{logit_scale:g}' if logit_scale != 1 else ''}"
             f"{f', every score near {score_offset:g}' if score_offset else ''}"
             f"{f', key j scores about {score_ramp:g} j' if score_ramp else ''}"
             f"{f', values near {value_offset:g}' if value_offset else ''})")
    kwargs = {"is_causal": is_causal}
    if pass_tiles:
        kwargs.update(Br=Br, Bc=Bc)
    budget = 5 * causal_flops(B, H, nq, nk, D, Br, Bc, is_causal) // 4 + 1024
    msg = (f"{label}: your loop did {{spent}} FLOPs of matrix products, more than the "
           f"{{limit}} the visible tiles need (with room to spare). Skip the key tiles that lie "
           "entirely after the query tile's last row instead of masking them.")
    ctx = flop_budget(budget, msg) if (is_causal and pass_tiles) else contextlib.nullcontext()
    with ctx:
        # with one query (or one key) the whole score matrix has the shape of a vector of
        # positions (torch.arange(nk)[None, :]): it is not banned then
        tails = ([(nq, nk)] if min(nq, nk) > 1 else []) + \
            (_row_block_tails(nq, nk, D, Br, Bc, is_causal) if pass_tiles else [])
        out = guards.run_answer(fn, q, kk, vv, forbid=forbid, exercise=exercise_id, asks=asks,
                                name=name, shape_tails=tails, **kwargs)
    if not isinstance(out, torch.Tensor):
        raise CheckFailed(f"{label}: expected a tensor, got {type(out).__name__}")
    check_shape(out, tuple(q.shape), name=label, quiet=True,
                hint="the output has q's shape (B, H, Nq, D)")
    if out.dtype != q.dtype:
        raise CheckFailed(f"{label}: the output is {out.dtype}, expected q's dtype {q.dtype}; "
                          "accumulate in float32, then cast the result back")
    if is_causal and first_unused < nk and torch.isnan(out).any():
        raise CheckFailed(f"{label}: NaN in the output. The keys from {first_unused} on are "
                          "never visible to any query and hold NaN here: your loop read a key "
                          "tile it must skip (one that starts after the query tile's last row).")
    guards.check_finite(out, name=label,
                        hint="inf or NaN with large logits: subtract the running max before exp, "
                             "and rescale l and acc by exp(m_old - m_new) when it grows; with "
                             "scores far below zero: the running max starts at -inf, not at 0; "
                             "keep l and acc in float32 whatever the inputs' dtype")
    if atol is None:
        atol = 2e-4 if dtype == torch.float32 else (1e-9 if dtype == torch.float64 else 6e-3)
    if rtol is None:
        rtol = atol
    if is_causal:
        hint = ("only with the mask wrong? A key tile may be skipped only when its first key "
                "comes after the query tile's LAST row (j0 > i0 + rows - 1); inside a tile "
                "compare absolute positions i0 + r and j0 + c, not r and c")
    else:
        hint = ("is the output divided by l once, at the end? are l and acc both rescaled by "
                "exp(m_old - m_new) when the max grows?")
    check_close(out.double(), want, atol=atol, rtol=rtol, name=label, quiet=True, hint=hint)
    if not quiet:
        print(f"ok: {label}")
    return out


def fa1_walk_reference(q, k, v, Br, Bc):
    """FA1's walk (K/V tile outer, query tile inner) for 2-D ``q, k, v`` of shape (N, d):
    the ``(j, i, m_i, l_i, o_i)`` of every step (``o_i`` normalised) and the output. The
    checks' reference."""
    n, d = q.shape
    q64, k64, v64 = q.double(), k.double(), v.double()
    m = torch.full((n,), float("-inf"), dtype=torch.float64)
    l = torch.zeros(n, dtype=torch.float64)
    o = torch.zeros(n, d, dtype=torch.float64)
    steps = []
    for j, c0 in enumerate(range(0, k.shape[0], Bc)):
        kj, vj = k64[c0:c0 + Bc], v64[c0:c0 + Bc]
        for i, r0 in enumerate(range(0, n, Br)):
            s = q64[r0:r0 + Br] @ kj.T / math.sqrt(d)
            m_old, l_old, o_old = m[r0:r0 + Br], l[r0:r0 + Br], o[r0:r0 + Br]
            m_new = torch.maximum(m_old, s.amax(-1))
            p = (s - m_new[:, None]).exp()
            a = (m_old - m_new).exp()
            l_new = a * l_old + p.sum(-1)
            o[r0:r0 + Br] = (a[:, None] * l_old[:, None] * o_old + p @ vj) / l_new[:, None]
            m[r0:r0 + Br], l[r0:r0 + Br] = m_new, l_new
            steps.append((j, i, m_new.clone(), l_new.clone(), o[r0:r0 + Br].clone()))
    return o, steps


def check_fa1_walk(fn, n, d, M=None, *, Br=None, Bc=None, exercise_id="4.7", generator=None,
                   score_ramp=0.0, score_offset=0.0, quiet=False):
    """Run ``fn(q, k, v, Br, Bc) -> (o, steps)`` on fresh (n, d) inputs and compare every
    step of the walk with FA1's (tile order, and m, l and the normalised O of the query
    tile after it). With ``score_ramp``, key j's score with every query is about
    ``score_ramp * j``: the scores span more than exp's range, even in float64. With
    ``score_offset``, every score is about ``score_offset``: far below zero, a running max
    that starts at 0 instead of -inf is wrong from the first step (and its exp underflows)."""
    if M is not None:
        Bc = M // (4 * d)
        Br = min(Bc, d)
    g = generator
    q, k, v = (torch.randn(n, d, generator=g) for _ in range(3))
    if score_ramp:
        c = d ** 0.25
        q[:, 0] = c
        k[:, 0] = torch.arange(n, dtype=k.dtype) * (score_ramp * math.sqrt(d) / c)
    if score_offset:
        # feature 0 of every query times feature 0 of every key is score_offset * sqrt(d)
        c = math.sqrt(abs(score_offset) * math.sqrt(d))
        q[:, 0] = c
        k[:, 0] = math.copysign(c, score_offset)
    want_o, want = fa1_walk_reference(q, k, v, Br, Bc)
    label = (f"FA1 walk (N={n}, d={d}, Br={Br}, Bc={Bc}"
             f"{f', key j scores about {score_ramp:g} j' if score_ramp else ''}"
             f"{f', every score near {score_offset:g}' if score_offset else ''})")
    forbid = FORBID_ATTENTION + (guards.Group("the checks' own FA1 walk",
                                              python=("course_utils.exercise_checks:fa1_walk_reference",)),)
    got = guards.run_answer(fn, q, k, v, Br, Bc, forbid=forbid, exercise=exercise_id,
                            asks="replay FA1's loops yourself", name="fa1_walk",
                            shape_tails=[(n, n)] if n > 1 else ())
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"{label}: return (o, steps), got {type(got).__name__}")
    o, steps = got
    for t, s in enumerate(steps):
        if not (isinstance(s, (tuple, list)) and len(s) == 5):
            raise CheckFailed(f"{label}: step {t} is {s!r:.80}; every step is (j, i, m_i, l_i, o_i): "
                              "the tile indices and the HBM copies of m, l and O of query tile i")
    order = [tuple(int(x) for x in s[:2]) for s in steps]
    want_order = [s[:2] for s in want]
    if order != want_order:
        first = next((t for t, (a, b) in enumerate(zip(order, want_order)) if a != b),
                     min(len(order), len(want_order)))
        raise CheckFailed(
            f"{label}: {len(order)} steps, expected {len(want_order)}; step {first} is "
            f"{order[first] if first < len(order) else 'missing'}, expected "
            f"{want_order[first] if first < len(want_order) else 'no more steps'}\n"
            "  hint: FA1's outer loop is over key/value tiles j, its inner loop over query "
            "tiles i; count tiles with a ceiling division")
    for t, ((j, i, m, l, oi), (_, _, wm, wl, wo)) in enumerate(zip(steps, want)):
        what = f"{label}, step {t} (key tile {j}, query tile {i})"
        m = torch.as_tensor(m).double()
        l = torch.as_tensor(l).double()
        oi = torch.as_tensor(oi).double()
        check_close(m, wm, atol=1e-5, rtol=1e-5, name=f"{what}: m", quiet=True,
                    hint="m is the running max over every key seen so far by these rows, "
                         "this tile's included (before the first key it is -inf, not 0)")
        check_close(l, wl, atol=1e-5, rtol=1e-5, name=f"{what}: l", quiet=True,
                    hint="l is measured against the running max: rescale the old l by "
                         "exp(m_old - m_new) before adding this tile's sum")
        guards.check_finite(oi, name=f"{what}: O")
        check_close(oi, wo, atol=1e-5, rtol=1e-5, name=f"{what}: O", quiet=True,
                    hint="O in HBM is normalised after every step (divided by the l of that "
                         "step): undo the old normalisation (times l_old, rescaled) before "
                         "adding P V, then divide by l_new")
    guards.check_finite(o, name=f"{label}: o")
    check_close(torch.as_tensor(o).double(), want_o, atol=1e-5, rtol=1e-5, name=f"{label}: o",
                quiet=True, hint="O in HBM is normalised after every step: undo the old "
                                 "normalisation (times l_old, rescaled) before adding P V")
    if not quiet:
        print(f"ok: {label}, {len(steps)} steps")
    return steps
