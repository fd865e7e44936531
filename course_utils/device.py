"""The one place that decides where the course runs: CPU, a CUDA GPU, or Hopper.

Importing :mod:`course_utils` imports this module first. When no CUDA GPU is
present it sets ``TRITON_INTERPRET=1`` *before* Triton is imported anywhere, so
every Triton kernel in the course runs on the CPU through the interpreter.

Notebooks ask this module for the device and for problem sizes and never write
``"cuda"`` themselves::

    from course_utils import device
    x = torch.randn(device.pick(cpu=256, gpu=4096), device=device.DEVICE)

``COURSE_DEVICE=cpu`` forces the CPU path even on a machine with a GPU.

Where Triton is not installed (macOS and Windows, for which Triton publishes no
wheels), ``HAS_TRITON`` is False and ``import triton`` -- in a notebook cell or in a
course module -- raises :class:`TritonUnavailable`, whose message names the ways to
run the Triton lessons; Jupyter shows that message alone, without a traceback.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import warnings

import torch

__all__ = [
    "DEVICE", "KIND", "HAS_GPU", "IS_HOPPER", "INTERPRET", "CAPABILITY", "HAS_TRITON",
    "TritonUnavailable", "pick", "needs", "describe", "lessons",
]

PLATFORM_NAMES = {"darwin": "macOS", "win32": "Windows", "cygwin": "Windows"}


def triton_missing_message(system: str | None = None) -> str:
    """What a learner reads when Triton is missing: why, and where the Triton lessons run."""
    system = system or sys.platform
    if system.startswith("linux"):
        return ("Triton is not installed in this environment. Fix: run `python course.py setup` "
                "from the course folder, then restart the kernel.")
    name = PLATFORM_NAMES.get(system, system)
    return (f"Triton publishes no wheels for {name}, so it is not installed. Lessons 0-5 and "
            "the simulator of lesson 8 run here; the Triton cells of lessons 6, 7 and 9 and "
            "their problem sets run on: a Linux machine (`python course.py lab`); WSL2 on "
            "Windows (the same command inside Ubuntu); the course's container (`docker build "
            "-t flash-course . && docker run -p 8888:8888 flash-course`, or \"Reopen in "
            "Container\" in VS Code); or a hosted GPU notebook such as Colab or Kaggle (clone "
            "the course, then `python course.py setup --here`).")


class TritonUnavailable(ModuleNotFoundError):
    """``import triton`` where Triton is not installed; the message says where to go."""

    def __init__(self, system: str | None = None):
        super().__init__(triton_missing_message(system), name="triton")

    def _render_traceback_(self):  # IPython shows these lines instead of a traceback
        return [f"TritonUnavailable: {self.args[0]}"]


class _NoTriton(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import triton`` (and its submodules) with :class:`TritonUnavailable`."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        raise TritonUnavailable()

    def exec_module(self, module):  # pragma: no cover - create_module always raises
        raise TritonUnavailable()


def _triton_installed() -> bool:
    if any(type(f).__name__ == "_NoTriton" for f in sys.meta_path):
        return False
    try:
        return importlib.util.find_spec("triton") is not None  # finds it without importing it
    except (ImportError, ValueError):
        return False


HAS_TRITON = _triton_installed()
if not HAS_TRITON and not any(type(f).__name__ == "_NoTriton" for f in sys.meta_path):
    sys.meta_path.insert(0, _NoTriton())


def _detect():
    forced = os.environ.get("COURSE_DEVICE", "").strip().lower()
    if forced not in ("", "cpu", "cuda"):
        raise ValueError(f"COURSE_DEVICE must be 'cpu' or 'cuda', got {forced!r}")
    if forced != "cpu" and torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        kind = "hopper" if cap[0] == 9 else "gpu"
        return torch.device("cuda"), kind, cap
    if forced == "cuda":
        raise RuntimeError("COURSE_DEVICE=cuda was set but torch sees no CUDA GPU")
    return torch.device("cpu"), "cpu", None


DEVICE, KIND, CAPABILITY = _detect()
HAS_GPU = KIND != "cpu"
IS_HOPPER = KIND == "hopper"

_TRITON_IMPORTED_FIRST = False
if not HAS_GPU:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        _TRITON_IMPORTED_FIRST = True
        warnings.warn(
            "triton was imported before course_utils on a machine without a GPU, so its "
            "kernels cannot run. Restart the kernel and import course_utils first.",
            RuntimeWarning, stacklevel=2)
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def pick(cpu, gpu, hopper=None):
    """Return the value meant for this machine: ``cpu`` on CPU, ``gpu`` on any CUDA
    GPU, ``hopper`` (default: ``gpu``) on sm90."""
    if KIND == "cpu":
        return cpu
    if KIND == "hopper" and hopper is not None:
        return hopper
    return gpu


_NEEDS = {
    "cpu": (lambda: True, ""),
    "triton": (lambda: HAS_TRITON, "Triton"),
    "gpu": (lambda: HAS_GPU, "a CUDA GPU (sm80 or newer)"),
    "hopper": (lambda: IS_HOPPER, "a Hopper GPU (sm90, e.g. H100)"),
}


def needs(what: str, quiet: bool = False) -> bool:
    """True when this machine has ``what`` ('gpu', 'hopper' or 'triton'); otherwise print
    why the cell is skipped and return False. Use as ``if device.needs('gpu'):``."""
    if what not in _NEEDS:
        raise ValueError(f"needs() takes one of {sorted(_NEEDS)}, got {what!r}")
    ok, label = _NEEDS[what]
    if ok():
        return True
    if not quiet and what == "triton":
        print(f"Skipped on this machine: {triton_missing_message()}")
    elif not quiet:
        print(f"Skipped on this machine ({describe()['device']}): this cell needs {label}. "
              "The text above explains what it would show.")
    return False


def describe() -> dict:
    """A small dict about the device, used by the doctor and by benchmark records."""
    if HAS_GPU:
        name = torch.cuda.get_device_name()
        label = f"{name} (sm{CAPABILITY[0]}{CAPABILITY[1]})"
    else:
        name = label = "CPU"
    return {
        "device": label,
        "name": name,
        "kind": KIND,
        "torch_device": str(DEVICE),
        "compute_capability": None if CAPABILITY is None else f"{CAPABILITY[0]}.{CAPABILITY[1]}",
        "triton_interpret": INTERPRET,
        "has_triton": HAS_TRITON,
    }


def lessons(has_triton: bool | None = None, kind: str | None = None) -> list[tuple[str, str]]:
    """Which lessons this machine runs, as ``("lessons 0-5", how)`` pairs for the doctor."""
    has_triton = HAS_TRITON if has_triton is None else has_triton
    kind = KIND if kind is None else kind
    out = [("lessons 0-5", "yes (PyTorch on " + ("the GPU" if kind != "cpu" else "the CPU") + ")")]
    if has_triton:
        how = "compiled for the GPU" if kind != "cpu" else \
            "Triton's interpreter on the CPU, small sizes"
        out.append(("lessons 6, 7, 9", f"yes ({how})"))
        out.append(("lesson 8", "simulator and Triton parts yes; the Hopper kernels "
                         + ("yes" if kind == "hopper" else "need an sm90 GPU (H100)")))
    else:
        out.append(("lessons 6, 7, 9", "no (Triton is not installed here; see below)"))
        out.append(("lesson 8", "the simulator yes; its Triton cells no"))
    return out
