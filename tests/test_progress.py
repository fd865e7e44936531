"""The progress view: a learner's notebook run with the official visible checks."""
import nbformat
import pytest

from course_utils import problems, progress


def _learner_copy(tmp_path, answers, check_edits=None):
    nb = nbformat.read(problems.EXERCISES / "00_setup.ipynb", as_version=4)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("course", {})
        ex = meta.get("exercise")
        if meta.get("role") == "answer" and ex in answers:
            cell.source = answers[ex]
        if meta.get("role") == "check" and ex in (check_edits or {}):
            cell.source = check_edits[ex]
    nbformat.write(nb, tmp_path / "00_setup.ipynb")


def test_progress_runs_the_learners_notebook_with_the_official_checks(tmp_path):
    sol = nbformat.read(problems.SOLUTIONS / "00_setup.ipynb", as_version=4)
    right = next(c.source for c in sol.cells
                 if c.get("metadata", {}).get("course", {}) .get("exercise") == "0.1"
                 and c.metadata["course"]["role"] == "answer")
    wrong = ("# Exercise 0.2\ndef scaled_scores(q, k):\n"
             "    return q @ k.transpose(-2, -1) / q.shape[-1]\n")
    # the learner "fixed" the check of 0.2 to pass: the official one is put back
    _learner_copy(tmp_path, {"0.1": right, "0.2": wrong}, {"0.2": "# Check 0.2\npass"})
    rows = progress.progress(["00"], tmp_path, timeout=120)
    got = {r.exercise: r for r in rows}
    assert got["0.1"].status == "pass"
    assert got["0.2"].status == "fail" and "CheckFailed" in got["0.2"].detail
    table = progress.progress_table(rows)
    assert "1/2" in table and "0.1+" in table and "0.2x" in table and "hidden" in table


def test_untouched_exercises_are_not_started(tmp_path):
    _learner_copy(tmp_path, {})
    rows = progress.progress(["0"], tmp_path, timeout=120)
    assert [r.status for r in rows] == ["not started", "not started"]


def test_missing_notebook_and_unknown_set(tmp_path, capsys):
    rows = progress.progress(["00"], tmp_path / "nowhere")
    assert {r.status for r in rows} == {"missing"}
    with pytest.raises(ValueError, match="no problem set 42"):
        progress.progress(["42"], tmp_path)
    assert progress.main(["42", "--dir", str(tmp_path)]) == 2
    assert "no problem set 42" in capsys.readouterr().err
