"""Where am I: which exercises of your own problem-set notebooks pass their checks.

    python -m course_utils.progress            # every problem set in exercises/
    python -m course_utils.progress 03 04      # only these
    python -m course_utils.progress --dir path/to/my/notebooks

or, in a notebook::

    from course_utils.progress import show_progress
    show_progress()

Each of your notebooks runs in a fresh kernel with your answer cells and the official
check cells (the visible ones: hidden tests are not run, and a check cell you edited
is put back as it was), and each exercise is reported as ``pass``, ``fail`` (with the
first line of what the check said) or ``not started`` (its answer still raises
``NotImplementedError``). Nothing is written to your notebooks.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_utils import problems

__all__ = ["ExerciseStatus", "progress", "progress_table", "show_progress", "main"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ExerciseStatus:
    problem_set: str      # "04_tiled_attention"
    exercise: str         # "4.3"
    points: int
    status: str           # "pass", "fail", "not started", "missing"
    detail: str = ""      # the first line of the failure


def _official_checks(stem: str) -> dict[str, str]:
    """The visible check cells of problem set ``stem``, by exercise, from its solution."""
    path = problems.SOLUTIONS / f"{stem}.ipynb"
    nb = nbformat.read(path, as_version=4)
    out = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("course", {})
        if meta.get("role") == "check":
            out[meta["exercise"]] = problems.check_source(cell.source)
    return out


def _points(stem: str) -> dict[str, int]:
    nb = nbformat.read(problems.SOLUTIONS / f"{stem}.ipynb", as_version=4)
    return {c.metadata["course"]["exercise"]: c.metadata["course"].get("points", 1)
            for c in nb.cells if c.get("metadata", {}).get("course", {}).get("role") == "answer"}


def _errors(cell):
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def _first_line(err) -> str:
    value = str(err.get("evalue", "")).strip().split("\n", 1)[0]
    text = f"{err.get('ename', 'Error')}: {value}" if value else str(err.get("ename", "Error"))
    return text if len(text) <= 110 else text[:107] + "..."


def _select(stems, only):
    if not only:
        return stems
    want = [str(o).zfill(2) if str(o).isdigit() else str(o) for o in only]
    picked = [s for s in stems if any(s.startswith(w) for w in want)]
    unknown = [w for w in want if not any(s.startswith(w) for s in stems)]
    if unknown:
        raise ValueError(f"no problem set {', '.join(unknown)}; there are "
                         f"{', '.join(s.split('_', 1)[0] for s in stems)}")
    return picked


def check_notebook(path: Path, stem: str, timeout: int = 300) -> list[ExerciseStatus]:
    """Run the notebook at ``path`` (a learner's copy of problem set ``stem``) with the
    official visible checks and report every exercise."""
    from nbclient import NotebookClient

    from course_utils.site import kernel_sockets

    official = _official_checks(stem)
    points = _points(stem)
    if not path.exists():
        return [ExerciseStatus(stem, ex, points[ex], "missing", f"no notebook {path}")
                for ex in official]
    nb = nbformat.read(path, as_version=4)
    seen = set()
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("course", {})
        if meta.get("role") == "check" and meta.get("exercise") in official:
            cell.source = official[meta["exercise"]]
            seen.add(meta["exercise"])
        if cell.cell_type == "code":
            cell.outputs = []
    with tempfile.TemporaryDirectory(prefix="course-progress-") as sock_dir:
        client = NotebookClient(nb, timeout=timeout, allow_errors=True, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}},
                                config=kernel_sockets(sock_dir))
        client.execute()
    by_ex: dict[str, dict] = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("course", {})
        if meta.get("exercise") in official:
            by_ex.setdefault(meta["exercise"], {})[meta.get("role")] = cell
    rows = []
    for ex in official:
        cells = by_ex.get(ex, {})
        if ex not in seen or "answer" not in cells:
            rows.append(ExerciseStatus(stem, ex, points.get(ex, 1), "missing",
                                       "its answer or check cell is not in the notebook"))
            continue
        errs = _errors(cells["check"])
        answer_errs = _errors(cells["answer"])
        if not errs and not answer_errs:
            rows.append(ExerciseStatus(stem, ex, points.get(ex, 1), "pass"))
            continue
        first = (answer_errs or errs)[0]
        if first.get("ename") == "NotImplementedError" and f"Exercise {ex}" in str(first.get("evalue")):
            rows.append(ExerciseStatus(stem, ex, points.get(ex, 1), "not started"))
        else:
            rows.append(ExerciseStatus(stem, ex, points.get(ex, 1), "fail", _first_line(first)))
    return rows


def progress(only=None, directory: str | Path | None = None,
             timeout: int = 300) -> list[ExerciseStatus]:
    """The status of every exercise of the problem sets ``only`` (all when None), from
    the notebooks in ``directory`` (default: the course's ``exercises/``)."""
    folder = Path(directory) if directory is not None else problems.EXERCISES
    stems = _select([p.stem for p in sorted(problems.SOLUTIONS.glob("*.ipynb"))], only)
    rows = []
    for stem in stems:
        rows.extend(check_notebook(folder / f"{stem}.ipynb", stem, timeout=timeout))
    return rows


def progress_table(rows: list[ExerciseStatus]) -> str:
    """A short text table: one line per problem set, then the exercises that do not pass."""
    sets: dict[str, list[ExerciseStatus]] = {}
    for r in rows:
        sets.setdefault(r.problem_set, []).append(r)
    width = max([len(s) for s in sets] + [11])
    lines = [f"{'problem set'.ljust(width)}  points  exercises (+ pass, x fail, . not started)"]
    total = got = 0
    for stem, rs in sets.items():
        pts = sum(r.points for r in rs)
        ok = sum(r.points for r in rs if r.status == "pass")
        total, got = total + pts, got + ok
        marks = " ".join(f"{r.exercise}{'+' if r.status == 'pass' else 'x' if r.status == 'fail' else '.'}"
                         for r in rs)
        lines.append(f"{stem.ljust(width)}  {ok:>2}/{pts:<3}  {marks}")
    lines.append(f"{'total'.ljust(width)}  {got:>2}/{total:<3}")
    fails = [r for r in rows if r.status in ("fail", "missing")]
    if fails:
        lines.append("")
        lines += [f"{r.exercise} {r.status}: {r.detail}" for r in fails]
    lines.append("(visible checks only; the grade also runs hidden tests)")
    return "\n".join(lines)


def show_progress(only=None, directory: str | Path | None = None, timeout: int = 300):
    """Print :func:`progress_table` for your notebooks (see the module docstring)."""
    t0 = time.monotonic()
    rows = progress(only, directory, timeout)
    print(progress_table(rows))
    print(f"({time.monotonic() - t0:.0f} s)")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_utils.progress",
                                 description="Which exercises of your problem-set notebooks pass "
                                             "their visible checks.")
    ap.add_argument("sets", nargs="*", help="problem sets to look at, e.g. 03 04 (default: all)")
    ap.add_argument("--dir", default=None,
                    help="folder with your notebooks (default: the course's exercises/)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    args = ap.parse_args(argv)
    try:
        show_progress(args.sets or None, args.dir, args.timeout)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
