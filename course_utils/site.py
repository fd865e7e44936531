"""The course as a static web site: every lesson rendered to HTML, for readers
without a kernel.

    python -m course_utils.site build [--out site] [--lessons 01 04] [--jobs 2]
                                      [--no-execute] [--src DIR] [--no-cache]
                                      [--save-executed DIR] [--on cpu|machine]
                                      [--outputs-from DIR]
    python -m course_utils.site check [site]

``build`` executes each lesson in ``notebooks/`` with ``COURSE_STATIC_WIDGETS=1``,
so every view shown with :func:`course_utils.widgets.show` leaves its static
filmstrip (a PNG) where the live widget would be, and any other widget (an
``interact``, say) is replaced by what it showed when the cell ran (its figure or
printout, with a line naming its settings); renders the lessons with
nbconvert's ``lab`` template into ``<out>/notebooks/``; writes an index page with
the lesson map; copies the files the lessons link to (rewriting links between
lessons from ``.ipynb`` to ``.html``); and then runs ``check``.

The math of the lessons is rendered at build time: every ``$...$`` and
``$$...$$`` of a markdown cell becomes MathML (with ``latex2mathml``), which
browsers draw natively, and the template's remote scripts (MathJax, require.js,
mermaid from a CDN) are removed, so a page reads the same without a network.

``check`` reads every page of a built site and lists broken internal links
(including ``#anchors``), missing images, images without a source, scripts
loaded from another site and math left as LaTeX; ``build`` also lists any live
widget left without a static fallback. Both exit with
status 1 and the list when something is wrong.

Executed lessons are kept in ``build/site-cache/``, keyed by the notebook and
the ``course_utils`` sources, so a rebuild re-runs only what changed.
``--no-execute`` renders notebooks as they are (``--src`` points at a folder of
already executed lessons, such as one written by ``--save-executed DIR``).

``--on machine`` executes the lessons on this machine's GPU (by default they run
on the CPU whatever the machine); ``bash benchmarks/gpu_verify.sh site LOG_DIR``
does that and keeps the runs in ``LOG_DIR/executed``. ``--outputs-from DIR``
takes each lesson's outputs from an executed copy in ``DIR``, so readers without a
GPU see the GPU's figures and timings beside today's text: a copy is used only when
its code cells are the lesson's code cells, as they are now (markdown may have
changed since); a lesson whose copy is missing or stale is executed here, and the
build log says which lessons are which.
"""
from __future__ import annotations

import argparse
import hashlib
import html
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
LESSONS_DIR = ROOT / "notebooks"
CACHE_DIR = ROOT / "build" / "site-cache"
MARKER = ".course-site"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
LESSON_RE = re.compile(r"^(\d\d)_\w+\.ipynb$")
_EXTERNAL = ("http:", "https:", "mailto:", "javascript:", "tel:", "ftp:")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REF_RE = re.compile(r"""(\s(?:href|src)\s*=\s*)(["'])(.*?)\2""", re.I | re.S)

__all__ = ["build", "check", "freeze_widgets", "latex_to_mathml", "lesson_paths", "main",
           "render_math", "strip_remote_scripts"]


# ---------------------------------------------------------------------- lessons
def lesson_paths(src: Path = LESSONS_DIR, lessons=None) -> list[Path]:
    """The lesson notebooks ``NN_topic.ipynb`` in ``src``, in order; ``lessons`` (a
    list of two-digit prefixes such as ``["01", "04"]``) picks some of them."""
    src = Path(src)
    if not src.is_dir():
        raise ValueError(f"src must be a folder of lesson notebooks, got {src}")
    found = sorted(p for p in src.glob("*.ipynb") if LESSON_RE.match(p.name))
    if lessons is None:
        return found
    if isinstance(lessons, str) or not all(isinstance(x, str) for x in lessons):
        raise TypeError(f"lessons must be a list of two-digit prefixes like ['01', '04'], "
                        f"got {lessons!r}")
    by_prefix = {p.name[:2]: p for p in found}
    bad = [x for x in lessons if not re.fullmatch(r"\d\d", x)]
    if bad:
        raise ValueError(f"lessons must be two-digit prefixes like '01', got {bad}")
    missing = [x for x in lessons if x not in by_prefix]
    if missing:
        raise ValueError(f"lessons {missing} have no notebook NN_topic.ipynb in {src} "
                         f"(there are {sorted(by_prefix)})")
    return [by_prefix[x] for x in sorted(set(lessons))]


def _fingerprint() -> str:
    """Changes whenever the course_utils sources or the Python version change."""
    h = hashlib.sha256(sys.version.encode())
    for p in sorted((ROOT / "course_utils").rglob("*.py")):
        h.update(str(p.relative_to(ROOT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _kernel_env(on="cpu") -> dict:
    """What the lesson kernels get on top of this process's environment: static
    widgets, inline figures (even under MPLBACKEND=Agg), course_utils, and the CPU
    (``on="cpu"``: the site shows the lessons as run on a CPU, whatever machine builds
    it) or this machine's own device (``on="machine"``: a GPU's figures and timings)."""
    env = {"COURSE_STATIC_WIDGETS": "1",
           "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    if on == "cpu":
        env["COURSE_DEVICE"] = "cpu"
    return env


def kernel_sockets(sock_dir):
    """Kernel sockets in a folder of this run's own (Unix) rather than on TCP ports:
    kernels started at the same moment (parallel lessons, other test workers) can
    otherwise pick the same free port, and a client then waits on the wrong kernel."""
    from traitlets.config import Config
    cfg = Config()
    if os.name == "posix" and len(str(sock_dir)) < 80:
        cfg.KernelManager.transport = "ipc"
        cfg.KernelManager.ip = str(Path(sock_dir) / "kernel")
    return cfg


def _execute(path: str, timeout: int, on: str = "cpu") -> tuple[str, str | None, float]:
    """Run one lesson in a fresh kernel in static-widget mode. Returns the executed
    notebook as JSON text, an error line (or None) and the seconds it took."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    class Client(NotebookClient):
        """Forgets a widget when the kernel closes it, as JupyterLab does (a
        finished ``tqdm`` bar with ``leave=False``, say)."""

        def handle_comm_msg(self, outs, msg, cell_index):
            super().handle_comm_msg(outs, msg, cell_index)
            if msg["msg_type"] == "comm_close":
                self.widget_state.pop(msg["content"].get("comm_id"), None)

    nb = nbformat.read(path, as_version=4)
    t = time.time()
    sock_dir = tempfile.mkdtemp(prefix="course-site-")
    # store_widget_state=True: nbclient 0.10 fails on Output widgets without it; it
    # is also what freeze_widgets() reads the widgets' contents from
    client = Client(nb, timeout=timeout, kernel_name="python3",
                    resources={"metadata": {"path": str(LESSONS_DIR)}},
                    store_widget_state=True, config=kernel_sockets(sock_dir))
    try:
        client.execute(env=dict(os.environ, **_kernel_env(on)))   # the kernel's env only
        error = None
    except CellTimeoutError as exc:
        error = f"a cell ran past {timeout} s: {str(exc).splitlines()[0]}"
    except CellExecutionError as exc:
        error = f"a cell raised {exc.ename}: {exc.evalue}"
        for k, cell in enumerate(nb.cells):
            errs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if errs:
                error = (f"cell {k} (id {cell.get('id', '?')}) raised {errs[0].get('ename')}: "
                         f"{errs[0].get('evalue')}")
                break
    except Exception as exc:  # noqa: BLE001 - kernel start-up problems and the like
        error = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    freeze_widgets(nb)
    if error:
        error = _ANSI.sub("", error)
    return nbformat.writes(nb), error, time.time() - t


# ---------------------------------------------------------------------- building
@dataclass
class BuildReport:
    """What ``build`` did: per-lesson notes, the problems found, the seconds taken."""
    out: Path
    lessons: list = field(default_factory=list)   # (name, how, seconds)
    problems: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self):
        return not self.problems


def _prepare_out(out: Path):
    out = Path(out).resolve()
    if out == ROOT or ROOT.is_relative_to(out) or out in (LESSONS_DIR, ROOT / "course_utils"):
        raise ValueError(f"out must be a folder for the site only, got {out}")
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"out must be a folder, got the file {out}")
        if any(out.iterdir()) and not (out / MARKER).exists():
            raise ValueError(f"out must be empty or a site built before (with {MARKER}); "
                             f"{out} holds other files")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("built by python -m course_utils.site build\n")
    return out


def _code_sources(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def outputs_from(lesson, executed_dir):
    """``(notebook, why)``: the lesson as it is now with the outputs of its executed
    copy in ``executed_dir`` (``why`` is ``""``), or ``(None, why)`` when that copy
    is missing or its code cells are not the lesson's (the outputs would not be
    what the code shows)."""
    import nbformat
    lesson = Path(lesson)
    copy = Path(executed_dir) / lesson.name
    if not copy.is_file():
        return None, f"no executed copy in {executed_dir}"
    now = nbformat.read(lesson, as_version=4)
    done = nbformat.read(copy, as_version=4)
    a, b = _code_sources(now), _code_sources(done)
    if len(a) != len(b):
        return None, f"stale copy ({len(b)} code cells, the lesson has {len(a)})"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return None, f"stale copy (code cell {i + 1} changed since it ran)"
    ran = iter([c for c in done.cells if c.cell_type == "code"])
    for cell in now.cells:
        if cell.cell_type == "code":
            src = next(ran)
            cell.outputs = src.get("outputs", [])
            cell.execution_count = src.get("execution_count")
    for key in ("widgets",):
        if key in done.metadata:
            now.metadata[key] = done.metadata[key]
    return now, ""


def _run_lessons(paths, execute, use_cache, jobs, timeout, report, cache_dir, outputs_dir=None,
                 on="cpu", done=None):
    """Executed notebook JSON per lesson path, running what the cache lacks.
    ``done(path, text, error, seconds)`` is called as each execution ends (in the
    order they end), so a long run keeps what it finished if it is stopped."""
    import nbformat
    texts, todo, why = {}, [], {}
    fp = (_fingerprint() + on) if execute else ""
    for p in paths:
        if outputs_dir is not None:
            nb, why[p] = outputs_from(p, outputs_dir)
            if nb is not None:
                texts[p] = nbformat.writes(nb)
                report.lessons.append((p.name, f"outputs from {outputs_dir}", 0.0))
                continue
        if not execute:
            texts[p] = p.read_text()
            report.lessons.append((p.name, "as is", 0.0))
            continue
        key = hashlib.sha256(p.read_bytes() + fp.encode()).hexdigest()[:20]
        cached = cache_dir / f"{p.stem}-{key}.ipynb"
        if use_cache and cached.exists():
            texts[p] = cached.read_text()
            report.lessons.append((p.name, "cached run" + (f" ({why[p]})" if why.get(p) else ""),
                                   0.0))
        else:
            todo.append((p, cached))
    if todo:
        results = {}

        def finished(i, result):
            results[i] = result
            if done is not None:
                done(todo[i][0], *result)

        if jobs > 1 and len(todo) > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx) as pool:
                futures = {pool.submit(_execute, str(p), timeout, on): i
                           for i, (p, _) in enumerate(todo)}
                for fut in as_completed(futures):
                    finished(futures[fut], fut.result())
        else:
            for i, (p, _) in enumerate(todo):
                finished(i, _execute(str(p), timeout, on))
        for i, (p, cached) in enumerate(todo):
            text, error, secs = results[i]
            texts[p] = text
            report.lessons.append((p.name, "executed" + (f" ({why[p]})" if why.get(p) else ""),
                                   secs))
            if error:
                report.problems.append(f"notebooks/{p.name}: execution failed: {error}")
            elif use_cache:
                cache_dir.mkdir(parents=True, exist_ok=True)
                tmp = cached.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(text)
                tmp.replace(cached)
                for stale in cache_dir.glob(f"{p.stem}-*.ipynb"):   # older runs of it
                    if stale != cached:
                        stale.unlink(missing_ok=True)
    report.lessons.sort()
    nbs = {p: nbformat.reads(texts[p], as_version=4) for p in paths}
    for nb in nbs.values():
        freeze_widgets(nb)   # no widget JavaScript on the site
    return nbs


# ---------------------------------------------------------------------- frozen widgets
_STATE_MIME = "application/vnd.jupyter.widget-state+json"
_TEXT_MODELS = ("HTMLModel", "HTMLMathModel", "LabelModel")


def _control_value(state):
    """The value a control shows, as text, or None for widgets without one."""
    if "_options_labels" in state:
        labels, index = state["_options_labels"], state.get("index")
        if isinstance(index, int) and 0 <= index < len(labels):
            return labels[index]
        if isinstance(index, (list, tuple)):
            return ", ".join(labels[i] for i in index if 0 <= i < len(labels))
        return None
    value = state.get("value")
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


def _frozen_outputs(model_id, models):
    """What a live widget shows, as notebook outputs, or None when that is nothing a
    page can show: the outputs its Output widgets captured (an ``interact``'s figure
    or printout at the initial settings), the text of its HTML and Label widgets,
    and one line naming the settings of its controls. A widget the kernel closed
    (absent from a saved state that holds others) shows nothing: ``[]``."""
    if models and model_id not in models:
        return []   # the kernel closed it: JupyterLab shows nothing there either
    outputs, settings, texts, seen = [], [], [], set()

    def walk(mid):
        mid = mid.removeprefix("IPY_MODEL_") if isinstance(mid, str) else None
        if mid is None or mid in seen or mid not in models:
            return
        seen.add(mid)
        name = models[mid].get("model_name", "")
        state = models[mid].get("state", {})
        if name == "OutputModel":
            outputs.extend(state.get("outputs", []))
        elif name in _TEXT_MODELS:
            if str(state.get("value", "")).strip():
                value = state["value"] if name != "LabelModel" else html.escape(state["value"])
                texts.append(value)
        elif name.endswith("Model") and state.get("description"):
            value = _control_value(state)
            if value is not None:
                settings.append((state["description"], value))
        for child in state.get("children", []) or []:
            walk(child)

    walk(model_id)
    if not outputs and not texts:
        return None
    frozen = []
    if texts:
        frozen.append({"output_type": "display_data", "metadata": {}, "data": {
            "text/html": '<div class="course-frozen-widget">' + " ".join(texts) + "</div>",
            "text/plain": re.sub(r"<[^>]+>", "", html.unescape(" ".join(texts)))}})
    if settings:
        line = ", ".join(f"{d} = {v}" for d, v in settings)
        frozen.append({"output_type": "display_data", "metadata": {}, "data": {
            "text/html": '<p class="course-frozen-widget"><em>Interactive when run in '
                         f"JupyterLab; shown here with {html.escape(line)}.</em></p>",
            "text/plain": f"(interactive when run in JupyterLab; shown here with {line})"}})
    return frozen + [dict(o) for o in outputs]


def freeze_widgets(nb):
    """Replace each live widget in ``nb``'s outputs by what it shows, read from the
    widget state saved with the notebook (see :func:`_frozen_outputs`), and drop
    that state. A widget with nothing to show (a bare slider) stays as it is, so
    that the build reports it as a widget without a static fallback. Returns the
    number of widgets replaced."""
    import nbformat
    state = nb.metadata.pop("widgets", None) or {}
    models = (state.get(_STATE_MIME) or {}).get("state") or {}
    replaced = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.get("outputs"):
            continue
        new = []
        for out in cell.outputs:
            view = out.get("data", {}).get(WIDGET_MIME)
            frozen = _frozen_outputs(view.get("model_id"), models) if view else None
            if frozen is None:
                new.append(out)
            else:
                new.extend(nbformat.from_dict(o) for o in frozen)
                replaced += 1
        cell.outputs = new
    return replaced


def _static_problems(name, nb, executed):
    """Live widgets without a static fallback, and lessons that were never run."""
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    if code and not any(c.get("outputs") for c in code):
        problems.append(f"notebooks/{name}: no cell has any output "
                        + ("" if executed else "(it was rendered with --no-execute; pass "
                                               "executed notebooks with --src)"))
    for k, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        outs = c.get("outputs", [])
        live = [o for o in outs if WIDGET_MIME in o.get("data", {})]
        if live:
            problems.append(
                f"notebooks/{name}: cell {k} (id {c.get('id', '?')}) shows a live widget with no "
                "static fallback on the site; display views with course_utils.widgets.show(view), "
                "or draw a figure when course_utils.widgets.static_mode() is true")
    return problems


def _title(nb, fallback):
    for c in nb.cells:
        if c.cell_type == "markdown":
            for line in c.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def _readme_rows():
    """The README's lesson table: {stem: (what you build, runs on)}."""
    rows = {}
    readme = ROOT / "README.md"
    if not readme.exists():
        return rows
    pat = re.compile(r"^\|\s*\d+\s*\|\s*`(\d\d_\w+)`\s*\|(.*)\|(.*)\|\s*$")
    for line in readme.read_text().splitlines():
        m = pat.match(line)
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return rows


def _inline_md(text):
    """Escape, then turn `code` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


_INDEX = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>FlashAttention, hands on</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto;
       padding: 0 1rem; line-height: 1.5; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ text-align: left; padding: .45rem .6rem; border-bottom: 1px solid #ddd;
         vertical-align: top; }}
th {{ background: #f4f4f4; }}
code {{ background: #f4f4f4; padding: 0 .2rem; }}
</style></head><body>
<h1>FlashAttention, hands on</h1>
<p>From a three-register toy machine to FlashAttention-style kernels, one notebook at a
time. These pages are the lessons as rendered on a CPU, with each animation drawn as a
filmstrip. To run them yourself: clone the course and run
<code>python course.py lab</code>.</p>
<h2 id="lessons">The lessons</h2>
<table>
<tr><th>#</th><th>lesson</th><th>what you build</th><th>runs on</th></tr>
{rows}
</table>
</body></html>
"""


def _index(pages):
    readme = _readme_rows()
    rows = []
    for stem, title in pages:
        what, runs = readme.get(stem, ("", ""))
        rows.append(f"<tr><td>{int(stem[:2])}</td><td><a href=\"notebooks/{stem}.html\">"
                    f"{html.escape(title)}</a></td><td>{_inline_md(what)}</td>"
                    f"<td>{_inline_md(runs)}</td></tr>")
    return _INDEX.format(rows="\n".join(rows))


def _link_files(body, rendered, out, src):
    """Rewrite links to rendered lessons (.ipynb -> .html) and copy the other local
    files the page points to into the site, at the same place relative to it.
    Links are read as from ``notebooks/``; a notebook there that is missing is
    taken from ``src`` when that holds it."""
    def fix(m):
        prefix, quote, ref = m.groups()
        if not ref or ref.startswith(("#", "//", "data:")) or ref.lower().startswith(_EXTERNAL):
            return m.group(0)
        parts = urlsplit(ref)
        if parts.scheme or parts.netloc:
            return m.group(0)
        target = (LESSONS_DIR / unquote(parts.path)).resolve()
        if target in rendered:
            new = ref[:len(parts.path)].removesuffix(".ipynb") + ".html" + ref[len(parts.path):]
            return f"{prefix}{quote}{new}{quote}"
        if not target.exists() and target.parent == LESSONS_DIR and (src / target.name).is_file():
            origin = src / target.name
        else:
            origin = target
        if origin.is_file() and target.is_relative_to(ROOT) and not any(
                part.startswith(".") for part in target.relative_to(ROOT).parts):
            dest = out / target.relative_to(ROOT)
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, dest)
        return m.group(0)
    return _REF_RE.sub(fix, body)


_NAV_STYLE = ("font-family:system-ui,sans-serif;font-size:14px;padding:.5rem 1rem;"
              "border-bottom:1px solid #ddd;background:#fafafa")


def _add_nav(body, pages, k):
    """A bar at the top of lesson ``k``: the lesson map, the previous and next lesson."""
    links = ['<a href="../index.html">all lessons</a>']
    if k > 0:
        links.append(f'<a href="{pages[k - 1][0]}.html">&larr; {html.escape(pages[k - 1][1])}</a>')
    if k + 1 < len(pages):
        links.append(f'<a href="{pages[k + 1][0]}.html">{html.escape(pages[k + 1][1])} &rarr;</a>')
    nav = f'<nav class="course-nav" style="{_NAV_STYLE}">' + " &middot; ".join(links) + "</nav>"
    m = re.search(r"<body[^>]*>", body)
    return body[:m.end()] + nav + body[m.end():] if m else nav + body


# ---------------------------------------------------------------------- offline math
_SKIP_TAGS = ("pre", "code", "script", "style", "textarea", "math")
_TAG = re.compile(r"(<!--.*?-->|<[^>]+>)", re.S)
_MATH = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\$([^$]+?)\$|\\\((.+?)\\\)", re.S)
_TEXT_CMD = re.compile(r"\\(text|mathrm|texttt|textbf)\{([^{}]*)\}")
_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//[^>]*>.*?</script>", re.S | re.I)
_MATHJAX_CONFIG = re.compile(r"<script\b[^>]*type=[\"']text/x-mathjax-config[\"'][^>]*>.*?</script>", re.S | re.I)
_INLINE_SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S | re.I)
_REMOTE_IMPORT = re.compile(r"""import\s*\(?\s*["'](?:https?:)?//""")


def latex_to_mathml(tex: str, display: bool = False) -> str:
    """One formula as MathML (one line, no markdown-special characters in it).
    Raises ``ValueError`` naming the formula when it cannot be converted."""
    try:
        from latex2mathml.converter import convert
    except ImportError as exc:   # pragma: no cover - a dependency of the package
        raise ImportError("the site renders math with latex2mathml: pip install latex2mathml") from exc
    src = tex.strip()
    # environments and escapes latex2mathml reads differently from MathJax
    src = src.replace("\\begin{aligned}", "\\begin{align*}").replace("\\end{aligned}", "\\end{align*}")
    src = _TEXT_CMD.sub(lambda m: f"\\{m.group(1)}{{{m.group(2).replace(chr(92) + '_', '_')}}}", src)
    try:
        out = convert(src, display="block" if display else "inline")
    except Exception as exc:  # noqa: BLE001 - any parser error is a formula it cannot draw
        raise ValueError(f"cannot render the formula {tex.strip()[:80]!r}: {type(exc).__name__}: {exc}") from None
    if re.search(r"&(?!#?\w+;)", out) or "<merror" in out:
        raise ValueError(f"cannot render the formula {tex.strip()[:80]!r}: the converter left "
                         f"LaTeX in its output")
    return out.replace("\n", "")


def render_math(body: str) -> tuple[str, list[str]]:
    """Replace the LaTeX of every text node (outside ``pre``, ``code``, ``script``,
    ``style``) by MathML; returns the page and the formulas it could not convert."""
    problems = []
    parts = _TAG.split(body)
    depth = 0
    for k, part in enumerate(parts):
        if k % 2:                                   # a tag or a comment
            m = re.match(r"<(/?)([a-zA-Z][\w-]*)", part)
            if m and m.group(2).lower() in _SKIP_TAGS and not part.endswith("/>"):
                depth += -1 if m.group(1) else 1
                depth = max(depth, 0)
            continue
        if depth or "$" not in part and "\\(" not in part and "\\[" not in part:
            continue

        def repl(m):
            block = m.group(1) is not None or m.group(2) is not None
            tex = html.unescape(next(g for g in m.groups() if g is not None))
            try:
                return latex_to_mathml(tex, display=block)
            except ValueError as exc:
                problems.append(str(exc))
                return m.group(0)
        parts[k] = _MATH.sub(repl, part)
    return "".join(parts), problems


def strip_remote_scripts(body: str) -> str:
    """Remove the scripts a page would fetch from another site (MathJax, require.js
    and mermaid from a CDN): the pages are static and their math is MathML."""
    body = _REMOTE_SCRIPT.sub("", body)
    body = _MATHJAX_CONFIG.sub("", body).replace("<!-- MathJax configuration -->", "")
    return _INLINE_SCRIPT.sub(lambda m: "" if _REMOTE_IMPORT.search(m.group(2)) else m.group(0), body)


def build(out="site", lessons=None, execute=True, src=None, jobs=None, use_cache=True,
          timeout=600, cache_dir=CACHE_DIR, save_executed=None, outputs_dir=None,
          on="cpu", log=print) -> BuildReport:
    """Build the site into ``out`` and check it; returns a :class:`BuildReport`
    whose ``problems`` lists everything wrong (empty when the site is good).

    ``lessons``: two-digit prefixes (default: every lesson in ``src``, which
    defaults to ``notebooks/``); ``execute=False`` renders the notebooks as they
    are; ``jobs``: lessons executed at once; ``use_cache``/``cache_dir``: reuse
    earlier runs of unchanged lessons; ``timeout``: seconds per cell;
    ``save_executed``: a folder to write the executed lessons to (as
    ``NN_topic.ipynb``, for a later ``build(execute=False, src=that folder)``);
    ``outputs_dir``: take the outputs of lessons whose executed copy there is current
    (see :func:`outputs_from`), executing the others; ``on``: ``"cpu"`` executes the
    lessons on the CPU whatever the machine, ``"machine"`` on this machine's device."""
    if jobs is None:
        jobs = min(2, os.cpu_count() or 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ValueError(f"timeout must be a positive int (seconds per cell), got {timeout!r}")
    paths = lesson_paths(LESSONS_DIR if src is None else Path(src), lessons)
    if save_executed is not None and Path(save_executed).resolve() in (
            LESSONS_DIR, paths[0].parent.resolve() if paths else None):
        raise ValueError(f"save_executed must be another folder than the lessons' own "
                         f"(the lessons stay without outputs), got {save_executed}")
    if not paths:
        raise ValueError(f"no lesson notebooks NN_topic.ipynb in {src or LESSONS_DIR}")
    if on not in ("cpu", "machine"):
        raise ValueError(f"on must be 'cpu' or 'machine', got {on!r}")
    if outputs_dir is not None and not Path(outputs_dir).is_dir():
        raise ValueError(f"outputs_dir must be a folder of executed lessons, got {outputs_dir}")
    t0 = time.time()
    out = _prepare_out(Path(out))
    report = BuildReport(out)
    keep = None if save_executed is None else Path(save_executed)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)

    def done(path, text, error, secs):
        # each lesson is logged and kept as soon as it has run, not after the last
        log(f"[site] {path.name}: executed in {secs:.1f} s" + (f" ({error})" if error else ""))
        sys.stdout.flush()
        if keep is not None:
            (keep / path.name).write_text(text, encoding="utf-8")

    nbs = _run_lessons(paths, execute, use_cache, jobs, timeout, report, Path(cache_dir),
                       None if outputs_dir is None else Path(outputs_dir), on, done)
    if keep is not None:
        import nbformat
        for p in paths:           # every lesson again, its widgets now frozen
            nbformat.write(nbs[p], keep / p.name)

    from nbconvert import HTMLExporter
    exporter = HTMLExporter(template_name="lab")
    rendered = {(LESSONS_DIR / p.name).resolve() for p in paths}
    (out / "notebooks").mkdir()
    pages = [(p.stem, _title(nbs[p], p.stem)) for p in paths]
    for k, p in enumerate(paths):
        nb = nbs[p]
        report.problems.extend(_static_problems(p.name, nb, execute))
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": pages[k][1]}})
        body, bad_math = render_math(strip_remote_scripts(body))
        report.problems.extend(f"{p.name}: {line}" for line in bad_math)
        body = _link_files(body, rendered, out, paths[0].parent)
        body = _add_nav(body, pages, k)
        (out / "notebooks" / f"{p.stem}.html").write_text(body, encoding="utf-8")
    (out / "index.html").write_text(_index(pages), encoding="utf-8")
    report.problems.extend(check(out))
    report.seconds = time.time() - t0
    for name, how, secs in report.lessons:
        if not how.startswith("executed"):          # those were logged as they ended
            log(f"[site] {name}: {how}" + (f" in {secs:.1f} s" if secs else ""))
    log(f"[site] {len(pages)} lesson pages and index.html in {out} ({report.seconds:.1f} s)")
    return report


# ---------------------------------------------------------------------- checking
class _Page(HTMLParser):
    """Collects the ids and the references (href/src) of one HTML page."""
    REF_ATTRS = {"a": ("href",), "img": ("src",), "link": ("href",), "script": ("src",),
                 "source": ("src",), "iframe": ("src",), "video": ("src", "poster"),
                 "audio": ("src",), "image": ("href", "xlink:href"), "use": ("href",)}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.refs = set(), []
        self.remote_scripts, self.math, self.tex = [], 0, []
        self._in = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            src = (a.get("src") or "").strip()
            if src.startswith("//") or src.lower().startswith(("http:", "https:")):
                self.remote_scripts.append(src)
        if tag == "math":
            self.math += 1
        if tag in _SKIP_TAGS:
            self._in.append(tag)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(unquote(a[key]))
        if tag == "img" and not (a.get("src") or "").strip():
            self.refs.append((tag, "src", ""))
        for attr in self.REF_ATTRS.get(tag, ()):
            if a.get(attr) is not None and (tag != "img" or a[attr].strip()):
                self.refs.append((tag, attr, a[attr].strip()))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_endtag(self, tag):
        if tag in self._in:
            while self._in and self._in.pop() != tag:
                pass

    def handle_data(self, data):
        if self._in and self._in[-1] == "script" and _REMOTE_IMPORT.search(data):
            self.remote_scripts.append("an inline script importing from another site")
        elif not self._in:
            self.tex.extend(m.group(0)[:60] for m in _MATH.finditer(data)
                            if "\\" in m.group(0) or "$$" in m.group(0))


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    page.close()
    return page


def check(site="site") -> list[str]:
    """Every broken internal link, missing anchor and missing image of the site in
    ``site``, one line each (an empty list when there is none)."""
    site = Path(site).resolve()
    if not site.is_dir():
        raise ValueError(f"site must be the folder of a built site, got {site}")
    pages = sorted(site.rglob("*.html"))
    if not pages:
        return [f"{site}: no HTML pages"]
    parsed = {p: _parse(p) for p in pages}
    problems = []
    for page, info in parsed.items():
        where = page.relative_to(site).as_posix()
        for src in info.remote_scripts:
            problems.append(f"{where}: script from another site: {src} (the site must work offline)")
        for tex in info.tex:
            problems.append(f"{where}: math left as LaTeX: {tex!r}")
        for tag, attr, ref in info.refs:
            kind = "missing image" if tag in ("img", "image") else "broken link"
            if not ref:
                problems.append(f"{where}: <{tag}> without a {attr}")
                continue
            if ref.startswith("//") or ref.lower().startswith(_EXTERNAL):
                continue
            if ref.startswith("data:"):
                if tag == "img" and "," in ref and not ref.split(",", 1)[1].strip():
                    problems.append(f"{where}: {kind}: an empty data: URI")
                continue
            parts = urlsplit(ref)
            if parts.scheme or parts.netloc:
                problems.append(f"{where}: {kind} {ref!r} (unknown scheme)")
                continue
            if parts.path:
                target = (page.parent / unquote(parts.path)).resolve()
                if parts.path.endswith("/") or target.is_dir():
                    target = target / "index.html"
                if not target.is_relative_to(site):
                    problems.append(f"{where}: {kind} {ref!r} points outside the site")
                    continue
                if not target.is_file():
                    problems.append(f"{where}: {kind} {ref!r} (no file "
                                    f"{target.relative_to(site).as_posix()})")
                    continue
            else:
                target = page
            frag = unquote(parts.fragment)
            if frag and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if frag not in ids:
                    problems.append(f"{where}: broken link {ref!r} (no anchor #{frag} in "
                                    f"{target.relative_to(site).as_posix()})")
    return problems


# ---------------------------------------------------------------------- command line
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course_utils.site",
                                 description="Build or check the course's static site.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="render every lesson to HTML and check the result")
    b.add_argument("--out", default=str(ROOT / "site"), help="output folder (default: site/)")
    b.add_argument("--lessons", nargs="+", metavar="NN", help="only these lessons (prefixes)")
    b.add_argument("--src", help="folder of lesson notebooks (default: notebooks/)")
    b.add_argument("--no-execute", action="store_true",
                   help="render the notebooks as they are (they must hold outputs)")
    b.add_argument("--no-cache", action="store_true", help="execute even if build/site-cache "
                                                          "has a run of the same notebook")
    b.add_argument("--jobs", type=int, default=None, help="lessons executed at once "
                                                          "(default: 2 or the CPU count)")
    b.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    b.add_argument("--save-executed", metavar="DIR",
                   help="also write the executed lessons to DIR (reuse: --no-execute --src DIR)")
    b.add_argument("--on", choices=("cpu", "machine"), default="cpu",
                   help="execute the lessons on the CPU (default) or on this machine's GPU")
    b.add_argument("--outputs-from", metavar="DIR",
                   help="outputs of lessons executed elsewhere (e.g. benchmarks/<gpu>/executed): "
                        "used where their code is the lessons' code, the rest executed here")
    c = sub.add_parser("check", help="list broken links and missing images of a built site")
    c.add_argument("site", nargs="?", default=str(ROOT / "site"))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            report = build(args.out, lessons=args.lessons, execute=not args.no_execute,
                           src=args.src, jobs=args.jobs, use_cache=not args.no_cache,
                           timeout=args.timeout, save_executed=args.save_executed,
                           outputs_dir=args.outputs_from, on=args.on)
            problems = report.problems
        else:
            problems = check(args.site)
    except (ValueError, TypeError) as exc:
        print(f"[site] error: {exc}", file=sys.stderr)
        return 2
    if problems:
        print(f"[site] {len(problems)} problem(s):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print("[site] no broken links and no missing images"
          + (", every widget has a static fallback" if args.cmd == "build" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
