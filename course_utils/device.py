"""The one place that decides where the course runs: CPU, a CUDA GPU, or Hopper.

Importing :mod:`course_utils` imports this module first. When no CUDA GPU is
present it sets ``TRITON_INTERPRET=1`` *before* Triton is imported anywhere, so
every Triton kernel in the course runs on the CPU through the interpreter.

Notebooks ask this module for the device and for problem sizes and never write
``"cuda"`` themselves::

    from course_utils import device
    x = torch.randn(device.pick(cpu=256, gpu=4096), device=device.DEVICE)

``COURSE_DEVICE=cpu`` forces the CPU path even on a machine with a GPU.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

__all__ = [
    "DEVICE", "KIND", "HAS_GPU", "IS_HOPPER", "INTERPRET", "CAPABILITY",
    "pick", "needs", "describe",
]


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
    "gpu": (lambda: HAS_GPU, "a CUDA GPU (sm80 or newer)"),
    "hopper": (lambda: IS_HOPPER, "a Hopper GPU (sm90, e.g. H100)"),
}


def needs(what: str, quiet: bool = False) -> bool:
    """True when this machine has ``what`` ('gpu' or 'hopper'); otherwise print
    why the cell is skipped and return False. Use as ``if device.needs('gpu'):``."""
    if what not in _NEEDS:
        raise ValueError(f"needs() takes one of {sorted(_NEEDS)}, got {what!r}")
    ok, label = _NEEDS[what]
    if ok():
        return True
    if not quiet:
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
    }
