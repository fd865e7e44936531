"""Checks for lesson 8's problem set. Each raises :class:`CheckFailed` with what
was expected, what was found and the most likely cause."""
from __future__ import annotations

import torch

from course_utils.checks import CheckFailed, check_close, check_equal
from course_utils.hopper import schedule_sim as sim

__all__ = ["check_schedule_runs", "best_feasible_schedule", "check_best_schedule",
           "check_fp8_quantizer"]


def check_schedule_runs(schedule, reference, name="schedule", rtol=0.01):
    """``schedule`` must simulate without deadlock or hazard, do all the matmul work of
    ``reference`` and take about as long (within ``rtol``)."""
    if not isinstance(schedule, sim.Schedule):
        raise CheckFailed(f"{name}: expected a Schedule, got {type(schedule).__name__}")
    try:
        got = sim.simulate(schedule)
    except sim.DeadlockError as e:
        raise CheckFailed(f"{name}: still deadlocks.\n{e}\n  hint: every consumer must "
                          "Arrive on the slot's 'empty' barrier once it has read the slot") from None
    except sim.HazardError as e:
        raise CheckFailed(f"{name}: runs into a hazard.\n{e}\n  hint: release a slot only "
                          "after the op that reads it, never before") from None
    ref = sim.simulate(reference)
    if abs(got.flops - ref.flops) > 1e-6 * ref.flops:
        raise CheckFailed(f"{name}: does {got.flops:.3g} matmul FLOPs, expected {ref.flops:.3g}"
                          "\n  hint: keep every Op, only add the missing releases")
    if abs(got.time_us - ref.time_us) > rtol * ref.time_us:
        raise CheckFailed(f"{name}: takes {got.time_us:.3f} us, the intended schedule "
                          f"{ref.time_us:.3f} us\n  hint: release each slot as soon as its "
                          "reader is done (K after Q K^T, V after P V), not at the very end")
    print(f"{name}: ok ({got.time_us:.2f} us, {got.tflops:.0f} TFLOPS predicted)")


def best_feasible_schedule(D: int, Bc: int, n_blocks: int = 8) -> str:
    """The schedule with the highest predicted TFLOPS among those whose registers fit."""
    best, best_t = None, -1.0
    for name in sim.SCHEDULE_NAMES:
        try:
            t = sim.simulate(sim.build_schedule(name, D=D, Bc=Bc, n_blocks=n_blocks)).tflops
        except sim.RegisterBudgetError:
            continue
        if t > best_t + 1e-9:
            best, best_t = name, t
    return best


def check_best_schedule(choose, cases=((64, 128), (128, 128), (256, 128), (256, 64))):
    """``choose(D, Bc)`` must name the fastest schedule that fits the register file."""
    for D, Bc in cases:
        check_equal(choose(D, Bc), best_feasible_schedule(D, Bc), name=f"choose({D}, {Bc})",
                    hint="simulate every name in SCHEDULE_NAMES, skip those that raise "
                         "RegisterBudgetError, keep the highest .tflops", quiet=True)
    print(f"choose: ok on {len(cases)} head-dim / tile cases")


def check_fp8_quantizer(quantize, name="quantize_block"):
    """``quantize(x)`` for one 2-D block must return ``(x8, scale)``: e4m3 values and a
    float scale with ``x ~= x8 * scale`` and ``max |x8| == 448``."""
    g = torch.Generator().manual_seed(8)
    for trial in range(3):
        x = torch.randn(64, 32, generator=g) * (10.0 ** (trial - 1))
        x[:, 5] *= 40                                     # an outlier channel
        out = quantize(x)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise CheckFailed(f"{name}: must return a tuple (x8, scale), got {type(out).__name__}")
        x8, scale = out
        if not isinstance(x8, torch.Tensor) or x8.dtype != torch.float8_e4m3fn:
            raise CheckFailed(f"{name}: x8 must be a torch.float8_e4m3fn tensor, got "
                              f"{getattr(x8, 'dtype', type(x8).__name__)}")
        scale = float(scale)
        check_close(torch.tensor(scale), x.abs().max() / 448.0, rtol=1e-5, atol=0,
                    name=f"{name} scale", quiet=True,
                    hint="scale = amax(|x|) / 448 maps the largest entry onto e4m3's largest value")
        back = x8.float() * scale
        bound = x.abs() * 2 ** -4 + scale * 2 ** -10
        bad = (back - x).abs() > bound + 1e-12
        if bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0])
            raise CheckFailed(f"{name}: element {divmod(i, x.shape[1])} dequantises to "
                              f"{float(back.reshape(-1)[i]):.4g}, expected {float(x.reshape(-1)[i]):.4g} "
                              "within e4m3's rounding\n  hint: divide by the scale before the cast")
    print(f"{name}: ok")
