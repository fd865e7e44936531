"""Lesson 8: an event-level model of one H100 streaming multiprocessor running the
attention forward under different schedules.

**Units.** Four asynchronous units, each with a throughput per SM (the H100 figure
divided by its 132 SMs):

=========  ==========================================  =============================
unit       does                                        H100 rate (whole GPU)
=========  ==========================================  =============================
``tma``    bulk tensor copies global -> shared          3.35 TB/s HBM x ``l2_reuse``
``tensor`` wgmma (Q K^T and P V)                        989 TFLOPS dense fp16
``mufu``   exp2 of the softmax (special-function unit)  3.9 TFLOPS
``alu``    the other softmax work: scale, max, sum,     67 TFLOPS fp32 (FMA = 2 FLOPs)
           convert, rescale O
=========  ==========================================  =============================

The copy engine serves its requests in order. On the other units one warpgroup's
ops run in the order it issued them, and several warpgroups are **processor-shared**:
the warp schedulers interleave the instructions of every ready warp, so two
warpgroups that issue matmuls together each get half the tensor cores and finish
together. Under
this sharing two uncoordinated warpgroups stay in lockstep, which is what
FlashAttention-3's explicit ordering (ping-pong) is meant to break.

**Warpgroups** run a *program*: a list of instructions executed in order.

* :class:`Op` -- start work on a unit. ``sync=True``: the warpgroup waits for it (the
  softmax). ``sync=False``: it returns at once (TMA copies, async wgmma), and the op
  arrives on ``barrier`` when done. ``reads`` / ``writes`` name shared-memory buffers.
* :class:`Wait` -- block until ``barrier`` has seen ``count`` arrivals (the
  simple form, also used for ``wgmma.wait_group``: "my n-th matmul has finished").
* :class:`WaitParity` -- the real mbarrier wait, ``mbarrier.wait(bar, parity)``: a
  barrier completes a *phase* each time it has received ``Schedule.arrivals_per_phase``
  arrivals (default 1), and the wait returns once the barrier's current phase has a
  parity different from ``parity`` -- that is, once the phase with that parity has
  completed. One bit cannot tell phase k from phase k + 2, which is why a ring slot's
  waits use ``(j // stages) & 1`` and why a wrong parity hangs or reads a stale tile.
* :class:`Arrive` -- one arrival on a barrier (a consumer releasing a buffer).

:func:`build_schedule` builds the six idealised schedules of the lesson (each with
two consumer warpgroups); :func:`build_kernel_schedule` builds the programs of the
course's real kernels (``hopper/triton_fwd.py``, ``hopper/gluon_fwd.py``) with their
own barriers and parities, and :data:`KERNEL_MODELS` maps each benchmarked provider
to one of them.

**Checks.** The simulator raises :class:`DeadlockError` when nothing is running and
some warpgroups wait forever (naming each one, its barrier, and the arrivals it
needs and has), :class:`HazardError` when a buffer is read before its copy completed
or overwritten while a reader still needs it, and :class:`RegisterBudgetError` when
the warpgroups' registers do not fit the 64K-register file.

**Assumptions** (parameters of :class:`Hardware`, not measured facts): ``l2_reuse``
-- a K/V tile is fetched from HBM once and served from L2 to about this many SMs
working on the same head; ``tensor_in_order`` -- ``False`` (default): warpgroups that
have matmuls in flight share the tensor cores as described above; ``True``: the tensor
cores run matmuls one after another in issue order, across warpgroups, so ordering
the *issue* (ping-pong's turn barriers) orders the execution too. Every op runs at its
unit's full rate, with no latency.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "Hardware", "H100", "Op", "Wait", "WaitParity", "Arrive", "Warpgroup", "Schedule",
    "SimResult", "build_kernel_schedule", "KERNEL_NAMES", "KERNEL_MODELS", "predict_kernels",
    "RELEASE_PROTOCOLS",
    "SimulationError", "DeadlockError", "HazardError", "RegisterBudgetError",
    "simulate", "build_schedule", "SCHEDULE_NAMES", "FA3_ABLATION", "register_need",
    "register_split", "plot_timeline", "compare_with_fa3",
]

# FlashAttention-3 paper, pipelining ablation (H100, D=128, non-causal, TFLOPS)
FA3_ABLATION = {"no_ws_pipelined": 570.0, "pingpong": 582.0, "fa3": 661.0}


@dataclass(frozen=True)
class Hardware:
    """Whole-GPU throughputs; the simulator divides them by ``num_sms``."""
    num_sms: int = 132
    tensor_tflops: float = 989.0     # dense fp16 wgmma
    exp_tflops: float = 3.9          # MUFU exp2, one op per "FLOP"
    alu_tflops: float = 67.0         # fp32 FMA units (2 FLOPs per FMA)
    hbm_tbps: float = 3.35
    l2_reuse: float = 8.0            # assumption, see the module docstring
    tensor_in_order: bool = False    # assumption: True = matmuls of all warpgroups run in
                                     # issue order; False = concurrent ones share the rate
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255

    def rate(self, unit: str) -> float:
        """Work per microsecond on one SM (FLOPs, exps, ALU ops or bytes)."""
        per_sm = {"tensor": self.tensor_tflops * 1e12,
                  "mufu": self.exp_tflops * 1e12,
                  "alu": self.alu_tflops * 1e12 / 2,
                  "tma": self.hbm_tbps * 1e12 * self.l2_reuse}[unit] / self.num_sms
        return per_sm / 1e6


H100 = Hardware()
UNITS = ("tma", "tensor", "mufu", "alu")
FIFO_UNITS = ("tma",)


# --------------------------------------------------------------------------- programs
@dataclass(frozen=True)
class Op:
    unit: str
    work: float
    label: str
    sync: bool = True
    barrier: str | None = None
    reads: tuple = ()
    writes: tuple = ()
    flops: float = 0.0               # matmul FLOPs counted for TFLOPS


@dataclass(frozen=True)
class Wait:
    barrier: str
    count: int


@dataclass(frozen=True)
class WaitParity:
    """``mbarrier.wait(barrier, parity)``: returns once the phase of that parity has
    completed, i.e. while the barrier's current phase has the other parity."""
    barrier: str
    parity: int

    def __post_init__(self):
        if self.parity not in (0, 1):
            raise ValueError(f"parity must be 0 or 1, got {self.parity!r}")


@dataclass(frozen=True)
class Arrive:
    barrier: str


@dataclass
class Warpgroup:
    name: str
    role: str                         # "producer" or "consumer"
    program: list
    regs: int                         # registers per thread it needs
    threads: int = 128


@dataclass
class Schedule:
    name: str
    warpgroups: list
    readers: dict = field(default_factory=dict)   # buffer -> readers per fill
    setmaxnreg: bool = True
    description: str = ""
    arrivals_per_phase: dict = field(default_factory=dict)   # barrier -> count (default 1)


class SimulationError(RuntimeError):
    """Base class of everything the simulator refuses."""


class DeadlockError(SimulationError):
    def __init__(self, time, blocked):
        self.time = time
        self.blocked = blocked        # [(warpgroup, barrier, needs, has)]
        # needs: an arrival count (Wait) or "parity p" (WaitParity); has: arrivals so far
        lines = [f"  {wg} waits on '{bar}' for arrival #{need}, it has {have}"
                 if isinstance(need, int) else
                 f"  {wg} waits on '{bar}' for the phase of {need} to complete; it has "
                 f"{have} arrival(s)" for wg, bar, need, have in blocked]
        super().__init__(
            f"deadlock at t={time:.3f} us: nothing is running and every unfinished warpgroup "
            "waits on a barrier that nobody will arrive on:\n" + "\n".join(lines)
            + "\nLook for a missing Arrive (a consumer that never releases a buffer), a Wait "
            "whose count is one phase ahead, or a WaitParity with the wrong parity.")


class HazardError(SimulationError):
    pass


class RegisterBudgetError(SimulationError):
    pass


# --------------------------------------------------------------------------- registers
def register_need(Br: int, Bc: int, D: int, pipelined: bool, overhead: int = 24) -> int:
    """Registers per thread of a consumer warpgroup (128 threads) holding ``Br`` query
    rows: the fp32 O accumulator (``Br*D/128``), the fp32 score tile S
    (``Br*Bc/128``; P overwrites S in place) and, when pipelined, the next block's S
    as well, plus ``overhead`` for addresses, m, l and loop state."""
    o = Br * D // 128
    s = Br * Bc // 128
    return overhead + o + s * (2 if pipelined else 1)


def register_split(roles: list, hw: Hardware = H100, producer_regs: int = 24,
                   setmaxnreg: bool = True) -> dict:
    """Registers per thread each warpgroup gets. Without ``setmaxnreg`` every
    warpgroup gets an equal share; with it the producers drop to ``producer_regs`` and
    the consumers share the rest (rounded down to a multiple of 8, at most 255)."""
    n = len(roles)
    even = min(hw.max_regs_per_thread, (hw.regs_per_sm // (128 * n)) // 8 * 8)
    if not setmaxnreg:
        return {i: even for i in range(n)}
    n_prod = sum(r == "producer" for r in roles)
    n_cons = n - n_prod
    if n_cons == 0:
        return {i: even for i in range(n)}
    left = hw.regs_per_sm // 128 - producer_regs * n_prod
    cons = min(240, (left // n_cons) // 8 * 8)
    return {i: (producer_regs if r == "producer" else cons) for i, r in enumerate(roles)}


# --------------------------------------------------------------------------- simulation
@dataclass
class SimResult:
    schedule: str
    time_us: float
    busy: dict                       # unit -> us with at least one op running
    work_time: dict                  # unit -> us of work at full rate
    trace: list                      # (warpgroup, unit, label, start, end)
    waits: list                      # (warpgroup, barrier, start, end)
    flops: float
    hw: Hardware

    @property
    def utilization(self) -> dict:
        """Fraction of the run each unit did useful work (work at full rate / time)."""
        return {u: self.work_time[u] / self.time_us for u in UNITS}

    @property
    def tflops(self) -> float:
        """Predicted whole-GPU matmul TFLOPS: this SM's FLOPs per second times the SMs."""
        return self.flops / (self.time_us * 1e-6) * self.hw.num_sms / 1e12


class _Buffer:
    __slots__ = ("name", "ready", "unread", "writing", "reading", "readers")

    def __init__(self, name, readers):
        self.name, self.readers = name, readers
        self.ready, self.unread, self.writing, self.reading = False, 0, None, []


def simulate(schedule: Schedule, hw: Hardware = H100, check_registers: bool = True) -> SimResult:
    """Run ``schedule`` to completion and return its timeline and statistics."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule (see build_schedule), got "
                        f"{type(schedule).__name__}")
    wgs = schedule.warpgroups
    if not wgs:
        raise ValueError("schedule has no warpgroups")
    if check_registers:
        _check_registers(schedule, hw)
    for wg in wgs:
        for ins in wg.program:
            if isinstance(ins, Op) and ins.unit not in UNITS:
                raise ValueError(f"{wg.name}: Op {ins.label!r} names unit {ins.unit!r}; "
                                 f"units are {UNITS}")
    rates = {u: hw.rate(u) for u in UNITS}
    fifo_units = FIFO_UNITS + (("tensor",) if hw.tensor_in_order else ())
    arrivals: dict[str, int] = {}
    buffers: dict[str, _Buffer] = {}
    pc = [0] * len(wgs)
    blocked = [None] * len(wgs)       # ("op", op_id) or ("wait", barrier, count, since)
    running = {u: [] for u in UNITS}  # unit -> list of [op_id, remaining, wg, op, start]
    trace, waits = [], []
    busy = {u: 0.0 for u in UNITS}
    work_time = {u: 0.0 for u in UNITS}
    flops = 0.0
    t = 0.0
    next_id = 0

    def buf(name):
        if name not in buffers:
            buffers[name] = _Buffer(name, schedule.readers.get(name, 1))
        return buffers[name]

    def start(i, op):
        nonlocal next_id, flops
        wg = wgs[i]
        for name in op.writes:
            b = buf(name)
            if b.reading:
                raise HazardError(
                    f"t={t:.3f} us: {wg.name} starts '{op.label}', which overwrites {name} "
                    f"while {', '.join(b.reading)} is still reading it. The producer must wait "
                    f"for the consumers' release of {name} before refilling it.")
            if b.writing is not None:
                raise HazardError(
                    f"t={t:.3f} us: {wg.name} starts '{op.label}', which overwrites {name} "
                    f"while the copy '{b.writing}' into it is still in flight and unread. The "
                    "producer must wait for the consumers' release before refilling it.")
            if b.unread > 0:
                raise HazardError(
                    f"t={t:.3f} us: {wg.name} starts '{op.label}', which overwrites {name} "
                    f"before {b.unread} of its {b.readers} reader(s) used the previous tile. "
                    "The producer must wait for the release (the 'empty' barrier) first.")
            b.ready, b.writing = False, op.label
        for name in op.reads:
            b = buf(name)
            if not b.ready or b.unread <= 0:
                why = (f"its copy ('{b.writing}') has not completed" if b.writing
                       else "it holds no tile that this reader has not used")
                raise HazardError(
                    f"t={t:.3f} us: {wg.name} starts '{op.label}', which reads {name}, but "
                    f"{why}. A Wait on the barrier that the copy arrives on is missing.")
            b.reading.append(wg.name)
        running[op.unit].append([next_id, float(op.work), i, op, t])
        work_time[op.unit] += op.work / rates[op.unit]
        flops += op.flops
        next_id += 1
        return next_id - 1

    def finish(entry):
        op_id, _, i, op, st = entry
        trace.append((wgs[i].name, op.unit, op.label, st, t))
        for name in op.writes:
            b = buffers[name]
            b.ready, b.unread, b.writing = True, b.readers, None
        for name in op.reads:
            b = buffers[name]
            b.reading.remove(wgs[i].name)
            b.unread -= 1
        if op.barrier:
            arrivals[op.barrier] = arrivals.get(op.barrier, 0) + 1
        if blocked[i] == ("op", op_id):
            blocked[i] = None

    def parity_done(barrier, parity):
        per_phase = schedule.arrivals_per_phase.get(barrier, 1)
        phase = arrivals.get(barrier, 0) // per_phase      # index of the current phase
        return phase % 2 != parity

    def advance_programs():
        progressed = True
        while progressed:
            progressed = False
            for i, wg in enumerate(wgs):
                while blocked[i] is None and pc[i] < len(wg.program):
                    ins = wg.program[pc[i]]
                    if isinstance(ins, Wait):
                        if arrivals.get(ins.barrier, 0) < ins.count:
                            blocked[i] = ("wait", ins.barrier, ins.count, t)
                            break
                    elif isinstance(ins, WaitParity):
                        if not parity_done(ins.barrier, ins.parity):
                            blocked[i] = ("parity", ins.barrier, ins.parity, t)
                            break
                    elif isinstance(ins, Arrive):
                        arrivals[ins.barrier] = arrivals.get(ins.barrier, 0) + 1
                        progressed = True
                    elif isinstance(ins, Op):
                        op_id = start(i, ins)
                        if ins.sync:
                            blocked[i] = ("op", op_id)
                    else:
                        raise TypeError(f"{wg.name}: instruction {pc[i]} is "
                                        f"{type(ins).__name__}, not Op / Wait / WaitParity / "
                                        "Arrive")
                    pc[i] += 1
                # release waits satisfied by arrivals made in this pass
            for i in range(len(wgs)):
                bl = blocked[i]
                if bl and ((bl[0] == "wait" and arrivals.get(bl[1], 0) >= bl[2])
                           or (bl[0] == "parity" and parity_done(bl[1], bl[2]))):
                    if t > bl[3]:
                        waits.append((wgs[i].name, bl[1], bl[3], t))
                    blocked[i] = None
                    progressed = True

    advance_programs()
    while True:
        active = [(u, e) for u in UNITS for e in running[u]]
        if not active:
            stuck = [(wgs[i].name, b[1], b[2] if b[0] == "wait" else f"parity {b[2]}",
                      arrivals.get(b[1], 0))
                     for i, b in enumerate(blocked) if b and b[0] in ("wait", "parity")]
            if stuck:
                raise DeadlockError(t, stuck)
            break
        # the copy engine serves requests in order. The other units run each
        # warpgroup's ops in its issue order and share their rate among warpgroups
        # (processor sharing: n warpgroups with work there progress at rate / n each)
        heads = {}
        for u in UNITS:
            firsts = {}
            for e in running[u]:
                firsts.setdefault(e[2], e[0])
            heads[u] = set(firsts.values())

        def share(u, e):
            if u in fifo_units:
                return rates[u] if e is running[u][0] else 0.0
            return rates[u] / len(heads[u]) if e[0] in heads[u] else 0.0
        dt = min(e[1] / share(u, e) for u, e in active if share(u, e) > 0)
        for u in UNITS:
            if running[u]:
                busy[u] += dt
                for e in running[u]:
                    e[1] -= dt * share(u, e)
        t += dt
        for u in UNITS:
            done = [e for e in running[u] if e[1] <= 1e-9 * max(1.0, rates[u])]
            running[u] = [e for e in running[u] if e not in done]
            for e in done:
                finish(e)
        advance_programs()
    return SimResult(schedule.name, t, busy, work_time, trace, waits, flops, hw)


def _check_registers(schedule, hw):
    roles = [wg.role for wg in schedule.warpgroups]
    split = register_split(roles, hw, setmaxnreg=schedule.setmaxnreg)
    total = sum(split[i] * wg.threads for i, wg in enumerate(schedule.warpgroups))
    if total > hw.regs_per_sm:
        raise RegisterBudgetError(f"{schedule.name}: the warpgroups ask for {total} registers, "
                                  f"the SM has {hw.regs_per_sm}")
    for i, wg in enumerate(schedule.warpgroups):
        if wg.regs > split[i]:
            how = ("setmaxnreg gives the consumers" if schedule.setmaxnreg
                   else "an even split (no setmaxnreg) gives each warpgroup")
            raise RegisterBudgetError(
                f"{schedule.name}: {wg.name} ({wg.role}) needs {wg.regs} registers per thread "
                f"but {how} {split[i]}; it would spill to local memory. Use smaller tiles "
                "(Bc), drop the intra-warpgroup pipeline, or rebalance with setmaxnreg.")


# --------------------------------------------------------------------------- schedules
SCHEDULE_NAMES = ("fa2_serial", "warp_specialized", "intra_pipeline", "pingpong",
                  "no_ws_pipelined", "fa3")

_DESCRIPTIONS = {
    "fa2_serial": "two warpgroups, each loads its own K/V and then computes: no producer, "
                  "no overlap inside a warpgroup",
    "warp_specialized": "a producer warpgroup streams K/V through a ring of shared-memory "
                        "stages; two consumer warpgroups compute, uncoordinated",
    "intra_pipeline": "producer + two consumers; each consumer issues S_{j+1} = Q K_{j+1}^T "
                      "before the softmax of block j",
    "pingpong": "producer + two consumers that take turns on the tensor cores (named "
                "barriers): one does its matmuls while the other does its softmax",
    "no_ws_pipelined": "ping-pong and the intra-warpgroup pipeline, but the consumers issue "
                       "their own copies (no producer warpgroup)",
    "fa3": "producer + ping-pong + intra-warpgroup pipeline: FlashAttention-3's forward",
}


def build_schedule(name: str, *, n_blocks: int = 16, Br: int = 64, Bc: int = 128, D: int = 128,
                   stages: int = 2, consumers: int = 2, setmaxnreg: bool | None = None) -> Schedule:
    """The programs of one SM's warpgroups for schedule ``name`` (one of
    :data:`SCHEDULE_NAMES`): ``consumers`` warpgroups of ``Br`` query rows each walk
    ``n_blocks`` key blocks of ``Bc`` keys, head dim ``D``; K/V go through ``stages``
    shared-memory slots."""
    if name not in SCHEDULE_NAMES:
        raise ValueError(f"name must be one of {SCHEDULE_NAMES}, got {name!r}")
    for arg, val in (("n_blocks", n_blocks), ("Br", Br), ("Bc", Bc), ("D", D),
                     ("stages", stages), ("consumers", consumers)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{arg} must be a positive int, got {val!r}")
    producer = name not in ("fa2_serial", "no_ws_pipelined")
    pipelined = name in ("intra_pipeline", "no_ws_pipelined", "fa3")
    pingpong = name in ("pingpong", "no_ws_pipelined", "fa3")
    if pingpong and consumers < 2:
        raise ValueError("ping-pong needs consumers >= 2")
    if setmaxnreg is None:
        setmaxnreg = producer
    kv_bytes = Bc * D * 2
    gemm = 2.0 * Br * Bc * D
    n_elem = Br * Bc
    alu_ops = 4 * n_elem + Br * D          # scale+max, FMA into exp2 arg, sum, convert; rescale O
    need = register_need(Br, Bc, D, pipelined)
    wgs = []
    readers = {}

    def softmax(j, c):
        return [Op("mufu", n_elem, f"exp S{j}"), Op("alu", alu_ops, f"softmax S{j}")]

    def qk(j, c, slot, sync):
        return Op("tensor", gemm, f"S{j}=QK{j}", sync=sync, barrier=f"s_done{c}",
                  reads=(slot("K", j),), flops=gemm)

    def pv(j, c, slot, sync):
        return Op("tensor", gemm, f"O+=P{j}V{j}", sync=sync, barrier=f"pv_done{c}",
                  reads=(slot("V", j),), flops=gemm)

    if producer:
        def slot(kind, j):
            return f"{kind}[{j % stages}]"
        for s in range(stages):
            readers[f"K[{s}]"] = readers[f"V[{s}]"] = consumers
        prog = []
        for j in range(n_blocks):
            s = j % stages
            use = j // stages
            # every consumer released this slot's previous K (then V) tile
            if use:
                prog.append(Wait(f"k_empty[{s}]", consumers * use))
            prog.append(Op("tma", kv_bytes, f"load K{j}", sync=False, barrier=f"k_full[{s}]",
                           writes=(f"K[{s}]",)))
            if use:
                prog.append(Wait(f"v_empty[{s}]", consumers * use))
            prog.append(Op("tma", kv_bytes, f"load V{j}", sync=False, barrier=f"v_full[{s}]",
                           writes=(f"V[{s}]",)))
        wgs.append(Warpgroup("producer", "producer", prog, regs=24))

    for c in range(consumers):
        if not producer:
            def slot(kind, j, c=c):
                return f"{kind}{c}[{j % 2}]"
        prog = []

        def load(j, c=c):
            if producer:
                s = j % stages
                return [Wait(f"k_full[{s}]", j // stages + 1)], [Wait(f"v_full[{s}]", j // stages + 1)]
            b = j % 2
            return ([Op("tma", kv_bytes, f"load K{j}", sync=True, writes=(f"K{c}[{b}]",))],
                    [Op("tma", kv_bytes, f"load V{j}", sync=True, writes=(f"V{c}[{b}]",))])

        def release(kind, j, c=c):
            return [Arrive(f"{kind}_empty[{j % stages}]")] if producer else []

        def turn_wait(k, c=c):
            # ping-pong: consumer c's k-th turn on the tensor cores comes after
            # consumer c-1's k-th turn (consumer 0 after the last one's (k-1)-th)
            if not pingpong:
                return []
            if c == 0:
                return [Wait(f"turn{c}", k)] if k else []
            return [Wait(f"turn{c}", k + 1)]

        def turn_pass(c=c):
            return [Arrive(f"turn{(c + 1) % consumers}")] if pingpong else []

        # turn k on the tensor cores = P_{k-1} V_{k-1} then S_k = Q K_k^T, issued together
        lk, _ = load(0)
        prog += lk + turn_wait(0) + [qk(0, c, slot, not pipelined)]
        if pipelined:
            prog += [Wait(f"s_done{c}", 1)]
        prog += release("k", 0) + turn_pass() + softmax(0, c)
        for j in range(n_blocks):
            _, lv = load(j)
            last = j + 1 == n_blocks
            if not pipelined:
                prog += lv + turn_wait(j + 1) + [pv(j, c, slot, True)] + release("v", j)
                if not last:
                    lk, _ = load(j + 1)
                    prog += lk + [qk(j + 1, c, slot, True)] + release("k", j + 1)
                prog += turn_pass()
                if not last:
                    prog += softmax(j + 1, c)
            elif not last:
                lk, _ = load(j + 1)
                prog += lk + turn_wait(j + 1) + [qk(j + 1, c, slot, False)]
                prog += lv + [pv(j, c, slot, False)]
                # wait for S_{j+1} only: P_j V_j keeps the tensor cores busy meanwhile
                prog += [Wait(f"s_done{c}", j + 2)] + release("k", j + 1) + turn_pass()
                prog += softmax(j + 1, c)
                prog += [Wait(f"pv_done{c}", j + 1)] + release("v", j)
            else:
                prog += lv + turn_wait(j + 1) + [pv(j, c, slot, True)] + turn_pass()
                prog += release("v", j)
        if not producer:
            for kind in "KV":
                for b in range(2):
                    readers[f"{kind}{c}[{b}]"] = 1
        wgs.append(Warpgroup(f"consumer{c}", "consumer", prog, regs=need))
    return Schedule(name, wgs, readers, setmaxnreg, _DESCRIPTIONS[name])


def compare_with_fa3(hw: Hardware = H100, **kw) -> list:
    """Predicted TFLOPS of every schedule next to the FA3 paper's ablation where it has
    a number; rows sorted by prediction."""
    rows = []
    for name in SCHEDULE_NAMES:
        r = simulate(build_schedule(name, **kw), hw)
        rows.append({"schedule": name, "predicted_tflops": round(r.tflops, 1),
                     "tensor_util": round(r.utilization["tensor"], 3),
                     "fa3_paper_tflops": FA3_ABLATION.get(name)})
    return sorted(rows, key=lambda r: r["predicted_tflops"])


# --------------------------------------------------------------------------- the real kernels
KERNEL_NAMES = ("triton_tma", "gluon_ws_serial", "gluon_ws_pipe", "gluon_pingpong")

_KERNEL_DESCRIPTIONS = {
    "triton_tma": "hopper/triton_fwd.py: one program of 8 warps (128 query rows, both "
                  "warpgroups in lockstep) issues its own K/V copies `stages - 1` blocks "
                  "ahead (Triton's software pipeline); matmul, softmax, matmul in order",
    "gluon_ws_serial": "hopper/gluon_fwd.py, pipeline=False: a 1-warp producer fills a ring "
                       "of K/V slots; one 8-warp consumer (128 rows, lockstep) runs "
                       "matmul, softmax, matmul; it releases the K slot on k_empty once "
                       "S is computed and the V slot on v_empty after P V",
    "gluon_ws_pipe": "hopper/gluon_fwd.py, pipeline=True: as gluon_ws_serial, but the "
                     "consumer issues S_{j+1} and P_j V_j before the softmax of block j+1 "
                     "(warpgroup_mma_wait(1))",
    "gluon_pingpong": "hopper/gluon_fwd.py, pingpong=True: a 1-warp producer and two "
                      "1-warpgroup consumers (64 rows each) that take turns on the tensor "
                      "cores through the mbarriers turn[0] / turn[1], each pipelined",
}

# benchmark provider (course_utils/bench/hopper.py) -> (kernel, K/V stages); the
# providers missing here (SDPA, Triton's compiler warp specialisation, FP8) have no
# program the simulator could copy
KERNEL_MODELS = {
    "triton_tma_s1": ("triton_tma", 1), "triton_tma_s2": ("triton_tma", 2),
    "triton_tma_s3": ("triton_tma", 3),
    "gluon_ws_serial": ("gluon_ws_serial", 2), "gluon_ws_pipe": ("gluon_ws_pipe", 2),
    "gluon_ws_pipe_s3": ("gluon_ws_pipe", 3),
    "gluon_pingpong": ("gluon_pingpong", 2), "gluon_pingpong_s3": ("gluon_pingpong", 3),
}


RELEASE_PROTOCOLS = ("separate", "joint")


def build_kernel_schedule(kernel: str, *, stages: int = 2, n_blocks: int = 16, Bc: int = 128,
                          D: int = 128, release: str = "separate") -> Schedule:
    """The programs one CTA (one SM) of a course kernel runs, with the kernel's own
    barriers: ``k_ready[s]`` / ``v_ready[s]`` (one arrival per phase, the TMA copy),
    ``k_empty[s]`` / ``v_empty[s]`` (one arrival per consumer partition) and, for
    ping-pong, ``turn[0]`` / ``turn[1]``; every mbarrier wait is a :class:`WaitParity`
    with the parity the kernel passes. A CTA has 128 query rows (``BLOCK_M`` of the
    kernels). ``wgmma.wait_group`` is a count :class:`Wait` on the warpgroup's own matmuls.

    ``release="separate"`` (the default) is ``gluon_fwd.py``'s protocol: a consumer
    arrives on ``k_empty[s]`` once ``S = Q K^T`` of the block is computed and on
    ``v_empty[s]`` after ``P V``; the producer waits on ``k_empty[s]`` before refilling
    K slot ``s`` and on ``v_empty[s]`` before refilling V slot ``s``. Every
    configuration finishes, ``stages=1`` included.

    ``release="joint"`` is the simpler protocol the kernel does not use: one
    ``kv_empty[s]`` per slot, released after ``P V``, waited for before both refills.
    With it and ``stages=1`` the pipelined consumers (``gluon_ws_pipe``,
    ``gluon_pingpong``) deadlock: they wait for ``K_{j+1}`` before releasing the one
    slot that ``K_{j+1}`` must be copied into. ``triton_tma`` has no producer and no
    empty barriers, so ``release`` does not change it."""
    if kernel not in KERNEL_NAMES:
        raise ValueError(f"kernel must be one of {KERNEL_NAMES}, got {kernel!r}")
    if release not in RELEASE_PROTOCOLS:
        raise ValueError(f"release must be one of {RELEASE_PROTOCOLS}, got {release!r}")
    for arg, val in (("stages", stages), ("n_blocks", n_blocks), ("Bc", Bc), ("D", D)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{arg} must be a positive int, got {val!r}")
    kv_bytes = Bc * D * 2
    pingpong = kernel == "gluon_pingpong"
    pipelined = kernel in ("gluon_ws_pipe", "gluon_pingpong")
    consumers = 2 if pingpong else 1
    Br = 64 if pingpong else 128                 # rows per consumer partition
    threads = 128 if pingpong else 256
    gemm = 2.0 * Br * Bc * D
    alu_ops = 4 * Br * Bc + Br * D

    def ph(j):                                   # the parity of slot j % stages at block j
        return (j // stages) & 1

    def K(j):
        return f"K[{j % stages}]"

    def V(j):
        return f"V[{j % stages}]"

    def qk(j, c, sync):
        return Op("tensor", gemm, f"S{j}=QK{j}", sync=sync, barrier=f"wgmma{c}",
                  reads=(K(j),), flops=gemm)

    def pv(j, c, sync):
        return Op("tensor", gemm, f"O+=P{j}V{j}", sync=sync, barrier=f"wgmma{c}",
                  reads=(V(j),), flops=gemm)

    def softmax(j):
        return [Op("mufu", Br * Bc, f"exp S{j}"), Op("alu", alu_ops, f"softmax S{j}")]

    def load(kind, j, sync):
        buf = K(j) if kind == "K" else V(j)
        return Op("tma", kv_bytes, f"load {kind}{j}", sync=sync,
                  barrier=f"{kind.lower()}_ready[{j % stages}]", writes=(buf,))

    joint = release == "joint"
    empties = ("kv_empty",) if joint else ("k_empty", "v_empty")
    per_phase = {f"{e}[{s}]": consumers for e in empties for s in range(stages)}
    readers = {f"{kind}[{s}]": consumers for kind in "KV" for s in range(stages)}
    wgs = []
    if kernel == "triton_tma":
        # the compiler's software pipeline: loads of block j + stages - 1 are issued at
        # the top of iteration j into the slot block j - 1 has just finished with
        prog = []
        ahead = stages - 1
        if ahead == 0:
            for j in range(n_blocks):
                prog += [load("K", j, True), qk(j, 0, True)] + softmax(j)
                prog += [load("V", j, True), pv(j, 0, True)]
        else:
            for j in range(min(ahead, n_blocks)):
                prog += [load("K", j, False), load("V", j, False)]
            for j in range(n_blocks):
                if j + ahead < n_blocks:
                    prog += [load("K", j + ahead, False), load("V", j + ahead, False)]
                prog += [WaitParity(f"k_ready[{j % stages}]", ph(j)), qk(j, 0, True)]
                prog += softmax(j)
                prog += [WaitParity(f"v_ready[{j % stages}]", ph(j)), pv(j, 0, True)]
        wgs.append(Warpgroup("program (8 warps)", "consumer", prog,
                             regs=register_need(64, Bc, D, False), threads=threads))
        return Schedule(f"{kernel} ({stages} stage{'s' if stages > 1 else ''})", wgs, readers,
                        False, _KERNEL_DESCRIPTIONS[kernel], per_phase)

    # gluon: the loader partition (_loader / _loader_pp)
    prog = []
    for j in range(n_blocks):
        s = j % stages
        if joint:
            prog += [WaitParity(f"kv_empty[{s}]", ph(j) ^ 1), load("K", j, False),
                     load("V", j, False)]
        else:
            prog += [WaitParity(f"k_empty[{s}]", ph(j) ^ 1), load("K", j, False),
                     WaitParity(f"v_empty[{s}]", ph(j) ^ 1), load("V", j, False)]
    wgs.append(Warpgroup("producer (1 warp)", "producer", prog, regs=24, threads=32))

    def turn_wait(k, c):
        if not pingpong:
            return []
        if c == 0:
            return [WaitParity("turn[0]", (k - 1) & 1)] if k > 0 else []
        return [WaitParity("turn[1]", k & 1)]

    def turn_pass(c):
        return [Arrive(f"turn[{1 - c}]")] if pingpong else []

    def release_k(j):                            # _release(k_empty, ...): S_j is computed
        return [] if joint else [Arrive(f"k_empty[{j % stages}]")]

    def release_v(j):                            # _release(v_empty, ...): P_j V_j is done
        return [Arrive(f"{'kv_empty' if joint else 'v_empty'}[{j % stages}]")]

    for c in range(consumers):
        prog = []
        issued = 0                               # matmuls this consumer has issued

        def done_upto(n, c=c):                   # warpgroup_mma_wait: the first n finished
            return Wait(f"wgmma{c}", n)
        if not pipelined:
            for j in range(n_blocks):
                prog += [WaitParity(f"k_ready[{j % stages}]", ph(j)), qk(j, c, True)]
                prog += release_k(j) + softmax(j)
                prog += [WaitParity(f"v_ready[{j % stages}]", ph(j)), pv(j, c, True)]
                prog += release_v(j)
        else:
            prog += [WaitParity("k_ready[0]", 0)] + turn_wait(0, c) + [qk(0, c, False)]
            issued += 1
            prog += turn_pass(c) + [done_upto(issued)] + release_k(0) + softmax(0)
            for j in range(n_blocks - 1):
                prog += [WaitParity(f"k_ready[{(j + 1) % stages}]", ph(j + 1))]
                if pingpong:
                    prog += [WaitParity(f"v_ready[{j % stages}]", ph(j))] + turn_wait(j + 1, c)
                    prog += [qk(j + 1, c, False), pv(j, c, False)] + turn_pass(c)
                else:
                    prog += [qk(j + 1, c, False), WaitParity(f"v_ready[{j % stages}]", ph(j)),
                             pv(j, c, False)]
                issued += 2
                # warpgroup_mma_wait(1): S_{j+1} has finished, P_j V_j may still run
                prog += [done_upto(issued - 1)] + release_k(j + 1) + softmax(j + 1)
                prog += [done_upto(issued)] + release_v(j)
            last = n_blocks - 1
            prog += [WaitParity(f"v_ready[{last % stages}]", ph(last))] + turn_wait(n_blocks, c)
            prog += [pv(last, c, False)] + turn_pass(c)
            issued += 1
            prog += [done_upto(issued)] + release_v(last)
        name = f"consumer{c} (1 warpgroup)" if pingpong else "consumer (8 warps)"
        wgs.append(Warpgroup(name, "consumer", prog, regs=register_need(64, Bc, D, pipelined),
                             threads=threads))
    title = f"{kernel} ({stages} stage{'s' if stages > 1 else ''}"
    title += ", K and V released together)" if joint else ")"
    return Schedule(title, wgs, readers, True, _KERNEL_DESCRIPTIONS[kernel], per_phase)


def predict_kernels(providers=None, hw: Hardware = H100, **kw) -> dict:
    """Predicted TFLOPS for each benchmark provider in :data:`KERNEL_MODELS` (or the
    given subset): ``{provider: tflops}``."""
    providers = list(KERNEL_MODELS) if providers is None else list(providers)
    out = {}
    for p in providers:
        if p not in KERNEL_MODELS:
            raise ValueError(f"no kernel model for provider {p!r}; known: {list(KERNEL_MODELS)}")
        kernel, stages = KERNEL_MODELS[p]
        out[p] = simulate(build_kernel_schedule(kernel, stages=stages, **kw), hw).tflops
    return out


# --------------------------------------------------------------------------- plotting
_COLORS = {"tma": "#4c72b0", "tensor": "#dd8452", "mufu": "#55a868", "alu": "#8172b3"}


def plot_timeline(result: SimResult, ax=None, t_max: float | None = None):
    """Gantt chart: one row per warpgroup (what it has running on which unit; grey
    hatched = waiting on a barrier) and one row per unit (busy)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.2))
    names = list(dict.fromkeys(w for w, *_ in result.trace))
    rows = names + [f"unit: {u}" for u in UNITS]
    y = {n: i for i, n in enumerate(rows)}
    for wg, unit, label, st, en in result.trace:
        ax.broken_barh([(st, en - st)], (y[wg] - 0.4, 0.8), color=_COLORS[unit])
        ax.broken_barh([(st, en - st)], (y[f"unit: {unit}"] - 0.4, 0.8), color=_COLORS[unit],
                       alpha=0.45)
    for wg, bar, st, en in result.waits:
        if wg in y:
            ax.broken_barh([(st, en - st)], (y[wg] - 0.15, 0.3), facecolor="none",
                           edgecolor="grey", hatch="///", linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    ax.invert_yaxis()
    ax.set_xlim(0, t_max or result.time_us)
    ax.set_xlabel("time on one SM (microseconds)")
    ax.set_title(f"{result.schedule}: {result.tflops:.0f} TFLOPS predicted, tensor cores "
                 f"{100 * result.utilization['tensor']:.0f}% busy")
    ax.legend(handles=[Patch(color=c, label=u) for u, c in _COLORS.items()]
              + [Patch(facecolor="none", edgecolor="grey", hatch="///", label="waiting")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return ax
