import io
import os
import subprocess
import sys
from pathlib import Path

from course_utils import device
from course_utils import doctor as doctor_module
from course_utils.doctor import diagnose, doctor, known_answer_kernel

ROOT = Path(__file__).resolve().parent.parent
GOOD = {"torch": "2.13.0+cpu", "triton": "3.9.0", "numpy": "2.4.6", "matplotlib": "3.11",
        "ipywidgets": "8.1.9", "jupyterlab": "4.6", "nbval": "0.11"}


def levels(findings):
    return [f.level for f in findings]


def test_healthy_environment():
    assert levels(diagnose(GOOD, interpret=True, has_gpu=False)) == ["ok"]


def test_numpy_triton_trap_is_one_line_with_fix():
    bad = dict(GOOD, triton="3.5.1", numpy="2.4.0")
    f = diagnose(bad, interpret=True, has_gpu=False)
    assert levels(f) == ["error"]
    assert "numpy<2.4" in f[0].message and "\n" not in f[0].message
    # compiled on a GPU the interpreter is not used: no error
    assert levels(diagnose(bad, interpret=False, has_gpu=True)) == ["ok"]
    assert levels(diagnose(dict(GOOD, triton="3.6.0", numpy="2.3.1"), True, False)) == ["ok"]


def test_other_findings():
    assert "not installed" in diagnose(dict(GOOD, triton=None), True, False)[0].message
    assert "not installed" in diagnose(dict(GOOD, torch=None), True, False)[0].message
    assert "import course_utils" in diagnose(GOOD, False, False, triton_first=True)[0].message
    assert levels(diagnose(GOOD, True, True)) == ["warn"]
    assert "failed" in diagnose(GOOD, True, False, kernel_error="boom")[0].message
    assert levels(diagnose(dict(GOOD, nbval=None), True, False)) == ["warn"]


TESTED = doctor_module.tested_versions()



def test_tested_versions_are_compared():
    assert set(TESTED) == {"cpu", "gpu"}
    assert doctor_module.tested_set(GOOD, TESTED) == "cpu"
    assert levels(diagnose(GOOD, True, False, tested=TESTED)) == ["ok"]
    gpu = dict(GOOD, torch=TESTED["gpu"]["torch"] + "+cu130", triton=TESTED["gpu"]["triton"])
    assert doctor_module.tested_set(gpu, TESTED) == "gpu"
    assert levels(diagnose(gpu, False, True, tested=TESTED)) == ["ok"]
    # the public index's CUDA torch 2.13.0 pins triton 3.7.1: a pair nobody tested
    for bad in (dict(GOOD, triton="3.7.1"), dict(GOOD, torch="2.12.0"),
                dict(gpu, triton=TESTED["cpu"]["triton"])):
        f = diagnose(bad, True, False, tested=TESTED)
        assert levels(f) == ["warn"], bad
        assert "outside what the course was tested with" in f[0].message
        assert TESTED["cpu"]["torch"] in f[0].message and TESTED["gpu"]["triton"] in f[0].message
    assert doctor_module.tested_set(dict(GOOD, torch=None), TESTED) is None


def test_no_triton_platforms_warn_with_the_ways_out():
    mac = dict(GOOD, triton=None)
    f = diagnose(mac, False, False, tested=TESTED, system="darwin")
    assert levels(f) == ["warn"]  # torch alone matches the tested CPU set
    for where in ("macOS", "WSL2", "container", "hosted GPU notebook", "Lessons 0-5"):
        assert where in f[0].message
    assert levels(diagnose(mac, False, False, tested=TESTED, system="win32")) == ["warn"]
    # on Linux a missing Triton is an error: the set-up installs it
    assert levels(diagnose(mac, False, False, tested=TESTED, system="linux")) == ["error"]


def test_known_answer_kernel_runs_here():
    ok, detail = known_answer_kernel()
    assert ok, detail


def test_report_and_cli():
    buf = io.StringIO()
    assert doctor(file=buf) is True
    text = buf.getvalue()
    for word in ("torch", "triton", "device", "capability", "triton mode", "test kernel   passed",
                 "tested with", "lessons 6, 7, 9: yes"):
        assert word in text
    # which tested set this machine is depends on the machine (CI: [cpu]; the GPU machine
    # the course was tested on: [gpu]; a torch / Triton pair of neither: none)
    installed = {name: doctor_module._version(name) for name in doctor_module.PACKAGES}
    match = doctor_module.tested_set(installed, doctor_module.tested_versions())
    assert ("this machine  " + (f"the tested [{match}] set" if match else "not a tested set")) \
        in text
    # a bare environment; with a GPU, compiled Triton builds each kernel's launcher with the
    # C compiler it finds on PATH, so PATH stays (without one the doctor rightly says so)
    path = os.environ.get("PATH", "") if device.HAS_GPU else ""
    r = subprocess.run([sys.executable, "-m", "course_utils", "doctor"], capture_output=True,
                       text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": path})
    assert r.returncode == 0, r.stderr
    assert "environment report" in r.stdout
