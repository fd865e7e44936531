"""Grade a class: the official template, one fresh kernel per submission, and
verdicts decided in this process.

How one submission is graded:

1. its file is read once, read-only; only the source of each answer cell,
   matched by id, is taken (:mod:`.submissions`);
2. those sources go into the official template (the solution notebook, with
   any hidden tests) in place of the official answers, stripped of nbval
   markers; outputs, metadata and tags are not carried over (:mod:`.instrument`);
3. the result runs in a separate process with a fresh kernel, a per-cell and a
   total time limit (:mod:`.runner`). That kernel only *ships data*: the values
   each answer defines and, for each answer function, every call the template
   made to it with its inputs and result;
4. a second fresh kernel, the verifier, runs the same template with no student
   code at all: each answer cell is replaced by those values and by stand-ins
   that return the recorded results (only for the inputs the verifier itself
   computes). Its check calls are the real checks, imported in a process the
   student never touched; their verdicts are the grade. Nothing the student's
   kernel prints, stores or claims to have passed counts.

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
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import torch

from course_utils import problems
from course_utils.grading import codec, instrument, submissions
from course_utils.grading.runner import write_atomic

GRADER_VERSION = 1
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
def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(MPLBACKEND="Agg", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               JUPYTER_PLATFORM_DIRS="1", PYDEVD_DISABLE_FILE_VALIDATION="1")
    return env


@dataclass
class _Job:
    student: str
    safe: str
    dir: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    t0: float = 0.0
    nonce: str = ""
    roles: list = field(default_factory=list)
    run: dict | None = None          # the student's run, once over
    tail: str = ""                   # the end of its runner's log
    verify: "_Job | None" = None     # the verifier run that follows it


def _launch(nb, job: _Job, cell_timeout, timeout, inputs=None):
    job.dir.mkdir(parents=True, exist_ok=True)
    work = job.dir / "work"
    work.mkdir(exist_ok=True)
    nb_path = job.dir / "graded.ipynb"
    nbformat.write(nb, nb_path)
    cmd = [sys.executable, str(Path(__file__).with_name("runner.py")), str(nb_path),
           str(job.dir / "run.json"), "--cwd", str(work), "--cell-timeout", str(cell_timeout),
           "--timeout", str(timeout)]
    log = open(job.dir / "runner.log", "wb")
    job.proc = subprocess.Popen(cmd, cwd=str(work), env=_env(), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    job.started = time.monotonic()


def _kill(job: _Job):
    """Stop a runner that overstayed, and the kernel it started."""
    pid_file = job.dir / "run.kernel-pid"
    for pid in ([int(pid_file.read_text())] if pid_file.exists() else []) + [job.proc.pid]:
        with contextlib.suppress(OSError, ValueError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        job.proc.wait(timeout=10)


def _read_run(job: _Job) -> dict | None:
    path = job.dir / "run.json"
    if not path.exists() or path.stat().st_size > 512 * 2**20:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("cells"), list) else None


def _runner_tail(job: _Job) -> str:
    with contextlib.suppress(OSError):
        return (job.dir / "runner.log").read_bytes()[-1500:].decode("utf-8", "replace")
    return ""


def _records(run, roles, nonce, kinds, any_cell=False):
    """``{(kind, key): [blob, ...]}`` of the records with this run's nonce, from
    check cells (or from any cell with ``any_cell``), and how many others were seen."""
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


def _run_blocking(nb, job: _Job, cell_timeout, timeout):
    _launch(nb, job, cell_timeout, timeout)
    try:
        job.proc.wait(timeout=timeout + 120)
    except subprocess.TimeoutExpired:
        _kill(job)
    run, tail = _read_run(job), _runner_tail(job)
    shutil.rmtree(job.dir, ignore_errors=True)
    return run, tail


def _decoded(blobs):
    """First readable record of each key: ``{key: payload}``."""
    out = {}
    for key, items in blobs.items():
        for blob in items:
            try:
                out[key] = codec.decode(codec.loads(blob))
                break
            except codec.CodecError:
                continue
    return out


def _exports(run, roles, nonce):
    recs, stray = _records(run, roles, nonce, {"export", "call", "rng"}, any_cell=True)
    dec = _decoded(recs)
    exports = {k: v for (kind, k), v in dec.items() if kind == "export" and isinstance(v, dict)}
    calls = {}
    for (kind, k), v in sorted(dec.items(), key=lambda kv: _call_order(kv[0][1])):
        if kind == "call" and isinstance(v, dict) and isinstance(v.get("name"), str):
            calls.setdefault(v["name"], []).append(v)
    rng = {k: v for (kind, k), v in dec.items() if kind == "rng"}
    return exports, calls, rng


def _call_order(key):
    name, _, i = key.rpartition("/")
    return (name, int(i) if i.isdigit() else 0)


def _verify_notebook(tpl, scratch_name, exports, calls, rng, cell_timeout, timeout):
    nonce = secrets.token_hex(16)
    job = _Job(scratch_name, "_verify", Path(tempfile.mkdtemp(prefix="course-grade-")),
               nonce=nonce)
    inputs = job.dir / "inputs.pt"
    torch.save(codec.encode({"rng": rng, "exports": exports, "calls": calls}), inputs)
    nb, job.roles = instrument.build(tpl.nb, tpl.exercises, "verify", nonce=nonce,
                                     inputs_path=str(inputs))
    return nb, job


def _verdicts(run, roles, nonce, kind="verdict"):
    """``{key: payload}`` of the verifier's verdicts (or, with ``kind="stop"``, of
    the check calls whose arguments could not be computed, with the reason)."""
    recs, _ = _records(run, roles, nonce, {kind})
    return {k: v for (_, k), v in _decoded(recs).items() if isinstance(v, dict)}


def prepare_reference(tpl: Template, scratch: Path, cell_timeout=60, timeout=600) -> Reference:
    """Run the official solution (recording what a student's kernel records),
    then verify it; every check must pass, and each check function must come
    from ``course_utils`` or ``torch.testing`` so the verifier runs its own copy."""
    t0 = time.monotonic()
    nonce = secrets.token_hex(16)
    nb, roles = instrument.build(tpl.nb, tpl.exercises, "reference", nonce=nonce)
    job = _Job("(reference)", "_reference", scratch / "_reference", nonce=nonce, roles=roles)
    run, tail = _run_blocking(nb, job, cell_timeout, timeout)
    if run is None:
        raise GradingError(f"template {tpl.path.name}: the official solution did not finish "
                           f"running:\n{tail}")
    _template_errors(tpl, run, roles, "official solution")
    exports, calls, rng = _exports(run, roles, nonce)
    nb, vjob = _verify_notebook(tpl, "(reference)", exports, calls, rng, cell_timeout, timeout)
    vrun, tail = _run_blocking(nb, vjob, cell_timeout, timeout)
    if vrun is None:
        raise GradingError(f"template {tpl.path.name}: verifying the official solution did not "
                           f"finish:\n{tail}")
    _template_errors(tpl, vrun, vjob.roles, "official solution, verified from its exported values")
    verdicts = _verdicts(vrun, vjob.roles, vjob.nonce)
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
def _cell_story(run, roles, ex, role):
    if run is None:
        return None
    for i, (r, e) in enumerate(roles):
        if r == role and e == ex and i < len(run["cells"]):
            info = run["cells"][i]
            st = info.get("status")
            if st == "ok":
                return None
            if st == "error":
                return f"raised {info.get('ename', '')}: {str(info.get('evalue', ''))[:500]}"
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


def grade_run(tpl: Template, ref: Reference, sub, srun, sroles, vrun, vroles, vnonce) -> dict:
    """Scores for one student: verdicts from the verifier run; explanations
    from both runs."""
    verdicts = _verdicts(vrun, vroles, vnonce) if vrun is not None else {}
    stops = _verdicts(vrun, vroles, vnonce, "stop") if vrun is not None else {}
    exercises, late_notes = [], []
    for e in tpl.exercises:
        item = {"exercise": e.id, "max": e.points, "points": 0, "passed": False,
                "reason": "", "checks": []}
        if e.id in sub.problems:
            item["reason"] = sub.problems[e.id]
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
            ans = _cell_story(srun, sroles, e.id, "answer")
            if ans:
                late_notes.append(f"exercise {e.id} passed, but your answer cell {ans}")
        else:
            why = [fails[0]] + ([f"({len(fails) - 1} more check(s) failed)"] if len(fails) > 1 else [])
            ans = _cell_story(srun, sroles, e.id, "answer")
            idx = next((i for i, r in enumerate(sroles) if r == ("answer", e.id)), len(sroles))
            before = _before_story(srun, sroles, idx)
            vchk = _cell_story(vrun, vroles, e.id, "check")
            if before:
                why.append(f"stopped earlier: {before}")
            if ans:
                why.append(f"your answer cell {ans}")
            if vchk and vchk not in " ".join(why):
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


def _student_result(tpl, sub, body, status, seconds):
    total = sum(x["points"] for x in body.get("exercises", []))
    return {"grader_version": GRADER_VERSION, "assignment": tpl.name,
            "template_sha256": tpl.sha256, "student": sub.student,
            "submission": str(sub.path) if sub.path else None,
            "submission_sha256": sub.sha256, "status": status, "total": total,
            "max": tpl.max_points, "seconds": round(seconds, 2), **body}


def _zero_body(tpl, reason):
    return {"exercises": [{"exercise": e.id, "max": e.points, "points": 0, "passed": False,
                           "reason": reason, "checks": []} for e in tpl.exercises],
            "notes": []}


def feedback_text(res: dict) -> str:
    lines = [f"# Feedback: {res['assignment']} — {res['student']}", "",
             f"**Score: {res['total']} / {res['max']}**", ""]
    if res["status"] != "graded":
        lines += [f"This submission could not be graded normally: {res.get('error', res['status'])}", ""]
    lines += ["| exercise | points | result |", "| --- | --- | --- |"]
    for x in res["exercises"]:
        lines.append(f"| {x['exercise']} | {x['points']} / {x['max']} | "
                     f"{'passed' if x['passed'] else 'not passed'} |")
    for x in res["exercises"]:
        lines += ["", f"## Exercise {x['exercise']}: "
                      f"{'passed' if x['passed'] else 'not passed'} ({x['points']} / {x['max']})"]
        if x["passed"]:
            lines.append("All checks passed.")
            continue
        if x["reason"]:
            lines.append(f"Why: {x['reason']}")
        for c in x["checks"]:
            mark = "passed" if c["passed"] else "FAILED"
            msg = c["message"].replace("\n", "\n    ")
            lines.append(f"- `{c['check']}`{' (hidden test)' if c['hidden'] else ''}: {mark}"
                         + (f"\n    {msg}" if msg and not c["passed"] else ""))
    if res.get("notes"):
        lines += ["", "## Notes"] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def _write_student(out_dir: Path, safe: str, res: dict):
    write_atomic(out_dir / "results" / f"{safe}.json", json.dumps(res, indent=1, sort_keys=True))
    write_atomic(out_dir / "feedback" / f"{safe}.md", feedback_text(res))


def _finish_student(tpl, ref, sub, job, vjob, seconds, killed):
    """The student's result once both runs are over (``vjob`` is None when the
    student's run produced nothing to verify)."""
    srun = job.run
    vrun = _read_run(vjob) if vjob is not None else None
    if srun is None or (vjob is not None and vrun is None):
        what = "your notebook's run" if srun is None else "the verifier run"
        body = _zero_body(tpl, f"{what} produced no result")
        body["notes"] = list(sub.notes) + [
            f"{what} was stopped at the total time limit" if killed else f"{what} failed"]
        res = _student_result(tpl, sub, body, "error", seconds)
        res["error"] = (f"{what} ran past the total time limit" if killed else
                        f"{what} produced no result: " + (_runner_tail(vjob) if vjob else job.tail)[-300:])
        return res
    body = grade_run(tpl, ref, sub, srun, job.roles, vrun, vjob.roles, vjob.nonce)
    return _student_result(tpl, sub, body, "graded", seconds)


# --------------------------------------------------------------------------- the class
@dataclass
class ClassResult:
    assignment: str
    out_dir: Path
    students: dict          # student -> result dict
    exercises: list         # [(id, points)]
    seconds: float
    notes: list

    def scores(self) -> dict:
        return {s: r["total"] for s, r in self.students.items()}


def grade(assignment, submissions_path, out_dir, *, workers: int = 2, cell_timeout: float = 60,
          timeout: float = 600, resume: bool = False, root=None, progress=None) -> ClassResult:
    """Grade every submission in ``submissions_path`` (a notebook, a folder of
    ``<student>.ipynb`` or an nbgrader ``submitted/`` tree) against the official
    template of ``assignment``; write the tables and feedback into ``out_dir``."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise GradingError(f"workers: expected a positive int, got {workers!r}")
    for nm, v in (("cell_timeout", cell_timeout), ("timeout", timeout)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise GradingError(f"{nm}: expected a positive number of seconds, got {v!r}")
    if submissions_path is None or not Path(submissions_path).exists():
        raise GradingError(f"submissions: expected an .ipynb file or a folder, got "
                           f"{submissions_path!r} (not found)")
    say = progress or (lambda msg: None)
    t_start = time.monotonic()
    if out_dir is None or (Path(out_dir).exists() and not Path(out_dir).is_dir()):
        raise GradingError(f"out_dir: expected a folder for the scores and feedback, got "
                           f"{out_dir!r}")
    tpl = load_template(assignment, root)
    try:
        found, notes = submissions.discover(submissions_path, tpl.name)
    except (OSError, ValueError) as e:
        raise GradingError(str(e)) from None
    out_dir = Path(out_dir)
    src = Path(submissions_path).resolve()
    if src.is_dir() and (out_dir.resolve() == src or src in out_dir.resolve().parents):
        raise GradingError(f"out_dir: {out_dir} is inside the submissions folder {src}; "
                           "choose a folder outside it")
    for sub_dir in ("results", "feedback"):
        (out_dir / sub_dir).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="course-grade-"))
    results = {}
    running: list[tuple[_Job, object]] = []
    try:
        todo = []
        for student, path in found:
            safe = submissions.safe_name(student)
            sub = submissions.read(student, path, tpl.exercises)
            if resume and sub.invalid is None:
                old = _load_json(out_dir / "results" / f"{safe}.json")
                if old and old.get("submission_sha256") == sub.sha256 and \
                        old.get("template_sha256") == tpl.sha256 and \
                        old.get("grader_version") == GRADER_VERSION and old.get("status") == "graded":
                    results[student] = old
                    say(f"{student}: kept earlier result {old['total']}/{old['max']}")
                    continue
            if sub.invalid is not None:
                res = _student_result(tpl, sub, _zero_body(tpl, sub.invalid), "invalid", 0.0)
                res["error"] = sub.invalid
                _write_student(out_dir, safe, res)
                results[student] = res
                say(f"{student}: invalid submission ({sub.invalid})")
                continue
            todo.append((student, safe, sub))
        ref = None
        if todo:
            say(f"running the official solution of {tpl.name} ...")
            ref = prepare_reference(tpl, scratch, cell_timeout, timeout)
            notes.extend(ref.notes)
            say(f"reference ready in {time.monotonic() - t_start:.1f} s; grading {len(todo)} "
                f"submission(s) with {workers} worker(s)")
        queue = list(todo)
        while queue or running:
            while queue and len(running) < workers:
                student, safe, sub = queue.pop(0)
                job = _Job(student, safe, Path(tempfile.mkdtemp(prefix="course-grade-")),
                           nonce=secrets.token_hex(16))
                try:
                    inputs_path = job.dir / "inputs.pt"
                    torch.save(codec.encode({"rng": ref.rng}), inputs_path)
                    nb, job.roles = instrument.build(tpl.nb, tpl.exercises, "student", sub.answers,
                                                     nonce=job.nonce, inputs_path=str(inputs_path))
                    _launch(nb, job, cell_timeout, timeout)
                    job.t0 = job.started
                    running.append((job, sub))
                except Exception as e:  # noqa: BLE001 - one student's trouble stays theirs
                    shutil.rmtree(job.dir, ignore_errors=True)
                    results[student] = _crashed(out_dir, tpl, sub, safe, e)
                    say(f"{student}: grading error ({e})")
            time.sleep(0.05)
            still = []
            for job, sub in running:
                current = job.verify or job
                if current.proc.poll() is None and time.monotonic() - current.started < timeout + 120:
                    still.append((job, sub))
                    continue
                killed = current.proc.poll() is None
                if killed:
                    _kill(current)
                try:
                    if job.verify is None:
                        # the student's run is over: read it, then start the verifier
                        job.run = _read_run(job)
                        job.tail = _runner_tail(job)
                        shutil.rmtree(job.dir, ignore_errors=True)
                        if job.run is not None and not killed:
                            exports, calls, _ = _exports(job.run, job.roles, job.nonce)
                            nb, job.verify = _verify_notebook(tpl, job.student, exports, calls,
                                                              ref.rng, cell_timeout, timeout)
                            _launch(nb, job.verify, cell_timeout, timeout)
                            still.append((job, sub))
                            continue
                    res = _finish_student(tpl, ref, sub, job, job.verify,
                                          time.monotonic() - job.t0, killed)
                    _write_student(out_dir, job.safe, res)
                    results[job.student] = res
                    say(f"{job.student}: {res['total']}/{res['max']} "
                        f"({time.monotonic() - job.t0:.1f} s)")
                except Exception as e:  # noqa: BLE001 - one student's trouble stays theirs
                    results[job.student] = _crashed(out_dir, tpl, sub, job.safe, e)
                    say(f"{job.student}: grading error ({e})")
                finally:
                    if (job, sub) not in still:
                        for j in (job, job.verify):
                            if j is not None:
                                shutil.rmtree(j.dir, ignore_errors=True)
            running = still
    finally:
        for job, _ in running:  # only after an interruption: stop what is still going
            for j in (job, job.verify):
                if j is not None and j.proc is not None and j.proc.poll() is None:
                    _kill(j)
                if j is not None:
                    shutil.rmtree(j.dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - t_start
    result = ClassResult(tpl.name, out_dir, dict(sorted(results.items())),
                         [(e.id, e.points) for e in tpl.exercises], seconds, notes)
    write_tables(result, tpl)
    return result


def _crashed(out_dir, tpl, sub, safe, err) -> dict:
    res = _student_result(tpl, sub, _zero_body(tpl, "grading error"), "error", 0.0)
    res["error"] = f"the grader failed on this submission: {type(err).__name__}: {err}"[:1000]
    with contextlib.suppress(Exception):
        _write_student(out_dir, safe, res)
    return res


def _load_json(path: Path):
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text(encoding="utf-8"))
    return None


def write_tables(result: ClassResult, tpl: Template):
    """``scores.csv`` (one row per student, one column per exercise) and
    ``scores.json``, each written atomically."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student"] + [f"{ex} ({pts})" for ex, pts in result.exercises]
               + ["total", "max", "status"])
    for student, r in result.students.items():
        pts = {x["exercise"]: x["points"] for x in r["exercises"]}
        w.writerow([student] + [pts.get(ex, 0) for ex, _ in result.exercises]
                   + [r["total"], r["max"], r["status"]])
    write_atomic(result.out_dir / "scores.csv", buf.getvalue())
    table = {"assignment": result.assignment, "template": str(tpl.path),
             "template_sha256": tpl.sha256, "grader_version": GRADER_VERSION,
             "exercises": [{"exercise": ex, "points": p} for ex, p in result.exercises],
             "max": tpl.max_points, "seconds": round(result.seconds, 2), "notes": result.notes,
             "students": {s: {"total": r["total"], "status": r["status"],
                              "points": {x["exercise"]: x["points"] for x in r["exercises"]},
                              "submission_sha256": r["submission_sha256"]}
                          for s, r in result.students.items()}}
    write_atomic(result.out_dir / "scores.json", json.dumps(table, indent=1, sort_keys=True))

