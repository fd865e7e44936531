"""Every problem set is graded with ``course-grade`` against the wrong answers learners
write (``tests/wrong_answers/``): each must score zero on its exercise, and the official
answers beside it full marks.

The official solution itself goes through the same path first: ``course-grade`` runs it
as a student's notebook (answers exported, the checks replayed in a second kernel) before
grading anyone and stops with the failing check if it loses a point. That every
generated exercise fails its checks is tests/test_exercises.py."""
import shutil

import nbformat
import pytest

from course_utils.grading import grader
from tests.wrong_answers import (MIN_WRONG, TABLE, dependencies, exercises_of, problem_sets,
                                 submissions, table_markdown, wrong_answers)

SETS = problem_sets()


def _downstream(deps: dict, targets) -> set:
    """The exercises that build, directly or not, on any of ``targets``."""
    out, grew = set(targets), True
    while grew:
        new = {b for b, a in deps.items() if b not in out and a & out}
        grew = bool(new)
        out |= new
    return out


@pytest.mark.parametrize("solution", SETS, ids=[p.stem for p in SETS])
def test_problem_set_scores_right_and_wrong(solution, tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    wrong = submissions(solution.stem)
    for name, nb, _ in wrong:
        nbformat.write(nb, subs / f"{name}.ipynb")
    out = tmp_path / "out"
    # raises GradingError naming the check if the official solution loses a point
    res = grader.grade(solution.stem, subs, out, workers=2, cell_timeout=600, timeout=1200)
    tpl = grader.load_template(solution.stem)
    points = {e.id: e.points for e in tpl.exercises}
    deps = dependencies(solution.stem)
    slipped, lost = [], []
    for name, _, used in wrong:
        got = {x["exercise"]: x["points"] for x in res.students[name]["exercises"]}
        for ex_id, why in used.items():
            if got.get(ex_id, 0) != 0:
                slipped.append(f"{ex_id} '{why}' scored {got[ex_id]}")
        # an official answer that builds on no wrong answer of this submission keeps its marks
        for ex_id in set(points) - _downstream(deps, used):
            if got.get(ex_id) != points[ex_id]:
                lost.append(f"{name}: the official {ex_id} scored {got.get(ex_id)} beside "
                            f"wrong answers to {sorted(used)}")
    assert not slipped, "wrong answers that earned marks:\n  " + "\n  ".join(slipped)
    assert not lost, "official answers that lost marks:\n  " + "\n  ".join(lost)


@pytest.mark.parametrize("solution", SETS, ids=[p.stem for p in SETS])
def test_every_exercise_has_wrong_answers(solution):
    nb = nbformat.read(solution, as_version=4)
    table = wrong_answers(solution.stem)
    short = {ex: len(table.get(ex, {})) for ex in exercises_of(nb)
             if len(table.get(ex, {})) < MIN_WRONG}
    assert not short, (f"{solution.stem}: exercises with fewer than {MIN_WRONG} wrong answers "
                       f"in tests/wrong_answers/{solution.stem}.py: {short}")
    unknown = set(table) - set(exercises_of(nb))
    assert not unknown, f"{solution.stem}: wrong answers for exercises it does not have: {unknown}"


def test_wrong_answers_are_never_graded_beside_a_wrong_answer_they_build_on():
    # 7.6 assembles the backward from the kernels of 7.1-7.3 (through the template's
    # wrappers): graded beside a wrong 7.1, any 7.6 would score zero
    assert dependencies("07_triton_backward")["7.6"] == {"7.1", "7.2", "7.3"}
    assert dependencies("04_tiled_attention")["4.3"] == {"4.2"}
    for solution in SETS:
        deps = dependencies(solution.stem)
        table = wrong_answers(solution.stem)
        seen = []
        for _, nb, used in submissions(solution.stem):
            for a in used:
                assert not deps[a] & set(used), (solution.stem, a, used)
                seen.append((a, used[a]))
            # every other answer cell holds the official answer
            for cell in nb.cells:
                meta = cell.get("metadata", {}).get("course", {})
                if meta.get("role") == "answer" and meta["exercise"] not in used:
                    assert "### BEGIN SOLUTION" in cell.source, (solution.stem, meta["exercise"])
        assert sorted(seen) == sorted((ex, why) for ex, cases in table.items() for why in cases)


def test_instructor_table_is_current():
    assert TABLE.exists() and TABLE.read_text(encoding="utf-8") == table_markdown(), \
        "docs/problem-sets.md is stale: run python -m tests.wrong_answers"
