"""Fixtures for the browser tests: the README's lab command serving the course on a
free loopback port, and a fresh headless Chromium (Debian's, driven by Playwright).

Without Chromium or Playwright the browser tests skip, unless the environment
variable ``CI`` is set: then ``ensure_chromium()`` installs Chromium with apt-get
and a missing browser fails the run. Screenshots and the server log go to
``artifacts/browser/``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
TOKEN = "course-browser-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    """A running JupyterLab: ``url`` (no trailing slash), ``token``, the server's log."""
    url: str
    token: str
    log: Path
    proc: subprocess.Popen

    def get(self, path: str, timeout: float = 10):
        """GET ``path`` (e.g. ``/api/status``) with the token; returns (status, body)."""
        sep = "&" if "?" in path else "?"
        with urllib.request.urlopen(f"{self.url}{path}{sep}token={self.token}",
                                    timeout=timeout) as r:
            return r.status, r.read().decode()

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


def _stop(proc: subprocess.Popen):
    """Stop the server (it shuts its kernels down on SIGTERM); kill its process group
    if it does not exit in time."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    """``python course.py lab --here`` with a token, on a free loopback port, with
    its runtime, config and data directories in a temp dir; stopped at the end."""
    tmp = tmp_path_factory.mktemp("lab")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "jupyterlab-server.log"
    port = free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_DATA_DIR=str(tmp / "data"),
               IPYTHONDIR=str(tmp / "ipython"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p))
    # user settings live in the temp config dir: no autosave (the lessons stay as they are
    # in the repo, without outputs) and no news prompt over the screenshots
    settings = tmp / "config" / "lab" / "user-settings" / "@jupyterlab"
    for plugin, value in (("docmanager-extension/plugin", {"autosave": False}),
                          ("apputils-extension/notification",
                           {"fetchNews": "false", "checkForUpdates": False})):
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env.pop("COURSE_STATIC_WIDGETS", None)   # the live widgets, not the filmstrips
    env.pop("MPLBACKEND", None)              # plots inline, as a learner sees them
    cmd = [sys.executable, str(ROOT / "course.py"), "lab", "--here", "--no-browser",
           f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
           f"--IdentityProvider.token={TOKEN}",
           "--LabApp.expose_app_in_browser=True",   # window.jupyterapp, to run cells
           # checkpoints in the temp dir, not in .ipynb_checkpoints/ beside the lessons
           f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", TOKEN, log, proc)
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"step 'start JupyterLab' failed: `{' '.join(cmd)}` exited with "
                            f"{proc.returncode}; server log {log}:\n{lab.log_tail()}")
            try:
                if lab.get("/api/status", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"step 'start JupyterLab' failed: no answer on {lab.url} within "
                            f"180 s; server log {log}:\n{lab.log_tail()}")
            time.sleep(0.5)
        yield lab
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def chromium():
    """The path of a working Chromium plus Playwright's ``sync_playwright``; skips
    when either is missing outside CI, fails in CI."""
    from course_utils.browser import ensure_chromium
    in_ci = bool(os.environ.get("CI"))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        msg = "the playwright package is not installed (pip install playwright)"
        if in_ci:
            pytest.fail(msg + "; CI must run the browser tests")
        pytest.skip(msg)
    found = ensure_chromium()
    if not found:
        if in_ci:
            pytest.fail(f"no Chromium for the browser tests in CI: {found.reason}")
        pytest.skip(f"no Chromium (set CI=1 as root to install it): {found.reason}")
    return found.path, sync_playwright


@pytest.fixture(scope="session")
def playwright_session(chromium):
    """(chromium path, a started Playwright); stopped at the end of the session."""
    path, sync_playwright = chromium
    manager = sync_playwright()
    pw = manager.start()
    try:
        yield path, pw
    finally:
        pw.stop()
