"""Every generated exercise must fail its checks: each answer cell raises the
NotImplementedError with its hint, and each check cell then fails."""
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_utils.site import kernel_sockets

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def _errors(cell):
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize("path", EXERCISES, ids=[p.stem for p in EXERCISES])
def test_exercise_fails_its_checks(path):
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="course-ex-") as sock_dir:
        client = NotebookClient(nb, timeout=600, allow_errors=True, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}},
                                config=kernel_sockets(sock_dir))
        client.execute()
    graded = [c for c in nb.cells if c.get("metadata", {}).get("course")]
    assert graded, f"{path.name}: no graded cells"
    by_ex = {}
    for cell in graded:
        by_ex.setdefault(cell.metadata["course"]["exercise"], {})[cell.metadata["course"]["role"]] = cell
    for ex, cells in by_ex.items():
        check_errs = _errors(cells["check"])
        assert check_errs, f"{path.name}: the check of exercise {ex} passed on the unsolved exercise"
        answer_errs = _errors(cells["answer"])
        # the stub raises either when its cell runs, or when the check calls the stub
        stub = answer_errs[0] if answer_errs else check_errs[0]
        if f"tl.static_assert(False, \"Exercise {ex}" in cells["answer"].source:
            # a stub inside a Triton kernel: the interpreter raises its assert, a GPU
            # compiler refuses the kernel; either way the message names the exercise
            # (the compiler's message may sit in the chained error of a device function)
            allowed = ("InterpreterError", "CompilationError", "CompileTimeAssertionFailure",
                       "AssertionError")
            said = stub["evalue"] + "\n".join(stub.get("traceback", []))
        else:
            allowed = ("NotImplementedError",)
            said = stub["evalue"]
        assert stub["ename"] in allowed, (path.name, ex, stub["ename"], stub["evalue"])
        assert f"Exercise {ex}" in said, (path.name, ex, stub["evalue"])
