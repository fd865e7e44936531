"""Run every test of the course: ``python -m course_utils.testing`` (what
``python course.py test`` calls after setting up the environment).

1. the generated problem-set notebooks are in sync with their solutions;
2. one pytest run over ``tests/`` (course_utils, the pipeline, the exercises, grading,
   ...) and, under nbval, every lesson in ``notebooks/`` and every problem set in
   ``solutions/`` (each notebook's cells stay together on one test worker, in order).

Extra arguments go to pytest (for example ``-x`` or ``-k softmax``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _workers() -> str:
    """Test workers: one per core (at most two) and one more; ``COURSE_TEST_WORKERS``
    sets the count."""
    return os.environ.get("COURSE_TEST_WORKERS", str(min(2, os.cpu_count() or 1) + 1))


def _par(n: str) -> list[str]:
    return ["-n", n] if n not in ("0", "1") else []


def steps(extra):
    py = sys.executable
    # the grading tests spend much of their time waiting (kernels starting, cells timed
    # out on purpose), so one worker more than the cores keeps both busy: on 2 cores
    # pytest took 420 s with 3 workers, 455 s with 2 and 433 s with 4 (same tests). The
    # notebooks run in the same pytest run, so they fill the workers' gaps instead of
    # waiting for the slowest test, and pytest starts its workers once
    return [
        ("generated notebooks in sync", [py, "-m", "course_utils.problems", "check"]),
        ("tests, and the lessons and solutions under nbval",
         [py, "-m", "pytest", "tests", "notebooks", "solutions", "-p", "no:cacheprovider",
          *_par(_workers()), "--dist", "loadgroup", "--timeout", "900",
          "--nbval-lax", "--nbval-cell-timeout", "600", *extra]),
    ]


def main(argv=None):
    extra = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MPLBACKEND="Agg")
    # one math thread per test worker: the workers already keep every core busy, and
    # oversubscribed torch threads make small CPU problems hundreds of times slower
    env.setdefault("OMP_NUM_THREADS", "1")
    failed = []
    t_all = time.time()
    for name, cmd in steps(extra):
        print(f"\n=== {name} ===\n$ {' '.join(cmd)}", flush=True)
        t = time.time()
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        print(f"=== {name}: {'passed' if rc == 0 else f'FAILED (exit {rc})'} "
              f"in {time.time() - t:.0f} s ===", flush=True)
        if rc != 0:
            failed.append(name)
    print(f"\nall steps took {time.time() - t_all:.0f} s")
    if failed:
        print("failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
