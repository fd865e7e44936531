#!/usr/bin/env python3
"""Set up the course and run it. Needs only Python 3.10-3.13.

    python course.py lab     # create .venv, install everything, open JupyterLab on the course
    python course.py test    # create .venv, install everything, run every test
    python course.py doctor  # create .venv if needed and print the environment report
    python course.py setup   # only create .venv and install everything

Set-up is idempotent: a second run only checks that nothing changed.

Options (each also a variable, for containers and CI):
  --here                 install into the Python that runs this script (``COURSE_VENV=here``;
                         for conda users who ran ``conda env create -f environment.yml``)
  COURSE_VENV=/path      put the environment elsewhere than ``.venv``
  --torch-index URL      where a machine without an NVIDIA GPU gets its CPU-only torch
                         (``COURSE_TORCH_INDEX``; default PyTorch's CPU index; ``pypi`` skips
                         it and uses pip's own index). On a GPU machine it picks the CUDA
                         build, e.g. https://download.pytorch.org/whl/cu126 for an older driver.
  COURSE_TORCH_SPEC=...  install this torch instead of the tested one (e.g. ``torch>=2.4``)

Which torch and Triton are installed, and why, is printed one line per decision; the
tested versions live in ``course_utils/data/tested_versions.ini``.
"""
from __future__ import annotations

import configparser
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
TESTED = ROOT / "course_utils" / "data" / "tested_versions.ini"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTHONS = ((3, 10), (3, 13))  # the oldest and newest Python the course is tested on
# Triton's interpreter up to 3.6 breaks on loops with runtime bounds with numpy >= 2.4.
NUMPY_RULE = ((3, 7), "numpy<2.4")
NO_TRITON_HELP = ("lessons 0-5 and lesson 8's simulator run here; for the Triton lessons "
                  "(6, 7, 9) use Linux, WSL2 on Windows, the course's container (Dockerfile, "
                  ".devcontainer/) or a hosted GPU notebook")


def say(msg):
    print(f"[course] {msg}", flush=True)


class SetupError(Exception):
    """A step failed; the message says what failed and how to fix it."""


# ---------------------------------------------------------------- decisions (pure)

@dataclass(frozen=True)
class Machine:
    system: str                # sys.platform: "linux", "darwin", "win32", ...
    python: tuple[int, int]
    nvidia_gpu: bool
    arch: str = "x86_64"

    @property
    def triton_wheels(self) -> bool:
        """Triton publishes wheels for Linux only (x86_64 and aarch64)."""
        return self.system.startswith("linux")

    @property
    def name(self) -> str:
        return {"darwin": "macOS", "win32": "Windows"}.get(self.system, self.system.capitalize())


@dataclass(frozen=True)
class Step:
    """One pip install: ``args`` after ``pip install``; ``why`` is the line printed."""
    args: tuple[str, ...]
    why: str
    fallback: bool = False  # when it fails, go on with the next step instead of stopping


def tested_sets(path: Path = TESTED) -> dict[str, dict[str, str]]:
    cfg = configparser.ConfigParser()
    if not cfg.read(path, encoding="utf-8"):
        raise SetupError(f"{path} is missing: the clone is incomplete. Fix: git checkout -- {path}")
    return {name: dict(cfg[name]) for name in cfg.sections()}


def vtuple(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    out = []
    for p in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def torch_steps(m: Machine, sets, *, spec: str | None = None, index: str | None = None,
                index_reachable=lambda url: False) -> list[Step]:
    """How to install torch on machine ``m``, in order of preference.

    ``spec`` (COURSE_TORCH_SPEC) replaces the tested version; ``index``
    (--torch-index / COURSE_TORCH_INDEX) is a URL, ``"pypi"`` or None (the default);
    ``index_reachable(url)`` answers quickly whether that index can be reached."""
    if m.nvidia_gpu and m.system.startswith("linux"):
        torch = spec or f"torch=={sets['gpu']['torch']}"
        if index and index != "pypi":
            return [Step((torch, "--index-url", index),
                         f"NVIDIA GPU found: {torch} (CUDA build) from {index}")]
        return [Step((torch,), f"NVIDIA GPU found: {torch}, the CUDA build from the public "
                               f"index (tested on the GPU with torch {sets['gpu']['torch']})")]
    torch = spec or f"torch=={sets['cpu']['torch']}"
    if not m.system.startswith("linux"):
        # PyPI's torch for macOS and Windows is the CPU build already.
        return [Step((torch,), f"{m.name}: {torch} from the public index (its CPU build)")]
    public = Step((torch,), f"no NVIDIA GPU: {torch} from pip's own index; on PyPI that is the "
                            "CUDA build for Linux (several GB), with the Triton it pins")
    if index == "pypi":
        return [public]
    url = index or CPU_INDEX
    if not index_reachable(url):
        return [Step(public.args, f"{url} cannot be reached: falling back to pip's own index, "
                                  f"where {torch} for Linux is the CUDA build (several GB) with "
                                  "the Triton it pins; --torch-index URL (or COURSE_TORCH_INDEX) "
                                  "picks another CPU-only index")]
    return [Step((torch, "--index-url", url), f"no NVIDIA GPU: CPU-only {torch} from {url} "
                                              "(small, no CUDA libraries)", fallback=True),
            Step(public.args, f"{url} had no {torch} for this machine: falling back to pip's "
                              "own index (on PyPI the CUDA build, several GB, with the Triton "
                              "it pins)")]


def triton_steps(m: Machine, sets, torch_version: str | None,
                 triton_version: str | None) -> list[Step]:
    """Add Triton only when the installed torch brought none (a CUDA torch pins its own)."""
    if triton_version:
        return []
    if not m.triton_wheels:
        return []
    tested = [s for s in sets.values() if vtuple(s["torch"]) == vtuple(torch_version)[:3]] \
        if torch_version else []
    pin = tested[0]["triton"] if tested else sets["cpu"]["triton"]
    low = ".".join(map(str, NUMPY_RULE[0]))
    return [Step((f"triton=={pin}",), f"torch {torch_version} brings no Triton: adding the tested "
                                      f"triton {pin} for the CPU interpreter", fallback=True),
            Step((f"triton>={low}",), f"triton {pin} has no wheel for Python "
                                      f"{m.python[0]}.{m.python[1]}: adding the newest triton>="
                                      f"{low} that has one")]


def numpy_step(m: Machine, triton_version: str | None) -> Step | None:
    """The interpreter rule: Triton <= 3.6 with numpy >= 2.4 fails on loops with runtime
    bounds. Compiled on a GPU the interpreter is not used, so the rule is not needed."""
    tv = vtuple(triton_version)
    if tv is None or tv[:2] >= NUMPY_RULE[0] or m.nvidia_gpu:
        return None
    return Step((NUMPY_RULE[1],), f"triton {triton_version} runs through its interpreter here, "
                                  f"which needs {NUMPY_RULE[1]}")


def tested_match(sets, torch_version: str | None, triton_version: str | None) -> str | None:
    """The name of the tested set that has exactly this torch and Triton, or None."""
    for name, s in sets.items():
        if vtuple(s["torch"]) == (vtuple(torch_version) or ())[:3] and \
                (triton_version is None or vtuple(s["triton"]) == vtuple(triton_version)):
            return name
    return None


# ---------------------------------------------------------------- the machine

def this_machine() -> Machine:
    return Machine(sys.platform, sys.version_info[:2], _has_nvidia_gpu(),
                   platform.machine().lower())


def _has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def index_reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether a package index answers for torch within ``timeout`` seconds."""
    scheme = urllib.parse.urlparse(url).scheme
    if scheme in ("", "file"):  # a local folder of wheels or a file:// index
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)).is_dir()
    try:
        req = urllib.request.Request(url.rstrip("/") + "/torch/")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status < 400
    except Exception:  # noqa: BLE001 - any failure means "not reachable"
        return False


def run(cmd, **kw):
    say("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], **kw)


def _probe(py, code) -> str | None:
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def _version_of(py, module) -> str | None:
    # importlib.metadata does not import the module (importing triton is slow)
    code = f"import importlib.metadata as m; print(m.version({module!r}))"
    return _probe(py, code)


def env_python(here: bool) -> Path:
    if here or os.environ.get("COURSE_VENV", "") == "here":
        return Path(sys.executable)
    loc = os.environ.get("COURSE_VENV", "")
    vdir = Path(loc) if loc else ROOT / ".venv"
    py = vdir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not py.exists():
        system_site = _launcher_has_cuda_torch()
        say(f"creating {vdir}" + (" (reusing this Python's CUDA torch)" if system_site else ""))
        try:
            venv.EnvBuilder(with_pip=True, system_site_packages=system_site).create(vdir)
        except (subprocess.CalledProcessError, OSError) as e:
            shutil.rmtree(vdir, ignore_errors=True)
            v = f"{sys.version_info[0]}.{sys.version_info[1]}"
            raise SetupError(f"could not create {vdir} ({e}). Fix: on Debian or Ubuntu install "
                             f"the venv module (`sudo apt install python{v}-venv`), or set up "
                             "into an environment you made yourself with --here") from None
    return py


def _launcher_has_cuda_torch() -> bool:
    code = "import torch,sys; sys.exit(0 if torch.version.cuda else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def _install(pip, steps: list[Step], what: str, fix: str):
    for i, step in enumerate(steps):
        say(step.why)
        if run(pip + list(step.args)).returncode == 0:
            return
        if not step.fallback or i == len(steps) - 1:
            raise SetupError(f"installing {what} failed (pip's message is above). Fix: {fix}")
        say(f"  pip install {' '.join(step.args)} failed; trying the next option")


def check_python(v=sys.version_info[:2]):
    if v < PYTHONS[0]:
        raise SetupError(f"Python {v[0]}.{v[1]} is too old: the course needs Python 3.10 or "
                         "newer. Fix: run this script with python3.10 ... python3.13.")
    if v > PYTHONS[1]:
        say(f"Python {v[0]}.{v[1]} is newer than the tested 3.10-3.13: trying anyway "
            "(if torch has no wheel for it yet, use Python 3.13)")


def setup(here=False, index: str | None = None) -> Path:
    check_python()
    index = index or os.environ.get("COURSE_TORCH_INDEX") or None
    spec = os.environ.get("COURSE_TORCH_SPEC") or None
    py = env_python(here)
    stamp_src = b"".join((ROOT / f).read_bytes() for f in ("pyproject.toml", "course.py"))
    stamp_src += TESTED.read_bytes() + f"{py}|{ROOT}|{index}|{spec}".encode()
    stamp = hashlib.sha256(stamp_src).hexdigest()
    stamp_file = py.parent.parent / ".course-setup-stamp"
    m = this_machine()
    wanted = "import course_utils, torch" + (", triton" if m.triton_wheels else "")
    if stamp_file.exists() and stamp_file.read_text() == stamp and \
            _probe(py, wanted) is not None:
        say(f"environment up to date ({py})")
        return py
    sets = tested_sets()
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check"]
    say(f"Python {platform.python_version()} on {m.name} ({m.arch}), "
        + ("an NVIDIA GPU" if m.nvidia_gpu else "no NVIDIA GPU"))

    torch_v = _version_of(py, "torch")
    if torch_v and not spec:
        say(f"torch {torch_v} is already installed: keeping it (COURSE_TORCH_SPEC=... replaces it)")
    else:
        steps = torch_steps(m, sets, spec=spec, index=index, index_reachable=index_reachable)
        _install(pip, steps, "torch",
                 "check the network, or choose a torch that installs here with "
                 "COURSE_TORCH_SPEC='torch>=2.4' (and --torch-index URL for another index)")
        torch_v = _version_of(py, "torch")

    triton_v = _version_of(py, "triton")
    if triton_v:
        say(f"triton {triton_v} is installed (torch pins it or it was there): keeping it")
    elif not m.triton_wheels:
        say(f"{m.name}: Triton publishes no wheels for this platform, so it is left out; "
            + NO_TRITON_HELP)
    else:
        _install(pip, triton_steps(m, sets, torch_v, None), "triton",
                 "pip install 'triton>=3.7' into the environment by hand, or use the container")
        triton_v = _version_of(py, "triton")

    _install(pip, [Step(("-e", f"{ROOT}[test]"), "installing the course and its test tools")],
             "the course", "check the network and run `python course.py setup` again")
    step = numpy_step(m, triton_v)
    if step:
        _install(pip, [step], "numpy", "pip install 'numpy<2.4' into the environment by hand")

    match = tested_match(sets, torch_v, triton_v)
    numpy_v = _version_of(py, "numpy")
    say(f"installed torch {torch_v}, triton {triton_v or '(none)'}, numpy {numpy_v}: "
        + (f"the tested [{match}] set" if match else
           "not a pair the course was tested with (`python course.py doctor` says more)"))
    stamp_file.write_text(stamp)
    return py


def main(argv):
    here = "--here" in argv
    argv = [a for a in argv if a != "--here"]
    index = None
    if "--torch-index" in argv:
        i = argv.index("--torch-index")
        if i + 1 >= len(argv):
            print("--torch-index needs a URL (or 'pypi')", file=sys.stderr)
            return 2
        index = argv[i + 1]
        del argv[i:i + 2]
    cmd, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if cmd not in ("setup", "lab", "test", "doctor"):
        print(__doc__)
        return 0 if cmd in ("help", "-h", "--help") else 2
    try:
        py = setup(here, index)
    except SetupError as e:
        say(f"set-up stopped: {e}")
        return 1
    os.chdir(ROOT)
    if cmd == "setup":
        return 0
    if cmd == "doctor":
        return run([py, "-m", "course_utils", "doctor"]).returncode
    if cmd == "lab":
        as_root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        cmd = [str(py), "-m", "jupyter", "lab", "--notebook-dir", str(ROOT), *as_root,
               *rest, "notebooks/00_setup.ipynb"]
        say("$ " + " ".join(cmd))
        sys.stdout.flush()
        if os.name == "posix":
            os.execv(cmd[0], cmd)  # JupyterLab takes this process over (signals reach it)
        return subprocess.run(cmd).returncode
    return run([py, "-m", "course_utils.testing", *rest]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
