"""The problem-set pipeline: each problem set is written once, in ``solutions/``,
and the exercise version in ``exercises/`` is generated from it.

Markers in a solution notebook (all are comments, so the solution runs as is):

* An **answer cell** is a code cell whose first line is ``# Exercise <id>`` (an
  optional ``(N points)`` may follow; default 1 point). Inside it, each region
  between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` is the answer. In the
  exercise it becomes ``raise NotImplementedError(<hint>)`` at the same indent.
  A ``### HINT: ...`` line anywhere in the cell supplies that hint and stays in
  the exercise as a ``# Hint:`` comment.
* Further hints, given one at a time when the learner asks for them
  (``course_utils.hints.hint("4.3")``), are ``### HINT+: ...`` lines, in order: they
  are removed from the exercise and written to ``course_utils/data/hints/<name>.json``.
  A hint says what to compute and which invariant holds; it never holds the code.
* A **check cell** is a code cell whose first line is ``# Check <id>``. A region
  between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` is kept in the
  solution (and the grader's template) but removed from the exercise.

``python -m course_utils.problems build`` normalises every solution (stable cell
ids ``ex-<id>-answer`` / ``ex-<id>-check``, ``metadata.course`` with role,
exercise id and points, outputs cleared except cells marked
``# NBVAL_CHECK_OUTPUT``) and writes the matching exercise.
``python -m course_utils.problems check`` exits non-zero when a committed
notebook is stale.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"

ANSWER_RE = re.compile(r"^#\s*Exercise\s+([A-Za-z0-9][\w.]*)\s*(?:\((\d+)\s+points?\))?")
CHECK_RE = re.compile(r"^#\s*Check\s+([A-Za-z0-9][\w.]*)\b")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HBEGIN, HEND = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
HINT_RE = re.compile(r"^(\s*)### HINT:\s*(.*)$")
MORE_HINT_RE = re.compile(r"^(\s*)### HINT\+:\s*(.*)$")
HINTS_DIR = Path(__file__).resolve().parent / "data" / "hints"
KEEP_OUTPUT = "NBVAL_CHECK_OUTPUT"
BANNER_ID = "exercise-banner"


class ProblemSetError(ValueError):
    """A solution notebook breaks the marker rules; the message says where."""


@dataclass
class GradedCell:
    exercise: str
    role: str  # "answer" or "check"
    points: int
    index: int


def cell_id(exercise: str, role: str) -> str:
    return f"ex-{exercise.replace('.', '-')}-{role}"


def classify(nb, path="notebook") -> list[GradedCell]:
    """Find the answer and check cells of a solution notebook and validate the markers."""
    found, answers, checks = [], {}, {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        first = cell.source.lstrip("\n").split("\n", 1)[0]
        m = ANSWER_RE.match(first)
        c = CHECK_RE.match(first)
        where = f"{path}, cell {i}"
        if m:
            ex = m.group(1)
            if ex in answers:
                raise ProblemSetError(f"{where}: a second answer cell for exercise {ex}")
            _solution_regions(cell.source, where)
            answers[ex] = i
            found.append(GradedCell(ex, "answer", int(m.group(2) or 1), i))
        elif c:
            ex = c.group(1)
            if ex in checks:
                raise ProblemSetError(f"{where}: a second check cell for exercise {ex}")
            _regions(cell.source, HBEGIN, HEND, where)
            checks[ex] = i
            found.append(GradedCell(ex, "check", 0, i))
        elif BEGIN in cell.source:
            raise ProblemSetError(f"{where}: has '{BEGIN}' but its first line is not "
                                  "'# Exercise <id>'")
    for ex, i in answers.items():
        if ex not in checks:
            raise ProblemSetError(f"{path}: exercise {ex} has an answer cell but no '# Check {ex}' cell")
        if checks[ex] < i:
            raise ProblemSetError(f"{path}: the check for exercise {ex} comes before its answer")
    for ex in checks:
        if ex not in answers:
            raise ProblemSetError(f"{path}: '# Check {ex}' has no answer cell '# Exercise {ex}'")
    return found


def _regions(src: str, begin: str, end: str, where: str):
    lines = src.split("\n")
    out, start = [], None
    for j, line in enumerate(lines):
        s = line.strip()
        if s == begin:
            if start is not None:
                raise ProblemSetError(f"{where}, line {j + 1}: '{begin}' inside another region")
            start = j
        elif s == end:
            if start is None:
                raise ProblemSetError(f"{where}, line {j + 1}: '{end}' without '{begin}'")
            out.append((start, j))
            start = None
    if start is not None:
        raise ProblemSetError(f"{where}, line {start + 1}: '{begin}' is never closed")
    return out


def _solution_regions(src, where):
    regions = _regions(src, BEGIN, END, where)
    if not regions:
        raise ProblemSetError(f"{where}: an answer cell needs a '{BEGIN}' ... '{END}' region")
    return regions


def _strip_regions(src: str, begin: str, end: str, replace) -> str:
    lines = src.split("\n")
    regions = _regions(src, begin, end, "cell")
    out, j = [], 0
    for a, b in regions:
        out.extend(lines[j:a])
        indent = lines[a][: len(lines[a]) - len(lines[a].lstrip())]
        out.extend(replace(indent))
        j = b + 1
    out.extend(lines[j:])
    return "\n".join(out)


def hint_tiers(src: str) -> list[str]:
    """The hints of an answer cell, first tier first: the ``### HINT:`` lines joined,
    then each ``### HINT+:`` line."""
    lines = src.split("\n")
    first = " ".join(m.group(2).strip() for m in map(HINT_RE.match, lines) if m)
    more = [m.group(2).strip() for m in map(MORE_HINT_RE.match, lines) if m]
    return ([first] if first else []) + more


_KERNEL_DECORATOR = re.compile(r"^\s*@(triton\.jit|gluon\.jit|jit)\b")


def _regions_in_kernels(src: str) -> list[bool]:
    """For each solution region of a cell: does it lie inside a ``@triton.jit`` (or
    ``@gluon.jit``) function?"""
    lines = src.split("\n")
    out = []
    for start, _ in _regions(src, BEGIN, END, "cell"):
        indent = len(lines[start]) - len(lines[start].lstrip())
        inside = False
        for j in range(start - 1, -1, -1):
            line = lines[j]
            if not line.strip():
                continue
            ind = len(line) - len(line.lstrip())
            if ind < indent and line.lstrip().startswith("def "):
                k = j - 1
                while k >= 0 and lines[k].lstrip().startswith("@"):
                    inside = inside or bool(_KERNEL_DECORATOR.match(lines[k]))
                    k -= 1
                break
        out.append(inside)
    return out


def exercise_source(src: str, exercise: str) -> str:
    """The exercise version of an answer cell."""
    tiers = hint_tiers(src)
    hint = tiers[0] if tiers else "write your answer in place of this line"
    msg = f"Exercise {exercise}: {hint}"
    if len(tiers) > 1:
        msg += f" (next hint: hint({exercise!r}))"
    in_kernel = _regions_in_kernels(src)
    count = iter(range(len(in_kernel)))

    def stub(ind):
        # a compiled Triton kernel cannot raise: there the stub is a compile-time assert
        # that fails with the same message (the interpreter raises it too)
        if in_kernel[next(count)]:
            return [f"{ind}tl.static_assert(False, {msg!r})"]
        return [f"{ind}raise NotImplementedError({msg!r})"]
    body = _strip_regions(src, BEGIN, END, stub)
    kept = [line for line in body.split("\n") if not MORE_HINT_RE.match(line)]
    return "\n".join(HINT_RE.sub(r"\1# Hint: \2", line) for line in kept)


def hints_json(solution_nb) -> str:
    """The generated hint file of a problem set: ``{exercise: [tier 1, tier 2, ...]}``."""
    import json
    out = {}
    for cell in solution_nb.cells:
        meta = cell.get("metadata", {}).get("course", {})
        if meta.get("role") == "answer":
            tiers = hint_tiers(cell.source)
            if tiers:
                out[meta["exercise"]] = tiers
    return json.dumps(out, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def check_source(src: str) -> str:
    return _strip_regions(src, HBEGIN, HEND, lambda ind: [])


def _stable_id(path: Path, i: int, cell) -> str:
    h = hashlib.sha1(f"{path.stem}:{i}:{cell.cell_type}".encode()).hexdigest()[:10]
    return f"c{h}"


def normalise_solution(nb, path: Path):
    """Return a copy of the solution with stable ids, metadata and cleaned outputs."""
    nb = copy.deepcopy(nb)
    nb.nbformat, nb.nbformat_minor = 4, max(nb.get("nbformat_minor", 5), 5)
    graded = {g.index: g for g in classify(nb, path.name)}
    seen = set()
    for i, cell in enumerate(nb.cells):
        meta = cell.setdefault("metadata", {})
        meta.pop("course", None)
        if i in graded:
            g = graded[i]
            cell.id = cell_id(g.exercise, g.role)
            meta["course"] = {"role": g.role, "exercise": g.exercise}
            if g.role == "answer":
                meta["course"]["points"] = g.points
        elif not cell.get("id") or cell.id in seen or cell.id.startswith("ex-"):
            cell.id = _stable_id(path, i, cell)
        if cell.id in seen:
            raise ProblemSetError(f"{path.name}: duplicate cell id {cell.id}")
        seen.add(cell.id)
        if cell.cell_type == "code":
            if KEEP_OUTPUT not in cell.source:
                cell.outputs = []
                cell.execution_count = None
            else:
                # nbval compares only cells that were run: keep a fixed count
                cell.execution_count = 1
                for out in cell.outputs:
                    if "execution_count" in out:
                        out["execution_count"] = 1
    for k in ("widgets",):
        nb.metadata.pop(k, None)
    return nb


def make_exercise(solution_nb, path: Path):
    """Generate the exercise notebook from a normalised solution notebook."""
    nb = copy.deepcopy(solution_nb)
    for cell in nb.cells:
        role = cell.get("metadata", {}).get("course", {}).get("role")
        if role == "answer":
            cell.source = exercise_source(cell.source, cell.metadata["course"]["exercise"])
        elif role == "check":
            cell.source = check_source(cell.source)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    banner = nbformat.v4.new_markdown_cell(
        f"*Exercise notebook, generated from `solutions/{path.name}`. Replace each "
        "`raise NotImplementedError(...)` with your answer and run the `# Check` cell below it. "
        "Do not edit the check cells: graders use their own copy.*")
    banner.id = BANNER_ID
    nb.cells.insert(0, banner)
    return nb


def _dump(nb) -> str:
    nbformat.validate(nb)
    return nbformat.writes(nb) + ("" if nbformat.writes(nb).endswith("\n") else "\n")


def build(root: Path = ROOT, write: bool = True, only=None) -> list[str]:
    """Regenerate solutions (normalised) and exercises. Returns the stale paths
    (all that were rewritten when ``write``; only listed otherwise). ``only``
    limits the work to solution notebooks whose file name starts with one of
    the given prefixes (for example ``["01"]``)."""
    sol_dir, ex_dir = root / "solutions", root / "exercises"
    stale = []
    expected_ex = set()
    for path in sorted(sol_dir.glob("*.ipynb")):
        if only and not any(path.name.startswith(o) for o in only):
            expected_ex.add(path.name)
            continue
        raw = path.read_text(encoding="utf-8")
        nb = nbformat.reads(raw, as_version=4)
        sol = normalise_solution(nb, path)
        ex = make_exercise(sol, path)
        targets = [(path, _dump(sol)), (ex_dir / path.name, _dump(ex))]
        hints_dir = root / "course_utils" / "data" / "hints"
        targets.append((hints_dir / f"{path.stem}.json", hints_json(sol)))
        expected_ex.add(path.name)
        for target, text in targets:
            old = target.read_text(encoding="utf-8") if target.exists() else None
            if old != text:
                stale.append(str(target.relative_to(root)))
                if write:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text, encoding="utf-8")
    for orphan in sorted(ex_dir.glob("*.ipynb")):
        if orphan.name not in expected_ex:
            stale.append(str(orphan.relative_to(root)))
            if write:
                orphan.unlink()
    return stale


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m course_utils.problems",
                                 description="Generate exercises/ from solutions/.")
    ap.add_argument("command", choices=["build", "check"],
                    help="build: rewrite generated notebooks; check: fail if any is stale")
    ap.add_argument("only", nargs="*", help="file-name prefixes to limit the work to, e.g. 01 02")
    args = ap.parse_args(argv)
    try:
        stale = build(write=args.command == "build", only=args.only)
    except ProblemSetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command == "check":
        if stale:
            print("stale generated notebooks (run `python -m course_utils.problems build`):")
            print("\n".join(f"  {s}" for s in stale))
            return 1
        print("exercises/ and solutions/ are in sync")
        return 0
    print("\n".join(f"wrote {s}" for s in stale) or "nothing to do: all in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
