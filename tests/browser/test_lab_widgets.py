"""The course in a real browser: the README's lab command serves JupyterLab with
working ipywidgets, and every interactive widget of every lesson works when a
learner uses it.

For each lesson that displays a widget, the test opens it in /lab and runs its
cells in order, as a learner would, up to the last cell that can show a widget.
Every cell whose output holds a live widget is then driven: it must be drawn
(rendered); its Play button must move it and Pause stop it (played); every
toggle and drop-down must change what it shows and, switched back, show the
same again; its slider is dragged to an end and stepped back with the keyboard
(scrubbed), and the view must then be exactly what it was before (its state is
a function of the controls). Cells with a known final state are checked for it
(the trace's cycle count, the softmax sum, the last tile step). Screenshots go
to ``artifacts/browser/``; a failing step names itself and keeps a screenshot of
the page at that moment. JupyterLab runs with autosave off, and each test
checks that its lesson file is unchanged on disk afterwards.
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

# a cell that may display a widget: course_utils.widgets.show(view) (not plt.show, not a
# lesson's own `def show`), a view's .widget(), or ipywidgets' interact
WIDGET_CALL = re.compile(r"^(?!\s*def ).*((?<![\w.])show\(|\.widget\(\)|interact\()", re.M)

# what a few widgets must show at the far end of their slider (cell id -> substrings)
FINAL_STATE = {
    "l01-07": ["cycles 7"],                    # Problem 1: 4 LOAD + 2 MAC + 1 STORE
    "l02-15": ["m = 6", "s = 1.57806"],        # the running sum over [3, 1, 5, 2, 6, 4]
}
# lessons that must have at least one live widget (a lesson losing its widget fails)
MUST_HAVE_WIDGETS = ("01", "02", "04", "05", "08", "09")


def widget_cells(path):
    """Indexes of the code cells that may display a widget."""
    import nbformat
    nb = nbformat.read(path, as_version=4)
    return [k for k, c in enumerate(nb.cells)
            if c.cell_type == "code" and WIDGET_CALL.search(c.source)]


def lessons_with_widgets():
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")
                  if widget_cells(p))


LESSONS = lessons_with_widgets()


def test_every_lesson_with_a_widget_is_driven():
    found = {Path(p).name[:2] for p in LESSONS}
    missing = [n for n in MUST_HAVE_WIDGETS if n not in found]
    assert not missing, f"no widget cell found in lessons {missing} (found {sorted(found)})"


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


def _open_and_run(page, steps, lab, notebook, last):
    """Open ``notebook`` in /lab and run cells 0..``last`` in order; returns the
    indexes of the cells whose output holds a live widget (drawn, without error)."""
    with steps.step(f"open {notebook} in /lab and start its kernel"):
        # a workspace of its own, so that nothing opened by another test is restored
        page.goto(f"{lab.url}/lab/workspaces/{steps.prefix}/tree/{notebook}?token={lab.token}")
        page.wait_for_function(_KERNEL_IDLE, arg=notebook, timeout=120_000)
        dialog = page.locator(".jp-Dialog")
        if dialog.count():   # "Select Kernel" for a notebook without kernel metadata
            dialog.locator(".jp-mod-accept").first.click()
            page.wait_for_function(_KERNEL_IDLE, arg=notebook, timeout=120_000)
        n_cells = page.evaluate(_N_CELLS, notebook)
        assert n_cells > last, f"the notebook opened with {n_cells} cells, expected more than {last}"
    drawn = []
    for i in range(last + 1):
        with steps.step(f"run cell {i} of {notebook}"):
            r = page.evaluate(_RUN_CELL, [notebook, i, CELL_TIMEOUT_MS])
            assert not r.get("timeout"), f"cell {i} still ran after {CELL_TIMEOUT_MS // 1000} s"
            assert r["error"] is None, f"cell {i} raised {r['error']}"
            assert r["ok"], f"cell {i} did not run"
        if r["widget"]:
            with steps.step(f"draw the widgets of cell {i} (ipywidgets in JupyterLab)"):
                page.wait_for_function(_WIDGETS_DRAWN, arg=[notebook, i], timeout=60_000)
                cell_text = page.evaluate(_CELL_NODE, [notebook, i])
                assert "Error displaying widget" not in cell_text, cell_text[-500:]
            drawn.append(i)
    return drawn


# What the output area of cell i shows: its text and a digest of each image.
_SNAPSHOT = """async ([path, i]) => {
  %s
  const node = panel.content.widgets[i].node.querySelector('.jp-Cell-outputArea');
  const imgs = Array.from(node.querySelectorAll('img')).map(im => im.src);
  const digests = [];
  for (const src of imgs) {
    const buf = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(src));
    digests.push(Array.from(new Uint8Array(buf)).slice(0, 8).map(b => b.toString(16)).join(''));
  }
  return node.innerText + ' [images ' + digests.join(' ') + ']';
}""" % _PANEL


# Marks cell i's node (so that a locator finds it) and scrolls it into view.
_MARK = """([path, i]) => {
  %s
  const node = panel.content.widgets[i].node;
  node.setAttribute('data-course-cell', String(i));
  node.scrollIntoView({block: 'start'});
}""" % _PANEL


def _snapshot(page, notebook, i):
    return page.evaluate(_SNAPSHOT, [notebook, i])


def _wait_for(page, notebook, i, pred, what, timeout=CHANGE_TIMEOUT_S):
    deadline = time.time() + timeout
    now = _snapshot(page, notebook, i)
    while not pred(now):
        if time.time() > deadline:
            raise AssertionError(f"{what} within {timeout} s; the widget shows {now[-300:]!r}")
        time.sleep(0.25)
        now = _snapshot(page, notebook, i)
    return now


def _settled(page, notebook, i, quiet=1.0):
    """The snapshot once it has not changed for ``quiet`` seconds (the kernel has
    answered the last control change)."""
    last, since = _snapshot(page, notebook, i), time.time()
    deadline = time.time() + CHANGE_TIMEOUT_S
    while time.time() - since < quiet and time.time() < deadline:
        time.sleep(0.2)
        now = _snapshot(page, notebook, i)
        if now != last:
            last, since = now, time.time()
    return last


def _slider_value(handle):
    return round(float(handle.get_attribute("aria-valuenow")))


def _drive_widget(page, steps, notebook, i, cell_id):
    """Render, play, switch, scrub and check one widget (the output of cell i)."""
    page.evaluate(_MARK, [notebook, i])
    output = page.locator(f'[data-course-cell="{i}"] .jp-Cell-outputArea').first
    tag = f"cell {i} ({cell_id})"
    with steps.step(f"{tag}: read what the widget shows"):
        output.scroll_into_view_if_needed()
        first = _settled(page, notebook, i)
        assert first.strip(" \n[]images"), "the widget shows nothing"
        steps.shot(f"{cell_id}-1-rendered", output)

    # toggles and drop-downs: another choice changes the view, the first one restores it
    toggles = output.locator(".widget-toggle-buttons button")
    selects = output.locator(".widget-dropdown select")
    for k in range(selects.count()):
        sel = selects.nth(k)
        with steps.step(f"{tag}: choose another option of drop-down {k} and back"):
            options = sel.locator("option").all_inner_texts()
            before = sel.input_value()
            assert len(options) > 1, "a drop-down with one option"
            other = next(o for o in sel.locator("option").evaluate_all(
                "os => os.map(o => o.value)") if o != before)
            sel.select_option(other)
            _wait_for(page, notebook, i, lambda s: s != first, "the view did not change")
            sel.select_option(before)
            back = _wait_for(page, notebook, i, lambda s: s == first,
                             "the first option did not bring the first view back")
            assert back == first
    if toggles.count() > 1:
        with steps.step(f"{tag}: press the other toggle button and back"):
            pressed = [k for k in range(toggles.count())
                       if "mod-active" in (toggles.nth(k).get_attribute("class") or "")]
            assert pressed, "no toggle button is pressed"
            other = next(k for k in range(toggles.count()) if k != pressed[0])
            toggles.nth(other).click()
            _wait_for(page, notebook, i, lambda s: s != first, "the view did not change")
            toggles.nth(pressed[0]).click()
            _wait_for(page, notebook, i, lambda s: s == first,
                      "the first button did not bring the first view back")

    play = output.locator(".widget-play button").first
    if play.count():
        with steps.step(f"{tag}: press Play and see the view change"):
            play.click()
            _wait_for(page, notebook, i, lambda s: s != first, "pressing Play changed nothing")
            steps.shot(f"{cell_id}-2-after-play", output)
        with steps.step(f"{tag}: pause"):
            pause = output.locator(".widget-play button:has(i.fa-pause)")
            if pause.count():
                pause.first.click()
            else:   # it already reached its last step and stopped
                assert output.locator(".widget-play button:has(i.fa-play)").count()

    handles = output.locator(".widget-slider .noUi-handle")
    with steps.step(f"{tag}: the widget has a control"):
        assert handles.count() or play.count() or selects.count() or toggles.count() > 1, \
            "the widget has no Play, slider, toggle or drop-down"
    if not handles.count():
        return
    handle = handles.first
    with steps.step(f"{tag}: drag the slider to an end"):
        start_value = _slider_value(handle)
        start_view = _settled(page, notebook, i)
        lo = round(float(handle.get_attribute("aria-valuemin")))
        hi = round(float(handle.get_attribute("aria-valuemax")))
        end = lo if start_value - lo >= hi - start_value else hi
        _drag_slider_away(page, output)
        _wait_for(page, notebook, i, lambda s: s != start_view, "dragging the slider changed nothing")
        deadline = time.time() + CHANGE_TIMEOUT_S
        while _slider_value(handle) != end and time.time() < deadline:
            time.sleep(0.2)
        assert _slider_value(handle) == end, f"the slider reads {_slider_value(handle)}, not {end}"
        at_end = _settled(page, notebook, i)
        steps.shot(f"{cell_id}-3-slider-at-end", output)
    with steps.step(f"{tag}: the state at the end of the slider"):
        for want in FINAL_STATE.get(cell_id, []) if end == hi else []:
            assert want in at_end, f"at the last step the widget should show {want!r}"
        m = re.search(r"step (\d+)/(\d+)", at_end)
        if m and end == hi:
            assert m.group(1) == m.group(2) == str(hi), f"the widget says {m.group(0)!r} at step {hi}"
    with steps.step(f"{tag}: step the slider back with the keyboard"):
        handle.focus()
        key = "ArrowLeft" if end > start_value else "ArrowRight"
        for _ in range(abs(end - start_value)):
            page.keyboard.press(key)
        deadline = time.time() + CHANGE_TIMEOUT_S
        while _slider_value(handle) != start_value and time.time() < deadline:
            time.sleep(0.2)
        assert _slider_value(handle) == start_value, \
            f"the slider reads {_slider_value(handle)} after the keys, not {start_value}"
        back = _wait_for(page, notebook, i, lambda s: s == start_view,
                         f"back at {start_value} the widget does not show what it showed there")
        assert back == start_view


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
@pytest.mark.parametrize("notebook", LESSONS, ids=[Path(p).stem for p in LESSONS])
def test_every_widget_of_the_lesson_works_in_the_browser(lab_server, playwright_session,
                                                         tmp_path, notebook):
    import nbformat
    on_disk = _sha(ROOT / notebook)
    cells = widget_cells(ROOT / notebook)
    ids = [c.get("id", f"cell{k}") for k, c in
           enumerate(nbformat.read(ROOT / notebook, as_version=4).cells)]
    prefix = Path(notebook).stem
    path, pw = playwright_session
    from course_utils.browser import launch
    for old in ARTIFACTS.glob(f"{prefix}-*.png"):
        old.unlink()
    context = launch(pw, tmp_path / "profile", path=path)
    page = None
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.set_viewport_size({"width": 1400, "height": 1000})
        steps = Steps(page, prefix, lab_server)
        drawn = _open_and_run(page, steps, lab_server, notebook, cells[-1])
        with steps.step(f"find the widgets of {notebook}"):
            assert drawn, (f"none of the cells {cells} of {notebook} drew a live widget")
        for i in drawn:
            _drive_widget(page, steps, notebook, i, ids[i])
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
