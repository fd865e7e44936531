"""course-grade: the grading model, adversarial submissions, and every real
problem set (solutions score full marks, generated exercises score zero).

The expensive part is kernels: the adversarial class is graded once (module
fixture, 2 workers) and every test that reads it shares the xdist group.
"""
from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from types import SimpleNamespace
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils import device as course_device
from course_utils.checks import check_equal
from course_utils.grading import (codec, grader, guard_keeper, instrument, kernel_side, sandbox,
                                  similarity, submissions)
from course_utils.grading.cli import main as cli_main

sys.path.insert(0, str(Path(__file__).parent))
import grading_helpers as H  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLASS_GROUP = pytest.mark.xdist_group("grading-adversarial-class")
CELL_TIMEOUT = 20


def _pythonpath(*first) -> str:
    """``first`` ahead of this process's own PYTHONPATH (on the GPU machine the Jupyter
    and nbval wheels live in a folder named there)."""
    return os.pathsep.join([str(p) for p in first] +
                           [p for p in [os.environ.get("PYTHONPATH")] if p])


def _hashes(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    H.make_problem_set(root)
    return root


def _tree_hash(*folders) -> dict:
    """``{path: sha256}`` of every file under ``folders`` (links by their target)."""
    out = {}
    for folder in folders:
        folder = Path(folder)
        if not folder.exists():
            continue
        for p in sorted(folder.rglob("*")):
            if "__pycache__" in p.parts or ".pytest_cache" in p.parts:
                continue
            if p.is_symlink():
                out[str(p)] = "link:" + os.readlink(p)
            elif p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


ISOLATION = sandbox.detect("auto")
# the hostile class needs a sandbox that holds: namespaces, or Landlock with signal scoping
HOLDS = ISOLATION.namespaces or ISOLATION.landlock >= 6
HOSTILE = list(H.HOSTILE_CASES) if HOLDS else []
HONEST_IN_HOSTILE = ("honest", "partial", "rng_user")
# (IPython's history database changes whenever any kernel on the machine runs: its
# configuration and startup folders are what a submission must not reach)
WATCHED = [ROOT / "course_utils", ROOT / "solutions", ROOT / "exercises", ROOT / "tests",
           Path.home() / ".ipython" / "profile_default" / "startup", Path.home() / ".jupyter",
           Path(sys.prefix) / "etc", Path(sys.prefix) / "share" / "jupyter"]


def _alive(token: str) -> list:
    """Pids of live processes whose command line carries ``token``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if token.encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                    out.append(int(d))
            except OSError:
                continue
    return out


@pytest.fixture(scope="module")
def graded_class(tiny, tmp_path_factory):
    """The adversarial class and, where the sandbox holds, the hostile one, graded
    together: every honest student among them must be scored right."""
    subs = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("grades")
    expected = H.make_class(tiny, subs)
    flag = tmp_path_factory.mktemp("flag") / "checks-neutered"
    flag.write_text("the startup-file payload acts only while this file exists")
    token = "course-grade-test-" + os.urandom(6).hex()
    if HOSTILE:
        expected.update(H.make_hostile_class(tiny, subs, out, ROOT, flag, token))
    files = [p for p in subs.iterdir() if not p.is_symlink()]
    before = _hashes(subs)
    modes = {p.name: p.stat().st_mode for p in files}
    watched = [tiny / "solutions", tiny / "exercises", subs] + WATCHED
    # IPython writes its default profile (a README in startup/ included) the first time any
    # kernel on the machine starts: made here first, so that a kernel another test starts
    # meanwhile on a fresh machine changes nothing the class is watched for
    from IPython.core.profiledir import ProfileDir
    (Path.home() / ".ipython").mkdir(exist_ok=True)
    ProfileDir.create_profile_dir_by_name(str(Path.home() / ".ipython"), "default")
    tree = _tree_hash(*watched)
    try:
        result = grader.grade(H.NAME, subs, out, workers=2, cell_timeout=CELL_TIMEOUT,
                              timeout=120, root=tiny, junit_xml=True)
        csv_after = (out / "scores.csv").read_text()
        time.sleep(4 if HOSTILE else 0)   # past the moment a left-over daemon would strike
        return {"root": tiny, "subs": subs, "out": out, "expected": expected, "before": before,
                "modes": modes, "result": result, "tree": tree, "watched": watched,
                "csv": csv_after, "token": token}
    finally:
        flag.unlink()
        for p in (Path.home() / ".ipython" / "profile_default" / "startup" /
                  "00-course-grade-test.py",
                  Path(sys.prefix) / "etc" / "ipython" / "ipython_config.py",
                  Path(sys.prefix) / "etc" / "jupyter" / "ipython_config.py"):
            if p.exists() and "course-grade-test" in p.read_text(errors="replace") + p.name:
                p.unlink()


# ------------------------------------------------------------------ the adversarial class
@CLASS_GROUP
@pytest.mark.parametrize("student", list(H.CASES) + HOSTILE)
def test_each_submission_gets_exactly_its_expected_score(graded_class, student):
    res = graded_class["result"].students[student]
    points, words = graded_class["expected"][student]
    got = {x["exercise"]: x["points"] for x in res["exercises"]}
    fb = (graded_class["out"] / "feedback" / f"{submissions.safe_name(student)}.md").read_text()
    assert got == points, f"{student}: {got} != {points}\n{fb}"
    assert res["total"] == sum(points.values())
    for w in words:
        assert w in fb, f"{student}: feedback lacks {w!r}:\n{fb}"
    # every exercise not passed says why
    for x in res["exercises"]:
        if not x["passed"]:
            assert x["reason"], (student, x)


@CLASS_GROUP
def test_submissions_are_never_modified(graded_class):
    subs = graded_class["subs"]
    assert _hashes(subs) == graded_class["before"]
    assert {p.name: p.stat().st_mode for p in subs.iterdir() if not p.is_symlink()} == \
        graded_class["modes"]


@CLASS_GROUP
def test_nothing_outside_the_output_folder_changed(graded_class):
    # the course checkout, the problem set, the submissions, the user's IPython and
    # Jupyter configuration and the Python installation, file by file
    after = _tree_hash(*graded_class["watched"])
    changed = sorted(set(after.items()) ^ set(graded_class["tree"].items()))
    assert not changed, changed[:10]
    assert not (ROOT / "course_utils" / "pwned.py").exists()


@CLASS_GROUP
def test_no_process_started_by_a_submission_is_alive(graded_class):
    # both setsid daemons (one kept the grader's marker variable, one cleared its
    # environment) carry the class's token on their command line
    assert _alive(graded_class["token"]) == []
    # a daemon that outlived its kernel would have rewritten the table by now
    assert (graded_class["out"] / "scores.csv").read_text() == graded_class["csv"]


@CLASS_GROUP
@pytest.mark.skipif(not HOLDS, reason="this machine's sandbox has neither namespaces nor "
                                      "Landlock signal scoping")
def test_honest_students_in_the_hostile_class_are_scored_right(graded_class):
    res = graded_class["result"]
    assert {s: res.students[s]["total"] for s in HONEST_IN_HOSTILE + ("=1+2",)} == \
        {"honest": 4, "partial": 3, "rng_user": 4, "=1+2": 4}
    assert res.isolation == ISOLATION.describe()


@CLASS_GROUP
def test_score_table_cells_cannot_be_formulas(graded_class):
    rows = list(csv.reader(io.StringIO((graded_class["out"] / "scores.csv").read_text())))
    assert rows[0][-2:] == ["review", "isolation"]
    assert all(r[-1] == ISOLATION.describe() for r in rows[1:])
    for r in rows:
        assert not any(c.startswith(grader._FORMULA) for c in r), r
    if HOSTILE:
        assert ["'=1+2", "2", "1", "1", "4", "4", "graded", "", ISOLATION.describe()] in rows


@CLASS_GROUP
def test_graded_notebooks_reproduce_the_verdicts_under_nbval(graded_class):
    out = graded_class["out"]
    assert (out / "junit" / "partial.xml").is_file()
    report = (out / "junit" / "partial.xml").read_text()
    assert 'failures="1"' in report and "exercise 1.2" in report
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "--nbval-lax", "--nbval-current-env", str(out / "graded" / "partial.ipynb")],
                       cwd=out / "graded", capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=_pythonpath(ROOT)))
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout[-3000:]
    assert "exercise 1.2: 2 check(s) failed" in r.stdout


@CLASS_GROUP
def test_tables_and_feedback_are_complete(graded_class):
    out, res = graded_class["out"], graded_class["result"]
    rows = (out / "scores.csv").read_text().strip().split("\n")
    assert rows[0] == "student,1.1 (2),1.2 (1),1.3 (1),total,max,status,review,isolation"
    assert len(rows) == 1 + len(H.CASES) + len(HOSTILE)
    table = json.loads((out / "scores.json").read_text())
    assert table["max"] == 4 and set(table["students"]) == set(H.CASES) | set(HOSTILE)
    assert table["isolation"] == ISOLATION.describe()
    for student in H.CASES:
        assert table["students"][student]["total"] == res.students[student]["total"]
        assert (out / "feedback" / f"{student}.md").exists()
        assert json.loads((out / "results" / f"{student}.json").read_text())["student"] == student
    leftovers = [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, leftovers
    assert res.students["not_a_notebook"]["status"] == "invalid"
    assert res.students["honest"]["submission_sha256"] == graded_class["before"]["honest.ipynb"]


@CLASS_GROUP
def test_hidden_tests_are_reported_without_their_values(graded_class):
    res = graded_class["result"].students["partial"]
    ex = next(x for x in res["exercises"] if x["exercise"] == "1.2")
    hidden = [c for c in ex["checks"] if c["hidden"]]
    assert hidden and not hidden[0]["passed"]
    assert hidden[0]["message"] == "a hidden test (double (2-d)) failed"


# ------------------------------------------------------------------ Triton answers
@pytest.fixture(scope="module")
def triton_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("course-triton")
    H.make_triton_problem_set(root)
    return root


def test_triton_answers_are_graded_from_tiles_and_launches(triton_set, tmp_path):
    # a device function called from a template kernel, a kernel the template launches
    # (its output buffer comes from torch.empty) and an in-place function; the answer
    # that rebinds the template's wrapper in its own kernel gets nothing for it
    subs = tmp_path / "subs"
    expected = H.make_triton_class(triton_set, subs)
    res = grader.grade(H.TRITON_NAME, subs, tmp_path / "out", workers=2,
                       cell_timeout=CELL_TIMEOUT * 3, timeout=300, root=triton_set)
    for student, (points, words) in expected.items():
        got = {x["exercise"]: x["points"] for x in res.students[student]["exercises"]}
        fb = (tmp_path / "out" / "feedback" / f"{student}.md").read_text()
        assert got == points, f"{student}: {got} != {points}\n{fb}"
        for w in words:
            assert w in fb, f"{student}: feedback lacks {w!r}:\n{fb}"


def _import_file(path: Path, name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shipped_calls(shipped):
    calls = {}
    for kind, _, blob in shipped:
        if kind == "call":
            rec = codec.decode(codec.loads(blob))
            calls.setdefault(rec["name"], []).append(rec)
    return calls


@pytest.fixture
def filled_empty():
    """As in a graded kernel (kernel_side.start): ``torch.empty`` holds NaN, so a buffer
    the template allocates is the same input in the student's kernel and the verifier."""
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled(),
           torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(was[0], warn_only=was[1])
    torch.utils.deterministic.fill_uninitialized_memory = was[2]


def test_device_functions_and_launches_replay_only_for_the_recorded_inputs(tmp_path, monkeypatch,
                                                                           filled_empty):
    src = tmp_path / "tiny_triton_answers.py"
    src.write_text(H.triton_module_source())
    mod = _import_file(src, "tiny_triton_answers")
    shipped = []
    monkeypatch.setattr(kernel_side, "_publish",
                        lambda kind, key, p: shipped.append((kind, key, codec.dumps(p))))
    monkeypatch.setitem(kernel_side._state, "mode", "student")
    monkeypatch.setitem(kernel_side._state, "calls", {})
    monkeypatch.setitem(kernel_side._state, "device", {})
    monkeypatch.setitem(kernel_side._state, "answer_bound", {})
    for ex, name in (("2.1", "row_unit"), ("2.2", "square_kernel"), ("2.3", "clamp_")):
        kernel_side.export(ex, [name], vars(mod))
    dev = course_device.DEVICE
    x = torch.randn(3, 8, device=dev)
    rows = mod.normalise_rows(x)
    xs, out = torch.randn(20, device=dev), torch.full((20,), float("nan"), device=dev)
    mod.square_kernel[(2,)](xs, out, 20, BLOCK=16)
    t = torch.randn(6, device=dev)
    mod.clamp_(t, 0.0)
    calls = _shipped_calls(shipped)
    # the device function stays a Triton function (a compiled kernel can call nothing else);
    # the template kernel that calls it is recorded, launch by launch
    assert type(mod.row_unit).__name__ in ("JITFunction", "InterpretedFunction")
    assert isinstance(mod.normalise_kernel, kernel_side._Recorder)
    assert "row_unit" not in calls and len(calls["normalise_kernel"]) == 1
    assert [p for p, _ in calls["normalise_kernel"][0]["mutated"]] == [[0, 1]]
    assert [p for p, _ in calls["square_kernel"][0]["mutated"]] == [[0, 1]]
    assert [p for p, _ in calls["clamp_"][0]["mutated"]] == [[0, 0]]

    # the verifier: the same template code (a fresh copy), with stand-ins that return what
    # was recorded
    mod = _import_file(src, "tiny_triton_answers_verify")
    monkeypatch.setitem(kernel_side._state, "mode", "verify")
    monkeypatch.setitem(kernel_side._state, "device", {})
    monkeypatch.setitem(kernel_side._state, "replays", {})
    monkeypatch.setitem(kernel_side._state, "inputs", {"calls": calls, "exports": {
        "2.1/row_unit": {"kind": "function"}, "2.2/square_kernel": {"kind": "function"},
        "2.3/clamp_": {"kind": "function"}}})
    for ex, name in (("2.1", "row_unit"), ("2.2", "square_kernel"), ("2.3", "clamp_")):
        kernel_side.bind(ex, [name], vars(mod))
    assert isinstance(mod.row_unit, kernel_side._Replay)
    assert isinstance(mod.normalise_kernel, kernel_side._Replay)  # the verifier decides alone
    assert torch.equal(mod.normalise_rows(x.clone()), rows)
    out2 = torch.full((20,), float("nan"), device=dev)
    mod.square_kernel[(2,)](xs.clone(), out2, 20, BLOCK=16)
    assert torch.equal(out2, xs * xs)
    t2 = torch.full((6,), -1.0, device=dev)  # not the recorded input
    with pytest.raises(kernel_side.Mismatch, match="inputs differ"):
        mod.clamp_(t2, 0.0)
    # the recorded calls are used up, or called the wrong way
    with pytest.raises(Exception, match="more often"):
        mod.normalise_rows(x)
    with pytest.raises(kernel_side.Mismatch, match="more often"):
        mod.square_kernel[(2,)](xs, out2, 20, BLOCK=16)
    kernel_side.bind("2.2", ["square_kernel"], vars(mod))
    with pytest.raises(kernel_side.Mismatch, match="launched as a kernel"):
        mod.square_kernel(xs, out2, 20, BLOCK=16)


def test_check_statements_are_guarded_so_later_checks_still_run():
    src = H.CHECKS["1.2"]
    guarded = instrument.guard_check(src, "1.2")
    assert guarded.count("except Exception") == 2 and "verify_call" not in guarded
    verify, _ = instrument.rewrite_check(src, "1.2")
    assert verify.count("__course_grade__.stopped('1.2', ") == 2
    # a check call inside a function or another check is not guarded: its error must reach
    # whatever called it
    nested = "def f():\n    check_equal(1, 2)\ncheck_raises(lambda: check_equal(1, 2), AssertionError)"
    assert instrument.guard_check(nested, "1.1").count("except Exception") == 1


def test_names_only_the_hidden_tests_bind_are_gone_when_the_check_cell_ends():
    # a later answer could otherwise read the hidden tests' helpers, inputs and results and
    # print them through a visible check's message into its feedback
    src = ("x = 3\ncheck_equal(x, 3)\n"
           "### BEGIN HIDDEN TESTS\n"
           "secret = [41]\n"
           "def helper():\n    return secret[0] + 1\n"
           "check_equal(helper(), 42)\n"
           "x = 4\n"
           "for kept in range(2):\n    pass\n"
           "### END HIDDEN TESTS\n")
    calls = []
    for cell in (instrument.guard_check(src, "1.1"), instrument.rewrite_check(src, "1.1")[0]):
        ns = {"check_equal": lambda a, b: calls.append(a == b),
              "__course_grade__": SimpleNamespace(
                  verify_call=lambda ex, site, fn, *a, **k: fn(*a, **k),
                  stopped=lambda *a: None)}
        exec(compile(cell, "<check>", "exec"), ns)
        # what the visible part binds stays: the exercise notebook, without hidden tests,
        # binds it too (and a later cell may read it)
        assert ns["x"] == 4
        assert not {"secret", "helper", "kept"} & set(ns), sorted(ns)
    assert calls == [True, True, True, True]


# ------------------------------------------------------------------ re-runs and crashes
def test_rerun_same_scores_crash_isolation_and_resume(tiny, tmp_path, monkeypatch):
    subs = tmp_path / "subs"
    expected = H.make_class(tiny, subs, names={"honest", "partial", "rng_user"})
    # the scores these submissions must get (the adversarial class checks them beside
    # the others); a crash and a resumed run must come back to exactly these
    first = {name: sum(points.values()) for name, (points, _) in expected.items()}
    assert first == {"honest": 4, "partial": 3, "rng_user": 4}

    real = grader.grade_run

    def crash_on_partial(tpl, ref, sub, *a, **k):
        if sub.student == "partial":
            raise RecursionError("simulated crash while grading")
        return real(tpl, ref, sub, *a, **k)

    out = tmp_path / "b"
    monkeypatch.setattr(grader, "grade_run", crash_on_partial)
    second = grader.grade(H.NAME, subs, out, workers=2, cell_timeout=CELL_TIMEOUT, timeout=120,
                          root=tiny)
    assert second.scores() == {"honest": 4, "partial": 0, "rng_user": 4}
    assert second.students["partial"]["status"] == "error"
    assert "simulated crash" in (out / "feedback" / "partial.md").read_text()
    monkeypatch.setattr(grader, "grade_run", real)

    # resume: the two graded students are kept, only the crashed one runs again
    said = []
    third = grader.grade(H.NAME, subs, out, workers=2, cell_timeout=CELL_TIMEOUT, timeout=120,
                         root=tiny, resume=True, progress=said.append)
    assert third.scores() == first
    assert sum("kept earlier result" in s for s in said) == 2


# The real problem sets are graded in tests/test_wrong_answers.py: each solution must score
# full marks, each generated exercise zero, and every listed wrong answer zero.


# ------------------------------------------------------------------ the template rewrite
def test_verifier_notebook_holds_no_student_code(tiny):
    tpl = grader.load_template(H.NAME, root=tiny)
    nb, roles = instrument.build(tpl.nb, tpl.exercises, "verify", nonce="n")
    src = "\n".join(c.source for c in nb.cells)
    assert "return 2 * x" not in src and "6 * 7" not in src
    assert "bind('1.2', ['double'], globals())" in src
    assert ("verify_call('1.2', 0, check_close, run_answer(double, x, forbid=('autograd',), "
            "exercise='1.2'), x + x, name='double')") in src
    assert "end_check('1.2')" in src
    e = next(x for x in tpl.exercises if x.id == "1.2")
    _, sites = instrument.rewrite_check(tpl.nb.cells[e.check_index].source, "1.2")
    assert [s[2] for s in sites] == [False, True]  # the second call is a hidden test
    assert ("bind", "1.1") in roles and ("check", "1.3") in roles


def test_student_notebook_takes_only_answer_sources(tiny):
    tpl = grader.load_template(H.NAME, root=tiny)
    answers = {"1.1": "# NBVAL_SKIP\nanswer_1_1 = 1"}
    nb, roles = instrument.build(tpl.nb, tpl.exercises, "student", answers, nonce="n")
    srcs = [c.source for c in nb.cells]
    assert "NBVAL_SKIP" not in "\n".join(srcs)
    assert any("answer_1_1 = 1" in s for s in srcs)
    # a missing answer becomes the exercise stub
    assert any("raise NotImplementedError('Exercise 1.2" in s for s in srcs)
    assert any("export('1.3', ['safe_div'], globals()" in s for s in srcs)
    # what the template's later cells read is put back if an answer cell rebinds it:
    # after 1.2's answer, its check's run_answer and check_close
    exp12 = next(s for s in srcs if "export('1.2'" in s)
    assert "protect=" in exp12 and "'run_answer'" in exp12 and "'check_close'" in exp12
    assert all(not c.get("outputs") and not c.metadata.get("tags") for c in nb.cells)
    assert roles[0] == ("setup", None) and ("check", "1.3") in roles


def test_answer_names():
    assert instrument.answer_names(H.ANSWERS["1.3"]) == ["safe_div"]
    assert instrument.answer_names("a, (b, c) = 1, (2, 3)\nfor i in range(2):\n    pass\n"
                                   "import math\nsq = [j for j in range(3)]") == ["a", "b", "c", "i", "sq"]
    with pytest.raises(instrument.TemplateError, match="defines no name"):
        instrument.answer_names("print(1)")


def test_expected_values_computed_apart_are_flagged():
    src = ("# Check 2.1\nq = torch.randn(3)\nref = q.softmax(0)\n"
           "check_close(my_softmax(q), ref, name='softmax')\n"
           "check_close(my_softmax(q), q.softmax(0))")
    assert instrument.exposed_names(src) == ["ref"]
    assert instrument.exposed_names(H.CHECKS["1.2"]) == []


@pytest.mark.parametrize("src, words", [
    ("# Check 1.1\nassert answer_1_1 == 42", "calls no check function"),
    ("# Check 1.1\ncheck_equal(answer_1_1,", "not valid Python"),
])
def test_ungradable_check_cells_are_refused(src, words):
    with pytest.raises(instrument.TemplateError, match=words):
        instrument.rewrite_check(src, "1.1")


def test_template_lookup_errors(tiny):
    with pytest.raises(grader.GradingError, match="no single problem set"):
        grader.load_template("99_nothing", root=tiny)
    with pytest.raises(grader.GradingError, match="assignment"):
        grader.load_template(None)
    assert grader.load_template("01", root=tiny).name == H.NAME
    assert grader.load_template(tiny / "solutions" / f"{H.NAME}.ipynb").max_points == 4


@pytest.mark.parametrize("kw, words", [
    ({"workers": 0}, "workers"), ({"workers": 1.5}, "workers"),
    ({"cell_timeout": -1}, "cell_timeout"), ({"timeout": "10"}, "timeout"),
])
def test_grade_rejects_bad_arguments(tiny, tmp_path, kw, words):
    sub = H.write_submission(tmp_path, "x", H.exercise_nb(tiny))
    with pytest.raises(grader.GradingError, match=words):
        grader.grade(H.NAME, sub, tmp_path / "out", root=tiny, **kw)
    with pytest.raises(grader.GradingError, match="submissions"):
        grader.grade(H.NAME, tmp_path / "nope", tmp_path / "out", root=tiny)


def test_output_folder_must_not_hold_submissions(tiny, tmp_path):
    H.write_submission(tmp_path, "x", H.exercise_nb(tiny))
    with pytest.raises(grader.GradingError, match="out_dir"):
        grader.grade(H.NAME, tmp_path, tmp_path / "out", root=tiny)


def test_names_that_meet_cost_no_student_their_grade(tiny, tmp_path):
    """A class whose names meet (a notebook and a nbgrader folder of one name; names that
    differ only in what a file name cannot hold) or hold control characters is graded
    whole: every submission gets its own result files, and nothing a name holds reaches
    the console, the notes or the table raw."""
    subs = tmp_path / "subs"
    subs.mkdir()
    H.write_submission(subs, "ann", H.exercise_nb(tiny))
    (subs / "ann" / H.NAME).mkdir(parents=True)
    H.write_submission(subs / "ann" / H.NAME, H.NAME, H.exercise_nb(tiny))
    H.write_submission(subs, "bo", H.exercise_nb(tiny))
    H.write_submission(subs, "bo ", H.exercise_nb(tiny))            # safe name "bo" too
    H.write_submission(subs, "cy\x1b[2J\nscore 9", H.exercise_nb(tiny))
    (subs / "notes\x1b[31m.txt").write_text("x")
    said = []
    res = grader.grade(H.NAME, subs, tmp_path / "out", root=tiny, progress=said.append)
    assert set(res.students) == {"ann", "ann (folder)", "bo", "bo ", "cy\x1b[2J\nscore 9"}
    assert all(r["status"] == "graded" for r in res.students.values())
    feedback = sorted(p.name for p in (tmp_path / "out" / "feedback").iterdir())
    assert len(feedback) == 5 and "bo.md" in feedback, feedback
    assert any("a notebook and a folder of that name" in n for n in res.notes), res.notes
    assert any("is another student's" in n for n in res.notes), res.notes
    shown = "\n".join(said + res.notes)
    assert "\x1b" not in shown and "cy\\x1b[2J\\x0ascore 9" in shown, shown
    table = (tmp_path / "out" / "scores.csv").read_text()
    assert "\x1b" not in table and len(table.splitlines()) == 6, table
    (tmp_path / "file").write_text("x")
    with pytest.raises(grader.GradingError, match="out_dir"):
        grader.grade(H.NAME, subs, tmp_path / "file", root=tiny)


def test_output_names_stay_apart():
    names = submissions.output_names(["bo", "bo ", " bo", "bo?", "a/b", "a_b"])
    assert len(set(names.values())) == 6 and names["bo"] == "bo" and names["a_b"] == "a_b"
    assert names == submissions.output_names(["bo?", " bo", "bo", "bo ", "a_b", "a/b"])
    assert submissions.printable("x\x1b[2J\n\u202e\\y") == "x\\x1b[2J\\x0a\\u202e\\\\y"


# ------------------------------------------------------------------ stand-ins in the verifier
def _bound(exports, calls):
    kernel_side._state["inputs"] = {"exports": exports, "calls": calls}
    ns = {}
    kernel_side.bind("1.2", ["f", "v", "gone"], ns)
    return ns


def test_verifier_stand_ins_return_recorded_results_for_matching_inputs():
    x = torch.arange(3.0)
    calls = {"f": [{"args": [x], "kwargs": {}, "outcome": {"returned": x * 2}},
                   {"args": [1, 0], "kwargs": {}, "outcome": {
                       "raised": ["builtins:ValueError", "builtins:Exception"], "message": "zero"}}]}
    ns = _bound({"1.2/f": {"kind": "function"}, "1.2/v": {"kind": "data", "value": 42},
                 "1.2/gone": {"kind": "missing"}}, calls)
    assert ns["v"] == 42 and "gone" not in ns
    assert torch.equal(ns["f"](torch.arange(3.0)), x * 2)
    with pytest.raises(ValueError, match="zero"):
        ns["f"](1, 0)
    with pytest.raises(kernel_side.Mismatch, match="more often"):
        ns["f"](1, 0)
    ns = _bound({"1.2/f": {"kind": "function"}}, calls)
    with pytest.raises(kernel_side.Mismatch, match="inputs differ"):
        ns["f"](torch.arange(3.0) + 1)
    ns = _bound({"1.2/f": {"kind": "function"}}, {"f": [{"args": [1], "kwargs": {}, "outcome": {
        "raised": ["__main__:MyError", "builtins:KeyError", "builtins:Exception"],
        "message": "m"}}]})
    with pytest.raises(KeyError):
        ns["f"](1)


def test_verify_call_ships_the_real_verdict(monkeypatch):
    shipped = []
    monkeypatch.setattr(kernel_side, "_publish", lambda kind, key, p: shipped.append((key, p)))
    kernel_side._state["hits"] = {}
    kernel_side.verify_call("1.1", 0, check_equal, 42, 42, name="n", quiet=True)
    with pytest.raises(AssertionError):
        kernel_side.verify_call("1.1", 0, check_equal, 41, 42, name="n", quiet=True)
    assert [k for k, _ in shipped] == ["1.1/c0/0", "1.1/c0/1"]
    assert shipped[0][1]["passed"] and not shipped[1][1]["passed"]
    assert "is 41, expected 42" in shipped[1][1]["message"]


def test_recorded_errors_map_only_to_known_exception_classes():
    assert codec.exception_class("builtins:ValueError") is ValueError
    import course_utils.checks
    assert codec.exception_class("course_utils.checks:CheckFailed") is \
        course_utils.checks.CheckFailed
    for name in ("os:system", "subprocess:run", "builtins:print", "builtins:exec",
                 "course_utils.grading.runner:write_atomic", "course_utils.nothing:X",
                 "torch.utils.model_dump.__main__:main", "builtins:ValueError:x", 7):
        assert codec.exception_class(name) is None, name
    assert "torch.utils.model_dump.__main__" not in sys.modules


# ------------------------------------------------------------------ data, never code
class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_blobs_cannot_carry_code():
    import base64
    evil = base64.b64encode(pickle.dumps({"__tensor__": _Boom()}, protocol=2)).decode()
    with pytest.raises(codec.CodecError, match="unreadable"):
        codec.loads(evil)
    with pytest.raises(codec.CodecError):
        codec.decode({"__weird__": 1})
    with pytest.raises(codec.CodecError, match="over the"):
        codec.loads("A" * 100, max_bytes=10)


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                  st.floats(allow_nan=False), st.text(max_size=8))
_tree = st.recursive(_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.tuples(kids, kids),
    st.dictionaries(st.text(max_size=4), kids, max_size=3)), max_leaves=8)


@settings(max_examples=20, deadline=None)
@given(_tree)
def test_codec_round_trip(value):
    assert codec.decode(codec.loads(codec.dumps(value))) == value


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=0, max_size=3),
       st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]))
def test_codec_round_trip_tensors(shape, dtype):
    t = (torch.rand(shape) * 5).to(dtype)
    back = codec.decode(codec.loads(codec.dumps({"t": t, "dt": dtype, "size": t.shape})))
    assert torch.equal(back["t"], t) and back["t"].dtype == dtype
    assert back["dt"] == dtype and back["size"] == tuple(shape)


def test_codec_tensors_travel_on_the_cpu_and_go_back_to_their_device():
    # a result recorded on the GPU comes back there in the checking kernel (autograd
    # refuses a gradient on another device than its input); a "meta" tensor stands in
    # for a GPU one here
    t = torch.arange(6.0).reshape(2, 3)
    enc = codec.encode(t)
    assert set(enc) == {"__tensor__"}           # a CPU tensor carries no device
    enc["__on__"] = "meta"
    back = codec.decode(enc)
    assert back.device.type == "cpu" and torch.equal(back, t)   # decoding builds CPU data only
    assert codec.materialise(back).device.type == "meta"
    assert codec.materialise([back])[0].device.type == "meta"
    # the grader decodes the student's records and encodes them again for the checking kernel
    again = codec.decode(codec.loads(codec.dumps({"r": back})))["r"]
    assert codec.materialise(again).device.type == "meta"
    enc["__on__"] = "evil(device)"
    assert codec.materialise(codec.decode(enc)).device.type == "cpu"


def test_grader_skip_cells_are_left_out_of_every_graded_notebook(tiny):
    tpl = grader.load_template(H.NAME, root=tiny)
    nb = copy.deepcopy(tpl.nb)
    nb.cells.append(nbformat.v4.new_code_cell("# GRADER_SKIP (timings)\ntimed = sum(range(9))"))
    for mode in ("reference", "student", "verify"):
        built, roles = instrument.build(nb, tpl.exercises, mode, {}, nonce="n")
        assert not any("timed = " in c.source for c in built.cells), mode
        assert len(built.cells) == len(roles)
    nb.cells[-1].source = "# an ordinary cell\ntimed = sum(range(9))"
    built, _ = instrument.build(nb, tpl.exercises, "verify", nonce="n")
    assert any("timed = " in c.source for c in built.cells)


def test_codec_flattens_hostile_values():
    class Always(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__

    class Sub(torch.Tensor):
        pass

    v = codec.decode(codec.loads(codec.dumps([Always(3), torch.zeros(2).as_subclass(Sub), object()])))
    assert type(v[0]) is int and v[0] == 3 and v[0] != 4
    assert type(v[1]) is torch.Tensor
    assert isinstance(v[2], codec.Unserializable) and v[2] != v[2]


def test_records_of_course_classes_with_foreign_fields_decode_as_ungradable():
    from course_utils.attention import AttentionState
    state = AttentionState(torch.zeros(2), torch.ones(2), torch.zeros(2, 3))
    tree = codec.encode(state)
    back = codec.materialise(codec.decode(tree))
    assert isinstance(back, AttentionState) and torch.equal(back.l, state.l)
    tree["fields"] = ["m", "l", "evil"]
    bad = codec.materialise(codec.decode(tree))
    assert isinstance(bad, codec.Unserializable) and "AttentionState" in bad.what


def test_runner_starts_the_kernel_again_when_it_dies_before_answering(tmp_path, monkeypatch):
    from course_utils.grading import runner
    tries = []

    def flaky(nb, result_path, *args):
        tries.append(result_path)
        if len(tries) < runner.START_TRIES:
            raise runner._StartFailed("Kernel died before replying to kernel_info")
        return {"outcome": "completed", "cells": []}

    path = tmp_path / "n.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("pass")]), path)
    monkeypatch.setattr(runner, "_run_once", flaky)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    assert runner.run(path, tmp_path / "r.json", tmp_path)["outcome"] == "completed"
    assert len(tries) == runner.START_TRIES and not path.exists()

    def dead(nb, result_path, *args):
        try:
            raise OSError("no such kernel")
        except OSError as e:
            raise runner._StartFailed(str(e)) from e

    nbformat.write(nbformat.v4.new_notebook(), path)
    monkeypatch.setattr(runner, "_run_once", dead)
    with pytest.raises(RuntimeError, match="did not start .* no such kernel"):
        runner.run(path, tmp_path / "r.json", tmp_path)


def test_kernel_and_runner_agree_on_the_record_type():
    text = (ROOT / "course_utils" / "grading" / "runner.py").read_text()
    assert f'MIME = "{kernel_side.MIME}"' in text


# ------------------------------------------------------------------ finding submissions
def test_discover_layouts(tiny, tmp_path):
    nb = H.exercise_nb(tiny)
    flat = tmp_path / "flat"
    flat.mkdir()
    H.write_submission(flat, "ann", nb)
    H.write_submission(flat, "bo", nb)
    (flat / "notes.txt").write_text("x")
    found, notes = submissions.discover(flat, H.NAME)
    assert [s for s, _ in found] == ["ann", "bo"] and "notes.txt" in notes[0]

    tree = tmp_path / "course" / "submitted"
    for student in ("cy", "di"):
        d = tree / student / H.NAME
        d.mkdir(parents=True)
        H.write_submission(d, H.NAME, nb)
    (tree / "eve" / "other").mkdir(parents=True)
    (tree / "eve" / "wrong").mkdir(parents=True)
    found, notes = submissions.discover(tmp_path / "course", H.NAME)
    assert [(s, p.name if p else None) for s, p in found] == [
        ("cy", f"{H.NAME}.ipynb"), ("di", f"{H.NAME}.ipynb"), ("eve", None)]
    assert any("eve" in n for n in notes)

    one, _ = submissions.discover(flat / "ann.ipynb", H.NAME)
    assert one == [("ann", flat / "ann.ipynb")]
    with pytest.raises(FileNotFoundError):
        submissions.discover(tmp_path / "missing", H.NAME)


def test_reading_a_submission_reports_problems(tiny, tmp_path):
    tpl = grader.load_template(H.NAME, root=tiny)
    nb = H.fill(H.exercise_nb(tiny), H.GOOD)
    path = H.write_submission(tmp_path, "s", nb)
    sub = submissions.read("s", path, tpl.exercises)
    assert set(sub.answers) == {"1.1", "1.2", "1.3"} and not sub.problems and not sub.notes
    path.write_bytes(b"\xff\xfe not text")
    assert "UTF-8" in submissions.read("s", path, tpl.exercises).invalid
    assert submissions.safe_name("../../etc/passwd") == "etc_passwd"
    # a lone surrogate (a JSON escape, not text a kernel's messages can carry) in one answer:
    # that answer runs with U+FFFD in its place, and the submission is still graded
    text = json.dumps(nb).replace("return x * 2", "return x * 2  # \\ud800", 1)
    path.write_text(text, encoding="ascii")
    sub = submissions.read("s", path, tpl.exercises)
    assert sub.invalid is None and set(sub.answers) == {"1.1", "1.2", "1.3"}
    assert "\ufffd" in sub.answers["1.2"] and "\ud800" not in sub.answers["1.2"]
    assert any("1.2" in n and "U+FFFD" in n for n in sub.notes), sub.notes


def test_invalid_class_needs_no_kernel(tiny, tmp_path):
    # only unreadable files: graded without starting the official solution at all
    subs = tmp_path / "subs"
    H.make_class(tiny, subs, names={"not_a_notebook", "invalid_json"})
    said = []
    res = grader.grade(H.NAME, subs, tmp_path / "out", root=tiny, progress=said.append)
    assert res.scores() == {"invalid_json": 0, "not_a_notebook": 0}
    assert not any("official solution" in s for s in said)


def test_cli(tiny, tmp_path, capsys):
    assert cli_main(["99_nothing", str(tmp_path), "-o", str(tmp_path / "o")]) == 2
    assert "no single problem set" in capsys.readouterr().err
    subs = tmp_path / "subs"
    H.make_class(tiny, subs, names={"invalid_json"})
    sol = tiny / "solutions" / f"{H.NAME}.ipynb"
    assert cli_main([str(sol), str(subs), "-o", str(tmp_path / "o"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "graded 1 submission(s)" in out and "1 not gradable" in out
    r = subprocess.run([sys.executable, "-m", "course_utils.grading", "--help"], cwd=ROOT,
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=_pythonpath(ROOT)))
    assert r.returncode == 0 and "nbgrader" in r.stdout


# ------------------------------------------------------------------ the decoder builds data only
def test_decoder_never_imports_or_calls_what_a_record_names(tmp_path):
    target = tmp_path / "pwned.py"
    tricks = [
        {"__dataclass__": "course_utils.grading.runner:write_atomic", "fields": ["path", "text"],
         "values": [str(target), "import sys; sys.exit(3)"]},
        {"__dataclass__": "torch.utils.model_dump.__main__:main", "fields": [], "values": []},
        {"__namedtuple__": "builtins:exec", "fields": ["src"], "values": ["raise SystemExit"]},
        {"__type__": "torch.utils.model_dump.__main__:main"},
        {"__func__": "os:system"},
    ]
    before = set(sys.modules)
    out = codec.decode(tricks)
    assert not target.exists() and set(sys.modules) == before
    # dataclass records stay inert data; only the course's own dataclasses, from modules
    # already imported, are ever built from them (never the grader's, never a function)
    assert isinstance(out[0], codec.Record) and isinstance(out[1], codec.Record)
    assert isinstance(codec.materialise(out[0]), codec.Unserializable)
    assert isinstance(codec.materialise(out[1]), codec.Unserializable)
    assert not target.exists() and set(sys.modules) == before
    from course_utils.hopper import schedule_sim as sim
    op = sim.Arrive("k_empty[0]")
    back = codec.decode(codec.loads(codec.dumps(op)))
    assert isinstance(back, codec.Record) and codec.materialise(back) == op
    assert out[2] == ("raise SystemExit",)
    assert out[3] == codec.Named("type", "torch.utils.model_dump.__main__:main")
    assert out[4] == codec.Named("function", "os:system")
    for bad in ({"__dtype__": "Tensor"}, {"__device__": "cpu; rm -rf"}, {"__set__": [[1]]},
                {"__dict__": [[[1], 2]]}, {"__tensor__": "x"}, {1: 2}):
        with pytest.raises(codec.CodecError):
            codec.decode(bad)


def test_deep_nesting_is_a_codec_error_not_a_crash():
    deep = []
    for _ in range(50_000):
        deep = [deep]
    with pytest.raises(codec.CodecError):
        codec.decode(deep)
    import base64
    blob = base64.b64encode(b"\x80\x02" + b"]" * 200_000).decode()
    with pytest.raises(codec.CodecError):
        codec.loads(blob)


def test_submissions_are_read_without_following_links(tiny, tmp_path):
    tpl = grader.load_template(H.NAME, root=tiny)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "linked.ipynb").symlink_to(tiny / "solutions" / f"{H.NAME}.ipynb")
    found, _ = submissions.discover(subs, H.NAME)
    assert [s for s, _ in found] == ["linked"]
    sub = submissions.read("linked", subs / "linked.ipynb", tpl.exercises, subs)
    assert "symbolic link" in sub.invalid and not sub.answers
    # a student folder that is a link (nbgrader layout) is not entered
    tree = tmp_path / "submitted"
    tree.mkdir()
    (tree / "eve").symlink_to(tiny / "solutions", target_is_directory=True)
    assert submissions.discover(tree, H.NAME)[0] == []
    # a file that resolves outside the folder through a linked parent
    (subs / "dir").symlink_to(tiny / "solutions", target_is_directory=True)
    with pytest.raises(OSError, match="link"):
        submissions.open_no_follow(subs / "dir" / f"{H.NAME}.ipynb", subs)
    fifo = subs / "fifo.ipynb"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="regular"):
        submissions.open_no_follow(fifo, subs)
    (subs / "deep.ipynb").write_bytes(b"[" * 200_000 + b"]" * 200_000)
    assert "nested too deeply" in submissions.read("deep", subs / "deep.ipynb", tpl.exercises,
                                                   subs).invalid


@pytest.mark.parametrize("value, shown", [
    ("=1+2", "'=1+2"), ("+SUM(A1)", "'+SUM(A1)"), ("-2+3", "'-2+3"), ("@cmd", "'@cmd"),
    ("\t=1", "\\x09=1"), ("\r=1", "\\x0d=1"), ("alice", "alice"), (3, 3)])
def test_score_cells_are_escaped(value, shown):
    assert grader.csv_cell(value) == shown


def test_decoder_refuses_tensors_that_would_grow_when_copied():
    """A record of a few bytes holding a tensor expanded to billions of elements, or many
    views of one storage, is refused before anything is copied; the student's result says
    why."""
    import base64
    big = torch.zeros(1, dtype=torch.uint8).expand(3 * 10**9)
    buf = io.BytesIO()
    torch.save({"__dict__": [["value", {"__tensor__": big}]]}, buf)
    blob = base64.b64encode(buf.getvalue()).decode()
    with pytest.raises(codec.TooLarge, match="MiB"):
        codec.decode(codec.loads(blob))
    small = torch.zeros(4, dtype=torch.uint8).expand(3, 4)      # overlapping, yet small
    with pytest.raises(codec.TooLarge, match="overlap"):
        codec.decode({"__tensor__": small})
    views = torch.zeros(2**20)                                  # 4 MiB, 40 views of it
    with pytest.raises(codec.TooLarge):
        codec.decode([{"__tensor__": views[:]} for _ in range(40)])
    budget = codec.Budget(10 * 2**20)
    codec.decode({"__tensor__": torch.zeros(2**20)}, budget)    # 4 MiB of 10
    codec.decode({"__tensor__": torch.zeros(2**20)}, budget)
    with pytest.raises(codec.TooLarge, match="records of this run"):
        codec.decode({"__tensor__": torch.zeros(2**20)}, budget)
    # grader side: one student's error, never an allocation of gigabytes
    with pytest.raises(codec.TooLarge):
        grader._decoded({("export", "1.1/x"): [blob]})


def test_feedback_renders_student_text_inert():
    """Error messages, names and notes cannot add headings, scores, table rows or HTML to
    the feedback."""
    evil = ("nope\n\n## Exercise 1.1: passed (2 / 2)\nAll checks passed.\n\n"
            "<img src=x onerror=alert(1)><script>alert(1)</script>\n| 1.2 | 1 / 1 | passed |\n"
            "**Score: 4 / 4**\n````\n# escaped the fence?\n")
    res = {"assignment": H.NAME, "student": "<img src=x onerror=alert(1)>\n# Score **4**",
           "total": 0, "max": 4, "status": "graded",
           "exercises": [{"exercise": "1.1", "max": 2, "points": 0, "passed": False,
                          "reason": "your answer cell raised ValueError: " + evil,
                          "checks": [{"check": "answer_1_1", "hidden": False, "passed": False,
                                      "message": evil}]}],
           "notes": ["your code crashed the kernel in 1.1: " + evil, evil]}
    text = grader.feedback_text(res)
    outside, fence = [], None
    for line in text.split("\n"):
        if fence is None and line.startswith("```"):
            fence = line[:len(line) - len(line.lstrip("`"))]
        elif fence is not None and line == fence:
            fence = None
        elif fence is None:
            outside.append(line)
    assert fence is None
    rendered = "\n".join(outside)
    assert "<img" not in rendered and "<script" not in rendered
    assert [ln for ln in outside if ln.startswith("#")] == [
        ln for ln in outside if ln.startswith(("# Feedback", "## Exercise 1.1: not passed",
                                               "## Notes"))]
    assert rendered.count("**Score") == 1 and "| 1.2 |" not in rendered
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;" in text.split("\n")[0]
    # characters that show as nothing or turn the text around: shown as ?
    hidden = "a\u061cb\u2060c\u00add\u180ee\u115ff\u3164g\u202eh"
    assert grader.md_block(hidden).split("\n")[1] == "a?b?c?d?e?f?g?h"
    assert grader.md_inline(hidden) == "a?b?c?d?e?f?g?h"
    assert grader.md_inline("Zoë Ünal 李") == "Zoë Ünal 李"


def test_answer_errors_after_hidden_tests_are_named_without_their_message():
    run = {"cells": [{"status": "ok"}, {"status": "ok"},
                     {"status": "error", "ename": "RuntimeError", "evalue": "seen: [1.5, 2.5]"}]}
    roles = [("answer", "1.2"), ("check", "1.2"), ("answer", "1.3")]
    shown = grader._cell_story(run, roles, "1.3", "answer", after=None)
    assert "seen: [1.5, 2.5]" in shown
    hidden = grader._cell_story(run, roles, "1.3", "answer", after=1)
    assert "RuntimeError" in hidden and "1.5" not in hidden


def test_hard_linked_submissions_are_refused(tiny, tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    outside = tmp_path / "solution.ipynb"
    shutil.copyfile(tiny / "solutions" / f"{H.NAME}.ipynb", outside)
    os.link(outside, subs / "linked.ipynb")
    sub = submissions.read("linked", subs / "linked.ipynb", [], subs)
    assert sub.invalid and "hard links" in sub.invalid


@pytest.mark.skipif(not ISOLATION.landlock, reason="needs Landlock")
def test_runs_without_namespaces_never_overlap(tiny, tmp_path):
    """Without namespaces every kernel shares the machine's sockets: only one run of a
    grading process is alive at a time."""
    import threading
    iso = sandbox.detect("landlock")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spans = []
    probe = "import time; print('t0', time.time()); time.sleep(1.5); print('t1', time.time())"
    with sandbox.Sandbox(scratch, [ROOT, tiny], iso) as box:
        def one(i):
            job = scratch / "jobs" / str(i)
            (job / "work").mkdir(parents=True)
            box.run(job, ["-c", probe], job / "work", job / "log", 60)
            said = _said(job / "log")
            spans.append((float(said["t0"]), float(said["t1"])))
        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0, spans
    assert "one run at a time" in iso.describe()


# ------------------------------------------------------------------ the sandbox
SANDBOX_PROBE = r"""
import os, subprocess, sys
def can_read(p):
    try:
        open(p).read(1)
        return True
    except OSError:
        return False
print("solutions", can_read(sys.argv[1]))
print("home", os.environ["HOME"].startswith(sys.argv[2]))
print("ipythondir", os.environ["IPYTHONDIR"].startswith(sys.argv[2]))
print("stage", __import__("course_utils").__file__.startswith(
    os.environ["PYTHONPATH"].split(os.pathsep)[0]))
# compiled before the run (not imported yet here): a kernel does not compile it again
import importlib.util
checks = importlib.util.find_spec("course_utils.checks").origin
print("compiled", os.path.exists(importlib.util.cache_from_source(checks)))
daemon = [sys.executable, "-c", "import time; time.sleep(300)", sys.argv[3]]
subprocess.Popen(["setsid"] + daemon, start_new_session=True)
subprocess.Popen(["env", "-i", "setsid"] + daemon, start_new_session=True)
"""

def _said(log: Path) -> dict:
    """``{name: value}`` of a probe's ``name value`` lines."""
    return dict(line.split(" ", 1) for line in log.read_text().split("\n")
                if line.count(" ") == 1)


WRITE_PROBE = r"""
import os, sys
def can_write(folder):
    probe = os.path.join(folder, "course-grade-write-probe")
    try:
        with open(probe, "w") as f:
            f.write("x")
    except OSError:
        return False
    os.unlink(probe)
    return True
for name, folder in zip(sys.argv[1::2], sys.argv[2::2]):
    print(name, can_write(folder))
"""


@pytest.mark.skipif(not ISOLATION.namespaces, reason="needs the namespaces")
@pytest.mark.parametrize("warm", ["1", "0"], ids=["warm", "fresh"])
def test_the_namespaces_alone_leave_only_the_run_writable(warm, tiny, tmp_path, monkeypatch):
    """With Landlock off, as on a GPU machine (CUDA does not start under it), the
    namespaces alone must keep a run from writing anywhere but its own folder and its
    private /tmp: not into the Python installation (whose etc/ipython every later kernel
    reads), not into /etc, not into a folder outside every hidden path."""
    monkeypatch.setenv("COURSE_GRADE_ASSUME_GPU", "1")      # what detect() does on a GPU
    monkeypatch.setenv("COURSE_GRADE_WARM", warm)
    iso = sandbox.detect("namespaces")
    assert iso.namespaces and not iso.landlock
    outside = Path(tempfile.mkdtemp(prefix="course-grade-test-", dir="/var/tmp"))
    try:
        places = {"outside": outside, "prefix": Path(sys.prefix), "etc": Path("/etc")}
        # only what this user could write to without the sandbox proves anything
        places = {k: v for k, v in places.items() if os.access(v, os.W_OK)}
        assert "outside" in places
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        with sandbox.Sandbox(scratch, [ROOT, tiny], iso) as box:
            job = scratch / "jobs" / "a"
            (job / "work").mkdir(parents=True)
            args = ["job", str(job / "work"), "tmp", "/tmp"]
            for name, folder in places.items():
                args += [name, str(folder)]
            assert box.run(job, ["-c", WRITE_PROBE, *args], job / "work", job / "log", 120)
            said = _said(job / "log")
        assert said == {"job": "True", "tmp": "True", **{k: "False" for k in places}}, said
        assert list(outside.iterdir()) == []
    finally:
        shutil.rmtree(outside, ignore_errors=True)


LEVELS = [lvl for lvl, ok in (("namespaces", ISOLATION.namespaces),
                              ("landlock", ISOLATION.landlock > 0), ("limits", True)) if ok]


@pytest.mark.parametrize("level", LEVELS)
def test_sandbox_levels(level, tiny, tmp_path):
    iso = sandbox.detect(level)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    box = sandbox.Sandbox(scratch, [ROOT, tiny], iso, memory_mb=8192)
    job = scratch / "jobs" / "a"
    (job / "work").mkdir(parents=True)
    secret = tiny / "solutions" / f"{H.NAME}.ipynb"
    token = "course-grade-test-" + os.urandom(6).hex()
    assert box.run(job, ["-c", SANDBOX_PROBE, str(secret), str(job), token], job / "work",
                   job / "log", 120)
    said = _said(job / "log")
    assert said["home"] == said["ipythondir"] == said["stage"] == said["compiled"] == "True", said
    # what each level promises, and the fallback says what it does not
    assert said["solutions"] == ("True" if level == "limits" else "False")
    left = _alive(token)
    for pid in left:
        os.kill(pid, 9)
    # the pid namespace, or else the run's supervisor (a child subreaper), took both
    # daemons, the one that cleared its environment too
    assert not left


HARDEN_PROBE = r"""
import os, sys, time
print("uts", os.readlink("/proc/self/ns/uts"))
print("ipc", os.readlink("/proc/self/ns/ipc"))
print("sysctl", os.access("/proc/sys/kernel/domainname", os.W_OK))
print("sysrq", os.access("/proc/sysrq-trigger", os.W_OK))
print("sys", os.access("/sys/kernel/mm", os.W_OK))
shm = "/dev/shm/course-grade-probe-" + sys.argv[1]
try:
    open(shm, "w").close()
    print("devshm", True)
except OSError:
    print("devshm", False)
for dev in ("/dev/null", "/dev/urandom"):
    with open(dev, "wb") as f:
        f.write(b"x")
print("uid", os.getuid())
print("capeff", [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("CapEff")][0])
import socket
try:
    socket.sethostname(socket.gethostname())     # the same name: nothing changes if allowed
    print("sethostname", True)
except OSError:
    print("sethostname", False)
sys.stdout.flush()
n = 0
for i in range(600):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    n += 1
print("forked", n)
"""

HARDEN_LEVELS = [lvl for lvl, ok in (("ns-only", ISOLATION.namespaces),
                                     ("landlock", ISOLATION.landlock > 0)) if ok]


@pytest.mark.parametrize("level", HARDEN_LEVELS)
def test_runs_cannot_change_the_host_or_outgrow_their_process_bound(level, tiny, tmp_path,
                                                                    monkeypatch):
    """Namespaces without Landlock (a GPU machine): /proc/sys, /proc/sysrq-trigger and
    /sys read-only, own UTS and IPC namespaces, and (as root) an unprivileged uid, so the
    process bound holds. Landlock alone: /dev read-only but for the devices a kernel
    uses, and the supervisor stops a run that starts too many processes (as root
    RLIMIT_NPROC does not)."""
    if level == "ns-only":
        monkeypatch.setenv("COURSE_GRADE_ASSUME_GPU", "1")
        iso = sandbox.detect("namespaces")
        assert not iso.landlock
    else:
        iso = sandbox.detect("landlock")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    tag = os.urandom(6).hex()
    shm = Path("/dev/shm") / f"course-grade-probe-{tag}"
    try:
        with sandbox.Sandbox(scratch, [ROOT, tiny], iso) as box:
            job = scratch / "jobs" / "a"
            (job / "work").mkdir(parents=True)
            box.run(job, ["-c", HARDEN_PROBE, tag], job / "work", job / "log", 120)
            said = _said(job / "log")
            log = (job / "log").read_text()
        assert not shm.exists()
    finally:
        shm.unlink(missing_ok=True)
    if level == "ns-only":      # (access() does not ask Landlock, which denies the write)
        assert said["sysctl"] == said["sysrq"] == said["sys"] == "False", said
    assert said["devshm"] == ("True" if level == "ns-only" else "False")   # a private tmpfs
    assert said["sethostname"] == "False", said
    if os.getuid() == 0:        # as root: no capability left (the uid of its own, or none kept)
        assert int(said["capeff"], 16) == 0, said
    if level == "ns-only":
        assert said["uts"] != os.readlink("/proc/self/ns/uts")
        assert said["ipc"] != os.readlink("/proc/self/ns/ipc")
        assert int(said["forked"]) < sandbox.MAX_PROCS, said
    else:
        # counted, not refused: the supervisor stops the whole run once it sees too many
        assert "started more than" in log, log
    assert not marked_alive_under(scratch)


def marked_alive_under(scratch: Path) -> list:
    """Processes still running whose folder lies in ``scratch``."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/cwd").startswith(str(scratch)):
                    out.append(int(d))
            except OSError:
                pass
    return out


KERNEL_PROBE = r"""
import gc, json, os, sys
def kind(fd):
    try:
        t = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "gone"
    return t.split(":")[0] if ":" in t and not t.startswith("/") else t
print(json.dumps({
    "env": {k: v for k, v in os.environ.items() if k not in ("COURSE_GRADE_RUN", "JPY_PARENT_PID")},
    "cwd": os.getcwd(), "path": sys.path, "argv0": os.path.basename(sys.argv[0]),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "fds": sorted(kind(fd) for fd in os.listdir("/proc/self/fd")),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] == "course_utils"),
    "xmode": get_ipython().InteractiveTB.mode, "frozen": gc.get_freeze_count()}))
"""


def _kernel_view(box, job):
    (job / "work").mkdir(parents=True)
    nb = job / "probe.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(KERNEL_PROBE)]), nb)
    runner = box.stage / "course_utils" / "grading" / "runner.py"
    assert box.run(job, [runner, nb, job / "run.json", "--cwd", job / "work", "--cell-timeout",
                         "60", "--timeout", "120"], job / "work", job / "runner.log", 180)
    run = json.loads((job / "run.json").read_text())
    view = json.loads(run["cells"][0]["stdout"])
    # the same run elsewhere: its own folder replaced by a name
    return run["kernels"], json.loads(json.dumps(view).replace(str(job.resolve()), "JOB"))


@pytest.mark.skipif(not sandbox.warm_starts_possible(ISOLATION),
                    reason="warm starts need the namespaces")
def test_warm_kernels_see_what_a_fresh_kernel_sees(tiny, tmp_path, monkeypatch):
    """A kernel forked from the class's warm process has the environment, folder, import
    path and open files a fresh kernel has, in a pid namespace of its own (it sees its
    run's processes only, never the warm process), and imports the course afresh."""
    views = {}
    for warm in (True, False):
        monkeypatch.setenv("COURSE_GRADE_WARM", "1" if warm else "0")
        scratch = tmp_path / f"scratch-{warm}"
        scratch.mkdir()
        with sandbox.Sandbox(scratch, [ROOT, tiny], ISOLATION) as box:
            kernels, views[warm] = _kernel_view(box, scratch / "jobs" / "a")
            assert kernels == ({"warm": 1, "cold": 0} if warm else {"warm": 0, "cold": 1})
            assert (box.warm_runs, box.cold_runs) == ((1, 0) if warm else (0, 1))
            if warm:
                stage = str(box.stage)
        views[warm] = json.loads(json.dumps(views[warm]).replace(str(scratch.resolve()), "S"))
    warm, cold = views[True], views[False]
    assert warm["env"] == cold["env"] and warm["cwd"] == cold["cwd"] == "JOB/work"
    assert warm["path"] == cold["path"] and stage.replace(str(tmp_path / "scratch-True"), "S") \
        in warm["path"]
    assert warm["argv0"] == cold["argv0"] == "ipykernel_launcher.py"
    assert warm["fds"] == cold["fds"], (warm["fds"], cold["fds"])
    assert warm["modules"] == cold["modules"] == []
    # both show errors as plain Python tracebacks (IPython's default reads the source of
    # every frame); the forked one starts with the warm process's imports out of the
    # garbage collector's sight
    assert warm["xmode"] == cold["xmode"] == "Plain"
    assert warm["frozen"] > 10_000 and cold["frozen"] < warm["frozen"] // 10, \
        (warm["frozen"], cold["frozen"])
    # pid 1 is the runner, then its kernel (and whatever the kernel started): nothing else
    assert warm["processes"][0] == 1 and len(warm["processes"]) <= len(cold["processes"]) + 1


@pytest.mark.skipif(not sandbox.warm_starts_possible(ISOLATION),
                    reason="warm starts need the namespaces")
def test_runs_start_fresh_when_the_warm_process_is_gone(tiny, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with sandbox.Sandbox(scratch, [ROOT, tiny], ISOLATION) as box:
        _kernel_view(box, scratch / "jobs" / "a")
        warm = box._warm.proc
        assert (box.warm_runs, box.cold_runs) == (1, 0) and warm.poll() is None
        warm.kill()
        warm.wait(timeout=30)
        kernels, view = _kernel_view(box, scratch / "jobs" / "b")
        assert kernels == {"warm": 0, "cold": 1} and (box.warm_runs, box.cold_runs) == (1, 1)
        assert view["cwd"] == "JOB/work"
    token = box.token
    assert not sandbox.marked_processes({token})


WARM_THEN_EXIT = r"""
import json, sys
from pathlib import Path
from course_utils.grading import sandbox
box = sandbox.Sandbox(Path(sys.argv[1]), [sys.argv[1]], sandbox.detect("namespaces"))
box._warm._start()
print(json.dumps({"token": box.token, "pid": box._warm.proc.pid, "stage": str(box.stage)}))
box.close()          # the class ends; the process then exits without releasing anything
"""


@pytest.mark.skipif(not sandbox.warm_starts_possible(ISOLATION),
                    reason="warm starts need the namespaces")
def test_one_warm_process_serves_every_class_of_the_grader_and_ends_with_it(tiny, tmp_path):
    """A class graded, then another class's sandbox in the same process: the second
    forks its run from the warm process and uses the staged package the first started
    (nothing is imported or copied twice); the warm process and the stage end with the
    grading process."""
    subs = tmp_path / "subs"
    H.make_class(tiny, subs, names={"honest"})
    seen = []
    real = sandbox.Sandbox.close

    def close(box):
        seen.append((box.token, box._warm.proc.pid, box.stage, box.warm_runs, box.cold_runs))
        real(box)
    try:
        sandbox.Sandbox.close = close
        res = grader.grade(H.NAME, subs, tmp_path / "out", workers=1,
                           cell_timeout=CELL_TIMEOUT, timeout=120, root=tiny)
        assert res.scores() == {"honest": 4}
        (tmp_path / "next").mkdir()
        with sandbox.Sandbox(tmp_path / "next", [ROOT, tiny], ISOLATION) as box:
            kernels, view = _kernel_view(box, tmp_path / "next" / "jobs" / "a")
        assert kernels == {"warm": 1, "cold": 0} and view["cwd"] == "JOB/work"
    finally:
        sandbox.Sandbox.close = real
    (t1, pid1, stage1, *runs1), (t2, pid2, stage2, *runs2) = seen
    # the class: the official solution's two runs, then the student's two, all warm
    assert runs1 == [4, 0] and runs2 == [1, 0] and (t1, pid1, stage1) == (t2, pid2, stage2)
    assert sandbox.marked_processes({t1}) == [pid1] and stage1.is_dir()
    sandbox.release_shared()                           # what the end of the process does
    assert not sandbox.marked_processes({t1}) and not stage1.exists()
    # and a grading process that simply exits takes its warm process and stage with it
    (tmp_path / "scratch").mkdir()
    r = subprocess.run([sys.executable, "-c", WARM_THEN_EXIT, str(tmp_path / "scratch")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=_pythonpath(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    said = json.loads(r.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 30
    while sandbox.marked_processes({said["token"]}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not sandbox.marked_processes({said["token"]}) and not Path(said["stage"]).exists()


@pytest.mark.skipif(not sandbox.warm_starts_possible(ISOLATION),
                    reason="warm starts need the namespaces")
def test_a_warm_process_serves_only_classes_that_start_alike(tiny, tmp_path, monkeypatch):
    """A class whose runs would start with another environment (here another Triton
    mode) gets a warm process of its own; a dead one is replaced at the next class."""
    boxes = []
    for i, interpret in enumerate(("1", "0", "1")):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        (tmp_path / str(i)).mkdir()
        boxes.append(sandbox.Sandbox(tmp_path / str(i), [ROOT, tiny], ISOLATION))
    try:
        a, b, c = (box._warm for box in boxes)
        assert a is c and a is not b and a.env["TRITON_INTERPRET"] == "1" != b.env[
            "TRITON_INTERPRET"]
        a.close()                    # as after the warm process died
        (tmp_path / "3").mkdir()
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        boxes.append(sandbox.Sandbox(tmp_path / "3", [ROOT, tiny], ISOLATION))
        assert boxes[-1]._warm is not a and not boxes[-1]._warm.dead
    finally:
        for box in boxes:
            box.close()
        sandbox.release_shared()


def test_sandbox_refuses_what_is_missing(monkeypatch):
    with pytest.raises(sandbox.SandboxError, match="isolation"):
        sandbox.detect("chroot")
    monkeypatch.setattr(sandbox.sandbox_exec, "landlock_abi", lambda: 0)
    with pytest.raises(sandbox.SandboxError, match="Landlock"):
        sandbox.detect("landlock")
    monkeypatch.setitem(sandbox._probe_cache, "ns", False)
    with pytest.raises(sandbox.SandboxError, match="namespaces"):
        sandbox.detect("namespaces")
    assert sandbox.detect("auto") == sandbox.Isolation(False, 0)


def test_limits_only_class_is_still_graded_and_says_so(tiny, tmp_path):
    # the fallback: no namespaces, no Landlock; the score table says so, a setsid
    # daemon that keeps the grader's marker is still found and killed
    subs = tmp_path / "subs"
    H.make_class(tiny, subs, names={"honest"})
    token = "course-grade-test-" + os.urandom(6).hex()
    H.PLACES.update(out=str(tmp_path / "out"), token=token)
    daemon = H._places(H.SETSID_DAEMON).replace('for prefix in ([], ["env", "-i"]):',
                                                'for prefix in ([],):')
    assert "env" not in daemon.split("for prefix")[1].split(":")[0]
    H.write_submission(subs, "daemon", H.fill(H.exercise_nb(tiny), H.BAD, {"1.2": daemon}))
    res = grader.grade(H.NAME, subs, tmp_path / "out", workers=2, cell_timeout=CELL_TIMEOUT,
                       timeout=120, root=tiny, isolation="limits")
    assert res.scores() == {"daemon": 0, "honest": 4}
    assert res.isolation == "rlimits, own session, fresh HOME and environment; one run at a time"
    table = (tmp_path / "out" / "scores.csv").read_text()
    time.sleep(4)
    left = _alive(token)
    for pid in left:
        os.kill(pid, 9)
    assert left == [] and (tmp_path / "out" / "scores.csv").read_text() == table


# ------------------------------------------------------------------ guards and copies
def test_guard_calls_in_check_cells_go_through_the_hooks():
    src = ("y = run_answer(f, x, forbid=('softmax',))\nwith guards.forbid('sdpa'):\n"
           "    z = f(x)\ncheck_close(guards.run_answer(f, x), y)")
    out = instrument.guard_check(src, "1.1")
    assert out.count("__course_grade__.guard_run_answer(") == 2
    assert "__course_grade__.guard_forbid('sdpa')" in out
    verify, _ = instrument.rewrite_check(src, "1.1")
    assert "guard_" not in verify   # the checking kernel runs no student code


def test_tampering_references_are_found():
    assert instrument.tamper_references("def f(x):\n    return 2 * x") == []
    for src, word in (("import course_utils.guards as g\ng.forbid = None", "guards"),
                      ("run_answer = lambda f, *a, **k: f(*a)", "run_answer"),
                      ("import torch\nwith torch._C.DisableTorchFunction():\n    pass",
                       "DisableTorchFunction"),
                      ("__course_grade__.export = print", "__course_grade__"),
                      ("import sys\nsys.modules['course_utils.grading.kernel_side']", "kernel_side"),
                      ("from IPython.display import publish_display_data", "publish_display_data")):
        assert any(word in r for r in instrument.tamper_references(src)), src


def test_guard_keeper_restores_what_answer_code_switched_off():
    from course_utils import guards
    import torch
    guard_keeper.capture()
    real_forbid, real_pop = guards.forbid, torch._C._pop_torch_function_stack
    try:
        guards.forbid = lambda *a, **k: None
        guards.GROUPS.pop("softmax")
        torch._C._pop_torch_function_stack = lambda: None
        changed = guard_keeper.check_and_restore()
        assert guards.forbid is real_forbid and "softmax" in guards.GROUPS
        assert torch._C._pop_torch_function_stack is real_pop
        assert any("forbid" in c for c in changed) and any("GROUPS" in c for c in changed)
        assert any("_pop_torch_function_stack" in c for c in changed)
        assert guard_keeper.check_and_restore() == []
        # a guarded course function's code swapped back by the answer is put back too
        import course_utils.softmax as sm
        snap = guard_keeper.snapshot()
        code = sm.safe_softmax.__code__
        sm.safe_softmax.__code__ = (lambda *a, **k: None).__code__
        assert any("safe_softmax" in c for c in guard_keeper.check_and_restore(snap))
        assert sm.safe_softmax.__code__ is code
    finally:
        guards.forbid, torch._C._pop_torch_function_stack = real_forbid, real_pop
        guard_keeper.check_and_restore()
        guard_keeper._SNAP.clear()


def _renamed_copy(fn) -> str:
    import ast
    import inspect
    import textwrap

    class R(ast.NodeTransformer):
        def visit_Name(self, n):
            return ast.copy_location(ast.Name(n.id + "_mine", n.ctx), n)

        def visit_arg(self, n):
            n.arg += "_mine"
            return n
    tree = R().visit(ast.parse(textwrap.dedent(inspect.getsource(fn))))
    fn_node = tree.body[0]
    fn_node.name = "my_own_softmax"
    doc = ast.Expr(ast.Constant("My own work."))
    if ast.get_docstring(fn_node) is not None:
        fn_node.body[0] = doc
    else:
        fn_node.body.insert(0, doc)
    return ast.unparse(tree)


def test_copies_of_course_code_and_of_the_official_answer_are_flagged():
    import course_utils.softmax as sm
    official = {"2.1": "# Exercise 2.1\n" + _renamed_copy(sm.online_softmax).replace(
        "my_own_softmax", "official")}
    idx = similarity.Index.build(sandbox.PACKAGE, official)
    copy = "# Exercise 2.1\nimport torch\n\n\n" + _renamed_copy(sm.safe_softmax)
    assert idx.flags("2.1", copy) == ["my_own_softmax is a copy of "
                                      "course_utils.softmax:safe_softmax"]
    assert idx.flags("2.1", official["2.1"].replace("official", "f")) == [
        "the answer cell is the official answer",
        "f is a copy of course_utils.softmax:online_softmax"]
    assert idx.flags("2.1", "# Exercise 2.1\ndef f(x):\n    return x.exp() / x.exp().sum()") == []


def test_graded_kernels_see_packages_installed_beside_the_interpreter(tmp_path, monkeypatch):
    """A ``pip install --target`` folder on the grader's path is passed on to the graded
    kernels; the course checkout and hidden folders never are."""
    from course_utils.grading import sandbox
    lib = tmp_path / "extra"
    (lib / "nbformat-5.0.dist-info").mkdir(parents=True)
    plain = tmp_path / "plain"
    plain.mkdir()
    secret = tmp_path / "secret" / "lib"
    (secret / "x-1.dist-info").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", sys.path + [str(lib), str(plain), str(secret), str(ROOT),
                                                 str(ROOT / "solutions")])
    got = sandbox._library_paths([str(tmp_path / "secret")])
    assert os.path.realpath(lib) in got
    assert os.path.realpath(plain) not in got and os.path.realpath(secret) not in got
    assert not any(p.startswith(os.path.realpath(ROOT)) for p in got)


def test_gpu_machines_grade_without_landlock(monkeypatch):
    """CUDA does not start under a Landlock ruleset (measured on an H100), so on a GPU
    machine the grader keeps the namespaces and says why Landlock is off."""
    from course_utils.grading import sandbox
    monkeypatch.setenv("COURSE_GRADE_ASSUME_GPU", "1")
    iso = sandbox.detect("auto")
    assert iso.landlock == 0
    if sandbox.sandbox_exec.landlock_abi():
        assert "Landlock off" in iso.describe()
        with pytest.raises(sandbox.SandboxError, match="CUDA"):
            sandbox.detect("landlock")
    monkeypatch.delenv("COURSE_GRADE_ASSUME_GPU")
    assert sandbox.detect("limits").landlock == 0


def test_checking_run_ignores_the_machines_other_pytest_plugins(tmp_path):
    """An installed pytest plugin that reorders tests (like pytest-randomly) would run the
    check cells out of order: the checking run loads nbval and pytest's own plugins only."""
    site = tmp_path / "site"
    (site / "reverse_order-1.0.dist-info").mkdir(parents=True)
    (site / "reverse_order-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: reverse-order\nVersion: 1.0\n")
    (site / "reverse_order-1.0.dist-info" / "entry_points.txt").write_text(
        "[pytest11]\nreverse_order = reverse_order\n")
    (site / "reverse_order.py").write_text(
        "def pytest_collection_modifyitems(items):\n    items.reverse()\n")
    nb = tmp_path / "job" / "n.ipynb"
    nb.parent.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 41"), nbformat.v4.new_code_cell("assert x + 1 == 42")]), nb)
    env = dict(os.environ, PYTHONPATH=_pythonpath(site, ROOT))
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    # the plugin is found and reorders an ordinary pytest run...
    probe = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(sorted("
                            "e.name for e in m.entry_points(group='pytest11')))"],
                           env=env, capture_output=True, text=True, check=True)
    assert "reverse_order" in probe.stdout
    # ...but not the checking run
    subprocess.run([sys.executable, str(ROOT / "course_utils" / "grading" / "runner.py"), str(nb),
                    str(tmp_path / "job" / "run.json"), "--cwd", str(tmp_path / "job"), "--nbval",
                    "--cell-timeout", "60", "--timeout", "120"], env=env, check=True,
                   capture_output=True, timeout=300)
    cells = json.loads((tmp_path / "job" / "run.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["ok", "ok"], cells


def test_student_records_count_only_from_the_cells_that_make_them():
    # call records come from the template's cells (the recorder, around the template's
    # calls), exports from the exercise's own export cell; the same records published by
    # answer code from an answer cell, or an export under another exercise's cell, are
    # dropped; a tamper flag counts from anywhere
    nonce = "n0"

    def rec(kind, key, payload):
        return {"nonce": nonce, "kind": kind, "key": key, "blob": codec.dumps(payload)}

    call = {"name": "double", "index": 0, "args": [], "kwargs": {},
            "outcome": {"returned": 4}}
    roles = [("setup", None), ("hook", "1.2"), ("answer", "1.2"), ("export", "1.2"),
             ("hook", "1.2"), ("check", "1.2"), ("answer", "1.3"), ("export", "1.3")]
    cells = [{"records": []} for _ in roles]
    cells[2]["records"] = [rec("call", "double/0", {**call, "outcome": {"returned": 99}}),
                           rec("export", "1.3/safe_div", {"name": "safe_div", "kind": "data",
                                                          "value": 1})]
    cells[3]["records"] = [rec("export", "1.2/double", {"name": "double", "kind": "function"})]
    cells[5]["records"] = [rec("call", "double/0", call)]
    cells[6]["records"] = [rec("call", "double/1", {**call, "index": 1}),
                           rec("export", "1.2/__tampered__", {"name": "__tampered__",
                                                              "kind": "tampered", "what": ["x"]})]
    exports, calls, _ = grader._exports({"cells": cells}, roles, nonce)
    assert [c["outcome"]["returned"] for c in calls["double"]] == [4]
    assert set(exports) == {"1.2/double", "1.2/__tampered__"}


def test_what_a_run_leaves_in_its_folder_is_read_without_following_links(tmp_path):
    # a run can write its own folder: a runner.log (or run.json, junit.xml) made a link to
    # a file only the grader may read must not bring that file into the feedback
    secret = tmp_path / "secret.txt"
    secret.write_text("ROOT ONLY")
    job = tmp_path / "job"
    job.mkdir()
    (job / "runner.log").symlink_to(secret)
    (job / "run.json").symlink_to(secret)
    os.mkfifo(job / "fifo")
    assert grader._regular_bytes(job / "runner.log", 1500, tail=True) is None
    assert grader._read_run(job / "run.json") is None
    assert grader._regular_bytes(job / "fifo", 1500) is None
    (job / "real.log").write_bytes(b"x" * 5000 + b"END")
    assert grader._regular_bytes(job / "real.log", 3, tail=True) == b"END"
    assert grader._regular_bytes(job / "real.log", 3) is None


def test_decoder_refuses_a_record_that_nests_one_list_in_the_next_twice():
    # stored once per level, copied out 2**levels times: refused before it is built
    tree = [1]
    for _ in range(30):
        tree = [tree, tree]
    with pytest.raises(codec.TooLarge, match="values"):
        codec.decode(tree)
    budget = codec.Budget()
    small = [[1, 2]] * 10
    assert codec.decode(small, budget) == small and budget.nodes_left < codec.MAX_STUDENT_NODES


def test_records_no_hook_makes_cost_the_exercise_of_their_cell():
    # answer code runs in the student's kernel and can reach its hooks: a record under a
    # spoiled nonce, a call record published by an answer cell, a call recorded twice
    nonce = "n1"

    def rec(kind, key, n=nonce):
        return {"nonce": n, "kind": kind, "key": key, "blob": codec.dumps({"name": "double"})}

    roles = [("setup", None), ("answer", "1.1"), ("export", "1.1"), ("check", "1.1"),
             ("answer", "1.2"), ("export", "1.2"), ("check", "1.2"), ("check", "1.3"),
             ("code", None)]
    cells = [{"records": []} for _ in roles]
    cells[2]["records"] = [rec("export", "1.1/answer_1_1")]
    cells[3]["records"] = [rec("call", "double/0")]
    assert grader._forged({"cells": cells}, roles, nonce, ["1.1", "1.2", "1.3"]) == {}
    cells[4]["records"] = [rec("call", "double/1")]                  # from an answer cell
    cells[6]["records"] = [rec("call", "double/0", n="spoiled")]     # another nonce
    cells[7]["records"] = [rec("call", "double/0")]                  # the same call again
    cells[8]["records"] = [rec("export", "1.3/safe_div")]            # not its export cell
    got = grader._forged({"cells": cells}, roles, nonce, ["1.1", "1.2", "1.3"])
    assert set(got) == {"1.1", "1.2", "1.3"}
    assert any("another nonce" in w for w in got["1.2"])
    assert any("recorded twice" in w for w in got["1.3"])
    assert all(any("does not make it" in w for w in got[e]) for e in ("1.1", "1.2"))
