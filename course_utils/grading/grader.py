"""Grade a class: the official template, sandboxed kernels, and verdicts
decided outside any kernel that ran student code.

How one submission is graded (:func:`grade_student`, one ``try/finally``; a
thread pool runs several students at once):

1. its file is read once, read-only, without following links; only the source
   of each answer cell, matched by id, is taken (:mod:`.submissions`);
2. those sources go into the official template (the solution notebook, with
   any hidden tests) in place of the official answers, stripped of nbval
   markers; outputs, metadata and tags are not carried over (:mod:`.instrument`);
3. the result runs in a fresh kernel inside the sandbox (:mod:`.sandbox`), with
   a per-cell and a total time limit. That kernel only *ships data*: the values
   each answer defines and, for each answer function, every call the template
   made to it with its inputs and result. When answer code kills the kernel,
   the notebook runs again with that exercise's answer left out, so the
   exercises after it are still graded;
4. a second fresh sandboxed kernel runs the same template with no student code
   at all, under pytest's nbval plugin: each answer cell is replaced by those
   values and by stand-ins that return the recorded results (only for the
   inputs this kernel itself computes), and each check cell is a test item
   whose check calls are the real checks. Their verdicts are the grade. The
   notebook is kept in ``<out>/graded/`` so that ``pytest --nbval`` gives the
   same verdicts again.

Answer code that reaches for the grading hooks or the course's guards scores
zero for that exercise; answers that are copies of a ``course_utils`` function
or of the official answer are flagged for review (:mod:`.similarity`).
Results are written atomically, one file per student as soon as that student
is done, then the class tables.
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_utils import problems
from course_utils.grading import codec, instrument, sandbox, similarity, submissions
from course_utils.grading.runner import write_atomic

GRADER_VERSION = 2
ROOT = Path(__file__).resolve().parents[2]
_CHECK_MODULES = ("course_utils", "torch.testing")


class GradingError(ValueError):
    """Bad arguments or an ungradable template; the message says what to fix."""


# --------------------------------------------------------------------------- template
@dataclass
class Template:
    name: str
    path: Path
    nb: object
    exercises: list
    sha256: str

    @property
    def max_points(self) -> int:
        return sum(e.points for e in self.exercises)


def load_template(assignment, root: Path | None = None) -> Template:
    """The official template for ``assignment``: a problem-set name such as
    ``01_register_machine`` (or its prefix ``01``), looked up in
    ``<root>/solutions/``, or the path of a solution notebook."""
    if not isinstance(assignment, (str, os.PathLike)) or not str(assignment):
        raise GradingError(f"assignment: expected a problem-set name like '01_register_machine' "
                           f"or a solution .ipynb path, got {assignment!r}")
    root = Path(root) if root is not None else ROOT
    p = Path(assignment)
    if p.suffix == ".ipynb" and p.is_file():
        path = p
    else:
        sols = sorted((root / "solutions").glob(f"{p.name}*.ipynb"))
        exact = [s for s in sols if s.stem == p.name]
        if exact:
            path = exact[0]
        elif len(sols) == 1:
            path = sols[0]
        else:
            have = ", ".join(s.stem for s in sorted((root / "solutions").glob("*.ipynb")))
            raise GradingError(f"assignment: no single problem set matches {str(assignment)!r} "
                               f"in {root / 'solutions'} (have: {have or 'none'})")
    raw = path.read_bytes()
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
        nb = problems.normalise_solution(nb, path)
    except (problems.ProblemSetError, ValueError) as e:
        raise GradingError(f"template {path}: {e}") from None
    exs = instrument.exercises_of(nb, str(path))
    return Template(path.stem, path, nb, exs, hashlib.sha256(raw).hexdigest())


# --------------------------------------------------------------------------- running
@dataclass
class _Class:
    """What grading every student of a class shares."""
    tpl: Template
    sandbox: sandbox.Sandbox
    jobs: Path
    out_dir: Path
    subs_root: Path
    cell_timeout: float
    timeout: float
    junit: bool = False
    resume: bool = False
    ref: "Reference | None" = None
    copies: similarity.Index | None = None
    official_refs: dict = field(default_factory=dict)
    out_names: dict = field(default_factory=dict)     # student -> file name of its outputs


def _run(cls: _Class, make, *, inputs=None, nbval=False, keep_as=None):
    """Build a notebook with ``make(inputs_path) -> (nb, roles)``, run it in the
    sandbox and return ``(run, roles, log tail)``; ``run`` is None when it
    produced no result. ``keep_as``: also copy the notebook (and its inputs and
    JUnit report) into the output folder under that name."""
    job = Path(tempfile.mkdtemp(prefix="run-", dir=cls.jobs))
    try:
        name = keep_as or "graded"
        inputs_path = None
        if inputs is not None:
            import torch
            inputs_file = job / f"{name}.inputs.pt"
            torch.save(codec.encode(inputs), inputs_file)
            inputs_path = inputs_file.name if nbval else str(inputs_file)
        nb, roles = make(inputs_path)
        nb_path = job / f"{name}.ipynb"
        nbformat.write(nb, nb_path)
        (job / "work").mkdir()
        runner = cls.sandbox.stage / "course_utils" / "grading" / "runner.py"
        # the result goes to a file whose random name only the runner learns (it reads and
        # removes run.json.name before the notebook's code runs): a run.json the notebook
        # writes itself is never read
        result_name = secrets.token_hex(16) + ".json"
        (job / "run.json.name").write_text(result_name, encoding="ascii")
        argv = [runner, nb_path, job / "run.json", "--cwd", job if nbval else job / "work",
                "--cell-timeout", cls.cell_timeout, "--timeout", cls.timeout] + \
            (["--nbval", "--junit-xml", job / "junit.xml"] if nbval else [])
        cls.sandbox.run(job, argv, job if nbval else job / "work", job / "runner.log",
                        cls.timeout + 120)
        # the run could write its folder: what is read back from it is read without
        # following a link, and only from a regular file (a link named runner.log would
        # otherwise put any file the grader may read into the feedback)
        run = _read_run(job / result_name)
        tail = (_regular_bytes(job / "runner.log", 1500, tail=True) or b"").decode(
            "utf-8", "replace")
        if keep_as and run is not None:
            graded = cls.out_dir / "graded"
            graded.mkdir(exist_ok=True)
            nbformat.write(nb, graded / nb_path.name)           # what was run, from memory
            if inputs is not None:
                torch.save(codec.encode(inputs), graded / f"{name}.inputs.pt")
            junit = _regular_bytes(job / "junit.xml", 64 * 2**20) if cls.junit else None
            if junit is not None:
                (cls.out_dir / "junit").mkdir(exist_ok=True)
                write_atomic(cls.out_dir / "junit" / f"{name}.xml", junit.decode("utf-8", "replace"))
        return run, roles, tail
    finally:
        shutil.rmtree(job, ignore_errors=True)


def _regular_bytes(path: Path, limit: int, tail: bool = False) -> bytes | None:
    """The bytes of ``path`` if it is a regular file, opened without following a link:
    ``None`` for a link, a folder, a FIFO, a device or a file larger than ``limit``
    (with ``tail``, its last ``limit`` bytes instead)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > limit:
            if not tail:
                return None
            f.seek(st.st_size - limit)
        return f.read(limit)


def _read_run(path: Path) -> dict | None:
    raw = _regular_bytes(path, 512 * 2**20)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("cells"), list) else None


def _records(run, roles, nonce, kinds, any_cell=False, where=None):
    """``{(kind, key): [blob, ...]}`` of the records with this run's nonce, from
    check cells (or from any cell with ``any_cell``, and there only those that
    ``where(kind, key, role, exercise)`` accepts), and how many others were seen."""
    out, stray = {}, 0
    for i, info in enumerate(run["cells"][: len(roles)]):
        role, ex = roles[i]
        recs = info.get("records", []) if isinstance(info, dict) else []
        for rec in recs if isinstance(recs, list) else []:
            if not isinstance(rec, dict) or rec.get("nonce") != nonce or rec.get("kind") not in kinds:
                stray += 1
                continue
            key = rec.get("key")
            if not isinstance(key, str) or not (any_cell or (role == "check"
                                                             and key.startswith(f"{ex}/"))):
                stray += 1
                continue
            if where is not None and not where(rec["kind"], key, role, ex):
                stray += 1
                continue
            out.setdefault((rec["kind"], key), []).append(rec.get("blob"))
    return out, stray


# --------------------------------------------------------------------------- reference
@dataclass
class Reference:
    rng: dict              # template cell -> random state of the official run
    order: dict            # exercise -> [verdict keys] the official answers produce
    hidden: set            # verdict keys inside hidden-test regions
    labels: dict = field(default_factory=dict)   # verdict key -> the check's name
    seconds: float = 0.0
    notes: list = field(default_factory=list)


def _decoded(blobs):
    """First readable record of each key: ``{key: payload}``. A record whose tensors
    would be too large to copy (:class:`codec.TooLarge`), or records of one run that
    together would be, fail the submission: nothing that large is ever built."""
    out = {}
    budget = codec.Budget()
    for key, items in blobs.items():
        for blob in items:
            try:
                out[key] = codec.decode(codec.loads(blob), budget)
                break
            except codec.TooLarge:
                raise
            except codec.CodecError:
                continue
    return out


# where each kind of the student kernel's records may come from: a call record from the
# template's own cells (only they call the answers; the recorder publishes it), an export
# from the exercise's own export cell; answer code can publish records too (it runs in
# that kernel), so a record from anywhere else is dropped. A tamper flag only costs the
# one who raises it and counts from anywhere.
_CALL_ROLES = ("code", "check")


def _from_its_cell(kind, key, role, ex) -> bool:
    if kind == "call":
        return role in _CALL_ROLES
    if kind == "export":
        return key.endswith("/__tampered__") or (role == "export" and key.startswith(f"{ex}/"))
    return True


def _exports(run, roles, nonce):
    recs, stray = _records(run, roles, nonce, {"export", "call", "rng"}, any_cell=True,
                           where=_from_its_cell)
    dec = _decoded(recs)
    exports = {k: v for (kind, k), v in dec.items() if kind == "export" and isinstance(v, dict)}
    calls = {}
    for (kind, k), v in sorted(dec.items(), key=lambda kv: _call_order(kv[0][1])):
        if kind == "call" and isinstance(v, dict) and isinstance(v.get("name"), str):
            calls.setdefault(v["name"], []).append(v)
    rng = {k: v for (kind, k), v in dec.items() if kind == "rng"}
    return exports, calls, rng


def _forged(run, roles, nonce, exercises) -> dict:
    """``{exercise: [what]}``: grading records in a student's run that its kernel's own
    hooks never make (answer code runs in that kernel and can reach them): one under
    another nonce (a hook's record spoiled), a call record from an answer or hook cell, an
    export from another cell than its exercise's export cell, a call recorded twice. Each
    costs the exercise of the cell it came from, or every exercise when that cell belongs
    to none."""
    out, seen = {}, set()
    for i, info in enumerate(run["cells"][: len(roles)]):
        role, ex = roles[i]
        recs = info.get("records", []) if isinstance(info, dict) else []
        for rec in recs if isinstance(recs, list) else []:
            if not isinstance(rec, dict):
                continue
            kind, key = rec.get("kind"), rec.get("key")
            what = None
            if rec.get("nonce") != nonce:
                what = "a grading record under another nonce"
            elif kind in ("call", "export") and isinstance(key, str) and \
                    not _from_its_cell(kind, key, role, ex):
                what = f"a grading record ({kind} {key[:80]}) from a cell that does not make it"
            elif kind == "call" and isinstance(key, str):
                if key in seen:
                    what = f"the call {key[:80]} recorded twice"
                seen.add(key)
            if what:
                for e in ([ex] if ex else exercises):
                    out.setdefault(e, []).append(what)
    return out


def _call_order(key):
    name, _, i = key.rpartition("/")
    return (name, int(i) if i.isdigit() else 0)


def _verify(cls: _Class, exports, calls, rng, sources, keep_as=None):
    """The checking run (under nbval) for these exported values and calls, with
    ``sources`` the answer cells' sources by exercise (for checks that read them):
    ``(run, roles, nonce, tail)``."""
    nonce = secrets.token_hex(16)

    def make(inputs_path):
        return instrument.build(cls.tpl.nb, cls.tpl.exercises, "verify", nonce=nonce,
                                inputs_path=inputs_path)
    run, roles, tail = _run(cls, make, inputs={"rng": rng, "exports": exports, "calls": calls,
                                               "sources": sources},
                            nbval=True, keep_as=keep_as)
    return run, roles, nonce, tail


def _verdicts(run, roles, nonce, kind="verdict"):
    """``{key: payload}`` of the checking run's verdicts (or, with ``kind="stop"``, of
    the check calls whose arguments could not be computed, with the reason)."""
    recs = {}
    for rec in run.get("records", []) if isinstance(run.get("records"), list) else []:
        if isinstance(rec, dict) and rec.get("nonce") == nonce and rec.get("kind") == kind \
                and isinstance(rec.get("key"), str):
            recs.setdefault((kind, rec["key"]), []).append(rec.get("blob"))
    return {k: v for (_, k), v in _decoded(recs).items() if isinstance(v, dict)}


def prepare_reference(cls: _Class) -> Reference:
    """Run the official solution (recording what a student's kernel records),
    then check it; every check must pass, and each check function must come
    from ``course_utils`` or ``torch.testing`` so the checking run uses its own copy."""
    tpl = cls.tpl
    t0 = time.monotonic()
    nonce = secrets.token_hex(16)
    run, roles, tail = _run(cls, lambda _: instrument.build(tpl.nb, tpl.exercises, "reference",
                                                            nonce=nonce))
    if run is None:
        raise GradingError(f"template {tpl.path.name}: the official solution did not finish "
                           f"running:\n{tail}")
    _template_errors(tpl, run, roles, "official solution")
    exports, calls, rng = _exports(run, roles, nonce)
    official = {e.id: tpl.nb.cells[e.answer_index].source for e in tpl.exercises}
    vrun, vroles, vnonce, tail = _verify(cls, exports, calls, rng, official)
    if vrun is None:
        raise GradingError(f"template {tpl.path.name}: checking the official solution did not "
                           f"finish:\n{tail}")
    _template_errors(tpl, vrun, vroles, "official solution, checked from its exported values")
    verdicts = _verdicts(vrun, vroles, vnonce)
    hidden_sites = {}
    for e in tpl.exercises:
        _, sites = instrument.rewrite_check(tpl.nb.cells[e.check_index].source, e.id)
        hidden_sites[e.id] = {s for s, _, h in sites if h}
    order, hidden, labels = {e.id: [] for e in tpl.exercises}, set(), {}
    for key, v in verdicts.items():
        ex, site, _ = key.rsplit("/", 2)
        where = f"template {tpl.path.name}, check {key}"
        mod = str(v.get("fn", "")).split(":")[0]
        if not any(mod == m or mod.startswith(m + ".") for m in _CHECK_MODULES):
            raise GradingError(f"{where}: the check function {v.get('fn')} is not from "
                               "course_utils or torch.testing, so the verifier cannot trust it")
        if not v.get("passed"):
            raise GradingError(f"{where}: fails when verified from the official answers' "
                               f"exported values: {v.get('message')}")
        order.setdefault(ex, []).append(key)
        labels[key] = str(v.get("label") or key)
        if int(site[1:]) in hidden_sites.get(ex, ()):
            hidden.add(key)
    for e in tpl.exercises:
        if not order.get(e.id):
            raise GradingError(f"template {tpl.path.name}: the check of exercise {e.id} made no "
                               "check call when the official solution was verified")
        order[e.id].sort(key=_key_order)
    ref = Reference(rng, order, hidden, labels, time.monotonic() - t0)
    for e in tpl.exercises:
        names = instrument.exposed_names(tpl.nb.cells[e.check_index].source)
        if names:
            ref.notes.append(
                f"check {e.id} computes {', '.join(names)} in statements of its own; they run in "
                "the student's kernel too. Writing the expected expression inside the check call "
                "keeps it out of reach of answer code.")
    return ref


def _template_errors(tpl, run, roles, what):
    for i, info in enumerate(run["cells"][: len(roles)]):
        if info.get("status") != "ok":
            role, ex = roles[i]
            where = f"{role} cell of exercise {ex}" if ex else f"cell {i} ({role})"
            raise GradingError(f"template {tpl.path.name}: the {what} fails in its {where}: "
                               f"{info.get('why') or ''} {info.get('ename', '')}: "
                               f"{info.get('evalue', '')}".strip())


def _key_order(key):
    _, site, hit = key.rsplit("/", 2)
    return (int(site[1:]), int(hit))


# --------------------------------------------------------------------------- one student
def _cell_story(run, roles, ex, role, after=None):
    """What went wrong in that cell, or None. ``after``: the index of the first cell that
    runs hidden tests; an error of a cell after it is named without its message, which
    answer code could fill with values it saw during those tests."""
    if run is None:
        return None
    for i, (r, e) in enumerate(roles):
        if r == role and e == ex and i < len(run["cells"]):
            info = run["cells"][i]
            st = info.get("status")
            if st == "ok":
                return None
            if st == "error":
                name = str(info.get("ename", ""))[:100]
                if after is not None and i > after:
                    return (f"raised {name} (its message is not shown: this cell runs after "
                            "hidden tests, whose values it could carry; run your notebook to "
                            "see it)")
                return f"raised {name}: {str(info.get('evalue', ''))[:500]}"
            return f"did not finish: {info.get('why') or st}"
    return None


def _before_story(run, roles, upto):
    """A kernel death, timeout or other stop before cell ``upto``."""
    if run is None:
        return None
    for i, (role, ex) in enumerate(roles[:upto]):
        info = run["cells"][i] if i < len(run["cells"]) else {}
        if info.get("status") in ("dead", "timeout"):
            where = f"the {role} cell of exercise {ex}" if ex else f"code cell {i}"
            return f"{where}: {info.get('why')}"
    return None


def grade_run(tpl: Template, ref: Reference, sub, srun, sroles, vrun, vroles, vnonce,
              extra: dict | None = None) -> dict:
    """Scores for one student: verdicts from the checking run; explanations
    from both runs. ``extra`` (per exercise): ``crashes`` (the kernel died in
    it: named first), ``tampered`` and ``elsewhere`` (zero, with the reason
    first), ``review`` (flags for the instructor, no effect on the score)."""
    extra = extra or {}
    verdicts = _verdicts(vrun, vroles, vnonce) if vrun is not None else {}
    stops = _verdicts(vrun, vroles, vnonce, "stop") if vrun is not None else {}
    exercises, late_notes = [], []
    with_hidden = {ex for ex, keys in ref.order.items() if any(k in ref.hidden for k in keys)}
    after = next((i for i, (role, ex) in enumerate(sroles or [])
                  if role == "check" and ex in with_hidden), None)
    for e in tpl.exercises:
        item = {"exercise": e.id, "max": e.points, "points": 0, "passed": False,
                "reason": "", "checks": [], "review": list(extra.get("review", {}).get(e.id, []))}
        if e.id in sub.problems:
            item["reason"] = sub.problems[e.id]
            exercises.append(item)
            continue
        first = []
        if e.id in extra.get("crashes", {}):
            first.append(f"your code crashed the kernel: {extra['crashes'][e.id]}; this answer "
                         "was left out so that the exercises after it could be graded")
        if extra.get("tampered", {}).get(e.id):
            first.append("your answer reached into " + ", ".join(extra["tampered"][e.id][:5])
                         + ", which answers must not touch; this exercise scores zero")
        for name, other in extra.get("elsewhere", {}).get(e.id, []):
            first.append(f"{name} is defined in the answer cell of exercise {other}, not in "
                         f"this exercise's; only what the answer cell of {e.id} defines counts "
                         "for it")
        if first:
            item["reason"] = "; ".join(first)
            exercises.append(item)
            continue
        fails = []
        for key in ref.order[e.id]:
            v = verdicts.get(key)
            hidden = key in ref.hidden
            label = ref.labels.get(key, key)
            if v is None:
                why = str((stops.get(key) or {}).get("message", ""))[:1000]
                ok, msg = False, (f"not reached: computing its arguments raised {why}" if why
                                  else "not reached: the check stopped before this call")
            else:
                ok, msg = bool(v.get("passed") is True), str(v.get("message", ""))[:2000]
            if hidden and not ok:
                msg = f"a hidden test ({label or 'unnamed'}) failed" if v else \
                    "a hidden test was not reached"
            item["checks"].append({"check": label or key, "hidden": hidden, "passed": ok,
                                   "message": "" if ok else msg})
            if not ok:
                fails.append(msg)
        if not fails:
            item.update(points=e.points, passed=True)
            ans = _cell_story(srun, sroles, e.id, "answer", after)
            if ans:
                late_notes.append(f"exercise {e.id} passed, but your answer cell {ans}")
        else:
            why = [fails[0]] + ([f"({len(fails) - 1} more check(s) failed)"] if len(fails) > 1 else [])
            ans = _cell_story(srun, sroles, e.id, "answer", after)
            idx = next((i for i, r in enumerate(sroles) if r == ("answer", e.id)), len(sroles))
            before = _before_story(srun, sroles, idx)
            # the check cell's own error may come from a hidden test (answer code replayed
            # there raises what the student's code raised): not shown when one failed
            hidden_failed = any(c["hidden"] and not c["passed"] for c in item["checks"])
            vchk = None if hidden_failed else _cell_story(vrun, vroles, e.id, "check")
            if before:
                why.append(f"stopped earlier: {before}")
            if ans:
                why.append(f"your answer cell {ans}")
            if vchk and "ExerciseFailed" not in vchk and vchk not in " ".join(why):
                why.append(f"the check cell {vchk}")
            item["reason"] = "; ".join(why)
        exercises.append(item)
    notes = list(sub.notes) + late_notes
    if srun is not None:
        dropped = sum(c.get("dropped_chars", 0) for c in srun["cells"] if isinstance(c, dict))
        if dropped:
            notes.append(f"{dropped} characters of printed output were discarded")
        if srun.get("outcome") not in ("completed", None):
            notes.append(f"your notebook's run ended early: {srun.get('outcome')}")
        stray = _stray(srun, sroles)
        if stray:
            notes.append(f"{stray} grading record(s) published by answer code were ignored")
    return {"exercises": exercises, "notes": notes}


def _stray(run, roles):
    n = 0
    for i, info in enumerate(run["cells"][: len(roles)]):
        if roles[i][0] == "answer" and isinstance(info, dict):
            n += sum(1 for r in info.get("records", []) if isinstance(r, dict)
                     and r.get("kind") in ("export", "verdict", "stop", "value", "rng"))
    return n


def _student_result(tpl, sub, body, status, seconds, isolation=""):
    total = sum(x["points"] for x in body.get("exercises", []))
    return {"grader_version": GRADER_VERSION, "assignment": tpl.name,
            "template_sha256": tpl.sha256, "student": sub.student,
            "submission": str(sub.path) if sub.path else None,
            "submission_sha256": sub.sha256, "status": status, "total": total,
            "max": tpl.max_points, "seconds": round(seconds, 2), "isolation": isolation, **body}


def _zero_body(tpl, reason):
    return {"exercises": [{"exercise": e.id, "max": e.points, "points": 0, "passed": False,
                           "reason": reason, "checks": [], "review": []}
                          for e in tpl.exercises],
            "notes": []}


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e"
                      "\u2066-\u2069\ufeff]")
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>&])")
# letters that show as nothing (Hangul fillers), on top of the format characters
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")


def _visible(text: str) -> str:
    """Control, format (direction marks, zero-width and invisible characters) and
    blank characters shown as ``?``."""
    text = _CONTROL.sub("?", text)
    if text.isascii():
        return text
    return "".join("?" if unicodedata.category(c) in ("Cf", "Co", "Cs") or c in _BLANK_LETTERS
                   else c for c in text)


def md_inline(text) -> str:
    """Student-controlled text (a name) as one line of inert Markdown: control and
    direction-changing characters shown as ``?``, newlines as spaces, every Markdown
    and HTML character escaped (``<`` as ``&lt;``)."""
    text = _visible(str(text).replace("\r", " ").replace("\n", " ").replace("\t", " "))
    return _MD_SPECIAL.sub(lambda m: {"<": "&lt;", ">": "&gt;", "&": "&amp;"}.get(
        m.group(1), "\\" + m.group(1)), text)


def md_block(text) -> str:
    """Text that may hold anything a student wrote (an error message, a printed value)
    as a fenced code block, whose fence is longer than any run of backticks in it: no
    heading, table, link or HTML in it is rendered."""
    text = _visible(str(text).replace("\r\n", "\n").replace("\r", "\n"))
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def feedback_text(res: dict) -> str:
    """The student's feedback as Markdown. Everything that a submission can influence
    (its name, error messages, check messages, notes) is either escaped or inside a
    fenced code block; headings, the score and the table come from the grader only."""
    lines = [f"# Feedback: {res['assignment']} — {md_inline(res['student'])}", "",
             f"**Score: {int(res['total'])} / {int(res['max'])}**", ""]
    if res["status"] != "graded":
        lines += ["This submission could not be graded normally:", "",
                  md_block(res.get("error", res["status"])), ""]
    crashes = [n for n in res.get("notes", []) if n.startswith("your code crashed")]
    if crashes:
        lines += ["**Your code crashed the kernel:**", "", md_block(crashes[0]), ""]
    lines += ["| exercise | points | result |", "| --- | --- | --- |"]
    for x in res["exercises"]:
        lines.append(f"| {x['exercise']} | {int(x['points'])} / {int(x['max'])} | "
                     f"{'passed' if x['passed'] else 'not passed'} |")
    for x in res["exercises"]:
        lines += ["", f"## Exercise {x['exercise']}: "
                      f"{'passed' if x['passed'] else 'not passed'} "
                      f"({int(x['points'])} / {int(x['max'])})"]
        if x["passed"]:
            lines.append("All checks passed.")
            continue
        if x["reason"]:
            lines += ["Why:", "", md_block(x["reason"])]
        for c in x["checks"]:
            mark = "passed" if c["passed"] else "FAILED"
            # (exercise ids and check names come from the official template)
            lines += ["", f"- `{c['check']}`"
                      f"{' (hidden test)' if c['hidden'] else ''}: {mark}"]
            if c["message"] and not c["passed"]:
                lines += ["", md_block(c["message"])]
    if res.get("notes"):
        lines += ["", "## Notes", "", md_block("\n".join(f"- {n}" for n in res["notes"]))]
    return "\n".join(lines) + "\n"


def _write_student(out_dir: Path, safe: str, res: dict):
    write_atomic(out_dir / "results" / f"{safe}.json", json.dumps(res, indent=1, sort_keys=True))
    write_atomic(out_dir / "feedback" / f"{safe}.md", feedback_text(res))


def _crash_site(run, roles):
    """``(exercise, story)`` of the first cell where the kernel died or could not
    be stopped, charged to the exercise whose answer ran last before it."""
    last = None
    for i, (role, ex) in enumerate(roles[: len(run["cells"])]):
        if role == "answer":
            last = ex
        info = run["cells"][i] if isinstance(run["cells"][i], dict) else {}
        stuck = info.get("status") == "timeout" and run.get("outcome") == "stuck cell" and \
            "could not" in str(info.get("why", ""))
        if info.get("status") == "dead" or stuck:
            where = f"the {role} cell of exercise {ex}" if ex else f"code cell {i}"
            return (ex if role in ("answer", "check", "export", "hook") and ex else last,
                    f"{where}: {info.get('why')}")
    return None


def _student_runs(cls: _Class, sub):
    """The student's notebook, run until it completes: when the kernel dies (or a
    cell cannot be stopped), run it again with that exercise's answer left out
    (its stub instead). ``(run, roles, nonce, tail, crashes)``."""
    answers, crashes = dict(sub.answers), {}
    stubs = {e.id: e.stub for e in cls.tpl.exercises}
    while True:
        nonce = secrets.token_hex(16)

        def make(inputs_path, nonce=nonce, answers=dict(answers)):
            return instrument.build(cls.tpl.nb, cls.tpl.exercises, "student", answers,
                                    nonce=nonce, inputs_path=inputs_path)
        run, roles, tail = _run(cls, make, inputs={"rng": cls.ref.rng})
        site = _crash_site(run, roles) if run is not None else None
        if site is None or site[0] is None or site[0] in crashes or site[0] not in stubs:
            return run, roles, nonce, tail, crashes
        crashes[site[0]] = site[1]
        answers[site[0]] = stubs[site[0]]


def _extra(cls: _Class, sub, exports, calls, crashes) -> dict:
    """Crashes, tampering, names answered in another exercise's cell, copies."""
    tampered, elsewhere, review = {}, {}, {}
    owner = {}
    for key, v in exports.items():
        ex, _, name = key.rpartition("/")
        kind = v.get("kind")
        if kind == "tampered":
            tampered.setdefault(ex, []).extend(str(w) for w in v.get("what", [])
                                               if isinstance(w, str))
        elif kind == "elsewhere":
            elsewhere.setdefault(ex, []).append((name, str(v.get("exercise", "?"))))
        elif kind == "function":
            owner[name] = ex
    for name, recs in calls.items():
        for r in recs:
            what = r.get("tampered")
            if isinstance(what, list) and owner.get(name):
                tampered.setdefault(owner[name], []).extend(str(w) for w in what)
    for e in cls.tpl.exercises:
        src = sub.answers.get(e.id)
        if not src:
            continue
        refs = [r for r in instrument.tamper_references(src)
                if r not in cls.official_refs.get(e.id, ())]
        if refs:
            tampered.setdefault(e.id, []).extend(refs)
        if cls.copies is not None:
            flags = cls.copies.flags(e.id, src)
            if flags:
                review[e.id] = flags
    tampered = {ex: list(dict.fromkeys(w)) for ex, w in tampered.items()}
    return {"crashes": crashes, "tampered": tampered, "elsewhere": elsewhere, "review": review}


def grade_student(cls: _Class, student: str, path) -> dict:
    """Grade one student, start to end: read, run in the sandbox, check, write the
    result. Whatever goes wrong (any exception, from the submission's data or the
    grader) is this student's ``error`` result; every run's folder and process is
    gone when it returns."""
    t0 = time.monotonic()
    safe = cls.out_names.get(student) or submissions.safe_name(student)
    sub = submissions.Submission(student, path)
    iso = cls.sandbox.isolation.describe()
    res = None
    try:
        sub = submissions.read(student, path, cls.tpl.exercises, cls.subs_root)
        if sub.invalid is not None:
            res = _student_result(cls.tpl, sub, _zero_body(cls.tpl, sub.invalid), "invalid", 0.0)
            res["error"] = sub.invalid
            return res
        if cls.resume:
            old = _load_json(cls.out_dir / "results" / f"{safe}.json")
            if old and old.get("submission_sha256") == sub.sha256 and \
                    old.get("template_sha256") == cls.tpl.sha256 and \
                    old.get("grader_version") == GRADER_VERSION and old.get("status") == "graded":
                old["kept"] = True
                res = old
                return old
        srun, sroles, snonce, tail, crashes = _student_runs(cls, sub)
        if srun is None:
            res = _student_result(cls.tpl, sub, _zero_body(cls.tpl, "your notebook's run "
                                                           "produced no result"), "error",
                                  time.monotonic() - t0, iso)
            res["error"] = "your notebook's run produced no result: " + tail[-300:]
            return res
        exports, calls, _ = _exports(srun, sroles, snonce)
        for ex, what in _forged(srun, sroles, snonce, [e.id for e in cls.tpl.exercises]).items():
            mark = exports.setdefault(f"{ex}/__tampered__", {"name": "__tampered__",
                                                             "kind": "tampered", "what": []})
            if mark.get("kind") == "tampered" and isinstance(mark.get("what"), list):
                mark["what"] = mark["what"] + sorted(set(what))[:5]
        sources = {e.id: (sub.answers[e.id] if e.id in sub.answers and e.id not in crashes
                          else e.stub) for e in cls.tpl.exercises}
        vrun, vroles, vnonce, vtail = _verify(cls, exports, calls, cls.ref.rng, sources,
                                              keep_as=safe)
        if vrun is None:
            res = _student_result(cls.tpl, sub, _zero_body(cls.tpl, "the checking run produced "
                                                           "no result"), "error",
                                  time.monotonic() - t0, iso)
            res["error"] = "the checking run produced no result: " + vtail[-300:]
            return res
        extra = _extra(cls, sub, exports, calls, crashes)
        body = grade_run(cls.tpl, cls.ref, sub, srun, sroles, vrun, vroles, vnonce, extra)
        body["notes"] = [f"your code crashed the kernel in {ex}: {why}" for ex, why in
                         crashes.items()] + body["notes"]
        if extra["review"]:
            body["notes"].append("flagged for the instructor's review (no effect on the "
                                 "score): " + "; ".join(f"{ex}: {', '.join(f)}" for ex, f in
                                                        extra["review"].items()))
        body["graded_notebook"] = f"graded/{safe}.ipynb"
        res = _student_result(cls.tpl, sub, body, "graded", time.monotonic() - t0, iso)
        return res
    except codec.TooLarge as e:
        res = _student_result(cls.tpl, sub, _zero_body(cls.tpl, "records too large"), "error",
                              time.monotonic() - t0, iso)
        res["error"] = f"the grading records of your notebook's run were refused: {e}"[:1000]
        return res
    except BaseException as e:  # noqa: BLE001 - one student's trouble stays theirs
        if isinstance(e, KeyboardInterrupt) and threading.current_thread() is \
                threading.main_thread():
            raise
        res = _student_result(cls.tpl, sub, _zero_body(cls.tpl, "grading error"), "error",
                              time.monotonic() - t0, iso)
        res["error"] = f"the grader failed on this submission: {type(e).__name__}: {e}"[:1000]
        return res
    finally:
        if res is not None and not res.get("kept"):
            with contextlib.suppress(Exception):
                _write_student(cls.out_dir, safe, res)


# --------------------------------------------------------------------------- the class
@dataclass
class ClassResult:
    assignment: str
    out_dir: Path
    students: dict          # student -> result dict
    exercises: list         # [(id, points)]
    seconds: float
    notes: list
    isolation: str = ""

    def scores(self) -> dict:
        return {s: r["total"] for s, r in self.students.items()}


def grade(assignment, submissions_path, out_dir, *, workers: int = 2, cell_timeout: float = 60,
          timeout: float = 600, resume: bool = False, root=None, progress=None,
          isolation: str = "auto", junit_xml: bool = False,
          memory_mb: int = 8192) -> ClassResult:
    """Grade every submission in ``submissions_path`` (a notebook, a folder of
    ``<student>.ipynb`` or an nbgrader ``submitted/`` tree) against the official
    template of ``assignment``; write the tables and feedback into ``out_dir``.
    ``isolation``: ``auto`` (all the sandbox this machine offers), ``namespaces``,
    ``landlock`` or ``limits`` (see :mod:`course_utils.grading.sandbox`);
    ``junit_xml``: also write ``<out>/junit/<student>.xml``."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise GradingError(f"workers: expected a positive int, got {workers!r}")
    for nm, v in (("cell_timeout", cell_timeout), ("timeout", timeout)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise GradingError(f"{nm}: expected a positive number of seconds, got {v!r}")
    if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 0:
        raise GradingError(f"memory_mb: expected a number of MiB (0 for no limit), got "
                           f"{memory_mb!r}")
    if submissions_path is None or not Path(submissions_path).exists():
        raise GradingError(f"submissions: expected an .ipynb file or a folder, got "
                           f"{submissions_path!r} (not found)")
    say = progress or (lambda msg: None)
    t_start = time.monotonic()
    if out_dir is None or (Path(out_dir).exists() and not Path(out_dir).is_dir()):
        raise GradingError(f"out_dir: expected a folder for the scores and feedback, got "
                           f"{out_dir!r}")
    try:
        iso = sandbox.detect(isolation)
    except sandbox.SandboxError as e:
        raise GradingError(str(e)) from None
    tpl = load_template(assignment, root)
    try:
        found, notes = submissions.discover(submissions_path, tpl.name)
    except (OSError, ValueError) as e:
        raise GradingError(str(e)) from None
    out_dir = Path(out_dir)
    src = Path(submissions_path).resolve()
    subs_root = src if src.is_dir() else src.parent
    if out_dir.resolve() == subs_root or subs_root in out_dir.resolve().parents:
        raise GradingError(f"out_dir: {out_dir} is inside the submissions folder {subs_root}; "
                           "choose a folder outside it")
    for sub_dir in ("results", "feedback"):
        (out_dir / sub_dir).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="course-grade-"))
    results = {}
    box = None
    try:
        (scratch / "jobs").mkdir()
        course_root = Path(root).resolve() if root is not None else ROOT
        box = sandbox.Sandbox(scratch, [ROOT, course_root, tpl.path.resolve().parent,
                                        out_dir.resolve(), subs_root], iso,
                              memory_mb=memory_mb, cpu_seconds=2 * timeout + 120)
        cls = _Class(tpl, box, scratch / "jobs", out_dir, subs_root, cell_timeout, timeout,
                     junit=junit_xml, resume=resume,
                     out_names=submissions.output_names([s for s, _ in found]))
        official = {e.id: tpl.nb.cells[e.answer_index].source for e in tpl.exercises}
        cls.official_refs = {ex: set(instrument.tamper_references(src))
                             for ex, src in official.items()}
        cls.copies = similarity.Index.build(sandbox.PACKAGE, official)
        # a class of unreadable files needs no kernel: read first, cheaply
        readable = [(s, p) for s, p in found
                    if p is not None and _quick_ok(p, subs_root)]
        if readable:
            say(f"running the official solution of {tpl.name} ({iso.describe()}) ...")
            cls.ref = prepare_reference(cls)
            notes.extend(cls.ref.notes)
            say(f"reference ready in {time.monotonic() - t_start:.1f} s; grading {len(found)} "
                f"submission(s) with {workers} worker(s)")
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(grade_student, cls, s, p): s for s, p in found}
            try:
                for f in as_completed(futures):
                    student = futures[f]
                    res = f.result()
                    results[student] = res
                    shown = submissions.printable(student)
                    if res.pop("kept", False):
                        say(f"{shown}: kept earlier result {res['total']}/{res['max']}")
                        continue
                    say(f"{shown}: {res['total']}/{res['max']}"
                        + (f" ({res['status']}: {submissions.printable(res.get('error', '')[:120])})"
                           if res["status"] != "graded" else f" ({res['seconds']:.1f} s)"))
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                box.kill_all()
                raise
    finally:
        if box is not None:
            box.close()
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - t_start
    result = ClassResult(tpl.name, out_dir, dict(sorted(results.items())),
                         [(e.id, e.points) for e in tpl.exercises], seconds, notes,
                         iso.describe())
    write_tables(result, tpl)
    return result


def _quick_ok(path, root) -> bool:
    try:
        raw = submissions.open_no_follow(path, root)
        return isinstance(json.loads(raw.decode("utf-8")), dict)
    except (OSError, ValueError, RecursionError, UnicodeDecodeError):
        return False


def _load_json(path: Path):
    with contextlib.suppress(OSError, ValueError, RecursionError):
        return json.loads(path.read_text(encoding="utf-8"))
    return None


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v):
    """A table cell that a spreadsheet shows as text, never runs as a formula, with
    control characters (a newline that would start a row of its own in a careless
    reader, a terminal's escape sequences) written as escapes."""
    if isinstance(v, str):
        v = submissions.printable(v)
        if v.startswith(_FORMULA):
            return "'" + v
    return v


def write_tables(result: ClassResult, tpl: Template):
    """``scores.csv`` (one row per student, one column per exercise, then the
    total, the status, the review flags and the isolation in force) and
    ``scores.json``, each written atomically."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student"] + [f"{ex} ({pts})" for ex, pts in result.exercises]
               + ["total", "max", "status", "review", "isolation"])
    for student, r in result.students.items():
        pts = {x["exercise"]: x["points"] for x in r["exercises"]}
        review = "; ".join(f"{x['exercise']}: {', '.join(x.get('review') or [])}"
                           for x in r["exercises"] if x.get("review"))
        w.writerow([csv_cell(c) for c in [student] + [pts.get(ex, 0) for ex, _ in result.exercises]
                    + [r["total"], r["max"], r["status"], review,
                       r.get("isolation") or result.isolation]])
    write_atomic(result.out_dir / "scores.csv", buf.getvalue())
    table = {"assignment": result.assignment, "template": str(tpl.path),
             "template_sha256": tpl.sha256, "grader_version": GRADER_VERSION,
             "isolation": result.isolation,
             "exercises": [{"exercise": ex, "points": p} for ex, p in result.exercises],
             "max": tpl.max_points, "seconds": round(result.seconds, 2), "notes": result.notes,
             "students": {s: {"total": r["total"], "status": r["status"],
                              "points": {x["exercise"]: x["points"] for x in r["exercises"]},
                              "review": {x["exercise"]: x.get("review") for x in r["exercises"]
                                         if x.get("review")},
                              "submission_sha256": r["submission_sha256"]}
                          for s, r in result.students.items()}}
    write_atomic(result.out_dir / "scores.json", json.dumps(table, indent=1, sort_keys=True))
