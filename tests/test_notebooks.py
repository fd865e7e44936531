"""House rules for every notebook: no hard-coded device, no stray outputs,
stable cell ids, fixed seeds where randomness is used; and nbval really
compares the cells marked for it."""
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(ROOT.glob("solutions/*.ipynb")) + \
    sorted(ROOT.glob("exercises/*.ipynb"))
IDS = [str(p.relative_to(ROOT)) for p in NOTEBOOKS]
CUDA = re.compile(r"""["']cuda(:\d+)?["']|\.cuda\(\)""")


def code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_hard_coded_device(path):
    for i, cell in enumerate(code_cells(path)):
        assert not CUDA.search(cell.source), \
            f"{path.name} code cell {i} hard-codes the GPU; use course_utils.device.DEVICE"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_saved_without_stray_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    # read from the file itself: nbformat.read gives a cell without an id a random one
    ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]
    assert all(ids) and len(set(ids)) == len(ids), f"{path.name}: missing or duplicate cell ids"
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        if "NBVAL_CHECK_OUTPUT" in cell.source:
            assert cell.outputs, f"{path.name} code cell {i} is marked for nbval but has no output"
        else:
            assert not cell.outputs, f"{path.name} code cell {i} was saved with outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_random_notebooks_fix_a_seed(path):
    src = "\n".join(c.source for c in code_cells(path))
    if re.search(r"torch\.(randn|rand|randint|randperm)\(|np\.random\.", src):
        assert re.search(r"manual_seed\(|np\.random\.seed\(|default_rng\(\d", src), \
            f"{path.name} draws random numbers without fixing a seed"


def test_nbval_compares_marked_cells(tmp_path):
    """A marked cell whose stored output is wrong makes nbval fail."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(6 * 7)")])
    nb.cells[0].id = "marked"
    nb.cells[0].execution_count = 1
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    good = tmp_path / "good.ipynb"
    nbformat.write(nb, good)
    nb.cells[0].outputs[0]["text"] = "41\n"
    bad = tmp_path / "bad.ipynb"
    nbformat.write(nb, bad)
    run = lambda p: subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",  # noqa: E731
                                    "--nbval-lax", str(p)], cwd=tmp_path, capture_output=True, text=True)
    assert run(good).returncode == 0
    r = run(bad)
    assert r.returncode != 0 and "41" in r.stdout


SAVES = re.compile(r"main\(|import main\b|\bsave\(")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_cell_overwrites_a_committed_measurement(path):
    """The lessons read the records under benchmarks/; a cell that runs a benchmark's
    command (which saves its record) would replace the committed one on a GPU, and the
    next run of the lesson would read the learner's partial sweep instead."""
    for i, cell in enumerate(code_cells(path)):
        if "course_utils.bench" in cell.source:
            assert not SAVES.search(cell.source), \
                f"{path.name} code cell {i} runs a benchmark command that saves its record"
