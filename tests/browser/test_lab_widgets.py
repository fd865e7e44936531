"""The course in a real browser: the README's lab command serves JupyterLab with
working ipywidgets, and the lesson animations move when a learner presses Play
or drags the slider.

Each browser test opens a lesson in /lab, runs cells until the widget under
test appears (the imports and the cells that show a view; every cell from the
top when those need more), presses Play, pauses, drags the slider, and checks
after each action that the text the widget shows has changed. Screenshots go to
``artifacts/browser/``; a failing step names itself and keeps a screenshot of
the page at that moment. JupyterLab runs with autosave off, and each test checks
that its lesson file is unchanged on disk afterwards.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
# one worker, one JupyterLab for every test here
pytestmark = [pytest.mark.xdist_group("browser"), pytest.mark.slow]

WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"

# (lesson notebook, CSS class of the element whose text shows the state, artifact prefix)
LESSONS = [
    ("notebooks/01_register_machine.ipynb", "course-registers", "lesson01-trace-stepper"),
    ("notebooks/04_tiled_attention.ipynb", "course-tile-state", "lesson04-tile-animation"),
]

CELL_TIMEOUT_MS = 300_000
CHANGE_TIMEOUT_S = 30


# ------------------------------------------------------------------ no browser
def page_config(html):
    """The ``jupyter-config-data`` JSON that JupyterLab's /lab page carries."""
    m = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                  html, re.S)
    assert m, "the /lab page has no jupyter-config-data block"
    return json.loads(m.group(1))


def test_lab_command_serves_ipywidgets(lab_server):
    """/lab answers 200 and loads the ipywidgets extension; a Python kernel is there."""
    status, body = lab_server.get("/lab")
    assert status == 200, f"GET /lab answered {status}"
    config = page_config(body)
    names = [ext.get("name") for ext in config.get("federated_extensions", [])]
    assert WIDGETS_EXTENSION in names, (
        f"JupyterLab does not load {WIDGETS_EXTENSION} (widgets would show as text); "
        f"its federated extensions are {names}; reinstall ipywidgets>=8 / jupyterlab_widgets")
    _, specs = lab_server.get("/api/kernelspecs")
    assert '"python3"' in specs, f"no python3 kernel: {specs[:300]}"
    _, listing = lab_server.get("/api/contents/notebooks")
    assert "00_setup.ipynb" in listing, "the server does not serve the course's notebooks/"


# ------------------------------------------------------------------ helpers
class Steps:
    """Names the step being run; on failure takes a screenshot and says which step
    failed, with the browser's errors and the server log's tail."""

    def __init__(self, page, prefix, lab):
        self.page, self.prefix, self.lab = page, prefix, lab
        self.errors = []
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}")
                if m.type == "error" else None)
        self.shots = []

    @contextmanager
    def step(self, what):
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - every failure gets the same report
            shot = ARTIFACTS / f"{self.prefix}-FAILED.png"
            try:
                self.page.screenshot(path=str(shot), full_page=True)
            except Exception as shot_exc:  # noqa: BLE001
                shot = f"(no screenshot: {shot_exc})"
            errors = "\n  ".join(self.errors[-10:]) or "(none)"
            raise AssertionError(
                f"{self.prefix}: step '{what}' failed: {type(exc).__name__}: {exc}\n"
                f"screenshot: {shot}\nbrowser errors:\n  {errors}\n"
                f"JupyterLab log ({self.lab.log}):\n{self.lab.log_tail(15)}") from exc

    def shot(self, name, locator=None):
        path = ARTIFACTS / f"{self.prefix}-{name}.png"
        (locator or self.page).screenshot(path=str(path))
        self.shots.append(path)
        return path


# The notebook panel showing ``path`` (JupyterLab is started with
# expose_app_in_browser, which puts the application at window.jupyterapp).
_PANEL = """const panel = Array.from(window.jupyterapp.shell.widgets('main'))
                   .find(w => w.context && w.context.path === path);"""

_KERNEL_IDLE = """(path) => {
  if (document.querySelector('.jp-Dialog') !== null) return true;
  if (!window.jupyterapp) return false;
  %s
  const k = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return Boolean(k && k.status === 'idle' && panel.content.widgets.length);
}""" % _PANEL

_N_CELLS = "(path) => { %s return panel.content.widgets.length; }" % _PANEL

# Runs cell i as Shift+Enter would (without moving on) and reports what it produced.
_RUN_CELL = """async ([path, i, timeoutMs]) => {
  %s
  const nb = panel.content;
  window.jupyterapp.shell.activateById(panel.id);
  nb.deselectAll();
  nb.activeCellIndex = i;
  const cell = nb.widgets[i];
  cell.node.scrollIntoView({block: 'center'});
  const timer = new Promise(res => setTimeout(() => res('timeout'), timeoutMs));
  const ok = await Promise.race([window.jupyterapp.commands.execute('notebook:run-cell'),
                                 timer]);
  const model = cell.model;
  if (model.type !== 'code') return {ok: ok !== 'timeout', widget: false, error: null};
  const outs = model.outputs.toJSON();
  const err = outs.find(o => o.output_type === 'error');
  return {
    ok: ok === true,
    timeout: ok === 'timeout',
    widget: outs.some(o => o.data && o.data['application/vnd.jupyter.widget-view+json']),
    error: err ? `${err.ename}: ${err.evalue}` : null,
  };
}""" % _PANEL

_CELL_NODE = "([path, i]) => { %s return panel.content.widgets[i].node.innerText; }" % _PANEL

_WIDGETS_DRAWN = """([path, i]) => {
  %s
  const node = panel.content.widgets[i].node;
  return node.querySelector('.jupyter-widgets') !== null
         || /Error displaying widget/.test(node.innerText);
}""" % _PANEL

_SHUTDOWN = """async (path) => {
  %s
  if (panel) await panel.sessionContext.shutdown();
}""" % _PANEL


def _wait_for_change(locator, before, what):
    deadline = time.time() + CHANGE_TIMEOUT_S
    now = locator.inner_text()
    while now == before:
        if time.time() > deadline:
            raise AssertionError(f"the displayed text did not change within {CHANGE_TIMEOUT_S} s "
                                 f"after {what}; it still reads {before!r}")
        time.sleep(0.2)
        now = locator.inner_text()
    return now


def _widget_cells(path):
    """Code cells that display a view (``show(...)`` or ``.widget()``), in order."""
    import nbformat
    nb = nbformat.read(path, as_version=4)
    code = [k for k, c in enumerate(nb.cells) if c.cell_type == "code"]
    shows = [k for k in code if "show(" in nb.cells[k].source or ".widget()" in
             nb.cells[k].source]
    return (code[0] if code else None), shows


def _open_and_run_to_widget(page, steps, lab, notebook, css):
    """Open ``notebook`` in /lab and run cells until an element with CSS class ``css``
    is drawn; returns (the output area that holds it, the cell's index).

    Fast path: the first code cell (the imports), then each cell that shows a view,
    so that a widget near the end of a long lesson does not cost the whole lesson.
    When such a cell needs names from earlier cells (NameError), every cell from
    the top is run in order, as a learner would."""
    with steps.step(f"open {notebook} in /lab and start its kernel"):
        # a workspace of its own, so that nothing opened by another test is restored
        page.goto(f"{lab.url}/lab/workspaces/{steps.prefix}/tree/{notebook}?token={lab.token}")
        page.wait_for_function(_KERNEL_IDLE, arg=notebook, timeout=120_000)
        dialog = page.locator(".jp-Dialog")
        if dialog.count():   # "Select Kernel" for a notebook without kernel metadata
            dialog.locator(".jp-mod-accept").first.click()
            page.wait_for_function(_KERNEL_IDLE, arg=notebook, timeout=120_000)
        n_cells = page.evaluate(_N_CELLS, notebook)
        assert n_cells > 0, "the notebook opened with no cells"
    target = page.locator(f".{css}")

    def run(i, name_error_ok=False):
        """Run cell i; True when the element with class ``css`` is now drawn."""
        with steps.step(f"run cell {i} of {notebook}"):
            r = page.evaluate(_RUN_CELL, [notebook, i, CELL_TIMEOUT_MS])
            assert not r.get("timeout"), f"cell {i} still ran after {CELL_TIMEOUT_MS // 1000} s"
            if r["error"] and name_error_ok and r["error"].startswith("NameError"):
                return None
            assert r["error"] is None, f"cell {i} raised {r['error']}"
            assert r["ok"], f"cell {i} did not run"
        if not r["widget"]:
            return False
        with steps.step(f"draw the widgets of cell {i} (ipywidgets in JupyterLab)"):
            page.wait_for_function(_WIDGETS_DRAWN, arg=[notebook, i], timeout=60_000)
            cell_text = page.evaluate(_CELL_NODE, [notebook, i])
            assert "Error displaying widget" not in cell_text, cell_text[-500:]
        return target.count() > 0

    first, shows = _widget_cells(ROOT / notebook)
    found = None
    if first is not None and shows:
        if run(first):
            found = first
        for k in ([] if found is not None else [k for k in shows if k != first]):
            done = run(k, name_error_ok=True)
            if done is None:      # needs earlier cells: fall back to running from the top
                break
            if done:
                found = k
                break
    if found is None:
        for i in range(n_cells):
            if run(i):
                found = i
                break
    with steps.step(f"find the widget with CSS class {css}"):
        if found is None:
            raise AssertionError(f"ran all {n_cells} cells of {notebook}; none drew an element "
                                 f"with CSS class {css!r}")
        target.first.wait_for(state="visible", timeout=30_000)
    return page.locator(".jp-OutputArea-output", has=target).first, found


def _drag_slider_away(page, output):
    """Drag the first slider in ``output`` to the end farther from its value."""
    handle = output.locator(".widget-slider .noUi-handle").first
    base = output.locator(".widget-slider .noUi-base").first
    handle.scroll_into_view_if_needed()
    value = float(handle.get_attribute("aria-valuenow"))
    lo = float(handle.get_attribute("aria-valuemin"))
    hi = float(handle.get_attribute("aria-valuemax"))
    assert hi > lo, f"the slider has one position only ({lo})"
    hb, bb = handle.bounding_box(), base.bounding_box()
    to_x = bb["x"] + (1 if value - lo < hi - value else 0) * bb["width"]
    page.mouse.move(hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2)
    page.mouse.down()
    page.mouse.move(to_x, hb["y"] + hb["height"] / 2, steps=12)
    page.mouse.up()


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ browser tests
@pytest.mark.parametrize("notebook,css,prefix", LESSONS, ids=[p for _, _, p in LESSONS])
def test_widget_moves_in_the_browser(lab_server, playwright_session, tmp_path,
                                     notebook, css, prefix):
    if not (ROOT / notebook).exists():
        pytest.fail(f"{notebook} is missing: the browser test needs the lesson")
    on_disk = _sha(ROOT / notebook)
    path, pw = playwright_session
    from course_utils.browser import launch
    for old in ARTIFACTS.glob(f"{prefix}-*.png"):
        old.unlink()
    context = launch(pw, tmp_path / "profile", path=path)
    page = None
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        steps = Steps(page, prefix, lab_server)
        output, cell = _open_and_run_to_widget(page, steps, lab_server, notebook, css)
        state = output.locator(f".{css}").first

        with steps.step(f"read the widget's text (cell {cell})"):
            output.scroll_into_view_if_needed()
            first = state.inner_text()
            assert first.strip(), f"the element with CSS class {css} is empty"
            steps.shot("1-rendered", output)

        play = output.locator(".widget-play button").first
        if play.count():
            with steps.step("press Play and see the text change"):
                play.click()
                playing = _wait_for_change(state, first, "pressing Play")
                steps.shot("2-after-play", output)
            with steps.step("pause"):
                pause = output.locator(".widget-play button:has(i.fa-pause)")
                if pause.count():
                    pause.first.click()
                else:   # it already reached its last step and stopped
                    assert output.locator(".widget-play button:has(i.fa-play)").count()
                time.sleep(0.5)
                first = state.inner_text()
                assert playing, "no text after Play"
        sliders = output.locator(".widget-slider .noUi-handle")
        with steps.step("drag the slider and see the text change"):
            assert sliders.count() or play.count(), "the widget has neither Play nor a slider"
            if sliders.count():
                _drag_slider_away(page, output)
                _wait_for_change(state, first, "dragging the slider")
                steps.shot("3-after-slider", output)
        steps.shot("4-page")
    finally:
        try:
            if page is not None:
                page.evaluate(_SHUTDOWN, notebook)   # stop the lesson's kernel
        except Exception:  # noqa: BLE001 - the server stops it at the end anyway
            pass
        context.close()
    with steps.step(f"leave {notebook} unchanged on disk"):
        assert _sha(ROOT / notebook) == on_disk, (
            f"{notebook} changed on disk during the test (autosave should be off)")


def test_a_failing_step_names_itself_and_keeps_a_screenshot(lab_server, playwright_session,
                                                            tmp_path):
    path, pw = playwright_session
    from course_utils.browser import launch
    shot = ARTIFACTS / "selftest-FAILED.png"
    shot.unlink(missing_ok=True)
    context = launch(pw, tmp_path / "profile", path=path)
    try:
        page = context.new_page()
        steps = Steps(page, "selftest", lab_server)
        with steps.step("open /lab"):
            page.goto(f"{lab_server.url}/lab?token={lab_server.token}")
            page.locator(".jp-LabShell").wait_for(timeout=60_000)
        with pytest.raises(AssertionError) as info:
            with steps.step("find an element that no lesson has"):
                page.locator(".course-no-such-widget").wait_for(timeout=1_000)
    finally:
        context.close()
    message = str(info.value)
    assert "selftest: step 'find an element that no lesson has' failed" in message
    assert f"screenshot: {shot}" in message and "JupyterLab log" in message
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
