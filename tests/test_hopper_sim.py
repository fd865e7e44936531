"""The lesson-8 schedule simulator: schedules, utilisation, deadlocks, hazards, registers."""
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
