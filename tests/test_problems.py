"""The solution -> exercise pipeline."""
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_utils import problems
from course_utils.problems import ProblemSetError, build, classify

ROOT = Path(__file__).resolve().parent.parent


def make_root(tmp_path, cells, name="42_demo.ipynb"):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    nb = new_notebook(cells=cells)
    nbformat.write(nb, tmp_path / "solutions" / name)
    return tmp_path


ANSWER = """# Exercise 42.1 (3 points)
def double(x):
    ### HINT: multiply by two
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION
"""
CHECK = """# Check 42.1
assert double(2) == 4
### BEGIN HIDDEN TESTS
assert double(-3) == -6
### END HIDDEN TESTS
"""


def good_cells():
    cells = [new_markdown_cell("# demo"), new_code_cell(ANSWER), new_code_cell(CHECK),
             new_code_cell("print('x')  # NBVAL_CHECK_OUTPUT")]
    cells[1].outputs = [nbformat.v4.new_output("stream", text="noise")]
    cells[3].outputs = [nbformat.v4.new_output("stream", text="x\n")]
    return cells


def test_repository_notebooks_are_in_sync():
    assert build(ROOT, write=False) == []


def test_build_generates_exercise(tmp_path):
    root = make_root(tmp_path, good_cells())
    written = build(root)
    assert sorted(written) == ["course_utils/data/hints/42_demo.json", "exercises/42_demo.ipynb",
                               "solutions/42_demo.ipynb"]
    sol = nbformat.read(root / "solutions/42_demo.ipynb", as_version=4)
    ex = nbformat.read(root / "exercises/42_demo.ipynb", as_version=4)
    a = next(c for c in sol.cells if c.get("id") == "ex-42-1-answer")
    assert a.metadata["course"] == {"role": "answer", "exercise": "42.1", "points": 3}
    assert a.outputs == [] and a.execution_count is None  # noisy output dropped
    assert "return 2 * x" in a.source
    kept = sol.cells[3]
    assert kept.outputs and kept.outputs[0]["text"] == "x\n"  # NBVAL_CHECK_OUTPUT kept
    assert kept.execution_count == 1
    ex_answer = next(c for c in ex.cells if c.get("id") == "ex-42-1-answer")
    assert "return 2 * x" not in ex_answer.source
    assert "raise NotImplementedError('Exercise 42.1: multiply by two')" in ex_answer.source
    assert "    # Hint: multiply by two" in ex_answer.source
    ex_check = next(c for c in ex.cells if c.get("id") == "ex-42-1-check")
    assert "double(-3)" not in ex_check.source and "double(2) == 4" in ex_check.source
    assert "double(-3)" in sol.cells[2].source  # hidden tests stay in the solution
    assert ex.cells[0].id == problems.BANNER_ID
    assert all(c.outputs == [] for c in ex.cells if c.cell_type == "code")
    # the generated exercise compiles and raises the hint when run
    ns = {}
    exec(compile(ex_answer.source, "cell", "exec"), ns)
    with pytest.raises(NotImplementedError, match="multiply by two"):
        ns["double"](1)
    # idempotent: a second build writes nothing
    assert build(root) == []


def test_stale_exercise_is_detected(tmp_path):
    root = make_root(tmp_path, good_cells())
    build(root)
    ex = root / "exercises/42_demo.ipynb"
    ex.write_text(ex.read_text().replace("multiply by two", "something else"))
    assert build(root, write=False) == ["exercises/42_demo.ipynb"]
    (root / "exercises/99_orphan.ipynb").write_text("{}")
    assert "exercises/99_orphan.ipynb" in build(root, write=False)
    build(root)
    assert build(root, write=False) == []
    assert not (root / "exercises/99_orphan.ipynb").exists()


def test_cli_check(tmp_path, monkeypatch, capsys):
    assert problems.main(["check"]) == 0
    root = make_root(tmp_path, good_cells())
    monkeypatch.setattr(problems, "ROOT", root)
    monkeypatch.setattr(problems.build, "__defaults__", (root, True, None))
    assert problems.main(["check"]) == 1
    assert "stale" in capsys.readouterr().out


@pytest.mark.parametrize("cells, message", [
    ([new_code_cell(ANSWER)], "no '# Check 42.1' cell"),
    ([new_code_cell(CHECK)], "has no answer cell"),
    ([new_code_cell(CHECK), new_code_cell(ANSWER)], "comes before its answer"),
    ([new_code_cell(ANSWER), new_code_cell(ANSWER), new_code_cell(CHECK)], "a second answer"),
    ([new_code_cell(ANSWER.replace("    ### END SOLUTION\n", "")), new_code_cell(CHECK)],
     "never closed"),
    ([new_code_cell("# Exercise 42.1\nx = 1"), new_code_cell(CHECK)], "needs a '### BEGIN"),
    ([new_code_cell("x = 1\n### BEGIN SOLUTION\n### END SOLUTION")], "first line is not"),
    ([new_code_cell(ANSWER), new_code_cell(CHECK.replace("### END HIDDEN TESTS\n", ""))],
     "never closed"),
])
def test_marker_errors(cells, message):
    with pytest.raises(ProblemSetError, match=message):
        classify(new_notebook(cells=cells))


def test_every_problem_set_has_graded_cells():
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        graded = classify(nb, path.name)
        assert graded, f"{path.name} has no exercises"
        ids = [c.get("id") for c in nb.cells]
        assert len(ids) == len(set(ids)), f"{path.name} has duplicate cell ids"
        data = json.loads(path.read_text())
        assert data["nbformat"] == 4 and data["nbformat_minor"] >= 5


def test_stub_inside_a_triton_kernel_is_a_compile_time_assert():
    src = ("# Exercise 42.2\n@triton.jit\ndef k(X, n, BLOCK: tl.constexpr):\n"
           "    ### HINT: mask the lanes past n\n    ### BEGIN SOLUTION\n    pass\n"
           "    ### END SOLUTION\n\n\ndef wrapper(x):\n    ### BEGIN SOLUTION\n"
           "    return x\n    ### END SOLUTION\n")
    out = problems.exercise_source(src, "42.2")
    assert "    tl.static_assert(False, 'Exercise 42.2: mask the lanes past n')" in out
    assert "    raise NotImplementedError('Exercise 42.2: mask the lanes past n')" in out
    assert problems._regions_in_kernels(src) == [True, False]
