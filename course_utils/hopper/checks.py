"""Checks for lesson 8's problem set. Each raises :class:`CheckFailed` with what
was expected, what was found and the most likely cause."""
from __future__ import annotations

import torch

from course_utils.checks import CheckFailed, check_close, check_equal
from course_utils.hopper import schedule_sim as sim

__all__ = ["check_schedule_runs", "check_releases_placed", "best_feasible_schedule",
           "fastest_feasible_schedules", "check_best_schedule",
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


def _is_release(ins) -> bool:
    return isinstance(ins, sim.Arrive) and "_empty[" in ins.barrier


def _release_of(buffer: str) -> str:
    """``"K[1]"`` -> ``"k_empty[1]"``: the barrier a reader of that slot arrives on."""
    kind, _, rest = buffer.partition("[")
    return f"{kind.lower()}_empty[{rest}"


def _show(ins) -> str:
    if isinstance(ins, sim.Op):
        return f"Op {ins.label!r}" + (f" (reads {', '.join(ins.reads)})" if ins.reads else "")
    if isinstance(ins, (sim.Arrive, sim.Wait)):
        return f"{type(ins).__name__}({ins.barrier!r})"
    return type(ins).__name__


def check_releases_placed(schedule, given, name="schedule"):
    """Every consumer program of ``schedule`` must be its program in ``given`` with, right
    after each ``Op`` that reads slots (``reads=("K[1]",)``), one ``Arrive`` on each of
    those slots' empty barriers (``k_empty[1]``), and no other release anywhere."""
    if not isinstance(schedule, sim.Schedule):
        raise CheckFailed(f"{name}: expected a Schedule, got {type(schedule).__name__}")
    if len(schedule.warpgroups) != len(given.warpgroups):
        raise CheckFailed(f"{name}: has {len(schedule.warpgroups)} warpgroups, the schedule given "
                          f"{len(given.warpgroups)}\n  hint: only add Arrives to the consumers")
    for wg, old in zip(schedule.warpgroups, given.warpgroups):
        if wg.role != "consumer":
            if list(wg.program) != list(old.program):
                raise CheckFailed(f"{name}: the program of {old.name} ({old.role}) changed\n"
                                  "  hint: only the consumers' programs get releases")
            continue
        prog = list(wg.program)
        if [i for i in prog if not _is_release(i)] != [i for i in old.program if not _is_release(i)]:
            raise CheckFailed(f"{name}: {wg.name}'s program is not the one given plus releases\n"
                              "  hint: keep every instruction; only insert Arrives on the "
                              "empty barriers")
        i = 0
        while i < len(prog):
            ins = prog[i]
            if _is_release(ins):
                before = _show(prog[i - 1]) if i else "the start of the program"
                raise CheckFailed(
                    f"{name}: in {wg.name}, {_show(ins)} (instruction {i}) comes right after "
                    f"{before}, not after the op that reads the slot.\n  hint: release each slot "
                    "right after the Op whose reads name it (K[s] -> k_empty[s], V[s] -> "
                    "v_empty[s]): earlier is a hazard, later holds the slot back from the producer")
            i += 1
            if isinstance(ins, sim.Op) and ins.reads:
                want = sorted(_release_of(b) for b in ins.reads)
                got = prog[i:i + len(want)]
                if sorted(g.barrier for g in got if _is_release(g)) != want:
                    nxt = _show(prog[i]) if i < len(prog) else "the end of the program"
                    raise CheckFailed(
                        f"{name}: in {wg.name}, {_show(ins)} is followed by {nxt}, not by "
                        f"{' and '.join(f'Arrive({w!r})' for w in want)}.\n  hint: the release "
                        "goes right after the op that reads the slot, before anything else")
                i += len(want)
    print(f"{name}: every release right after its reader")


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


def fastest_feasible_schedules(D: int, Bc: int, n_blocks: int = 8) -> tuple:
    """Every schedule whose predicted TFLOPS equal the highest among those whose registers
    fit (several where schedules tie: ping-pong and fa3 do wherever the intra-warpgroup
    pipeline buys nothing more)."""
    got = {}
    for name in sim.SCHEDULE_NAMES:
        try:
            got[name] = sim.simulate(sim.build_schedule(name, D=D, Bc=Bc, n_blocks=n_blocks)).tflops
        except sim.RegisterBudgetError:
            continue
    if not got:
        return ()
    top = max(got.values())
    return tuple(n for n, t in got.items() if t >= top - 1e-9 * max(1.0, abs(top)))


def check_best_schedule(choose, cases=((64, 128), (128, 128), (256, 128), (256, 64))):
    """``choose(D, Bc)`` must name the fastest schedule that fits the register file (any
    of them where several tie)."""
    for D, Bc in cases:
        got = choose(D, Bc)
        best = fastest_feasible_schedules(D, Bc)
        if len(best) == 1:
            check_equal(got, best[0], name=f"choose({D}, {Bc})",
                        hint="simulate every name in SCHEDULE_NAMES, skip those that raise "
                             "RegisterBudgetError, keep the highest .tflops", quiet=True)
        elif got not in best:
            raise CheckFailed(f"choose({D}, {Bc}): {got!r} is not among the fastest schedules "
                              f"that fit (several tie here). Hint: simulate every name in "
                              "SCHEDULE_NAMES, skip those that raise RegisterBudgetError, keep "
                              "the highest .tflops")
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
