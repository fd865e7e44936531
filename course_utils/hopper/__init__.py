"""Lesson 8: Hopper (sm90) — FlashAttention-3's ideas on a schedule simulator, then
real kernels.

* :mod:`course_utils.hopper.schedule_sim` — an event-level model of one H100 SM
  running an attention forward under different schedules (CPU only, no Triton).
* :mod:`course_utils.hopper.triton_fwd` — a Triton forward reading tiles through
  tensor descriptors (TMA), with ``num_stages`` / ``warp_specialize``.
* :mod:`course_utils.hopper.gluon_fwd` — a Gluon forward with explicit TMA loads,
  mbarriers, ``warpgroup_mma`` and producer / consumer partitions (sm90 only).
* :mod:`course_utils.hopper.gluon_bwd` — a Gluon backward: one key-stationary pass,
  five products, dQ added through the TMA unit, and the autograd pair with the forward.
* :mod:`course_utils.hopper.fp8` — FP8 quantisation with per-block scales, the
  Hadamard rotation, and an FP8 Triton forward.

Only the simulator is imported eagerly: the kernel modules import Triton (and
Gluon) when first used, so ``import course_utils.hopper`` works on any machine.
"""
import importlib

from course_utils import device  # noqa: F401  (sets TRITON_INTERPRET first)
from . import schedule_sim  # noqa: F401

_LAZY = {"triton_fwd", "gluon_fwd", "gluon_bwd", "fp8"}


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
