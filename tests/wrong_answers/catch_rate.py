"""How often each wrong answer is caught, over many fresh draws of the checks.

The problem sets draw new sizes and values on every run, so a wrong answer that the
checks catch only on some draws earns marks on others: the grading test then fails
now and then (and a learner's wrong answer passes now and then). This tool runs the
check cell of each exercise (hidden checks included) against each wrong answer of
``tests/wrong_answers/`` many times, each with its own seed, in this process, and
prints how many draws caught it; the official answer and the honest answers of
``tests/honest_answers.py`` go through the same draws and must pass every one.

    python -m tests.wrong_answers.catch_rate 09 [--draws 20] [--exercise 9.5]

Everything runs in one namespace per problem set, the way a learner's kernel runs
the notebook: the cells before an exercise's answer once, then for every answer
(official, honest or wrong) its cell, the template cells up to the check and the
check cell with its hidden checks. An answer that redefines a template function is
also run with the template's own functions around its other names, as the second
kernel of ``course-grade`` checks it. The seeds are fixed (draw ``i`` uses seed
``1000 i + 7``), so an escape can be replayed. ``course-grade`` adds its own watch on
top (tests/test_wrong_answers.py grades every wrong answer once, with a fresh seed).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time

from course_utils import device  # noqa: F401 - the interpreter where there is no GPU, first
import nbformat

from tests.wrong_answers import ROOT, _defined, problem_sets, wrong_answers


def _cells(stem: str):
    nb = nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = cell.get("metadata", {}).get("course", {})
        out.append((i, meta.get("role"), meta.get("exercise"), cell.source))
    return out


def _honest(stem: str) -> dict:
    from tests.honest_answers import HONEST
    return HONEST.get(stem, {})


def _cell_file(src: str, name: str) -> str:
    """A file name for one cell's source, held in ``linecache`` as IPython holds a notebook
    cell's: compiled Triton reads a kernel's source through ``inspect``, which would otherwise
    find this module's own text (it is ``__main__``, the namespace's module)."""
    import hashlib
    import linecache

    digest = hashlib.sha1(f"{name}\0{src}".encode()).hexdigest()[:16]
    path = f"/nonexistent-course-cells/{name.replace(' ', '_')}-{digest}.py"
    linecache.cache[path] = (len(src), None, src.splitlines(True), path)
    return path


def _run(src: str, ns: dict, name: str) -> BaseException | None:
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            exec(compile(src, _cell_file(src, name), "exec"), ns)
    except BaseException as exc:   # noqa: BLE001 - a check's failure is the measurement
        if isinstance(exc, KeyboardInterrupt):
            raise
        return exc
    return None


def _trial(src, before, between, check, ns, ex, seed, as_written):
    """Run one answer and its check; the first error, or None. ``as_written``: the template
    cells before the answer run first (so the answer's definitions win); otherwise after it
    (the template's own functions, and every kernel defined anew around the answer's
    @triton.jit functions: Triton's interpreter rewrites a kernel once, on its first run)."""
    import torch

    from course_utils import guards
    # the answer's own source, as the grader gives it (checks that read it, check_source)
    guards.register_answer_sources({ex: src})
    order = (before + [src] + between) if as_written else ([src] + before + between)
    for cell in order:
        err = _run(cell, ns, f"answer {ex}" if cell is src else f"template cell of {ex}")
        if err is not None:
            return err
    if seed is not None:
        torch.manual_seed(seed)
        check = check.replace("torch.manual_seed(", "(lambda *a: None)(")
    return _run(check, ns, f"check {ex}")


def catch_rates(stem: str, draws: int, only: str | None = None):
    """Yield ``(exercise, description, right, caught, draws, detail)``: for a wrong answer
    ``detail`` is the first seed it escaped with; for a right one (``right``: the official
    answer, described as ``"(official)"``, or an honest one, ``"(honest) ..."``) ``caught``
    counts its failures and ``detail`` is the first failure's message."""
    import torch

    cells = _cells(stem)
    table = wrong_answers(stem)
    ns: dict = {"__name__": "__main__"}
    pos = 0
    for ex in [c[2] for c in cells if c[1] == "answer"]:
        a = next(k for k, c in enumerate(cells) if c[1] == "answer" and c[2] == ex)
        ch = next(k for k, c in enumerate(cells) if c[1] == "check" and c[2] == ex)
        for k in range(pos, a):                       # what comes before, once
            err = _run(cells[k][3], ns, f"cell {cells[k][0]}")
            if err is not None and cells[k][1] != "check":
                raise RuntimeError(f"{stem}: cell {cells[k][0]} failed: {err!r}")
        # the template cells around the answer run again with every answer (see _trial)
        before = [cells[k][3] for k in range(pos, a) if cells[k][1] is None]
        between = [cells[k][3] for k in range(a + 1, ch)]
        official = cells[a][3]
        if only is None or only == ex:
            answers = [("(official)", official, True)] + [
                (f"(honest) {why}", src, True) for why, src in _honest(stem).get(ex, {}).items()
            ] + [(why, src, False) for why, src in table.get(ex, {}).items()]
            template = set().union(*(_defined(t) for t in before + between))
            for why, src, right in answers:
                # as the learner's notebook runs (an answer that redefines a template function
                # replaces it), and, where it does, with the template's functions and the
                # answer's own names: the second kernel of course-grade checks both
                orders = [True] + ([False] if _defined(src) & template else [])
                caught, escape, first = 0, None, None
                for d in range(draws):
                    seed = 1000 * d + 7
                    err = None
                    for as_written in orders:
                        err = err or _trial(src, before, between, cells[ch][3], ns, ex, seed,
                                            as_written)
                    if err is not None:
                        caught += 1
                        first = first or f"seed {seed}: {type(err).__name__}: {str(err)[:300]}"
                    elif escape is None:
                        escape = seed
                yield ex, why, right, caught, draws, (first if right else escape)
        # the official answer (and its check's helpers) stay bound for what follows
        _trial(official, before, between, cells[ch][3], ns, ex, None, False)
        pos = ch + 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sets", nargs="*", help="problem set numbers or stems (all when none)")
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--exercise", default=None)
    args = p.parse_args(argv)
    stems = [s.stem for s in problem_sets()]
    chosen = [s for s in stems if not args.sets or any(s.startswith(x.zfill(2)) or s == x
                                                       for x in args.sets)]
    bad = 0
    for stem in chosen:
        t0 = time.time()
        for ex, why, right, caught, n, escape in catch_rates(stem, args.draws, args.exercise):
            if right:
                ok = caught == 0
                line = (f"{ex:5s} {'ok ' if ok else 'BAD'} {why} failed {caught}/{n}"
                        + ("" if ok else f"  ({escape})"))
            else:
                ok = caught == n
                line = (f"{ex:5s} {'ok ' if ok else 'BAD'} caught {caught}/{n}  {why}"
                        + ("" if ok else f"  (escaped with seed {escape})"))
            bad += not ok
            print(line, flush=True)
        print(f"# {stem}: {time.time() - t0:.0f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
