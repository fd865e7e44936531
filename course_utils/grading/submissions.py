"""Finding submissions and reading the answer cells out of them.

A submission is only ever opened for reading, once, as bytes; nothing is
executed from it and nothing is written next to it. It is opened without
following symbolic links (``O_NOFOLLOW``, every folder on the way checked too),
and only when it is a regular file whose real path lies inside the submissions
folder: a link to the solution notebook, a FIFO or a device is refused, and so is a
regular file with more than one hard link (which could be the solution notebook under
another name). From a readable notebook
the grader takes the source of each answer cell, matched by its stable id
(``ex-<id>-answer``), and nothing else: stored outputs, metadata, tags, check
cells and every other cell are ignored (and noted in the feedback when they
differ from the exercise).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_SUBMISSION_BYTES = 256 * 2**20
_SAFE = re.compile(r"[^A-Za-z0-9._@+-]")


@dataclass
class Submission:
    student: str
    path: Path | None
    sha256: str = ""
    answers: dict = field(default_factory=dict)   # exercise id -> source
    problems: dict = field(default_factory=dict)  # exercise id -> why it has no answer
    notes: list = field(default_factory=list)     # things the student should know
    invalid: str | None = None                    # why the whole file was rejected


def safe_name(student: str) -> str:
    s = _SAFE.sub("_", student).strip("._") or "student"
    return s[:100]


def printable(name: str) -> str:
    """``name`` as a console line or a table cell can show it: control and other
    invisible characters (a newline, an escape sequence, a direction override) written
    as escapes, so a file name cannot forge lines or repaint a terminal."""
    out = []
    for ch in str(name):
        if ch.isprintable() and ch != "\\":
            out.append(ch)
        elif ch == "\\":
            out.append("\\\\")
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def output_names(students) -> dict:
    """``{student: file name}`` for the results, feedback and graded notebooks: the
    :func:`safe_name` of each, made unique. Names that differ only in the characters a
    file name cannot hold ("ana b" and "ana_b", "honest " and "honest") would share one;
    a name that is its own file name keeps it, and every other student on it (in sorted
    order) gets a suffix from a digest of the name, and a counter if even that is taken."""
    names, taken = {}, set()
    for student in sorted(students, key=lambda s: (safe_name(s) != s, s)):
        base = safe_name(student)
        name = base
        if name in taken:
            digest = hashlib.sha256(student.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            name = f"{base[:90]}-{digest}"
            k = 2
            while name in taken:
                name = f"{base[:90]}-{digest}-{k}"
                k += 1
        taken.add(name)
        names[student] = name
    return names


def discover(source, assignment: str):
    """``[(student, path)]`` for one notebook, a folder of ``<student>.ipynb``
    files, or an nbgrader tree ``submitted/<student>/<assignment>/<file>.ipynb``
    (given as the ``submitted`` folder or its parent). Also returns a list of
    notes about files that were skipped."""
    src = Path(source)
    notes = []
    if not src.exists():
        raise FileNotFoundError(f"submissions: {src} does not exist")
    if src.is_file():
        return [(src.stem, src)], notes
    if (src / "submitted").is_dir():
        src = src / "submitted"
    subdirs = sorted(p for p in src.iterdir() if p.is_dir() and not p.is_symlink()
                     and not p.name.startswith("."))
    files = sorted(p for p in src.iterdir() if p.suffix == ".ipynb" and not p.name.startswith(".")
                   and (p.is_symlink() or p.is_file()))
    linked = sorted(p.name for p in src.iterdir() if p.is_symlink() and p.suffix != ".ipynb")
    if linked:
        notes.append(f"skipped symbolic links: {', '.join(printable(n) for n in linked[:20])}")
    out = [(p.stem, p) for p in files]
    flat = {p.stem for p in files}
    for d in subdirs:
        if d.name.startswith(".") or d.name == ".ipynb_checkpoints":
            continue
        # a folder named like a notebook beside it ("ana.ipynb" and "ana/") is another
        # submission: both are graded, the folder's under its own name
        student = f"{d.name} (folder)" if d.name in flat else d.name
        if student != d.name:
            notes.append(f"{printable(d.name)}: a notebook and a folder of that name; the "
                         f"folder's submission is graded as {printable(student)!s}")
        found = _nbgrader_notebook(d, assignment)
        if isinstance(found, str):
            notes.append(f"{printable(d.name)}: {printable(found)}")
            out.append((student, None))
        else:
            out.append((student, found))
    others = sorted(p.name for p in src.iterdir() if p.is_file() and p.suffix != ".ipynb"
                    and not p.name.startswith("."))
    if others:
        notes.append("skipped files that are not .ipynb: "
                     + ", ".join(printable(n) for n in others[:20]))
    # one submission per name (a folder "ana (folder)" beside "ana.ipynb" and "ana/")
    seen: set = set()
    for i, (student, path) in enumerate(out):
        name, k = student, 2
        while name in seen:
            name, k = f"{student} ({k})", k + 1
        seen.add(name)
        out[i] = (name, path)
    names = output_names([s for s, _ in out])
    for student, name in sorted(names.items()):
        if name != safe_name(student):
            notes.append(f"{printable(student)}: its file name {safe_name(student)!r} is "
                         f"another student's; its results are in {name}.json / {name}.md")
    return out, notes


def _nbgrader_notebook(student_dir: Path, assignment: str):
    cands = [student_dir / assignment] if (student_dir / assignment).is_dir() else \
        [p for p in student_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
         and not p.is_symlink()]
    if not cands:
        return f"no {assignment}/ folder in {student_dir}"
    if len(cands) > 1:
        return (f"{len(cands)} assignment folders and none named {assignment}: "
                + ", ".join(sorted(p.name for p in cands)))
    if cands[0].is_symlink():
        return f"{cands[0]} is a symbolic link; submissions are read only from real folders"
    nbs = sorted(p for p in cands[0].glob("*.ipynb") if p.is_symlink() or p.is_file())
    named = [p for p in nbs if p.stem == assignment]
    if named:
        return named[0]
    if len(nbs) == 1:
        return nbs[0]
    return (f"{len(nbs)} notebooks in {cands[0]} and none named {assignment}.ipynb"
            if nbs else f"no notebook in {cands[0]}")


def _source(cell) -> str | None:
    s = cell.get("source", "")
    if isinstance(s, list) and all(isinstance(x, str) for x in s):
        return "".join(s)
    return s if isinstance(s, str) else None


def _without_lone_surrogates(src: str) -> tuple[str, int]:
    """``src`` with each lone surrogate (valid in JSON as an escape, not as text: the kernel's
    messages could not carry it) replaced by U+FFFD, and how many there were."""
    try:
        src.encode("utf-8")
        return src, 0
    except UnicodeEncodeError:
        pass
    lone = sum(1 for ch in src if 0xD800 <= ord(ch) <= 0xDFFF)
    return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in src), lone


def open_no_follow(path: Path, root: Path | None = None) -> bytes:
    """The bytes of ``path``, a regular file inside ``root``, read without
    following a symbolic link anywhere on the way. Raises ``OSError`` (with a
    message for the student's feedback) otherwise."""
    path = Path(path)
    top = root if root is not None else path.parent
    # every component below the submissions folder must be a real folder / file
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(top))
    except ValueError:
        rel = Path(path.name)
    cur = Path(os.path.abspath(top))
    for part in rel.parts:
        cur = cur / part
        if cur.is_symlink():
            raise OSError(f"{cur.name} is a symbolic link; links are not followed")
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(top))
    if real != top and top not in real.parents:
        raise OSError(f"the file resolves to {real}, outside the submissions folder")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        if st.st_nlink > 1:
            # a hard link has no outside path to resolve: it may be the solution notebook
            # itself, so a file with more than one name is never read
            raise OSError(f"the file has {st.st_nlink} hard links; submissions with more "
                          "than one name are refused (copy the file instead of linking it)")
        if st.st_size > MAX_SUBMISSION_BYTES:
            raise OSError(f"the file is {st.st_size / 2**20:.0f} MiB, over the "
                          f"{MAX_SUBMISSION_BYTES // 2**20} MiB limit")
        chunks, left = [], MAX_SUBMISSION_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        raw = b"".join(chunks)
        if len(raw) > MAX_SUBMISSION_BYTES:
            raise OSError("the file grew past the size limit while it was read")
        return raw
    finally:
        os.close(fd)


def read(student: str, path: Path | None, exercises, root: Path | None = None) -> Submission:
    """Read one submission (read-only, see :func:`open_no_follow`) and pull out its
    answer cells."""
    sub = Submission(student, path)
    if path is None:
        sub.invalid = "no notebook found for this student"
        return sub
    try:
        raw = open_no_follow(path, root)
    except OSError as e:
        why = e.strerror if e.strerror else str(e)
        if getattr(e, "errno", None) == getattr(__import__("errno"), "ELOOP", -1):
            why = "the submission is a symbolic link; links are not followed"
        sub.invalid = f"could not read the file ({why})"
        return sub
    sub.sha256 = hashlib.sha256(raw).hexdigest()
    try:
        nb = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        sub.invalid = "not a notebook: the file is not UTF-8 text"
        return sub
    except json.JSONDecodeError as e:
        sub.invalid = f"not a notebook: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        return sub
    except RecursionError:
        sub.invalid = "not a notebook: the JSON is nested too deeply to read"
        return sub
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        sub.invalid = "not a notebook: the JSON has no list of cells"
        return sub
    if nb.get("nbformat") != 4:
        sub.notes.append(f"nbformat is {nb.get('nbformat')!r}, expected 4; reading it anyway")
    by_id, headers = {}, {}
    saw_outputs = saw_nbval = False
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict):
            continue
        cid = cell.get("id")
        src = _source(cell)
        if isinstance(cid, str):
            by_id.setdefault(cid, []).append((i, cell, src))
        if cell.get("cell_type") == "code" and src:
            first = src.lstrip("\n").split("\n", 1)[0]
            m = re.match(r"^#\s*Exercise\s+([A-Za-z0-9][\w.]*)", first)
            if m:
                headers.setdefault(m.group(1), []).append(cid)
        if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count")):
            saw_outputs = True
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        tags = meta.get("tags") if isinstance(meta.get("tags"), list) else []
        if any(isinstance(t, str) and t.startswith("nbval") for t in tags) or \
                (src and "NBVAL_" in src):
            saw_nbval = True
    if saw_outputs:
        sub.notes.append("stored outputs were ignored: every answer is run afresh")
    if saw_nbval:
        sub.notes.append("nbval markers and tags were ignored and removed")
    for e in exercises:
        cells = by_id.get(e.answer_id, [])
        if len(cells) > 1:
            sub.problems[e.id] = (f"{len(cells)} cells carry the id {e.answer_id} (cells "
                                  f"{', '.join(str(i) for i, _, _ in cells)}); ids must be "
                                  "unique, so this answer cannot be identified")
            continue
        if not cells:
            others = [c for c in headers.get(e.id, []) if c != e.answer_id]
            if others:
                sub.problems[e.id] = (f"no cell with id {e.answer_id}; a cell starting with "
                                      f"'# Exercise {e.id}' has id {others[0]!r}. Answer in the "
                                      "cell that came with the exercise notebook (cell ids "
                                      "must not change)")
            else:
                sub.problems[e.id] = f"the answer cell (id {e.answer_id}) is missing"
            continue
        _, cell, src = cells[0]
        if cell.get("cell_type") != "code" or src is None:
            sub.problems[e.id] = f"the cell with id {e.answer_id} is not a code cell"
            continue
        src, lone = _without_lone_surrogates(src)
        if lone:
            sub.notes.append(f"exercise {e.id}: the answer cell held {lone} character(s) that "
                             "are not Unicode text (lone surrogates, as a JSON escape such as "
                             "\\ud800 can write); each ran as U+FFFD")
        sub.answers[e.id] = src
        checks = by_id.get(e.check_id, [])
        if not checks:
            sub.notes.append(f"exercise {e.id}: the check cell was deleted; "
                             "the grader used its own copy")
        elif len(checks) == 1 and _source(checks[0][1]) not in (e.visible_check, e.full_check):
            sub.notes.append(f"exercise {e.id}: the check cell was edited; "
                             "the grader used its own copy")
    return sub
