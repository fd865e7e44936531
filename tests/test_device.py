import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import device

ROOT = Path(__file__).resolve().parent.parent


def test_cpu_machine_uses_interpreter():
    if device.HAS_GPU:
        pytest.skip("this machine has a GPU")
    assert device.KIND == "cpu" and str(device.DEVICE) == "cpu"
    assert os.environ["TRITON_INTERPRET"] == "1" and device.INTERPRET


def test_pick_and_needs(capsys):
    assert device.pick(cpu=1, gpu=2, hopper=3) == {"cpu": 1, "gpu": 2, "hopper": 3}[device.KIND]
    assert device.needs("cpu")
    if not device.HAS_GPU:
        assert device.needs("gpu") is False
        assert "needs a CUDA GPU" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs\\(\\) takes one of"):
        device.needs("tpu")


def _fresh(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_DEVICE")}
    e.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e)


def test_interpret_set_before_triton_import():
    r = _fresh("import course_utils, os, triton; print(os.environ.get('TRITON_INTERPRET'))",
               COURSE_DEVICE="cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def test_triton_first_is_warned():
    r = _fresh("import triton, course_utils", COURSE_DEVICE="cpu")
    assert "import course_utils first" in r.stderr


def test_bad_course_device():
    r = _fresh("import course_utils", COURSE_DEVICE="tpu")
    assert r.returncode != 0 and "COURSE_DEVICE must be" in r.stderr
