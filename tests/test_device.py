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


# A machine without Triton (macOS, Windows), simulated by hiding Triton from a fresh
# interpreter before course_utils is imported.
HIDE_TRITON = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
for m in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
    del sys.modules[m]
"""


def _without_triton(code, system):
    # torch and urllib look at sys.platform while importing: import them first
    pre = HIDE_TRITON + "import torch, urllib.request\n" + f"sys.platform = {system!r}\n"
    return _fresh(pre + code, COURSE_DEVICE="cpu")


def test_no_triton_import_gives_one_clear_message():
    r = _without_triton("""
import course_utils
from course_utils import device
assert device.HAS_TRITON is False and device.describe()["has_triton"] is False
for stmt in ("import triton", "import triton.language as tl", "import course_utils.triton_intro",
             "from course_utils import triton_decode", "import course_utils.triton_attention"):
    try:
        exec(stmt)
    except device.TritonUnavailable as e:
        assert isinstance(e, ModuleNotFoundError) and e.name == "triton"
        lines = e._render_traceback_()
        assert len(lines) == 1, lines
        print(stmt, "->", lines[0])
    else:
        raise AssertionError(stmt + " did not raise")
""", system="darwin")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 5
    for line in lines:
        for where in ("macOS", "Linux", "WSL2", "container", "hosted GPU notebook",
                      "Lessons 0-5", "lesson 8"):
            assert where in line, (where, line)


def test_no_triton_needs_and_lessons():
    r = _without_triton("""
from course_utils import device
assert device.needs("triton") is False
assert [w for w, _ in device.lessons()] == ["lessons 0-5", "lessons 6, 7, 9", "lesson 8"]
print(device.lessons())
""", system="win32")
    assert r.returncode == 0, r.stderr
    assert "Skipped on this machine" in r.stdout and "Windows" in r.stdout
    assert "'lessons 6, 7, 9', 'no (Triton" in r.stdout and "the simulator yes" in r.stdout


def test_no_triton_on_linux_says_run_setup():
    r = _without_triton("""
from course_utils import device
try:
    import triton
except device.TritonUnavailable as e:
    print(e)
""", system="linux")
    assert r.returncode == 0, r.stderr
    assert "python course.py setup" in r.stdout and "WSL2" not in r.stdout


def test_triton_present_is_untouched():
    assert device.HAS_TRITON
    assert device.needs("triton", quiet=True)
    assert not any(type(f).__name__ == "_NoTriton" for f in sys.meta_path)
    assert ("lessons 6, 7, 9", "yes (Triton's interpreter on the CPU, small sizes)") in \
        device.lessons(True, "cpu")
    assert device.lessons(True, "hopper")[2] == ("lesson 8", "simulator and Triton parts yes; "
                                                      "the Hopper kernels yes")
