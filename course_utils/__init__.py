"""Helper package for the FlashAttention course.

``device`` is imported first on purpose: it decides CPU vs GPU and sets
``TRITON_INTERPRET`` before anything imports Triton.
"""
from . import device  # noqa: F401  (must stay the first import)
from .device import DEVICE  # noqa: F401

__version__ = "0.1.0"
