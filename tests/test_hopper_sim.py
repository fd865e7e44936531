"""The lesson-8 schedule simulator: schedules, utilisation, deadlocks, hazards, registers."""
import re
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from course_utils.hopper import schedule_sim as sim
from course_utils.hopper.schedule_sim import Arrive, Op, Schedule, Wait, Warpgroup


@pytest.mark.parametrize("name", sim.SCHEDULE_NAMES)
def test_every_schedule_runs_and_counts_all_flops(name):
    r = sim.simulate(sim.build_schedule(name, n_blocks=4))
    assert r.flops == pytest.approx(2 * 4 * 2 * (2.0 * 64 * 128 * 128))   # 2 consumers, 2 GEMMs
    assert 0 < r.utilization["tensor"] <= 1
    assert 0 < r.tflops <= sim.H100.tensor_tflops


def test_tensor_work_time_matches_rate():
    r = sim.simulate(sim.build_schedule("pingpong", n_blocks=4))
    assert r.work_time["tensor"] == pytest.approx(r.flops / sim.H100.rate("tensor"))
    assert r.tflops == pytest.approx(sim.H100.tensor_tflops * r.utilization["tensor"])


def test_fa3_ingredients_order_like_the_paper():
    rows = {r["schedule"]: r["predicted_tflops"] for r in sim.compare_with_fa3()}
    assert rows["no_ws_pipelined"] < rows["pingpong"] <= rows["fa3"]
    assert rows["fa3"] > rows["warp_specialized"]


def test_serial_single_consumer_is_tensor_bound_by_softmax():
    r = sim.simulate(sim.build_schedule("fa2_serial", n_blocks=4, consumers=1))
    # alone, a warpgroup alternates matmul and softmax: the tensor cores idle in between
    assert r.utilization["tensor"] < 0.6


def test_deadlock_names_waiting_warpgroups_and_barriers():
    sched = sim.build_schedule("warp_specialized", n_blocks=4)
    for wg in sched.warpgroups:
        if wg.role == "consumer":
            wg.program = [i for i in wg.program if not isinstance(i, Arrive)]
    with pytest.raises(sim.DeadlockError) as e:
        sim.simulate(sched)
    msg = str(e.value)
    assert "producer waits on 'k_empty[0]'" in msg and "arrival #2, it has 0" in msg
    assert e.value.blocked[0][0] == "producer"


def test_hazard_read_before_copy_completes():
    prog_p = [Op("tma", 1000, "load K0", sync=False, barrier="full", writes=("K",))]
    prog_c = [Op("tensor", 1e6, "S=QK", reads=("K",))]          # missing Wait("full", 1)
    sched = Schedule("bad", [Warpgroup("p", "producer", prog_p, 24),
                             Warpgroup("c", "consumer", prog_c, 100)])
    with pytest.raises(sim.HazardError, match="reads K.*has not completed"):
        sim.simulate(sched)
    prog_c.insert(0, Wait("full", 1))
    assert sim.simulate(sched).time_us > 0


def test_hazard_overwrite_before_release():
    prog_p = [Op("tma", 1000, "load K0", sync=False, barrier="full", writes=("K",)),
              Op("tma", 1000, "load K1", sync=False, barrier="full", writes=("K",))]
    prog_c = [Wait("full", 2), Op("tensor", 1e6, "S=QK", reads=("K",))]
    sched = Schedule("bad", [Warpgroup("p", "producer", prog_p, 24),
                             Warpgroup("c", "consumer", prog_c, 100)])
    with pytest.raises(sim.HazardError, match="overwrites K while the copy .load K0."):
        sim.simulate(sched)


def test_register_budget():
    assert sim.register_need(64, 128, 128, pipelined=True) == 24 + 64 + 128
    assert sim.register_split(["producer", "consumer", "consumer"]) == {0: 24, 1: 240, 2: 240}
    assert sim.register_split(["producer", "consumer", "consumer"], setmaxnreg=False)[1] == 168
    with pytest.raises(sim.RegisterBudgetError, match="needs 280 registers"):
        sim.simulate(sim.build_schedule("fa3", n_blocks=2, D=256))
    sim.simulate(sim.build_schedule("fa3", n_blocks=2, D=256, Bc=64))
    with pytest.raises(sim.RegisterBudgetError, match="even split"):
        sim.simulate(sim.build_schedule("fa3", n_blocks=2, setmaxnreg=False))


def test_bad_arguments():
    with pytest.raises(ValueError, match="name must be one of"):
        sim.build_schedule("fa4")
    with pytest.raises(ValueError, match="stages must be a positive int"):
        sim.build_schedule("fa3", stages=0)
    with pytest.raises(TypeError, match="schedule must be a Schedule"):
        sim.simulate("fa3")
    with pytest.raises(ValueError, match="names unit"):
        sim.simulate(Schedule("x", [Warpgroup("c", "consumer", [Op("gpu", 1, "x")], 10)]))


@given(n=st.integers(1, 6), stages=st.integers(1, 4), name=st.sampled_from(sim.SCHEDULE_NAMES))
def test_no_deadlock_any_size(n, stages, name):
    r = sim.simulate(sim.build_schedule(name, n_blocks=n, stages=stages))
    assert r.time_us >= r.work_time["tensor"] - 1e-9


def test_plot_timeline():
    import matplotlib
    matplotlib.use("Agg")
    ax = sim.plot_timeline(sim.simulate(sim.build_schedule("fa3", n_blocks=3)))
    assert "fa3" in ax.get_title()


# ----------------------------------------------------------------- problem-set checks
import copy  # noqa: E402

import torch  # noqa: E402

from course_utils.checks import CheckFailed  # noqa: E402
from course_utils.hopper import checks  # noqa: E402


def _broken():
    s = sim.build_schedule("warp_specialized", n_blocks=4)
    for wg in s.warpgroups:
        wg.program = [i for i in wg.program if not isinstance(i, Arrive)]
    return s


def _add_releases(s, before=False, only_k=False):
    s = copy.deepcopy(s)
    for wg in s.warpgroups:
        if wg.role != "consumer":
            continue
        prog = []
        for ins in wg.program:
            rel = []
            if isinstance(ins, Op) and ins.reads:
                kind = ins.reads[0][0].lower()
                if not (only_k and kind == "v"):
                    rel = [Arrive(f"{kind}_empty[{ins.reads[0][2:-1]}]")]
            prog += (rel + [ins]) if before else ([ins] + rel)
        wg.program = prog
    return s


def test_check_schedule_runs_accepts_fix_rejects_wrong():
    ref = sim.build_schedule("warp_specialized", n_blocks=4)
    checks.check_schedule_runs(_add_releases(_broken()), ref)
    with pytest.raises(CheckFailed, match="still deadlocks"):
        checks.check_schedule_runs(_broken(), ref)
    with pytest.raises(CheckFailed, match="hazard"):
        checks.check_schedule_runs(_add_releases(_broken(), before=True), ref)
    with pytest.raises(CheckFailed, match="still deadlocks"):
        checks.check_schedule_runs(_add_releases(_broken(), only_k=True), ref)
    with pytest.raises(CheckFailed, match="expected a Schedule"):
        checks.check_schedule_runs(None, ref)


def test_check_best_schedule():
    checks.check_best_schedule(checks.best_feasible_schedule)
    with pytest.raises(CheckFailed, match="choose"):
        checks.check_best_schedule(lambda D, Bc: "fa3")


def test_check_fp8_quantizer():
    def good(x):
        s = x.abs().max() / 448.0
        return (x / s).to(torch.float8_e4m3fn), s
    checks.check_fp8_quantizer(good)
    with pytest.raises(CheckFailed, match="scale"):
        checks.check_fp8_quantizer(lambda x: ((x / x.abs().max()).to(torch.float8_e4m3fn),
                                              x.abs().max()))
    with pytest.raises(CheckFailed, match="float8_e4m3fn"):
        checks.check_fp8_quantizer(lambda x: (x.half(), x.abs().max() / 448))
    with pytest.raises(CheckFailed, match="dequantises"):
        checks.check_fp8_quantizer(lambda x: (x.clamp(-448, 448).to(torch.float8_e4m3fn),
                                              x.abs().max() / 448))


# ----------------------------------------------------------------- mbarrier phases
from course_utils.hopper.schedule_sim import WaitParity  # noqa: E402


def _one_barrier(waiter, arrivals, per_phase=1):
    """A producer arrives ``arrivals`` times on 'bar' and then on 'done'; a consumer
    waits for 'done' and then runs ``waiter``."""
    prod = [Op("alu", 1.0, f"work{i}", barrier="bar") for i in range(arrivals)] + [Arrive("done")]
    sched = Schedule("phases", [Warpgroup("p", "producer", prod, 24),
                                Warpgroup("c", "consumer", [WaitParity("done", 0)] + waiter, 100)],
                     arrivals_per_phase={"bar": per_phase})
    return sim.simulate(sched, check_registers=False)


def test_parity_wait_semantics():
    # a fresh barrier is in phase 0: the phase "before" it (parity 1) counts as complete
    _one_barrier([WaitParity("bar", 1)], 0)
    with pytest.raises(sim.DeadlockError, match="parity 0"):
        _one_barrier([WaitParity("bar", 0)], 0)
    # one arrival completes phase 0: parity 0 passes, parity 1 now waits for phase 1
    _one_barrier([WaitParity("bar", 0)], 1)
    with pytest.raises(sim.DeadlockError, match="parity 1"):
        _one_barrier([WaitParity("bar", 1)], 1)
    # two arrivals per phase: one arrival completes nothing
    with pytest.raises(sim.DeadlockError, match="'bar' for the phase of parity 0"):
        _one_barrier([WaitParity("bar", 0)], 1, per_phase=2)
    _one_barrier([WaitParity("bar", 0)], 2, per_phase=2)
    # one bit cannot tell phase 0 from phase 2: after two phases parity 0 waits again
    with pytest.raises(sim.DeadlockError, match="parity 0"):
        _one_barrier([WaitParity("bar", 0)], 2)
    _one_barrier([WaitParity("bar", 1)], 2)
    _one_barrier([WaitParity("bar", 0)], 3)
    with pytest.raises(ValueError, match="parity must be 0 or 1"):
        WaitParity("bar", 2)


@pytest.mark.parametrize("kernel", sim.KERNEL_NAMES)
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_kernel_schedules_run_and_count_all_flops(kernel, stages):
    # the kernel's protocol (K and V released separately) finishes with any ring size,
    # stages=1 included, as the Gluon kernel does on the GPU
    r = sim.simulate(sim.build_kernel_schedule(kernel, stages=stages, n_blocks=5))
    assert r.flops == pytest.approx(5 * 2 * 2.0 * 128 * 128 * 128)   # 128 rows, 2 GEMMs
    assert 0 < r.tflops <= sim.H100.tensor_tflops


@pytest.mark.parametrize("kernel", ["gluon_ws_pipe", "gluon_pingpong"])
def test_one_slot_finishes_with_separate_release_and_deadlocks_with_joint(kernel):
    sep = sim.build_kernel_schedule(kernel, stages=1, n_blocks=5)
    assert sim.build_kernel_schedule(kernel, stages=1, n_blocks=5, release="separate") == sep
    r = sim.simulate(sep)
    assert r.flops == pytest.approx(5 * 2 * 2.0 * 128 * 128 * 128)
    # K_1 is copied into the single slot before P_0 V_0 (which still reads V_0) starts
    span = {label: (t0, t1) for _, _, label, t0, t1 in r.trace}
    assert span["load K1"][1] <= span["O+=P0V0"][0] + 1e-9
    assert span["load V1"][0] >= span["O+=P0V0"][1] - 1e-9
    # releasing K and V together on one kv_empty: the pipelined consumer waits for
    # K_{j+1} before it releases slot j, which with one slot is the slot K_{j+1} needs
    with pytest.raises(sim.DeadlockError) as e:
        sim.simulate(sim.build_kernel_schedule(kernel, stages=1, n_blocks=5, release="joint"))
    msg = str(e.value)
    assert "producer (1 warp) waits on 'kv_empty[0]'" in msg
    assert "'k_ready[0]'" in msg
    # a second slot breaks the cycle under either protocol
    for release in sim.RELEASE_PROTOCOLS:
        sim.simulate(sim.build_kernel_schedule(kernel, stages=2, n_blocks=5, release=release))


@given(n=st.integers(1, 6), stages=st.integers(1, 4), kernel=st.sampled_from(sim.KERNEL_NAMES),
       in_order=st.booleans())
def test_kernel_schedules_deadlock_only_joint_pipelined_with_one_slot(n, stages, kernel, in_order):
    hw = sim.Hardware(tensor_in_order=in_order)
    r = sim.simulate(sim.build_kernel_schedule(kernel, stages=stages, n_blocks=n), hw)
    assert r.time_us >= r.work_time["tensor"] - 1e-9
    joint = sim.build_kernel_schedule(kernel, stages=stages, n_blocks=n, release="joint")
    if stages == 1 and n > 1 and kernel in ("gluon_ws_pipe", "gluon_pingpong"):
        with pytest.raises(sim.DeadlockError, match="kv_empty\\[0\\]"):
            sim.simulate(joint, hw)
        return
    r = sim.simulate(joint, hw)
    assert r.time_us >= r.work_time["tensor"] - 1e-9


def test_kernel_schedules_use_the_kernels_barriers():
    pp = sim.build_kernel_schedule("gluon_pingpong", stages=2, n_blocks=4)
    roles = [wg.role for wg in pp.warpgroups]
    assert roles == ["producer", "consumer", "consumer"]
    # both consumers release each K and each V slot
    assert pp.arrivals_per_phase == {f"{e}[{s}]": 2 for e in ("k_empty", "v_empty")
                                     for s in range(2)}
    prod = pp.warpgroups[0].program
    # the producer waits on k_empty[j % 2] before K_j and on v_empty[j % 2] before V_j,
    # each with parity ((j // 2) & 1) ^ 1
    waits = [(i.barrier, i.parity) for i in prod if isinstance(i, WaitParity)]
    assert waits == [("k_empty[0]", 1), ("v_empty[0]", 1), ("k_empty[1]", 1), ("v_empty[1]", 1),
                     ("k_empty[0]", 0), ("v_empty[0]", 0), ("k_empty[1]", 0), ("v_empty[1]", 0)]
    for wg in pp.warpgroups[1:]:
        prog = wg.program
        names = {i.barrier for i in prog if isinstance(i, (WaitParity, Arrive))}
        assert {"k_ready[0]", "v_ready[1]", "k_empty[0]", "v_empty[1]", "turn[0]",
                "turn[1]"} <= names
        assert not any("kv_empty" in n for n in names)
        # K_j is handed back once S_j is computed, before P_j V_j is issued
        arrives = [k for k, i in enumerate(prog) if isinstance(i, Arrive)]
        labels = [i.label if isinstance(i, sim.Op) else None for i in prog]
        k0 = next(k for k in arrives if prog[k].barrier == "k_empty[0]")
        v0 = next(k for k in arrives if prog[k].barrier == "v_empty[0]")
        assert labels.index("S0=QK0") < k0 < labels.index("O+=P0V0") < v0
    # the model's mbarriers are the ones the Gluon kernel allocates (plus ping-pong's turn)
    src = Path(sim.__file__).with_name("gluon_fwd.py").read_text()
    allocated = set(re.findall(r"(\w+) = gl\.allocate_shared_memory\(gl\.int64", src))
    assert {"k_ready", "v_ready", "k_empty", "v_empty"} <= allocated
    for kernel in ("gluon_ws_serial", "gluon_ws_pipe", "gluon_pingpong"):
        used = {i.barrier.split("[")[0] for wg in sim.build_kernel_schedule(kernel).warpgroups
                for i in wg.program if isinstance(i, (WaitParity, Arrive))}
        assert used <= allocated and {"k_ready", "v_ready", "k_empty", "v_empty"} <= used
    # one lockstep consumer in the Triton kernel and the non-ping-pong Gluon kernels
    for kernel in ("triton_tma", "gluon_ws_serial", "gluon_ws_pipe"):
        wgs = sim.build_kernel_schedule(kernel).warpgroups
        assert sum(wg.role == "consumer" for wg in wgs) == 1
    assert all(wg.role == "consumer" for wg in sim.build_kernel_schedule("triton_tma").warpgroups)


def test_wrong_parity_hangs_or_reads_a_tile_in_flight():
    good = sim.build_kernel_schedule("gluon_ws_serial", stages=2, n_blocks=4)
    # producer waits on kv_empty with the consumers' parity: the fresh ring looks full
    bad = copy.deepcopy(good)
    bad.warpgroups[0].program = [WaitParity(i.barrier, i.parity ^ 1) if isinstance(i, WaitParity)
                                 else i for i in bad.warpgroups[0].program]
    with pytest.raises(sim.DeadlockError, match="'k_empty\\[0\\]' for the phase of parity 0"):
        sim.simulate(bad)
    # consumer waits on k_ready with the flipped parity: it returns before the copy lands
    bad = copy.deepcopy(good)
    bad.warpgroups[1].program = [WaitParity(i.barrier, i.parity ^ 1)
                                 if isinstance(i, WaitParity) and i.barrier.startswith("k_ready")
                                 else i for i in bad.warpgroups[1].program]
    with pytest.raises(sim.HazardError, match="has not completed"):
        sim.simulate(bad)


def test_kernel_predictions_the_lesson_states():
    # what lesson 8 claims from the model: one stage exposes the copies; the pipelined
    # consumer beats the serial one; ping-pong gains only if matmuls run in issue order
    p = sim.predict_kernels()
    assert p["triton_tma_s1"] < p["triton_tma_s2"] == pytest.approx(p["triton_tma_s3"])
    assert p["gluon_ws_serial"] < p["gluon_ws_pipe"]
    assert p["gluon_pingpong"] == pytest.approx(p["gluon_ws_pipe"], rel=1e-3)
    q = sim.predict_kernels(hw=sim.Hardware(tensor_in_order=True))
    assert q["gluon_pingpong"] > 1.1 * q["gluon_ws_pipe"]
    assert q["gluon_ws_pipe"] == pytest.approx(p["gluon_ws_pipe"])     # one consumer: no change
    with pytest.raises(ValueError, match="no kernel model"):
        sim.predict_kernels(["sdpa_cudnn"])
    with pytest.raises(ValueError, match="kernel must be one of"):
        sim.build_kernel_schedule("fa3")
    with pytest.raises(ValueError, match="stages must be a positive int"):
        sim.build_kernel_schedule("triton_tma", stages=0)
    with pytest.raises(ValueError, match="release must be one of"):
        sim.build_kernel_schedule("gluon_ws_pipe", release="kv")


def test_kernel_models_cover_the_benchmarked_kernels():
    import json
    from pathlib import Path
    for path in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*/hopper.json"):
        providers = {r["provider"] for r in json.loads(path.read_text())["rows"]}
        unmodelled = providers - set(sim.KERNEL_MODELS)
        assert all(p.startswith(("sdpa_", "fp8_")) or p == "triton_tma_ws" for p in unmodelled), \
            unmodelled
        for p in sim.KERNEL_MODELS:
            assert p in providers, f"{p} is not in {path}"


def test_check_best_schedule_takes_any_of_tied_schedules():
    # ping-pong and fa3 tie exactly at (224, 96) and (256, 64): an answer that keeps the
    # last of equal results (>=) is right, and so is the first
    tied = [(224, 96), (256, 64)]
    for D, Bc in tied:
        assert set(checks.fastest_feasible_schedules(D, Bc)) == {"pingpong", "fa3"}

    def keep_last(D, Bc):
        best, best_t = None, -1.0
        for name in sim.SCHEDULE_NAMES:
            try:
                t = sim.simulate(sim.build_schedule(name, D=D, Bc=Bc, n_blocks=8)).tflops
            except sim.RegisterBudgetError:
                continue
            if t >= best_t:
                best, best_t = name, t
        return best

    checks.check_best_schedule(keep_last, cases=tied + [(64, 128), (256, 128)])
    with pytest.raises(checks.CheckFailed, match="not among the fastest"):
        checks.check_best_schedule(lambda D, Bc: "intra_pipeline", cases=tied)
