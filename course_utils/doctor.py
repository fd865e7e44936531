"""The environment doctor: ``python -m course_utils doctor`` or ``doctor()``.

It reports versions, the device, the compute capability and whether Triton runs
compiled or through the interpreter, then runs a tiny Triton kernel whose answer
is known, compares torch and Triton with the versions the course was tested with
(``data/tested_versions.ini``, the file the set-up installs from) and says which
lessons this machine runs. Known problems come back as one line with the fix, not
a traceback.
"""
from __future__ import annotations

import configparser
import importlib
import importlib.metadata
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from . import device

TESTED_FILE = Path(__file__).resolve().parent / "data" / "tested_versions.ini"

PACKAGES = ["torch", "triton", "numpy", "matplotlib", "ipywidgets", "jupyterlab", "nbval"]


@dataclass
class Finding:
    level: str  # "ok", "warn" or "error"
    message: str


def _version(name):
    if name == "triton" and not device.HAS_TRITON:
        return None
    try:
        mod = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return None
    version = getattr(mod, "__version__", None)
    if version is None:  # e.g. jupyterlab exposes no __version__ on some releases
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return version


def tested_versions(path: Path = TESTED_FILE) -> dict[str, dict[str, str]]:
    """The tested sets: ``{"cpu": {"torch": "2.13.0", "triton": "3.9.0", ...}, "gpu": {...}}``."""
    cfg = configparser.ConfigParser()
    if not cfg.read(path, encoding="utf-8"):
        return {}
    return {name: dict(cfg[name]) for name in cfg.sections()}


def tested_set(versions: dict, tested: dict) -> str | None:
    """The name of the tested set whose torch and Triton match the installed ones, or None
    (without Triton, torch alone decides)."""
    torv, tv = _vtuple(versions.get("torch")), _vtuple(versions.get("triton"))
    for name, s in tested.items():
        if torv == _vtuple(s.get("torch")) and (tv is None or tv == _vtuple(s.get("triton"))):
            return name
    return None


def _describe_sets(tested: dict) -> str:
    return "; ".join(f"{name}: torch {s.get('torch')} + triton {s.get('triton')} "
                     f"(Python {s.get('python')})" for name, s in tested.items())


def _vtuple(v: str | None):
    if not v:
        return None
    parts = []
    for p in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def diagnose(versions: dict, interpret: bool, has_gpu: bool, triton_first: bool = False,
             kernel_error: str | None = None, tested: dict | None = None,
             system: str | None = None) -> list[Finding]:
    """Turn what is installed into findings. Pure, so each rule is testable.
    ``tested`` is :func:`tested_versions`'s dict (None: do not compare versions);
    ``system`` is ``sys.platform`` (Triton has wheels for Linux only)."""
    system = system or sys.platform
    out = []
    tv, nv, torv = _vtuple(versions.get("triton")), _vtuple(versions.get("numpy")), \
        _vtuple(versions.get("torch"))
    if torv is None:
        out.append(Finding("error", "torch is not installed: run `python course.py setup`."))
    if tv is None and system.startswith("linux"):
        out.append(Finding("error", "triton is not installed: run `python course.py setup` "
                                    "(it installs the tested Triton for this machine)."))
    elif tv is None:
        out.append(Finding("warn", device.triton_missing_message(system)))
    if tested and torv is not None and tested_set(versions, tested) is None:
        pair = f"torch {versions['torch']}" + (f" + triton {versions['triton']}" if tv else "")
        out.append(Finding(
            "warn", f"{pair} is outside what the course was tested with "
                    f"({_describe_sets(tested)}). "
                    "Most lessons still work; if a check fails for no reason you can see, "
                    "remove `.venv` and run `python course.py setup` again: it installs a "
                    "tested set where it can and says why when it cannot."))
    if interpret and tv and nv and tv < (3, 7) and nv >= (2, 4):
        out.append(Finding(
            "error",
            f"triton {versions['triton']} with numpy {versions['numpy']}: the interpreter fails on "
            "loops with a runtime bound. Fix: pip install 'numpy<2.4' (or triton>=3.7)."))
    if not has_gpu and triton_first:
        out.append(Finding(
            "error", "triton was imported before course_utils on a CPU machine, so kernels "
                     "cannot run. Fix: restart the kernel and `import course_utils` first."))
    if has_gpu and interpret:
        out.append(Finding("warn", "TRITON_INTERPRET=1 is set on a GPU machine: kernels run in "
                                   "the slow interpreter. Unset it to compile them."))
    if kernel_error:
        out.append(Finding("error", f"the known-answer Triton kernel failed: {kernel_error}"))
    for name in ("matplotlib", "ipywidgets", "jupyterlab", "nbval"):
        if versions.get(name) is None:
            out.append(Finding("warn", f"{name} is missing: run `python course.py setup`."))
    if not out:
        out.append(Finding("ok", "everything the course needs is in place"))
    return out


def known_answer_kernel():
    """Sum each row of a small matrix with a Triton kernel whose loop bound is
    only known at run time (the case that breaks with some numpy/triton pairs).
    Returns (ok, detail)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def row_sum(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        tl.store(out_ptr + row, tl.sum(acc, axis=0))

    rows, cols = 4, 100
    x = torch.arange(rows * cols, dtype=torch.float32, device=device.DEVICE).reshape(rows, cols)
    out = torch.empty(rows, dtype=torch.float32, device=device.DEVICE)
    row_sum[(rows,)](x, out, cols, BLOCK=32)
    # sum of r*cols + c over c = cols*(r*cols) + cols*(cols-1)/2
    expected = [cols * r * cols + cols * (cols - 1) / 2 for r in range(rows)]
    got = out.cpu().tolist()
    ok = all(abs(a - b) < 1e-3 for a, b in zip(got, expected))
    return ok, f"row sums {got}" + ("" if ok else f", expected {expected}")


def doctor(run_kernel: bool = True, file=None) -> bool:
    """Print the environment report; return True when nothing is wrong."""
    file = file or sys.stdout
    triton_first = bool(getattr(device, "_TRITON_IMPORTED_FIRST", False))
    versions = {p: _version(p) for p in PACKAGES}
    info = device.describe()
    p = lambda *a: print(*a, file=file)  # noqa: E731
    p("FlashAttention course — environment report")
    p(f"  python        {platform.python_version()} ({sys.executable})")
    for name in PACKAGES:
        p(f"  {name:<13} {versions[name] or 'not installed'}")
    p(f"  device        {info['device']}  (course_utils.device.KIND = {info['kind']!r})")
    p(f"  capability    {info['compute_capability'] or '-'}")
    mode = "interpreter (TRITON_INTERPRET=1, runs on CPU)" if info["triton_interpret"] \
        else "compiled for the GPU"
    if not info["has_triton"]:
        mode = "Triton is not installed"
    p(f"  triton mode   {mode}")
    tested = tested_versions()
    match = tested_set(versions, tested)
    p(f"  tested with   {_describe_sets(tested) or '(tested_versions.ini is missing)'}")
    p("  this machine  " + (f"the tested [{match}] set" if match else "not a tested set"))
    kernel_error = None
    if run_kernel and versions["triton"] and versions["torch"]:
        try:
            ok, detail = known_answer_kernel()
            p(f"  test kernel   {'passed' if ok else 'WRONG ANSWER'}: {detail}")
            if not ok:
                kernel_error = "wrong answer: " + detail
        except Exception as e:  # noqa: BLE001 - reported as one line below
            kernel_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            p("  test kernel   failed")
    for which, how in device.lessons():
        p(f"  {which}: {how}")
    findings = diagnose(versions, info["triton_interpret"], device.HAS_GPU, triton_first,
                        kernel_error, tested=tested)
    for f in findings:
        p(f"  [{f.level}] {f.message}")
    return all(f.level != "error" for f in findings)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0 if doctor() else 1)
