"""A tiny problem set and a class of adversarial submissions for tests/test_grading.py.

``make_problem_set(root)`` writes ``root/solutions/01_tiny.ipynb`` and runs the
pipeline on ``root`` to generate ``root/exercises/01_tiny.ipynb``.
``make_class(root, folder)`` writes one submission per entry of ``CASES``,
each built from the generated exercise, and returns ``{student: expected}``.

Exercises (4 points): 1.1 a number (2 points), 1.2 a function on tensors
(with a hidden test), 1.3 a function that must raise ``ValueError``.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import nbformat

from course_utils import problems

NAME = "01_tiny"

SETUP = """import math
import torch
from course_utils.checks import check_close, check_equal, check_raises
from course_utils.guards import run_answer

torch.manual_seed(0)"""

ANSWERS = {
    "1.1": "# Exercise 1.1 (2 points)\n### HINT: six times seven\n### BEGIN SOLUTION\n"
           "answer_1_1 = 6 * 7\n### END SOLUTION",
    "1.2": "# Exercise 1.2\ndef double(x):\n    ### HINT: twice x\n    ### BEGIN SOLUTION\n"
           "    return 2 * x\n    ### END SOLUTION",
    "1.3": "# Exercise 1.3\ndef safe_div(a, b):\n    ### HINT: refuse b == 0\n"
           "    ### BEGIN SOLUTION\n    if b == 0:\n"
           "        raise ValueError('safe_div: b must not be zero')\n"
           "    return a / b\n    ### END SOLUTION",
}

CHECKS = {
    "1.1": "# Check 1.1\ncheck_equal(answer_1_1, 42, name=\"answer_1_1\", hint=\"six sevens\")",
    "1.2": "# Check 1.2\nx = torch.randn(5)\n"
           "check_close(run_answer(double, x, forbid=('autograd',), exercise='1.2'), x + x, "
           "name=\"double\")\n"
           "### BEGIN HIDDEN TESTS\ny = torch.randn(3, 4)\n"
           "check_close(run_answer(double, y), y * 2.0, name=\"double (2-d)\")\n"
           "### END HIDDEN TESTS",
    "1.3": "# Check 1.3\ncheck_raises(lambda: safe_div(1, 0), ValueError, name=\"safe_div(1, 0)\", "
           "match=\"zero\")\ncheck_equal(safe_div(6, 3), 2.0, name=\"safe_div(6, 3)\")",
}

# bodies that solve each exercise when pasted into its answer cell
GOOD = {
    "1.1": "# Exercise 1.1 (2 points)\nanswer_1_1 = 42",
    "1.2": "# Exercise 1.2\ndef double(x):\n    return x * 2",
    "1.3": "# Exercise 1.3\ndef safe_div(a, b):\n    if b == 0:\n"
           "        raise ValueError('b is zero')\n    return a / b",
}
BAD = {
    "1.1": "# Exercise 1.1 (2 points)\nanswer_1_1 = 41",
    "1.2": "# Exercise 1.2\ndef double(x):\n    return x * 3",
    "1.3": "# Exercise 1.3\ndef safe_div(a, b):\n    return a / b if b else float('inf')",
}

PATCH_CHECKS = """
import course_utils.checks as C
_real_close = C.check_close
def _swap(actual, expected, **kw):          # pass by comparing expected with itself
    return _real_close(expected, expected, **kw)
C.check_close = _swap
C.check_equal = lambda *a, **k: None
C.check_raises = lambda *a, **k: None
C.CheckFailed = type("Never", (Exception,), {})
check_close, check_equal, check_raises = C.check_close, C.check_equal, C.check_raises
"""

PATCH_TORCH = """
import torch, torch.testing
torch.testing.assert_close = lambda *a, **k: None
torch.allclose = lambda *a, **k: True
torch.Tensor.__eq__ = lambda self, other: True
torch.Tensor.all = lambda self, *a, **k: torch.tensor(True)
"""

PATCH_GRADER = """
import sys
_g = sys.modules.get("course_utils.grading.kernel_side")
if _g is not None:
    _g.student_call = lambda *a, **k: None      # publish nothing
    _g._publish = lambda *a, **k: None
for _n in ("__course_grade__",):
    globals()[_n] = type("Fake", (), {"student_call": staticmethod(lambda *a, **k: None),
                                      "stmt": staticmethod(lambda *a, **k: None)})
"""

FORGE = """
from IPython.display import publish_display_data
import course_utils.grading.kernel_side as K
for key in ("1.1/c0/0", "1.2/c0/0", "1.2/c1/0", "1.3/c0/0", "1.3/c1/0"):
    # forged records: right format, nonce copied from the kernel, wrong values
    K._publish("value", key, {"value": 41})
    publish_display_data({K.MIME: {"nonce": "0" * 32, "kind": "value", "key": key, "blob": "!!"}})
print("ok: answer_1_1 (= 42)")
"""

EVIL_VALUES = """
class Always(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
answer_1_1 = Always(7)
"""

EVIL_TENSOR = """
import torch
class Agree(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if getattr(func, "__name__", "") in ("__eq__", "eq", "isclose", "allclose", "le", "__le__"):
            return torch.ones_like(out, dtype=torch.bool) if isinstance(out, torch.Tensor) else True
        return out
def double(x):
    return (x * 3).as_subclass(Agree)
"""

DELETE_FILES = """
import os, shutil
for d in (".", ".."):
    for name in os.listdir(d):
        p = os.path.join(d, name)
        try:
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
        except OSError:
            pass
"""


def _nb(cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = cells
    return nb


def make_problem_set(root: Path) -> Path:
    """Write the tiny solution and build its exercise with the course pipeline."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [md("# Problem set 1 — tiny\nA problem set for testing the grader."), code(SETUP)]
    for ex in ("1.1", "1.2", "1.3"):
        cells += [md(f"## Exercise {ex}"), code(ANSWERS[ex]), code(CHECKS[ex])]
    cells.append(code("print('done')"))
    (root / "solutions").mkdir(parents=True, exist_ok=True)
    (root / "exercises").mkdir(parents=True, exist_ok=True)
    nbformat.write(_nb(cells), root / "solutions" / f"{NAME}.ipynb")
    problems.build(root=root, write=True)
    return root / "solutions" / f"{NAME}.ipynb"


def exercise_nb(root: Path):
    return nbformat.read(root / "exercises" / f"{NAME}.ipynb", as_version=4)


def cell(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def fill(nb, answers: dict, extra: dict | None = None):
    """Put answer bodies (and optional extra code in front of them) into the answer cells."""
    nb = copy.deepcopy(nb)
    for ex, src in answers.items():
        c = cell(nb, f"ex-{ex.replace('.', '-')}-answer")
        c.source = src
    for ex, code in (extra or {}).items():
        c = cell(nb, f"ex-{ex.replace('.', '-')}-answer")
        c.source = c.source + "\n" + code
    return nb


def _all(kind):
    return dict((GOOD if kind == "good" else BAD))


def _case_edited_checks(nb):
    nb = fill(nb, _all("bad"))
    for c in nb.cells:
        if c.get("id", "").endswith("-check"):
            c.source = "# Check\nprint('ok: all checks passed')"
    return nb


def _case_deleted_checks(nb):
    nb = fill(nb, _all("bad"))
    nb.cells = [c for c in nb.cells if not c.get("id", "").endswith("-check")]
    return nb


def _case_fake_outputs(nb):
    nb = fill(nb, _all("bad"))
    for c in nb.cells:
        if c.cell_type == "code":
            c.execution_count = 1
            c.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                text="ok: passed (max |diff| 0.00e+00)\n")]
    return nb


def _case_nbval(nb):
    answers = _all("bad")
    answers["1.1"] = "# NBVAL_SKIP\n" + GOOD["1.1"]          # a right answer still counts
    answers["1.2"] = "# NBVAL_IGNORE_OUTPUT\n" + BAD["1.2"]
    nb = fill(nb, answers)
    for c in nb.cells:
        if c.cell_type == "code":
            c.metadata["tags"] = ["nbval-skip", "nbval-ignore-output", "raises-exception",
                                  "skip-execution"]
            if c.get("id", "").endswith("-check"):
                c.source = "# NBVAL_SKIP\n" + c.source
    return nb


def _case_collision(nb):
    nb = fill(nb, _all("good"))
    twin = copy.deepcopy(cell(nb, "ex-1-1-answer"))
    twin.source = BAD["1.1"]
    nb.cells.insert(1, twin)
    return nb


def _case_renamed(nb):
    nb = fill(nb, _all("good"))
    cell(nb, "ex-1-1-answer").id = "my-own-cell"
    return nb


def _case_missing(nb):
    nb = fill(nb, _all("good"))
    nb.cells = [c for c in nb.cells if c.get("id") != "ex-1-2-answer"]
    return nb


HISTORY_READER = """# Exercise 1.2
def double(x):
    ip = get_ipython()
    seen = repr([ip.user_ns.get(k) for k in ("In", "_ih", "_i", "_ii", "_iii")])
    seen += repr(getattr(ip.history_manager, "input_hist_raw", []))
    hidden = ("randn(3, " + "4)", "(2" + "-d)")     # spelled apart: not this cell's own text
    return x * (3 if any(h in seen for h in hidden) else 2)"""


# student -> (builder(exercise_nb) -> notebook | bytes, expected points per exercise,
#             words the feedback must contain)
CASES = {
    "honest": (lambda nb: fill(nb, _all("good")), {"1.1": 2, "1.2": 1, "1.3": 1}, []),
    "partial": (lambda nb: fill(nb, {**_all("good"), "1.2": BAD["1.2"]}),
                {"1.1": 2, "1.2": 0, "1.3": 1}, ["double", "differs"]),
    "untouched": (lambda nb: nb, {"1.1": 0, "1.2": 0, "1.3": 0}, ["NotImplementedError"]),
    "rng_user": (lambda nb: fill(nb, _all("good"), {"1.1": "import torch\n_ = torch.randn(999)",
                                                     "1.2": "_ = torch.rand(7)"}),
                 {"1.1": 2, "1.2": 1, "1.3": 1}, []),
    "edited_checks": (_case_edited_checks, {"1.1": 0, "1.2": 0, "1.3": 0},
                      ["check cell was edited"]),
    "deleted_checks": (_case_deleted_checks, {"1.1": 0, "1.2": 0, "1.3": 0},
                       ["check cell was deleted"]),
    "fake_outputs": (_case_fake_outputs, {"1.1": 0, "1.2": 0, "1.3": 0},
                     ["stored outputs were ignored"]),
    "nbval_markers": (_case_nbval, {"1.1": 2, "1.2": 0, "1.3": 0}, ["nbval markers"]),
    "patch_checks": (lambda nb: fill(nb, _all("bad"), {"1.1": PATCH_CHECKS}),
                     {"1.1": 0, "1.2": 0, "1.3": 0}, ["must not touch", "differs"]),
    "patch_torch": (lambda nb: fill(nb, _all("bad"), {"1.1": PATCH_TORCH}),
                    {"1.1": 0, "1.2": 0, "1.3": 0}, ["differs"]),
    "patch_grader": (lambda nb: fill(nb, _all("bad"), {"1.1": PATCH_GRADER}),
                     {"1.1": 0, "1.2": 0, "1.3": 0}, ["not reached"]),
    "forged_records": (lambda nb: fill(nb, _all("bad"), {"1.1": FORGE}),
                       {"1.1": 0, "1.2": 0, "1.3": 0}, ["ignored"]),
    "fake_pass": (lambda nb: fill(nb, _all("bad"), {
        "1.1": "print('PASS'); print('ok: answer_1_1 (= 42)'); print('All checks passed: 4/4')"}),
        {"1.1": 0, "1.2": 0, "1.3": 0}, ["is 41, expected 42"]),
    "evil_values": (lambda nb: fill(nb, {"1.1": "# Exercise 1.1\n" + EVIL_VALUES,
                                         "1.2": "# Exercise 1.2\n" + EVIL_TENSOR}),
                    {"1.1": 0, "1.2": 0, "1.3": 0}, ["is 7, expected 42"]),
    "infinite_loop": (lambda nb: fill(nb, {**_all("good"), "1.2": "import time\nwhile True:\n"
                                           "    time.sleep(0.05)"}),
                      {"1.1": 2, "1.2": 0, "1.3": 1}, ["interrupted"]),
    # a kernel that cannot be stopped or dies takes only its own exercise: the notebook
    # runs again without that answer, and the crash is named first
    "stuck_loop": (lambda nb: fill(nb, {**_all("good"), "1.2": (
        "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n"
        "    except BaseException:\n        pass")}),
        {"1.1": 2, "1.2": 0, "1.3": 1}, ["could not be interrupted", "crashed the kernel"]),
    "sys_exit": (lambda nb: fill(nb, {**_all("good"), "1.2": "import sys\nsys.exit(0)"}),
                 {"1.1": 2, "1.2": 0, "1.3": 1}, ["SystemExit"]),
    "os_exit": (lambda nb: fill(nb, {**_all("good"), "1.2": "import os\nos._exit(0)"}),
                {"1.1": 2, "1.2": 0, "1.3": 1}, ["kernel died", "crashed the kernel"]),
    # the answer reads the kernel's input history while its check cell runs: the check cell
    # (hidden tests included) is not there, so it sees no hidden test and answers right
    "history_reader": (lambda nb: fill(nb, {**_all("good"), "1.2": HISTORY_READER}),
                       {"1.1": 2, "1.2": 1, "1.3": 1}, []),
    "big_output": (lambda nb: fill(nb, _all("good"), {"1.1": "print('x' * 100_000_000)"}),
                   {"1.1": 2, "1.2": 1, "1.3": 1}, ["characters of printed output were discarded"]),
    "deletes_files": (lambda nb: fill(nb, _all("good"), {"1.2": DELETE_FILES}),
                      {"1.1": 2, "1.2": 1, "1.3": 1}, []),
    "id_collision": (_case_collision, {"1.1": 0, "1.2": 1, "1.3": 1}, ["ids must be unique"]),
    "renamed_cell": (_case_renamed, {"1.1": 0, "1.2": 1, "1.3": 1}, ["my-own-cell"]),
    "missing_cell": (_case_missing, {"1.1": 2, "1.2": 0, "1.3": 1}, ["is missing"]),
    "not_a_notebook": (lambda nb: b"\x89PNG\r\n\x1a\n\x00\x00binary", {"1.1": 0, "1.2": 0, "1.3": 0},
                       ["not a notebook"]),
    "invalid_json": (lambda nb: json.dumps(nb)[:-40].encode(), {"1.1": 0, "1.2": 0, "1.3": 0},
                     ["invalid JSON"]),
    "json_not_notebook": (lambda nb: b"[1, 2, 3]", {"1.1": 0, "1.2": 0, "1.3": 0},
                          ["no list of cells"]),
}


# ------------------------------------------------------------------ a hostile class
# Submissions that attack the grader itself rather than the checks. They need to know
# where things are (the course, the submissions, the output folder): ``make_class``
# fills ``PLACES`` before building them. Each is written so that, were the sandbox to
# fail, the damage would show in the score or in the hashed tree, and would touch
# nothing outside this test's own folders and grading processes.
PLACES: dict = {}

DECODER_TRICKS = """
import collections, dataclasses
@dataclasses.dataclass
class W:                      # claims to be the grader's file writer
    path: str
    text: str
W.__module__, W.__qualname__, W.__name__ = "course_utils.grading.runner", "write_atomic", "write_atomic"
class Exit:                   # claims to be a module's main(), which calls sys.exit
    pass
Exit.__module__, Exit.__qualname__ = "torch.utils.model_dump.__main__", "main"
NT = collections.namedtuple("NT", "src")
NT.__module__, NT.__qualname__ = "builtins", "exec"
answer_1_1 = [W({pwned!r}, "import sys; sys.exit(3)"), Exit, NT("print(1)"), Exit()]
"""

DECODER_RAISES = """
class Zero(ValueError):       # an error class that claims to be the grader's writer
    pass
Zero.__module__, Zero.__qualname__ = "course_utils.grading.runner", "write_atomic"
def safe_div(a, b):
    if b == 0:
        raise Zero("b is zero")
    return a / b
"""

READ_SOLUTIONS = """
import glob, json, os
answer_1_1 = 41
seen = []
for p in sorted(glob.glob({tiny!r} + "/solutions/*.ipynb") + glob.glob({course!r} + "/solutions/*.ipynb")
                + glob.glob({course!r} + "/tests/*.py") + glob.glob({subs!r} + "/*.ipynb")):
    try:
        text = open(p).read()
    except OSError:
        continue
    seen.append(p)
    if p.endswith("01_tiny.ipynb") or p.endswith("honest.ipynb"):
        for c in json.loads(text)["cells"]:
            src = "".join(c["source"])
            if src.startswith("# Exercise 1.1"):
                exec(src, globals())
for p in (os.path.expanduser("~/stolen.txt"), {subs!r} + "/stolen.txt", {course!r} + "/stolen.txt"):
    try:
        open(p, "w").write("\\n".join(seen))
    except OSError:
        pass
"""

STARTUP_FILES = """
import os, sys
payload = ("import os\\nif os.path.exists(%r):\\n"
           "    import course_utils.checks as C\\n"
           "    C.check_equal = C.check_close = C.check_raises = lambda *a, **k: None\\n" % {flag!r})
for d in (os.path.expanduser("~/.ipython/profile_default/startup"),
          os.path.join(os.environ.get("IPYTHONDIR", "/nonexistent"), "profile_default", "startup"),
          os.path.join(sys.prefix, "etc", "ipython", "startup")):
    try:
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "00-course-grade-test.py"), "w").write(payload)
    except OSError:
        pass
for d in (os.path.join(sys.prefix, "etc", "ipython"), os.path.join(sys.prefix, "etc", "jupyter")):
    try:
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "ipython_config.py"), "w").write(
            "c.InteractiveShellApp.exec_lines = [%r]" % payload)
    except OSError:
        pass
"""

SETSID_DAEMON = """
import subprocess, sys
code = ("import time\\ntime.sleep(3)\\n"
        "for p in (%r, %r):\\n"
        "    try:\\n"
        "        open(p, 'w').write('student,total\\\\nsetsid_daemon,999\\\\n')\\n"
        "    except OSError:\\n"
        "        pass\\n"
        "time.sleep(120)  # %s" % ({out!r} + "/scores.csv", {out!r} + "/scores.json", {token!r}))
for prefix in ([], ["env", "-i"]):   # one keeps the grader's marker variable, one does not
    subprocess.Popen(prefix + ["setsid", sys.executable, "-c", code], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""

KILL_OTHERS = """
import os, signal
mine = dict(l.split("=", 1) for l in open("/proc/self/environ").read().split("\\0") if "=" in l)
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        env = dict(l.split("=", 1) for l in open(f"/proc/{pid}/environ").read().split("\\0") if "=" in l)
    except OSError:
        continue
    # the kernels and runners of the other students of this very class
    if env.get("PYTHONPATH") == mine.get("PYTHONPATH") and \\
            env.get("COURSE_GRADE_RUN") != mine.get("COURSE_GRADE_RUN"):
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
"""

MUTATE_INPUT = "# Exercise 1.2\ndef double(x):\n    x.zero_()\n    return x"
NAN_STEER = "# Exercise 1.2\ndef double(x):\n    x.fill_(float('nan'))\n    return x.clone()"


def _places(src: str) -> str:
    return src.format(**PLACES)


def _case_all_in_one(nb):
    one = "\n\n".join([GOOD["1.1"], GOOD["1.2"].replace("# Exercise 1.2\n", ""),
                        GOOD["1.3"].replace("# Exercise 1.3\n", "")])
    return fill(nb, {"1.1": one, "1.2": "# Exercise 1.2\n", "1.3": "# Exercise 1.3\n"})


# student -> (builder, expected points, words the feedback must contain)
HOSTILE_CASES = {
    "decoder_tricks": (lambda nb: fill(nb, {**_all("good"),
                                            "1.1": "# Exercise 1.1\n" + _places(DECODER_TRICKS),
                                            "1.3": "# Exercise 1.3\n" + DECODER_RAISES}),
                       {"1.1": 0, "1.2": 1, "1.3": 0}, ["must not touch"]),
    "reads_solutions": (lambda nb: fill(nb, _all("bad"), {"1.1": _places(READ_SOLUTIONS)}),
                        {"1.1": 0, "1.2": 0, "1.3": 0}, ["is 41, expected 42"]),
    "startup_files": (lambda nb: fill(nb, _all("bad"), {"1.1": _places(STARTUP_FILES)}),
                      {"1.1": 0, "1.2": 0, "1.3": 0}, ["is 41, expected 42"]),
    "setsid_daemon": (lambda nb: fill(nb, _all("bad"), {"1.2": _places(SETSID_DAEMON)}),
                      {"1.1": 0, "1.2": 0, "1.3": 0}, []),
    "kills_others": (lambda nb: fill(nb, _all("bad"), {"1.1": KILL_OTHERS}),
                     {"1.1": 0, "1.2": 0, "1.3": 0}, []),
    "all_in_one_cell": (_case_all_in_one, {"1.1": 2, "1.2": 0, "1.3": 0},
                        ["defined in the answer cell of exercise 1.1"]),
    "mutates_input": (lambda nb: fill(nb, {**_all("good"), "1.2": MUTATE_INPUT}),
                      {"1.1": 2, "1.2": 0, "1.3": 1}, ["changed its input"]),
    "nan_steering": (lambda nb: fill(nb, {**_all("good"), "1.2": NAN_STEER}),
                     {"1.1": 2, "1.2": 0, "1.3": 1}, ["changed its input"]),
    "guard_tamper": (lambda nb: fill(nb, {**_all("good"), "1.2": MUTATE_INPUT + (
        "\nimport course_utils.guards as g\ng.run_answer = lambda fn, *a, **k: fn(*a)\n"
        "run_answer = g.run_answer")}),
        {"1.1": 2, "1.2": 0, "1.3": 1}, ["must not touch"]),
    "=1+2": (lambda nb: fill(nb, _all("good")), {"1.1": 2, "1.2": 1, "1.3": 1}, []),
    # the check's helper replaced under a name built at run time (no name the source scan
    # knows): the check would never call the answer, and the answer's code could publish
    # the call records the checking run replays. The template's helper is put back after
    # the cell, so the check calls the (wrong) answer
    "rebinds_template_helper": (lambda nb: fill(nb, {**_all("good"), "1.2": BAD["1.2"] + (
        "\nglobals()['run_' + 'answer'] = lambda fn, x, **k: x * 2")}),
        {"1.1": 2, "1.2": 0, "1.3": 1}, ["double"]),
    # a learner's own helper that shares a name with one the template imports but never
    # reads again, and a scratch value over a template one: nothing lost
    "own_helpers_over_template_names": (lambda nb: fill(nb, {**_all("good"), "1.2": (
        "# Exercise 1.2\nimport math\nmath = math\ncheck_close = None\n"
        "def double(x):\n    return x + x\n")}), {"1.1": 2, "1.2": 1, "1.3": 1}, []),
    "nested_json": (lambda nb: b"[" * 200_000 + b"]" * 200_000, {"1.1": 0, "1.2": 0, "1.3": 0},
                    ["nested too deeply"]),
    "symlink": ("symlink", {"1.1": 0, "1.2": 0, "1.3": 0}, ["symbolic link"]),
}


def make_hostile_class(root: Path, folder: Path, out: Path, course: Path, flag: Path,
                       token: str, names=None) -> dict:
    """The hostile submissions (and the honest ones among them); ``{student: expected}``."""
    PLACES.update(tiny=str(root), subs=str(folder), out=str(out), course=str(course),
                  flag=str(flag), token=token, pwned=str(course / "course_utils" / "pwned.py"))
    folder.mkdir(parents=True, exist_ok=True)
    base = exercise_nb(root)
    out_ = {}
    for student, (build, points, words) in HOSTILE_CASES.items():
        if names is not None and student not in names:
            continue
        if build == "symlink":
            (folder / f"{student}.ipynb").symlink_to(root / "solutions" / f"{NAME}.ipynb")
        else:
            write_submission(folder, student, build(base))
        out_[student] = (points, words)
    return out_


def write_submission(folder: Path, student: str, content):
    path = folder / f"{student}.ipynb"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:  # raw JSON: nbformat.write would repair what some cases break on purpose
        path.write_text(json.dumps(content, indent=1), encoding="utf-8")
    return path


def make_class(root: Path, folder: Path, names=None) -> dict:
    """Write the adversarial submissions; returns ``{student: (points, words)}``."""
    folder.mkdir(parents=True, exist_ok=True)
    base = exercise_nb(root)
    out = {}
    for student, (build, points, words) in CASES.items():
        if names is not None and student not in names:
            continue
        write_submission(folder, student, build(base))
        out[student] = (points, words)
    return out


# ------------------------------------------------------------------ a Triton problem set
# Answers that are Triton code reach the template in two ways that plain functions do
# not: a device function called from a template kernel (its arguments are tiles, in the
# CPU interpreter or a compiled kernel) and a kernel the template launches (its result
# is what it writes into an output tensor). 2.3 is a plain function that works in place.
TRITON_NAME = "02_tiny_triton"

TRITON_SETUP = """import torch

from course_utils import device  # sets TRITON_INTERPRET before triton is imported
import triton
import triton.language as tl
from course_utils.checks import check_close
from course_utils.triton_intro import launch

torch.manual_seed(0)"""

TRITON_TEMPLATE = """@triton.jit
def normalise_kernel(X, OUT, D: tl.constexpr):
    row = tl.program_id(0)
    d = tl.arange(0, D)
    x = tl.load(X + row * D + d)
    tl.store(OUT + row * D + d, row_unit(x))


def normalise_rows(x):
    out = torch.empty_like(x)
    launch(normalise_kernel, (x.shape[0],), x, out, D=x.shape[1])
    return out"""

TRITON_ANSWERS = {
    "2.1": "# Exercise 2.1\n@triton.jit\ndef row_unit(x):\n"
           "    ### HINT: divide by the largest |x| of the row\n    ### BEGIN SOLUTION\n"
           "    return x / tl.max(tl.abs(x), 0)\n    ### END SOLUTION",
    "2.2": "# Exercise 2.2\n@triton.jit\ndef square_kernel(X, OUT, n, BLOCK: tl.constexpr):\n"
           "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
           "    ### HINT: mask the load and the store\n    ### BEGIN SOLUTION\n"
           "    mask = offs < n\n    x = tl.load(X + offs, mask=mask)\n"
           "    tl.store(OUT + offs, x * x, mask=mask)\n    ### END SOLUTION",
    "2.3": "# Exercise 2.3\ndef clamp_(t, lo):\n    ### HINT: in place\n    ### BEGIN SOLUTION\n"
           "    t.clamp_(min=lo)\n    ### END SOLUTION",
}

# (tensors on the course's device: the CPU, where Triton interprets, or the GPU)
TRITON_CHECKS = {
    "2.1": "# Check 2.1\nx = torch.randn(3, 8, device=device.DEVICE)\n"
           "check_close(normalise_rows(x), x / x.abs().amax(1, keepdim=True), name=\"unit rows\")",
    "2.2": "# Check 2.2\nx = torch.randn(20, device=device.DEVICE)\n"
           "out = torch.empty(20, device=device.DEVICE)\n"
           "square_kernel[(2,)](x, out, 20, BLOCK=16)\ncheck_close(out, x * x, name=\"squares\")",
    "2.3": "# Check 2.3\nt = torch.randn(6, device=device.DEVICE)\nu = t.clone()\nclamp_(u, 0.0)\n"
           "check_close(u, t.clamp(min=0.0), name=\"clamp_ in place\")",
}

TRITON_GOOD = {
    "2.1": "# Exercise 2.1\n@triton.jit\ndef row_unit(x):\n    m = tl.max(tl.abs(x), axis=0)\n"
           "    return x * (1.0 / m)",
    "2.2": "# Exercise 2.2\n@triton.jit\ndef square_kernel(X, OUT, n, BLOCK: tl.constexpr):\n"
           "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
           "    x = tl.load(X + offs, mask=offs < n, other=0.0)\n"
           "    tl.store(OUT + offs, x * x, mask=offs < n)",
    "2.3": "# Exercise 2.3\ndef clamp_(t, lo):\n    t.copy_(torch.where(t < lo, torch.full_like(t, lo), t))",
}

# a wrong device function, with the template's wrapper rebound to a torch version
# that gives the right rows in the student's kernel; and a clamp that is not in place
TRITON_CHEAT = {
    "2.1": TRITON_GOOD["2.1"].replace("x * (1.0 / m)", "x") + "\n\n\n"
           "def normalise_rows(x):\n    return x / x.abs().amax(1, keepdim=True)",
    "2.2": TRITON_GOOD["2.2"],
    "2.3": "# Exercise 2.3\ndef clamp_(t, lo):\n    return t.clamp(min=lo)",
}

TRITON_CASES = {
    "honest": (lambda nb: fill(nb, TRITON_GOOD), {"2.1": 1, "2.2": 1, "2.3": 1}, []),
    "untouched": (lambda nb: nb, {"2.1": 0, "2.2": 0, "2.3": 0}, ["NotImplementedError"]),
    # 2.1's cell replaces the template's wrapper by a PyTorch one: the wrapper is put back
    # after the cell, so the check launches the answer's kernel, which does not normalise
    "rebinds_template": (lambda nb: fill(nb, TRITON_CHEAT), {"2.1": 0, "2.2": 1, "2.3": 0},
                         ["unit rows", "clamp_ in place"]),
}


def make_triton_problem_set(root: Path) -> Path:
    """Write the Triton solution and build its exercise with the course pipeline."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [md("# Problem set 2 — tiny Triton\nA problem set for testing the grader."),
             code(TRITON_SETUP), code(TRITON_TEMPLATE)]
    for ex in ("2.1", "2.2", "2.3"):
        cells += [md(f"## Exercise {ex}"), code(TRITON_ANSWERS[ex]), code(TRITON_CHECKS[ex])]
    (root / "solutions").mkdir(parents=True, exist_ok=True)
    (root / "exercises").mkdir(parents=True, exist_ok=True)
    nbformat.write(_nb(cells), root / "solutions" / f"{TRITON_NAME}.ipynb")
    problems.build(root=root, write=True)
    return root / "solutions" / f"{TRITON_NAME}.ipynb"


def make_triton_class(root: Path, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    base = nbformat.read(root / "exercises" / f"{TRITON_NAME}.ipynb", as_version=4)
    out = {}
    for student, (build, points, words) in TRITON_CASES.items():
        write_submission(folder, student, build(base))
        out[student] = (points, words)
    return out


def triton_module_source() -> str:
    """The template's code with the official answers, as one Python module
    (``@triton.jit`` needs its functions in a file)."""
    return "\n\n\n".join([TRITON_SETUP, TRITON_TEMPLATE] + [TRITON_ANSWERS[e] for e in
                                                            ("2.1", "2.2", "2.3")]) + "\n"
