import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import course_utils  # noqa: E402  (sets TRITON_INTERPRET before triton is imported)
from course_utils import device  # noqa: E402
import pytest  # noqa: E402

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "course", deadline=None, max_examples=int(os.environ.get("COURSE_HYPOTHESIS_EXAMPLES", 25)),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=True, print_blob=True)
    settings.load_profile("course")
except ImportError:  # pragma: no cover
    pass


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_hopper = pytest.mark.skip(reason="needs an sm90 (Hopper) GPU")
    for item in items:
        if "gpu" in item.keywords and not device.HAS_GPU:
            item.add_marker(skip_gpu)
        if "hopper" in item.keywords and not device.IS_HOPPER:
            item.add_marker(skip_hopper)
