"""The static site: ``python -m course_utils.site build`` renders lessons to HTML
with a static filmstrip for every widget, and ``check`` finds broken links and
missing images."""
import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils import site

ROOT = Path(__file__).resolve().parent.parent
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def write_nb(path, cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNEL
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md"
                else nbformat.v4.new_code_cell(src) for kind, src in cells]
    for k, cell in enumerate(nb.cells):
        cell.id = f"c{k:02d}"
    nbformat.write(nb, path)
    return path


def write_site(root, pages):
    for rel, body in pages.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>")


# ---------------------------------------------------------------------- check
def test_check_passes_a_good_site(tmp_path):
    write_site(tmp_path, {
        "index.html": '<a href="notebooks/a.html">a</a> <a href="notebooks/a.html#Part-2">2</a>'
                      '<a href="https://example.org/x">out</a> <a href="#top">top</a>'
                      '<h1 id="top">t</h1><img src="img/fig.png" alt="f">'
                      f'<img src="data:image/png;base64,{PNG}">',
        "notebooks/a.html": '<h2 id="Part-2">P</h2><a href="../index.html">home</a>'
                            '<a href="./">dir</a><a href="../exercises/a.ipynb">ex</a>'
                            '<h3 id="Lesson-0-%E2%80%94-Setup">x</h3>'
                            '<a href="#Lesson-0-%E2%80%94-Setup">enc</a>'
                            '<a href="#Lesson-0-\u2014-Setup">raw</a>',
        "notebooks/index.html": "listing",
    })
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "fig.png").write_bytes(base64.b64decode(PNG))
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "a.ipynb").write_text("{}")
    assert site.check(tmp_path) == []


def test_check_lists_broken_links_and_missing_images(tmp_path):
    write_site(tmp_path, {
        "index.html": '<a href="notebooks/missing.html">gone</a>'
                      '<a href="notebooks/a.html#No-Such-Heading">anchor</a>'
                      '<a href="#nowhere">self</a>'
                      '<a href="../outside.html">up</a>'
                      '<img src="img/missing.png">'
                      '<img alt="no source">'
                      '<img src="data:image/png;base64,">',
        "notebooks/a.html": '<h2 id="Part-2">P</h2>',
    })
    problems = site.check(tmp_path)
    expected = [
        "index.html: broken link 'notebooks/missing.html' (no file notebooks/missing.html)",
        "index.html: broken link 'notebooks/a.html#No-Such-Heading' "
        "(no anchor #No-Such-Heading in notebooks/a.html)",
        "index.html: broken link '#nowhere' (no anchor #nowhere in index.html)",
        "index.html: broken link '../outside.html' points outside the site",
        "index.html: missing image 'img/missing.png' (no file img/missing.png)",
        "index.html: <img> without a src",
        "index.html: missing image: an empty data: URI",
    ]
    assert sorted(problems) == sorted(expected)


def test_check_command_fails_with_the_list(tmp_path):
    write_site(tmp_path, {"index.html": '<img src="gone.png">'})
    r = subprocess.run([sys.executable, "-m", "course_utils.site", "check", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 1
    assert "missing image 'gone.png'" in r.stderr


def test_check_rejects_a_folder_that_is_not_a_site(tmp_path):
    with pytest.raises(ValueError, match="site must be the folder of a built site"):
        site.check(tmp_path / "nope")
    assert site.check(tmp_path) == [f"{tmp_path.resolve()}: no HTML pages"]


# ---------------------------------------------------------------------- build
def test_build_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="lessons must be two-digit prefixes"):
        site.build(tmp_path / "s", lessons=["1"])
    with pytest.raises(TypeError, match="lessons must be a list"):
        site.build(tmp_path / "s", lessons="01")
    with pytest.raises(ValueError, match=r"lessons \['77'\] have no notebook"):
        site.build(tmp_path / "s", lessons=["77"])
    with pytest.raises(ValueError, match="jobs must be a positive int"):
        site.build(tmp_path / "s", jobs=0)
    with pytest.raises(ValueError, match="timeout must be a positive int"):
        site.build(tmp_path / "s", timeout=0)
    with pytest.raises(ValueError, match="on must be 'cpu' or 'machine'"):
        site.build(tmp_path / "s", on="gpu")
    # the lessons run on the CPU unless asked to run on this machine's device
    assert site._kernel_env()["COURSE_DEVICE"] == "cpu"
    assert "COURSE_DEVICE" not in site._kernel_env("machine")
    with pytest.raises(ValueError, match="src must be a folder"):
        site.build(tmp_path / "s", src=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="out must be a folder for the site only"):
        site.build(ROOT)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("not a site")
    with pytest.raises(ValueError, match="out must be empty or a site built before"):
        site.build(tmp_path / "busy", execute=False)
    assert (tmp_path / "busy" / "keep.txt").exists()


# the tests of the small course run on one test worker, so it is built once
SMALL_COURSE = pytest.mark.xdist_group("site-small-course")


@pytest.fixture(scope="module")
def small_course(tmp_path_factory):
    """Four tiny lessons: one that links to the others, one with a view shown through
    course_utils.widgets.show, one that displays a live widget directly, one that
    fails. The cache key ignores edits to course_utils made while the tests run."""
    src = tmp_path_factory.mktemp("lessons")
    write_nb(src / "00_intro.ipynb", [
        ("md", "# Intro lesson\n\nSee [the tiles](01_tiles.ipynb#The-tiles) and "
               "[the README](../README.md).\n\n## Peak memory against $N$\n\n"
               "Inline $B_r \\le d$ and a block\n\n$$\n\\begin{aligned}\n"
               "l &\\leftarrow \\alpha\\, l + \\operatorname{rowsum} \\tilde P\n\\end{aligned}\n$$\n\n"
               "and `$x$` in code stays as it is."),
        ("code", "print('hello')"),
    ])
    write_nb(src / "01_tiles.ipynb", [
        ("md", "# Tiles\n\n## The tiles"),
        ("code", "from course_utils.widgets import show\n"
                 "from course_utils.widgets.tile_animation import TileAnimation\n"
                 "view = TileAnimation(Nq=8, Nk=8, Br=4, Bc=4)\n"
                 "_ = show(view)"),
    ])
    write_nb(src / "02_live.ipynb", [
        ("md", "# Live only"),
        ("code", "import ipywidgets\nipywidgets.IntSlider(3)"),
    ])
    write_nb(src / "03_broken.ipynb", [("md", "# Broken"), ("code", "x = 1"),
                                       ("code", "raise ValueError('boom')")])
    out = tmp_path_factory.mktemp("site") / "site"
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(site, "_fingerprint", lambda: "fixed")
        report = site.build(out, src=src, cache_dir=cache, jobs=2, log=lambda m: None)
        yield src, out, cache, report


@SMALL_COURSE
def test_build_renders_filmstrips_and_an_index(small_course):
    src, out, _, report = small_course
    assert [how for _, how, _ in report.lessons] == ["executed"] * 4
    index = (out / "index.html").read_text()
    for stem, title in (("00_intro", "Intro lesson"), ("01_tiles", "Tiles")):
        assert f'href="notebooks/{stem}.html"' in index and title in index
    tiles = (out / "notebooks" / "01_tiles.html").read_text()
    assert "data:image/png;base64," in tiles, "the filmstrip is not on the page"
    intro = (out / "notebooks" / "00_intro.html").read_text()
    assert 'href="01_tiles.html#The-tiles"' in intro, "links between lessons point at .html"
    assert (out / "README.md").exists(), "files the lessons link to are copied"
    assert '<a href="../index.html">all lessons</a>' in intro
    assert '<a href="01_tiles.html">Tiles &rarr;</a>' in intro


@SMALL_COURSE
def test_build_renders_math_offline(small_course):
    """The math is MathML in the page, no script comes from another site, and the
    heading's anchor (which holds the LaTeX) still works."""
    _, out, _, _ = small_course
    intro = (out / "notebooks" / "00_intro.html").read_text()
    assert intro.count("<math") == 3, "the heading, the inline and the block formula"
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">' in intro
    assert "<mtable" in intro, "aligned is drawn as a table"
    assert "<code>$x$</code>" in intro, "math in code is left alone"
    assert "MathJax" not in intro and "cdnjs" not in intro and "require.min.js" not in intro
    assert not re.search(r"<script[^>]*src=[\"']?(https?:)?//", intro)
    assert 'id="Peak-memory-against-$N$"' in intro and site.check(out) == []


def test_render_math_converts_text_and_skips_code_and_attributes():
    body = ('<h2 id="a-$N$">About $N$<a href="#a-$N$">x</a></h2><p>$a &lt; b$ and</p>'
            '<p>$$\nx^2\n$$</p><pre>$not math$</pre><code>$y$</code>'
            '<script>var s = "$z$";</script>')
    out, problems = site.render_math(body)
    assert problems == []
    assert out.count("<math") == 3
    assert 'id="a-$N$"' in out and 'href="#a-$N$"' in out
    assert "&#x0003C;" in out or "&lt;" in out.split("<math")[2], "a < b keeps its operator"
    assert "<pre>$not math$</pre>" in out and "<code>$y$</code>" in out and '"$z$"' in out
    assert 'display="block"' in out


def test_render_math_reports_what_it_cannot_draw():
    out, problems = site.render_math("<p>fine $x$, broken $\\frac{1}{$ end</p>")
    assert len(problems) == 1 and "cannot render the formula" in problems[0]
    with pytest.raises(ValueError, match="cannot render the formula"):
        site.latex_to_mathml("\\frac{1}{")


def test_strip_remote_scripts_and_check_flags_them(tmp_path):
    from nbconvert import HTMLExporter
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# T\n\n$x$")]
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    assert re.search(r"<script[^>]*src=\"https://", body), "the template loads scripts remotely"
    clean = site.strip_remote_scripts(body)
    assert not re.search(r"<script[^>]*src=\"https?://", clean)
    assert "import(\"https://" not in clean and "text/x-mathjax-config" not in clean
    write_site(tmp_path, {"index.html": '<script src="https://cdn.example/x.js"></script>'
                                        '<script type="module">await import("https://e/m.mjs")'
                                        '</script><p>left $\\alpha$ here</p><code>$\\beta$</code>'})
    problems = site.check(tmp_path)
    assert any("script from another site: https://cdn.example/x.js" in p for p in problems)
    assert any("inline script importing from another site" in p for p in problems)
    assert any("math left as LaTeX" in p and "alpha" in p for p in problems)
    assert not any("beta" in p for p in problems)


@SMALL_COURSE
def test_build_reports_live_widgets_and_failing_lessons(small_course):
    _, out, _, report = small_course
    assert report.problems == [
        "notebooks/03_broken.ipynb: execution failed: cell 2 (id c02) raised ValueError: boom",
        "notebooks/02_live.ipynb: cell 1 (id c01) shows a live widget with no static fallback "
        "on the site; display views with course_utils.widgets.show(view), or draw a figure "
        "when course_utils.widgets.static_mode() is true"]
    assert (out / "notebooks" / "03_broken.html").exists(), "a failing lesson is still shown"


@SMALL_COURSE
def test_build_reuses_earlier_runs_and_renders_as_is(small_course, tmp_path):
    src, _, cache, _ = small_course
    again = site.build(tmp_path / "again", src=src, lessons=["00", "01"], cache_dir=cache,
                       save_executed=tmp_path / "executed", log=lambda m: None)
    assert [how for _, how, _ in again.lessons] == ["cached run"] * 2 and again.ok
    # executed lessons saved by one build render as they are in another
    reused = site.build(tmp_path / "reused", src=tmp_path / "executed", execute=False,
                        log=lambda m: None)
    assert [how for _, how, _ in reused.lessons] == ["as is"] * 2 and reused.ok
    assert "data:image/png;base64," in (tmp_path / "reused/notebooks/01_tiles.html").read_text()
    with pytest.raises(ValueError, match="save_executed must be another folder"):
        site.build(tmp_path / "x", src=src, save_executed=src)
    raw = site.build(tmp_path / "raw", src=src, lessons=["00"], execute=False,
                     log=lambda m: None)
    assert raw.problems == ["notebooks/00_intro.ipynb: no cell has any output (it was rendered "
                            "with --no-execute; pass executed notebooks with --src)"]
    # a site built before may be rebuilt in place
    assert site.build(tmp_path / "raw", src=src, lessons=["00"], execute=False,
                      log=lambda m: None).problems == raw.problems


@SMALL_COURSE
def test_outputs_from_an_executed_copy_only_while_its_code_is_current(small_course, tmp_path):
    src, _, cache, _ = small_course
    executed = tmp_path / "gpu"
    site.build(tmp_path / "first", src=src, lessons=["00", "01"], cache_dir=cache,
               save_executed=executed, log=lambda m: None)
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    for name in ("00_intro.ipynb", "01_tiles.ipynb"):
        (lessons / name).write_bytes((src / name).read_bytes())
    # prose edited since the run: the outputs still fit the code, and the new prose is used
    nb = nbformat.read(lessons / "00_intro.ipynb", as_version=4)
    nb.cells[0].source += "\n\nA sentence written after the run."
    nbformat.write(nb, lessons / "00_intro.ipynb")
    merged, why = site.outputs_from(lessons / "00_intro.ipynb", executed)
    assert why == "" and "written after the run" in merged.cells[0].source
    assert merged.cells[1].outputs[0]["text"] == "hello\n"
    assert not nbformat.read(lessons / "00_intro.ipynb", as_version=4).cells[1].outputs
    # code edited since the run: the copy is stale and the lesson is executed here
    nb = nbformat.read(lessons / "01_tiles.ipynb", as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace("Nq=8", "Nq=12")
    nbformat.write(nb, lessons / "01_tiles.ipynb")
    assert site.outputs_from(lessons / "01_tiles.ipynb", executed) == \
        (None, "stale copy (code cell 1 changed since it ran)")
    assert site.outputs_from(src / "02_live.ipynb", executed)[1].startswith("no executed copy")
    report = site.build(tmp_path / "out", src=lessons, cache_dir=cache, outputs_dir=executed,
                        log=lambda m: None)
    assert report.ok, report.problems
    assert [how for _, how, _ in report.lessons] == [
        f"outputs from {executed}", "executed (stale copy (code cell 1 changed since it ran))"]
    assert "written after the run" in (tmp_path / "out/notebooks/00_intro.html").read_text()
    with pytest.raises(ValueError, match="outputs_dir must be a folder"):
        site.build(tmp_path / "x", src=lessons, outputs_dir=tmp_path / "nowhere")


@SMALL_COURSE
def test_build_leaves_this_process_alone(small_course):
    assert os.environ.get("COURSE_STATIC_WIDGETS") != "1", "only the kernels are static"


# ---------------------------------------------------------------------- frozen widgets
def widget_nb(outputs, models):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("interact(...)", outputs=[
        nbformat.from_dict(o) for o in outputs])]
    if models is not None:
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
            "state": {mid: {"model_name": name, "state": state}
                      for mid, (name, state) in models.items()},
            "version_major": 2, "version_minor": 0}}
    return nb


def view(model_id):
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/plain": "a widget", site.WIDGET_MIME: {
                "version_major": 2, "version_minor": 0, "model_id": model_id}}}


INTERACT = {
    "box": ("VBoxModel", {"children": ["IPY_MODEL_pick", "IPY_MODEL_size", "IPY_MODEL_out"]}),
    "pick": ("DropdownModel", {"description": "batch", "_options_labels": ["1", "8"],
                               "index": 1}),
    "size": ("IntSliderModel", {"description": "log2 cache", "value": 15}),
    "out": ("OutputModel", {"outputs": [
        {"output_type": "stream", "name": "stdout", "text": "B=8, cache=32768\n"},
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": PNG}}]}),
    "bar": ("HBoxModel", {"children": ["IPY_MODEL_label", "IPY_MODEL_progress"]}),
    "label": ("HTMLModel", {"description": "", "value": "train: 100% 8/8"}),
    "progress": ("FloatProgressModel", {"description": "", "value": 8.0, "max": 8.0}),
    "slider": ("IntSliderModel", {"description": "x", "value": 3}),
}


def test_freeze_widgets_keeps_what_each_widget_shows():
    nb = widget_nb([view("box"), view("bar"), view("slider"), view("closed")], INTERACT)
    assert site.freeze_widgets(nb) == 3
    assert "widgets" not in nb.metadata, "no widget state (or JavaScript) on the site"
    outs = nb.cells[0].outputs
    texts = [o.get("text") or o["data"].get("text/plain") for o in outs]
    assert texts[0] == ("(interactive when run in JupyterLab; shown here with batch = 8, "
                        "log2 cache = 15)"), "the interact's settings"
    assert texts[1] == "B=8, cache=32768\n" and outs[2]["data"]["image/png"] == PNG, \
        "the interact's printout and figure"
    assert texts[3] == "train: 100% 8/8", "the progress bar's text"
    assert site.WIDGET_MIME in outs[4]["data"] and len(outs) == 5, \
        "a bare slider has nothing to show: it stays, and the build reports it"
    problems = site._static_problems("x.ipynb", nb, True)
    assert len(problems) == 1 and "cell 0" in problems[0] and "no static fallback" in problems[0]


def test_freeze_widgets_without_saved_state_changes_nothing():
    nb = widget_nb([view("box")], None)
    assert site.freeze_widgets(nb) == 0
    assert site.WIDGET_MIME in nb.cells[0].outputs[0]["data"]


# ---------------------------------------------------------------------- the course's site
# a call of course_utils.widgets.show (not plt.show, not a lesson's own `def show`)
SHOW_CALL = re.compile(r"^(?!\s*def ).*(?<![\w.])show\(", re.M)


@pytest.mark.slow
def test_build_every_lesson(tmp_path):
    """The site of the whole course, as ``python -m course_utils.site build`` makes it:
    every lesson executed with static widgets and rendered, no broken link or missing
    image, every widget with its static fallback (each cell that shows a view holds
    its filmstrip). Runs are cached in build/site-cache, so a later build of the
    site reuses them."""
    lessons = site.lesson_paths()
    if not (ROOT / "notebooks" / "01_register_machine.ipynb").exists():
        pytest.skip("lesson 1 is not in notebooks/ yet")
    out = ROOT / "build" / "site-test"
    report = site.build(out, save_executed=tmp_path, timeout=300, log=lambda m: None)
    assert report.problems == [], "\n".join(report.problems)
    assert site.check(out) == []
    assert sorted(name for name, _, _ in report.lessons) == [p.name for p in lessons]
    index = (out / "index.html").read_text()
    filmstrips = {}
    for p in lessons:
        page = (out / "notebooks" / f"{p.stem}.html").read_text()
        assert f'href="notebooks/{p.stem}.html"' in index, f"{p.stem} is not in the index"
        assert "application/vnd.jupyter.widget-view+json" not in page, f"{p.stem}: a live widget"
        nb = nbformat.read(tmp_path / p.name, as_version=4)
        for k, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and SHOW_CALL.search(cell.source):
                pngs = [o for o in cell.outputs if "image/png" in o.get("data", {})]
                assert pngs, f"{p.stem}: cell {k} shows a view but holds no filmstrip"
                assert pngs[0]["data"]["image/png"][:40] in page, \
                    f"{p.stem}: the filmstrip of cell {k} is not on the page"
                filmstrips[p.stem] = filmstrips.get(p.stem, 0) + 1
    # the two animations the browser tests drive live: the trace stepper, the tiles
    assert filmstrips.get("01_register_machine", 0) >= 1, filmstrips
    assert filmstrips.get("04_tiled_attention", 0) >= 1, filmstrips
    page = (out / "notebooks" / "01_register_machine.html").read_text()
    assert page.count("data:image/png;base64,") >= 1
    # offline: no page loads a script from another site, and the math is MathML
    for p in lessons:
        page_p = (out / "notebooks" / f"{p.stem}.html").read_text()
        assert not re.search(r"<script[^>]*src=[\"']?(https?:)?//", page_p), p.stem
        if "$" in "".join(c.source for c in nbformat.read(p, as_version=4).cells
                          if c.cell_type == "markdown"):
            assert "<math" in page_p, f"{p.stem}: its math is not rendered"
    assert "application/vnd.jupyter.widget-view+json" not in page


@SMALL_COURSE
def test_each_lesson_is_kept_as_soon_as_it_has_run(small_course, tmp_path, monkeypatch):
    """A long GPU run stopped part-way keeps (and has logged) the lessons it finished."""
    src, _, _, _ = small_course
    real = site._execute
    ran = []

    def stop_at_second(path, timeout, on="cpu"):
        if ran:
            raise KeyboardInterrupt("stopped from outside")
        ran.append(path)
        return real(path, timeout, on)

    monkeypatch.setattr(site, "_execute", stop_at_second)
    lines = []
    with pytest.raises(KeyboardInterrupt):
        site.build(tmp_path / "out", src=src, lessons=["00", "01"], jobs=1, use_cache=False,
                   save_executed=tmp_path / "kept", log=lines.append)
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["00_intro.ipynb"]
    kept = nbformat.read(tmp_path / "kept" / "00_intro.ipynb", as_version=4)
    assert any(c.get("outputs") for c in kept.cells if c.cell_type == "code")
    assert len(lines) == 1 and lines[0].startswith("[site] 00_intro.ipynb: executed in ")
