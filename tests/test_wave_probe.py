"""The 4k-keys probes of lesson 8's forward without a GPU: the last wave's arithmetic of
benchmarks/wave_probe.py, its refusals before any work, and which persistent programs get
O slots of their own (the shared-memory sum of gluon_fwd.o_slots_fit)."""
import pytest

from course_utils.hopper import gluon_fwd
from tests.bench_scripts import load


def test_the_last_wave_as_the_grid_predicts_it():
    probe = load("wave_probe")
    # B = 4, H = 32, 4k keys, 128-row tiles on 132 SMs: 31 waves and 4 programs
    w, busy = probe.waves(4 * 32 * 32, 132)
    assert w == pytest.approx(31.0303, abs=1e-4) and busy == pytest.approx(4096 / (32 * 132))
    assert probe.waves(4 * 33 * 32, 132) == (32.0, 1.0)
    w, busy = probe.waves(8, 132)                  # fewer tiles than SMs: one wave, 8 busy
    assert busy == pytest.approx(8 / 132)


@pytest.mark.parametrize("args, message", [
    (["--d", "96"], "head dims"),
    (["--heads", "0,32"], "integers >= 1"),
    (["--heads", "32,x"], "comma-separated integers"),
    (["--runs", "0"], "--runs must be >= 1"),
    (["--settle", "-5"], "milliseconds >= 0"),
])
def test_the_wave_probe_refuses_bad_arguments_before_any_work(args, message, capsys):
    probe = load("wave_probe")
    with pytest.raises(SystemExit) as e:
        probe.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("persistent, fp8, block_m, stages, d, fits", [
    (True, False, 192, 3, 64, True),     # FASTEST[64]: 120 KiB of ring, 24 of slots
    (True, False, 128, 3, 128, False),   # FASTEST[128] made persistent: 224 KiB taken
    (True, False, 128, 2, 128, True),    # two stages: 160 + 32 KiB
    (False, False, 192, 3, 64, False),   # the grid stores O through its Q slots
    (True, True, 128, 3, 128, False),    # FP8 keeps O in registers (it spilled with slots)
    (True, True, 192, 3, 64, False),
])
def test_which_persistent_programs_get_o_slots(persistent, fp8, block_m, stages, d, fits):
    in_bytes = 1 if fp8 else 2
    assert gluon_fwd.o_slots_fit(persistent, fp8, block_m, 128, stages, d, in_bytes, 2) is fits


def test_o_slots_keep_the_margin():
    # exactly at the limit with the margin: fits; one byte over: not
    free = gluon_fwd.SM90_SHARED_BYTES - gluon_fwd.O_SLOTS_MARGIN
    ring = (128 + 2 * 2 * 128) * 128 * 2
    slots = 128 * 128 * 2
    assert ring + slots < free
    assert gluon_fwd.o_slots_fit(True, False, 128, 128, 2, 128, 2, 2)
    assert not gluon_fwd.o_slots_fit(True, False, 128, 128, 2, 128, 2,
                                     (free - ring) // (128 * 128) + 1)
