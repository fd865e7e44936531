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


# The tests that take a minute or more each on two cores (whole classes graded in the
# sandbox, the browser), in the order they should start: pytest-xdist hands work out in
# collection order, so a long test collected last keeps one worker busy while the other
# has nothing left to do.
LONG_FIRST = (
    "@grading-adversarial-class",
    "@browser",
    "test_problem_set_scores_right_and_wrong[04_",
    "test_problem_set_scores_right_and_wrong[07_",
    "test_problem_set_scores_right_and_wrong[03_",
    "test_problem_set_scores_right_and_wrong[05_",
    "test_problem_set_scores_right_and_wrong[06_",
    "test_problem_set_scores_right_and_wrong[09_",
    "test_problem_set_scores_right_and_wrong[02_",
    "test_problem_set_scores_right_and_wrong[08_",
    "test_build_every_lesson",
    "test_rerun_same_scores_crash_isolation_and_resume",
    "test_problem_set_scores_right_and_wrong[",
    "test_honest_answers_keep_full_marks[",
)


def _is_notebook(item) -> bool:
    return str(getattr(item, "path", "")).endswith(".ipynb")


def _start_rank(item) -> int:
    group = item.get_closest_marker("xdist_group")
    name = item.nodeid + (f"@{group.args[0]}" if group and group.args else "")
    rank = next((i for i, part in enumerate(LONG_FIRST) if part in name), None)
    if rank is not None:
        return rank
    # then the notebooks (several seconds each), then the many short tests that fill
    # whatever is left at the end
    return len(LONG_FIRST) + (0 if _is_notebook(item) else 1)


# first, so that pytest-xdist (which names each test by its group) sees the notebooks' groups
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_hopper = pytest.mark.skip(reason="needs an sm90 (Hopper) GPU")
    for item in items:
        if "gpu" in item.keywords and not device.HAS_GPU:
            item.add_marker(skip_gpu)
        if "hopper" in item.keywords and not device.IS_HOPPER:
            item.add_marker(skip_hopper)
    # the cells of a notebook under nbval run in one kernel, in order: one worker each
    for item in items:
        if _is_notebook(item):
            item.add_marker(pytest.mark.xdist_group(
                f"notebook:{item.path.parent.name}/{item.path.name}"))
    # stable: the tests of one group (one module fixture, one notebook) keep their order
    items.sort(key=_start_rank)


@pytest.fixture(autouse=True)
def _seeded(request):
    """Every test starts from its own seed, whatever ran before it on its worker: a failure
    replays with the same draws. ``COURSE_TEST_SEED=n`` shifts every seed (to look for
    tests that pass only on some draws); the problem sets' check cells draw from the
    operating system's randomness on purpose and are not affected."""
    import random
    import zlib

    import torch

    shift = int(os.environ.get("COURSE_TEST_SEED", 0))
    seed = (zlib.crc32(request.node.nodeid.encode()) + shift) % 2**31
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass
    yield
