"""Tiered hints: the first tier in the exercise, the others on request only."""
import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_utils import hints, problems

ANSWER = """# Exercise 42.1
def online_max(xs):
    ### HINT: keep one running number
    ### HINT+: the running max never decreases; compare each new value with it
    ### HINT+: start from minus infinity so the first value always wins
    ### BEGIN SOLUTION
    m = float("-inf")
    for x in xs:
        m = max(m, x)
    return m
    ### END SOLUTION
"""
CHECK = "# Check 42.1\nassert online_max([3, 1, 4]) == 4\n"


@pytest.fixture
def built(tmp_path, monkeypatch):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(ANSWER), new_code_cell(CHECK)]),
                   tmp_path / "solutions" / "42_demo.ipynb")
    problems.build(tmp_path)
    monkeypatch.setattr(hints, "HINTS_DIR", tmp_path / "course_utils" / "data" / "hints")
    monkeypatch.setattr(hints, "_shown", {})
    return tmp_path


def test_later_tiers_are_not_in_the_exercise(built):
    ex = nbformat.read(built / "exercises" / "42_demo.ipynb", as_version=4)
    src = next(c.source for c in ex.cells if c.get("id") == "ex-42-1-answer")
    assert "# Hint: keep one running number" in src
    assert "never decreases" not in src and "minus infinity" not in src
    assert "hint('42.1')" in src and "float(\"-inf\")" not in src
    data = json.loads((built / "course_utils/data/hints/42_demo.json").read_text())
    assert data == {"42.1": ["keep one running number",
                             "the running max never decreases; compare each new value with it",
                             "start from minus infinity so the first value always wins"]}


def test_hint_gives_the_next_tier_each_time(built, capsys):
    assert "Hint 1 of 3" in hints.hint("42.1")
    assert "never decreases" in hints.hint("42.1")
    third = hints.hint("42.1")
    assert "minus infinity" in third and "last hint" in third
    assert "minus infinity" in hints.hint("42.1")      # stays on the last one
    assert "keep one running" in hints.hint("42.1", 1)


def test_hint_errors(built):
    with pytest.raises(ValueError, match="has no hints"):
        hints.hint("42.9")
    with pytest.raises(ValueError, match="no problem set 43"):
        hints.hint("43.1")
    with pytest.raises(ValueError, match="hints 1 to 3"):
        hints.hint("42.1", 4)
    with pytest.raises(ValueError, match="look like"):
        hints.hint("x")


def test_stale_hint_file_is_reported(built):
    (built / "course_utils/data/hints/42_demo.json").write_text("{}\n")
    assert problems.build(built, write=False) == ["course_utils/data/hints/42_demo.json"]


def test_every_problem_set_has_its_hint_file():
    for sol in sorted(problems.SOLUTIONS.glob("*.ipynb")):
        assert (problems.HINTS_DIR / f"{sol.stem}.json").exists(), sol.name
