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
the mistake to the full source of an answer cell (first line ``# Exercise N.k``). A
mistake in a line or two of the official answer is written as that change:
``edit(official("4.3"), (old_lines, new_lines))``, which fails loudly if the official
answer no longer holds ``old_lines``.
``tests/test_wrong_answers.py`` grades them with ``course-grade``: each submission holds
wrong answers to several exercises that do not build on one another and the official
answers elsewhere (so an exercise that builds on an earlier one is graded with that one
right), and every wrong answer must score zero on its exercise.
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


def official(exercise: str) -> str:
    """The official answer cell of ``exercise`` ("4.3"), hints and solution markers left out:
    the base of a wrong answer that differs from it in a line or two (see :func:`edit`)."""
    major = exercise.split(".")[0].zfill(2)
    path = next(p for p in problem_sets() if p.stem.startswith(major + "_"))
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("course", {})
        if meta.get("role") == "answer" and meta.get("exercise") == exercise:
            keep = [ln for ln in cell.source.split("\n")
                    if not ln.strip().startswith(("### HINT", "### BEGIN SOLUTION",
                                                  "### END SOLUTION"))]
            return "\n".join(keep)
    raise KeyError(f"no answer cell for exercise {exercise} in {path.name}")


def edit(src: str, *changes: tuple[str, str]) -> str:
    """``src`` with each ``(old, new)`` applied in turn; each ``old`` must occur exactly once,
    so a change to the official answer that moves the text fails here, not silently."""
    for old, new in changes:
        if src.count(old) != 1:
            raise ValueError(f"wrong-answer edit: {old!r} occurs {src.count(old)} times, not once")
        src = src.replace(old, new)
    return src


def exercises_of(nb) -> list[str]:
    out = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("course", {})
        if meta.get("role") == "answer":
            out.append(meta["exercise"])
    return out


def _defined(src: str) -> set[str]:
    """Top-level names a cell binds (functions, classes, assignments, imports)."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set()
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def dependencies(stem: str) -> dict[str, set[str]]:
    """``{B: {A, ...}}``: the earlier exercises whose answers exercise ``B`` builds on.
    ``A``'s *carriers* are the names its official answer defines and, transitively, the
    names a template cell defines when its code mentions a carrier (a wrapper that
    launches a template kernel calling ``A``'s device function, say); ``B`` depends on
    ``A`` when ``B``'s official answer or check cell mentions a carrier of ``A``."""
    import re

    from course_utils.grading import grader, instrument
    tpl = grader.load_template(stem, root=ROOT)
    cells = tpl.nb.cells
    own = {i for e in tpl.exercises for i in (e.answer_index, e.check_index)}
    template = [c.source for i, c in enumerate(cells) if c.cell_type == "code" and i not in own]

    def mentions(names, src):
        return bool(names) and re.search(
            r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b", src) is not None

    out = {e.id: set() for e in tpl.exercises}
    for a in tpl.exercises:
        carriers = set(instrument.answer_names(cells[a.answer_index].source, f"answer of {a.id}"))
        grew = True
        while grew:
            new = set().union(*[_defined(src) for src in template if mentions(carriers, src)])
            grew = not new <= carriers
            carriers |= new
        for b in tpl.exercises:
            if b.check_index > a.check_index and any(
                    mentions(carriers, cells[i].source) for i in (b.answer_index, b.check_index)):
                out[b.id].add(a.id)
    return out


def submissions(stem: str) -> list[tuple[str, object, dict[str, str]]]:
    """``(name, notebook, {exercise: description})`` for each wrong submission.

    Each submission holds wrong answers for several exercises at once and the official
    answer everywhere else, but never a wrong answer beside a wrong answer to an exercise
    it builds on or that builds on it (:func:`dependencies`): a mistake must score zero
    because of what it gets wrong, not because an earlier answer was wrong too. Every
    wrong answer of the table is in exactly one submission."""
    table = wrong_answers(stem)
    if not table:
        return []
    from course_utils.grading import grader
    exercise = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
    tpl = grader.load_template(stem, root=ROOT)
    official = {e.id: tpl.nb.cells[e.answer_index].source for e in tpl.exercises}
    deps = dependencies(stem)

    def related(a, b):
        return a in deps.get(b, ()) or b in deps.get(a, ())

    todo = {ex: list(cases.items()) for ex, cases in table.items()}
    subs = []
    while any(todo.values()):
        picked = []
        for ex in sorted(todo, key=lambda e: -len(todo[e])):   # the longest lists first
            if todo[ex] and not any(related(ex, p) for p in picked):
                picked.append(ex)
        chosen = {ex: todo[ex].pop(0) for ex in picked}
        nb = copy.deepcopy(exercise)
        used = {}
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("course", {})
            ex = meta.get("exercise")
            if meta.get("role") != "answer":
                continue
            if ex in chosen:
                why, src = chosen[ex]
                cell.source = src.strip("\n")
                used[ex] = why
            elif ex in official:
                cell.source = official[ex]
        subs.append((f"wrong{len(subs) + 1}", nb, used))
    return subs


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _is_check(name: str) -> bool:
    # expect_*: a check cell's own helper that runs the answer and checks it
    return name.startswith(("check_", "expect_")) or name in ("run_answer", "one_pass",
                                                               "check_source")


def _calls_outside_defs(tree) -> list[str]:
    """Names of the calls a piece of code makes itself, not inside the functions it defines."""
    names = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, ast.Call):
                names.append(_call_name(child))
            visit(child)
    visit(tree)
    return names


def _check_calls(src: str, hidden: bool) -> int:
    """How many check statements a check cell runs, visible or hidden: its own check calls,
    and for each call of a helper the cell defines, the check calls that helper makes."""
    try:
        full = ast.parse(src)
    except SyntaxError:
        return 0
    helpers = {n.name: n for n in full.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def weight(name, seen):
        n = 0
        for sub in ast.walk(helpers[name]):
            if isinstance(sub, ast.Call):
                called = _call_name(sub)
                if _is_check(called):
                    n += 1
                elif called in helpers and called not in seen:
                    n += weight(called, seen | {called})
        return n

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
    for name in _calls_outside_defs(tree):
        if _is_check(name):
            n += 1
        elif name in helpers:
            n += weight(name, {name})
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
            "answer with `course-grade` and requires zero points for it and full marks for "
            "the official answers graded beside it (never beside a wrong answer they build "
            "on); `course-grade` itself first grades the official solution and stops if it "
            "loses a point. Visible and hidden checks count "
            "the check calls in each check cell (hidden ones are removed from the exercise "
            "handed out).\n\n")
    return head + "\n".join(rows) + "\n"


TABLE = ROOT / "docs" / "problem-sets.md"
