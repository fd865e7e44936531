"""Every problem set is graded with ``course-grade`` against the wrong answers learners
write (``tests/wrong_answers/``): each must score zero on its exercise, while the
solution scores full marks and the untouched exercise zero."""
import shutil

import nbformat
import pytest

from course_utils.grading import grader
from tests.wrong_answers import (MIN_WRONG, TABLE, exercises_of, problem_sets, submissions,
                                 table_markdown, wrong_answers)

SETS = problem_sets()


@pytest.mark.parametrize("solution", SETS, ids=[p.stem for p in SETS])
def test_problem_set_scores_right_and_wrong(solution, tmp_path):
    exercise = solution.parent.parent / "exercises" / solution.name
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(solution, subs / "solution.ipynb")
    shutil.copy(exercise, subs / "exercise.ipynb")
    wrong = submissions(solution.stem)
    for name, nb, _ in wrong:
        nbformat.write(nb, subs / f"{name}.ipynb")
    out = tmp_path / "out"
    res = grader.grade(solution.stem, subs, out, workers=2, cell_timeout=600, timeout=1200)
    tpl = grader.load_template(solution.stem)
    sol, ex = res.students["solution"], res.students["exercise"]
    assert sol["total"] == tpl.max_points, (out / "feedback" / "solution.md").read_text()
    assert ex["total"] == 0, (out / "feedback" / "exercise.md").read_text()
    slipped = []
    for name, _, used in wrong:
        got = {x["exercise"]: x["points"] for x in res.students[name]["exercises"]}
        for ex_id, why in used.items():
            if got.get(ex_id, 0) != 0:
                slipped.append(f"{ex_id} '{why}' scored {got[ex_id]}")
    assert not slipped, "wrong answers that earned marks:\n  " + "\n  ".join(slipped)


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


def test_instructor_table_is_current():
    assert TABLE.exists() and TABLE.read_text(encoding="utf-8") == table_markdown(), \
        "docs/problem-sets.md is stale: run python -m tests.wrong_answers"
