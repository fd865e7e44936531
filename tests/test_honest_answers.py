"""Correct answers that learners write otherwise than the official ones keep full marks
(``tests/honest_answers.py``): each problem set's honest answers go into one submission,
the official answers elsewhere, graded with ``course-grade``."""
import copy

import nbformat
import pytest

from course_utils.grading import grader
from tests.honest_answers import HONEST
from tests.wrong_answers import ROOT


def _submission(stem):
    nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
    tpl = grader.load_template(stem, root=ROOT)
    official = {e.id: tpl.nb.cells[e.answer_index].source for e in tpl.exercises}
    subs = []
    todo = {ex: list(cases.values()) for ex, cases in HONEST[stem].items()}
    while any(todo.values()):
        sub = copy.deepcopy(nb)
        for cell in sub.cells:
            meta = cell.get("metadata", {}).get("course", {})
            if meta.get("role") == "answer":
                ex = meta["exercise"]
                cell.source = (todo[ex].pop(0).strip("\n") if todo.get(ex)
                               else official[ex])
        subs.append(sub)
    return subs, {e.id: e.points for e in tpl.exercises}


@pytest.mark.parametrize("stem", sorted(HONEST))
def test_honest_answers_keep_full_marks(stem, tmp_path):
    subs, points = _submission(stem)
    folder = tmp_path / "subs"
    folder.mkdir()
    for i, nb in enumerate(subs):
        nbformat.write(nb, folder / f"honest{i + 1}.ipynb")
    res = grader.grade(stem, folder, tmp_path / "out", workers=1, cell_timeout=600, timeout=1200)
    lost = []
    for name, st in res.students.items():
        got = {x["exercise"]: x for x in st["exercises"]}
        for ex, full in points.items():
            if got.get(ex, {}).get("points") != full:
                lost.append(f"{name} {ex}: {got.get(ex, {}).get('points')} of {full} "
                            f"({got.get(ex, {}).get('reason', '')[:300]})")
    assert not lost, "honest answers that lost marks:\n  " + "\n  ".join(lost)
