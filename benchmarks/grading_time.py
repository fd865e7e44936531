"""How long course-grade takes for a class, each run started fresh and forked warm.

    python benchmarks/grading_time.py [PROBLEM_SET] [--copies K] [--workers N]

The class: K copies of the official solution, K untouched exercises and the wrong-answer
submissions of ``tests/wrong_answers/`` for that problem set. It is graded twice, with
``COURSE_GRADE_WARM=0`` (every run a fresh Python, as in a sandbox without namespaces)
and with warm starts (the default where the namespaces hold); both must give the same
scores. Prints the wall time and the CPU time of the grader and everything it started
(the children the grader collected), and the ratio.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from course_utils.grading import grader, sandbox  # noqa: E402
from tests.wrong_answers import submissions  # noqa: E402


def make_class(stem: str, copies: int, folder: Path) -> int:
    folder.mkdir(parents=True)
    sol = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4)
    exe = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
    for i in range(copies):
        nbformat.write(sol, folder / f"solution{i}.ipynb")
        nbformat.write(exe, folder / f"untouched{i}.ipynb")
    wrong = submissions(stem)
    for name, nb, _ in wrong:
        nbformat.write(nb, folder / f"{name}.ipynb")
    return 2 * copies + len(wrong)


def cpu_seconds() -> float:
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem_set", nargs="?", default="06_triton_forward")
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    iso = sandbox.detect("auto")
    if not sandbox.warm_starts_possible(iso):
        sys.exit(f"warm starts need the namespaces, and this machine has: {iso.describe()}")
    top = Path(tempfile.mkdtemp(prefix="grading-time-"))
    try:
        n = make_class(a.problem_set, a.copies, top / "class")
        rows = {}
        for mode in ("fresh", "warm"):
            os.environ["COURSE_GRADE_WARM"] = "0" if mode == "fresh" else "1"
            t0, c0 = time.monotonic(), cpu_seconds()
            res = grader.grade(a.problem_set, top / "class", top / f"out-{mode}",
                               workers=a.workers)
            # the warm process outlives the class (it would serve the next one): end it
            # here, so that its CPU time, and its runs', is counted with this class
            sandbox.release_shared()
            rows[mode] = (time.monotonic() - t0, cpu_seconds() - c0, res.scores())
        if rows["fresh"][2] != rows["warm"][2]:
            sys.exit(f"the scores differ: {rows['fresh'][2]} vs {rows['warm'][2]}")
        print(f"{a.problem_set}: {n} submissions, {a.workers} workers, {os.cpu_count()} cores, "
              f"isolation: {iso.describe()}")
        for mode, (wall, cpu, _) in rows.items():
            print(f"  {mode:5s} runs: {wall:6.1f} s wall, {cpu:6.1f} s CPU "
                  f"({wall / n:.1f} s wall per submission)")
        print(f"  warm / fresh: {rows['warm'][0] / rows['fresh'][0]:.2f} of the wall time, "
              f"{rows['warm'][1] / rows['fresh'][1]:.2f} of the CPU time; same scores")
    finally:
        os.environ.pop("COURSE_GRADE_WARM", None)
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
