"""``course-grade``: grade a class's submissions of one problem set.

    course-grade 01_register_machine submitted/ -o grades/
    python -m course_utils.grading 01 alice.ipynb -o grades/ --workers 2

Writes ``grades/scores.csv``, ``grades/scores.json``, ``grades/results/<student>.json``,
``grades/feedback/<student>.md``, ``grades/graded/<student>.ipynb`` (the checking
notebook: ``pytest --nbval`` on it gives the same verdicts) and, with ``--junit-xml``,
``grades/junit/<student>.xml``.
"""
from __future__ import annotations

import argparse
import sys

from course_utils.grading.grader import GradingError, grade
from course_utils.grading.instrument import TemplateError


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="course-grade",
        description="Grade submissions of a problem set against its official template "
                    "(the solution notebook, with hidden tests). Only answer cells are taken "
                    "from a submission; every check is re-verified outside the student's kernel.")
    ap.add_argument("assignment", help="problem set name (e.g. 01_register_machine, or 01) or "
                                       "the path of its solution notebook")
    ap.add_argument("submissions", help="one .ipynb, a folder of <student>.ipynb, or an nbgrader "
                                        "submitted/<student>/<assignment>/ tree")
    ap.add_argument("-o", "--out", required=True, help="output folder for scores and feedback")
    ap.add_argument("-j", "--workers", type=int, default=2,
                    help="submissions graded at once (default 2)")
    ap.add_argument("--cell-timeout", type=float, default=60,
                    help="seconds one cell may run (default 60)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds one whole submission may run (default 600)")
    ap.add_argument("--resume", action="store_true",
                    help="keep earlier results whose submission and template are unchanged")
    ap.add_argument("--isolation", choices=("auto", "namespaces", "landlock", "limits"),
                    default="auto", help="sandbox for the graded kernels: auto (all this "
                    "machine offers, the default), namespaces or landlock (fail if missing), "
                    "limits (process limits only)")
    ap.add_argument("--memory-mb", type=int, default=8192,
                    help="private-memory limit of each graded process in MiB (0: none)")
    ap.add_argument("--junit-xml", action="store_true",
                    help="also write junit/<student>.xml, the checking run's JUnit report")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    a = ap.parse_args(argv)
    say = (lambda m: None) if a.quiet else (lambda m: print(m, flush=True))
    try:
        res = grade(a.assignment, a.submissions, a.out, workers=a.workers,
                    cell_timeout=a.cell_timeout, timeout=a.timeout, resume=a.resume, progress=say,
                    isolation=a.isolation, junit_xml=a.junit_xml, memory_mb=a.memory_mb)
    except (GradingError, TemplateError, FileNotFoundError) as e:
        print(f"course-grade: error: {e}", file=sys.stderr)
        return 2
    for n in res.notes:
        print(f"note: {n}")
    n = len(res.students)
    mx = sum(p for _, p in res.exercises)
    mean = sum(res.scores().values()) / n if n else 0.0
    bad = sum(1 for r in res.students.values() if r["status"] != "graded")
    print(f"graded {n} submission(s) of {res.assignment} in {res.seconds:.1f} s: mean "
          f"{mean:.2f} / {mx}" + (f", {bad} not gradable (see feedback)" if bad else ""))
    print(f"isolation: {res.isolation}")
    print(f"wrote {res.out_dir / 'scores.csv'}, {res.out_dir / 'scores.json'}, "
          f"{res.out_dir / 'feedback'}/ and {res.out_dir / 'graded'}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
