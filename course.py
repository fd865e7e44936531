#!/usr/bin/env python3
"""Set up the course and run it. Needs only Python 3.10+.

    python course.py lab     # create .venv, install everything, open JupyterLab on the course
    python course.py test    # create .venv, install everything, run every test
    python course.py doctor  # create .venv if needed and print the environment report

Set-up is idempotent: a second run only checks that nothing changed.
``COURSE_VENV=/path`` puts the environment elsewhere; ``--here`` (or
``COURSE_VENV=here``) installs into the Python that runs this script (for conda
users who ran ``conda env create -f environment.yml``).
A torch that already has CUDA in the launching Python is reused; on a machine
without an NVIDIA GPU the CPU build ``torch==2.13.0`` is installed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CPU_TORCH = "torch==2.13.0"
CPU_TRITON = "triton==3.9.0"  # >= 3.7: its interpreter works with numpy >= 2.4


def say(msg):
    print(f"[course] {msg}", flush=True)


def run(cmd, **kw):
    say("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], **kw)


def env_python(here: bool) -> Path:
    if here:
        return Path(sys.executable)
    loc = os.environ.get("COURSE_VENV", "")
    if loc == "here":
        return Path(sys.executable)
    vdir = Path(loc) if loc else ROOT / ".venv"
    py = vdir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not py.exists():
        system_site = _launcher_has_cuda_torch()
        say(f"creating {vdir}" + (" (reusing this Python's CUDA torch)" if system_site else ""))
        venv.EnvBuilder(with_pip=True, system_site_packages=system_site).create(vdir)
    return py


def _launcher_has_cuda_torch() -> bool:
    code = "import torch,sys; sys.exit(0 if torch.version.cuda else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def _has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def _probe(py, code) -> str | None:
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def setup(here=False) -> Path:
    py = env_python(here)
    stamp_src = b"".join((ROOT / f).read_bytes() for f in ("pyproject.toml", "course.py"))
    stamp = hashlib.sha256(stamp_src + str(py).encode()).hexdigest()
    stamp_file = py.parent.parent / ".course-setup-stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp and \
            _probe(py, "import course_utils, torch, triton") is not None:
        say(f"environment up to date ({py})")
        return py
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check"]
    if _probe(py, "import torch; print(torch.__version__)") is None:
        if _has_nvidia_gpu():
            spec = os.environ.get("COURSE_TORCH_SPEC", "torch")
            run(pip + [spec], check=True)
        else:
            spec = os.environ.get("COURSE_TORCH_SPEC", CPU_TORCH)
            run(pip + [spec, CPU_TRITON], check=True)
    run(pip + ["-e", f"{ROOT}[test]"], check=True)
    tv = _probe(py, "import triton; print(triton.__version__)")
    if tv and tuple(int(p) for p in tv.split(".")[:2]) < (3, 7):
        # triton <= 3.6 interpreter breaks with numpy >= 2.4 on loops with runtime bounds
        run(pip + ["numpy<2.4"], check=True)
    stamp_file.write_text(stamp)
    return py


def main(argv):
    here = "--here" in argv
    argv = [a for a in argv if a != "--here"]
    cmd, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if cmd not in ("setup", "lab", "test", "doctor"):
        print(__doc__)
        return 0 if cmd in ("help", "-h", "--help") else 2
    py = setup(here)
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
