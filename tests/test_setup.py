"""The README's two commands: `python course.py lab` serves the course, and the
set-up they share picks torch and Triton without conflicts on every platform.

The install decisions are pure functions of the machine (platform, Python, GPU) and
of whether an index can be reached, so they are tested here without any network."""
import configparser
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("course_script", ROOT / "course.py")
course = importlib.util.module_from_spec(_spec)
sys.modules["course_script"] = course  # dataclasses look their module up there
_spec.loader.exec_module(course)
SETS = course.tested_sets()
CPU_TORCH, GPU_TORCH = f"torch=={SETS['cpu']['torch']}", f"torch=={SETS['gpu']['torch']}"
PYTHONS = [(3, 10), (3, 11), (3, 12), (3, 13)]


def linux(py=(3, 11), gpu=False):
    return course.Machine("linux", py, gpu)


def reachable(answer, calls=None):
    def probe(url):
        if calls is not None:
            calls.append(url)
        return answer
    return probe


# ------------------------------------------------------------------ the tested versions

def test_tested_versions_file_has_both_sets():
    cfg = configparser.ConfigParser()
    assert cfg.read(ROOT / "course_utils" / "data" / "tested_versions.ini")
    assert set(cfg.sections()) == {"cpu", "gpu"}
    for name in ("cpu", "gpu"):
        for key in ("python", "torch", "triton", "numpy", "machine"):
            assert cfg[name].get(key), f"[{name}] has no {key}"
        assert course.vtuple(cfg[name]["torch"]) >= (2, 4)
    # the doctor reads the file the set-up installs from
    from course_utils import doctor
    assert doctor.TESTED_FILE == course.TESTED.resolve()
    assert doctor.tested_versions() == SETS


def test_missing_tested_file_names_the_fix(tmp_path):
    with pytest.raises(course.SetupError, match="git checkout"):
        course.tested_sets(tmp_path / "nope.ini")


# ------------------------------------------------------------------ torch

@pytest.mark.parametrize("py", PYTHONS)
def test_linux_cpu_prefers_the_cpu_index_then_falls_back(py):
    calls = []
    steps = course.torch_steps(linux(py), SETS, index_reachable=reachable(True, calls))
    assert calls == [course.CPU_INDEX]
    assert [s.args for s in steps] == [(CPU_TORCH, "--index-url", course.CPU_INDEX), (CPU_TORCH,)]
    assert steps[0].fallback and not steps[1].fallback
    assert "CPU-only" in steps[0].why and "falling back" in steps[1].why
    # no step pins a Triton next to torch: the torch chosen decides its own Triton
    assert not any("triton" in a for s in steps for a in s.args)


@pytest.mark.parametrize("py", PYTHONS)
def test_linux_cpu_unreachable_index_goes_straight_to_the_public_index(py):
    steps = course.torch_steps(linux(py), SETS, index_reachable=reachable(False))
    assert [s.args for s in steps] == [(CPU_TORCH,)]
    assert "cannot be reached" in steps[0].why and "--torch-index" in steps[0].why
    assert "CUDA build" in steps[0].why  # the learner is told why the download is large


def test_learner_chooses_the_index():
    calls = []
    url = "https://mirror.example/whl/cpu"
    steps = course.torch_steps(linux(), SETS, index=url, index_reachable=reachable(True, calls))
    assert calls == [url] and steps[0].args == (CPU_TORCH, "--index-url", url)
    # "pypi" skips the CPU index without probing it
    calls.clear()
    steps = course.torch_steps(linux(), SETS, index="pypi", index_reachable=reachable(True, calls))
    assert calls == [] and [s.args for s in steps] == [(CPU_TORCH,)]


@pytest.mark.parametrize("py", PYTHONS)
def test_gpu_machine_gets_the_tested_cuda_torch(py):
    calls = []
    steps = course.torch_steps(linux(py, gpu=True), SETS, index_reachable=reachable(True, calls))
    assert calls == [] and [s.args for s in steps] == [(GPU_TORCH,)]
    assert "NVIDIA GPU" in steps[0].why
    url = "https://download.pytorch.org/whl/cu126"
    steps = course.torch_steps(linux(py, gpu=True), SETS, index=url)
    assert [s.args for s in steps] == [(GPU_TORCH, "--index-url", url)]


@pytest.mark.parametrize("system", ["darwin", "win32"])
@pytest.mark.parametrize("py", PYTHONS)
def test_macos_and_windows_get_pypi_torch_and_no_triton(system, py):
    m = course.Machine(system, py, False, "arm64")
    calls = []
    steps = course.torch_steps(m, SETS, index_reachable=reachable(True, calls))
    assert calls == [] and [s.args for s in steps] == [(CPU_TORCH,)]
    assert not m.triton_wheels
    assert course.triton_steps(m, SETS, SETS["cpu"]["torch"], None) == []
    assert course.numpy_step(m, None) is None


def test_torch_spec_replaces_the_tested_version():
    steps = course.torch_steps(linux(), SETS, spec="torch>=2.4", index_reachable=reachable(False))
    assert [s.args for s in steps] == [("torch>=2.4",)]
    steps = course.torch_steps(linux(gpu=True), SETS, spec="torch==2.9.1")
    assert [s.args for s in steps] == [("torch==2.9.1",)]


# ------------------------------------------------------------------ Triton and numpy

def test_triton_is_added_only_when_torch_brings_none():
    # a CUDA torch from the public index pins its own Triton: nothing is added
    assert course.triton_steps(linux(), SETS, SETS["cpu"]["torch"], "3.7.1") == []
    # the CPU-only torch brings none: the tested Triton, then any Triton >= 3.7 that has a
    # wheel for this Python (triton 3.9.0 has none for 3.10)
    steps = course.triton_steps(linux((3, 10)), SETS, SETS["cpu"]["torch"] + "+cpu", None)
    assert [s.args for s in steps] == [(f"triton=={SETS['cpu']['triton']}",), ("triton>=3.7",)]
    assert steps[0].fallback and not steps[1].fallback
    # the GPU set's torch without its Triton gets the GPU set's Triton
    steps = course.triton_steps(linux(), SETS, SETS["gpu"]["torch"] + "+cpu", None)
    assert steps[0].args == (f"triton=={SETS['gpu']['triton']}",)
    # an untested torch gets the CPU set's Triton first
    steps = course.triton_steps(linux(), SETS, "2.12.1", None)
    assert steps[0].args == (f"triton=={SETS['cpu']['triton']}",)


def test_numpy_rule_only_for_old_triton_in_the_interpreter():
    step = course.numpy_step(linux(), "3.6.0")
    assert step.args == ("numpy<2.4",)
    assert course.numpy_step(linux(gpu=True), "3.6.0") is None  # compiled, no interpreter
    for v in ("3.7.1", "3.9.0", None):
        assert course.numpy_step(linux(), v) is None


def test_tested_match():
    cpu, gpu = SETS["cpu"], SETS["gpu"]
    assert course.tested_match(SETS, cpu["torch"] + "+cpu", cpu["triton"]) == "cpu"
    assert course.tested_match(SETS, gpu["torch"] + "+cu130", gpu["triton"]) == "gpu"
    assert course.tested_match(SETS, cpu["torch"], gpu["triton"]) is None
    assert course.tested_match(SETS, cpu["torch"], "3.7.1") is None
    assert course.tested_match(SETS, "2.12.0", cpu["triton"]) is None
    assert course.tested_match(SETS, cpu["torch"], None) == "cpu"  # no Triton on this platform


# ------------------------------------------------------------------ running the steps

def test_install_falls_back_and_failure_names_the_fix(monkeypatch, capsys):
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd[-1] if cmd[-2] != "--index-url" else "cpu-index")
        return subprocess.CompletedProcess(cmd, 0 if ran[-1] == CPU_TORCH else 1)

    monkeypatch.setattr(course, "run", fake_run)
    steps = course.torch_steps(linux(), SETS, index_reachable=reachable(True))
    course._install(["pip"], steps, "torch", "the fix")
    assert ran == ["cpu-index", CPU_TORCH]
    out = capsys.readouterr().out
    assert out.count("[course]") == 3 and "trying the next option" in out
    ran.clear()
    with pytest.raises(course.SetupError, match="installing triton failed .* Fix: do this"):
        course._install(["pip"], [course.Step(("triton==9",), "why")], "triton", "do this")


def test_index_probe_is_fast_and_offline(tmp_path):
    assert course.index_reachable(str(tmp_path)) and course.index_reachable(tmp_path.as_uri())
    assert not course.index_reachable((tmp_path / "missing").as_uri())
    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.perf_counter()
    assert not course.index_reachable(f"http://127.0.0.1:{port}/whl/cpu", timeout=2)
    assert time.perf_counter() - t < 3


def test_python_versions():
    for v in PYTHONS:
        course.check_python(v)
    with pytest.raises(course.SetupError, match="3.10 or newer"):
        course.check_python((3, 9))
    course.check_python((3, 14))  # allowed, with a line saying it is untested


def test_torch_index_option_needs_a_value():
    r = subprocess.run([sys.executable, "course.py", "setup", "--torch-index"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "needs a URL" in r.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_usage_and_unknown_command():
    r = subprocess.run([sys.executable, "course.py"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "python course.py lab" in r.stdout
    r = subprocess.run([sys.executable, "course.py", "nonsense"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2


def test_lab_command_serves_the_course(tmp_path):
    port, token = free_port(), "course-test-token"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    cmd = [sys.executable, "course.py", "lab", "--here", "--no-browser", f"--port={port}",
           "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
           "--ServerApp.port_retries=0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        body, deadline = None, time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}",
                                            timeout=5) as r:
                    assert r.status == 200
                    body = r.read().decode()
                    break
            except OSError:
                time.sleep(1)
        assert body is not None, "JupyterLab did not answer on /lab"
        assert "JupyterLab" in body
        url = f"http://127.0.0.1:{port}/api/contents/notebooks?token={token}"
        with urllib.request.urlopen(url, timeout=10) as r:
            listing = r.read().decode()
        assert "00_setup.ipynb" in listing  # it serves the course's notebooks
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------ the container

def test_container_runs_the_course_setup():
    docker = (ROOT / "Dockerfile").read_text()
    steps = [line for line in docker.splitlines() if line and not line.startswith("#")]
    runs = [line for line in steps if line.startswith("RUN ")]
    assert runs == ["RUN python course.py setup"]  # the set-up itself, not a copy of its steps
    assert not any("pip install" in line for line in steps)
    py = ".".join(SETS["cpu"]["python"].split(".")[:2])
    assert steps[0] == f"FROM python:{py}-slim"  # the Python of the tested CPU set
    assert 'CMD ["python", "course.py", "lab"' in docker
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored  # a host's (perhaps macOS) environment never enters the image
    import json
    text = (ROOT / ".devcontainer" / "devcontainer.json").read_text()
    dev = json.loads("\n".join(line for line in text.splitlines()
                               if not line.lstrip().startswith("//")))
    assert dev["build"]["dockerfile"] == "../Dockerfile"
    assert dev["postCreateCommand"] == "python course.py setup"
    assert dev["workspaceFolder"] == "/course" and "target=/course" in dev["workspaceMount"]


def test_venv_failure_names_the_fix(monkeypatch, tmp_path):
    def no_ensurepip(self, env_dir):
        raise subprocess.CalledProcessError(1, ["python", "-m", "ensurepip"])

    monkeypatch.setattr(course.venv.EnvBuilder, "create", no_ensurepip)
    monkeypatch.setattr(course, "_launcher_has_cuda_torch", lambda: False)
    monkeypatch.setenv("COURSE_VENV", str(tmp_path / "env"))
    with pytest.raises(course.SetupError, match=r"apt install python3\.\d+-venv"):
        course.env_python(here=False)
    assert not (tmp_path / "env").exists()  # nothing half-made is left behind


@pytest.mark.parametrize("case", ["cpu_index", "cuda_torch_pins_old_triton", "macos", "kept"])
def test_setup_runs_the_steps_in_order(case, monkeypatch, tmp_path, capsys):
    """The whole set-up with pip replaced: which installs run, in which order."""
    py = tmp_path / "env" / "bin" / "python"
    py.parent.mkdir(parents=True)
    system = "darwin" if case == "macos" else "linux"
    installed = {"torch": "2.13.0+cpu", "triton": "3.9.0"} if case == "kept" else {}
    pips = []

    def fake_run(cmd, **kw):
        args = tuple(str(c) for c in cmd[5:])  # after `python -m pip install --disable-...`
        pips.append(args)
        if args[0].startswith("torch") and case == "cuda_torch_pins_old_triton":
            installed.update(torch="2.11.0", triton="3.6.0")
        elif args[0].startswith("torch"):
            installed["torch"] = "2.13.0+cpu"  # the CPU-only build brings no Triton
        elif args[0].startswith("triton"):
            installed["triton"] = args[0].split("==")[1]
        elif args[0] == "-e":
            installed["numpy"] = "2.4.6"
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(course, "env_python", lambda here: py)
    monkeypatch.setattr(course, "this_machine", lambda: course.Machine(system, (3, 12), False))
    monkeypatch.setattr(course, "index_reachable", lambda url, timeout=5.0: True)
    monkeypatch.setattr(course, "_version_of", lambda p, module: installed.get(module))
    monkeypatch.setattr(course, "run", fake_run)
    monkeypatch.delenv("COURSE_TORCH_INDEX", raising=False)
    if case == "cuda_torch_pins_old_triton":
        monkeypatch.setenv("COURSE_TORCH_SPEC", "torch==2.11.0")
    else:
        monkeypatch.delenv("COURSE_TORCH_SPEC", raising=False)
    course.setup()
    firsts = [a[0] for a in pips]
    expected = {
        "cpu_index": [CPU_TORCH, f"triton=={SETS['cpu']['triton']}", "-e"],
        "cuda_torch_pins_old_triton": ["torch==2.11.0", "-e", "numpy<2.4"],
        "macos": [CPU_TORCH, "-e"],
        "kept": ["-e"],
    }[case]
    assert firsts == expected
    if case == "cpu_index":
        assert pips[0] == (CPU_TORCH, "--index-url", course.CPU_INDEX)
    out = capsys.readouterr().out
    if case == "macos":
        assert "Triton publishes no wheels" in out and "WSL2" in out
    if case == "kept":
        assert "keeping it" in out and "the tested [cpu] set" in out
    assert (tmp_path / "env" / ".course-setup-stamp").exists()
