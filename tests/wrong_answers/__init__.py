"""Wrong answers that learners actually write, one module per problem set.

``tests/wrong_answers/NN_topic.py`` defines::

    WRONG = {
        "4.3": {
            "no running max: exp of the raw scores": '''# Exercise 4.3
    def my_flash_attention(q, k, v, is_causal=False, Br=16, Bc=16):
        ...''',
            ...
        },
    }

one entry per exercise of that problem set, each a dict from a short description of
the mistake to the full source of an answer cell (first line ``# Exercise N.k``).
``tests/test_wrong_answers.py`` grades them with ``course-grade``: submission ``j``
takes the ``j``-th wrong answer of every exercise, and every exercise must score zero.
``python -m tests.wrong_answers`` prints the instructors' table of checks and caught
mistakes (kept in ``docs/problem-sets.md``).
"""
from __future__ import annotations

import ast
import copy
import importlib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent
MIN_WRONG = 3


def problem_sets() -> list[Path]:
    return sorted((ROOT / "solutions").glob("*.ipynb"))


def wrong_answers(stem: str) -> dict[str, dict[str, str]]:
    """The ``WRONG`` table of one problem set ({} when it has no module yet)."""
    if not (HERE / f"{stem}.py").exists():
        return {}
    mod = importlib.import_module(f"tests.wrong_answers.{stem}")
    table = getattr(mod, "WRONG")
    for ex, cases in table.items():
        for why, src in cases.items():
            first = src.lstrip("\n").split("\n", 1)[0]
            if not first.startswith(f"# Exercise {ex}"):
                raise ValueError(f"{stem}: the wrong answer {why!r} for {ex} must start with "
                                 f"'# Exercise {ex}', not {first!r}")
    return table


def exercises_of(nb) -> list[str]:
    out = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("course", {})
        if meta.get("role") == "answer":
            out.append(meta["exercise"])
    return out


def submissions(stem: str) -> list[tuple[str, object, dict[str, str]]]:
    """``(name, notebook, {exercise: description})`` for each wrong submission: the
    exercise notebook with answer cell ``ex`` replaced by its ``j``-th wrong answer."""
    table = wrong_answers(stem)
    if not table:
        return []
    exercise = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
    k = max(len(v) for v in table.values())
    subs = []
    for j in range(k):
        nb = copy.deepcopy(exercise)
        used = {}
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("course", {})
            ex = meta.get("exercise")
            if meta.get("role") == "answer" and ex in table:
                cases = list(table[ex].items())
                why, src = cases[j % len(cases)]
                cell.source = src.strip("\n")
                used[ex] = why
        subs.append((f"wrong{j + 1}", nb, used))
    return subs


def _check_calls(src: str, hidden: bool) -> int:
    """How many check statements a check cell makes, visible or hidden."""
    lines = src.split("\n")
    keep, inside = [], False
    for line in lines:
        s = line.strip()
        if s == "### BEGIN HIDDEN TESTS":
            inside = True
            continue
        if s == "### END HIDDEN TESTS":
            inside = False
            continue
        if inside == hidden:
            keep.append(line)
        elif not inside:
            keep.append("")
    try:
        tree = ast.parse("\n".join(keep))
    except SyntaxError:
        return 0
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name.startswith("check_") or name in ("run_answer", "one_pass", "check_source"):
                n += 1
    return n


def table_markdown() -> str:
    rows = ["| problem set | exercise | points | visible checks | hidden checks | "
            "wrong answers that score zero |",
            "| --- | --- | --- | --- | --- | --- |"]
    for path in problem_sets():
        nb = nbformat.read(path, as_version=4)
        wrong = wrong_answers(path.stem)
        checks, points = {}, {}
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("course", {})
            if meta.get("role") == "check":
                checks[meta["exercise"]] = cell.source
            elif meta.get("role") == "answer":
                points[meta["exercise"]] = meta.get("points", 1)
        for ex in exercises_of(nb):
            src = checks.get(ex, "")
            caught = "; ".join(wrong.get(ex, {})) or "none yet"
            rows.append(f"| `{path.stem}` | {ex} | {points.get(ex, 1)} | "
                        f"{_check_calls(src, False)} | {_check_calls(src, True)} | {caught} |")
    head = ("# Problem sets: what each exercise checks\n\n"
            "Generated by `python -m tests.wrong_answers` from `solutions/` and "
            "`tests/wrong_answers/`; `tests/test_wrong_answers.py` grades every listed wrong "
            "answer with `course-grade` and requires zero points for it, full marks for the "
            "solution and zero for the untouched exercise. Visible and hidden checks count "
            "the check calls in each check cell (hidden ones are removed from the exercise "
            "handed out).\n\n")
    return head + "\n".join(rows) + "\n"


TABLE = ROOT / "docs" / "problem-sets.md"
