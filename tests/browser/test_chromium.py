"""ensure_chromium(): finds Debian's Chromium, installs it with apt-get only when
asked (or in CI, as root), and says why when there is none. No browser runs here:
fake executables stand in for it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import browser

ROOT = Path(__file__).resolve().parents[2]


def fake_browser(path: Path, works=True):
    path.write_text("#!/bin/sh\n" + ("echo 'Chromium 999.0 fake'\n" if works else "exit 3\n"))
    path.chmod(0o755)
    return str(path)


def test_finds_a_working_browser(tmp_path):
    found = browser.ensure_chromium(install=False, path=fake_browser(tmp_path / "chromium"))
    assert found and found.path == str(tmp_path / "chromium")
    assert "Chromium 999.0 fake" in found.reason


def test_a_browser_that_does_not_run_is_no_browser(tmp_path):
    found = browser.ensure_chromium(install=False,
                                    path=fake_browser(tmp_path / "chromium", works=False))
    assert not found and found.path is None and "--version` fails" in found.reason


def test_missing_without_install_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    found = browser.ensure_chromium(path=str(tmp_path / "none"))
    assert not found and "apt-get install chromium" in found.reason
    found = browser.ensure_chromium(install=False, path=str(tmp_path / "none"))
    assert not found


def test_install_needs_root_and_apt_get(tmp_path, monkeypatch):
    monkeypatch.setattr(browser.os, "geteuid", lambda: 1000)
    found = browser.ensure_chromium(install=True, path=str(tmp_path / "none"))
    assert not found and "needs root" in found.reason
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    found = browser.ensure_chromium(install=True, path=str(tmp_path / "none"))
    assert not found and "no apt-get" in found.reason


class FakeApt:
    """Stands in for subprocess.run: records apt-get calls, 'installs' a fake browser."""

    def __init__(self, target: Path, fail_on=None):
        self.target, self.fail_on, self.calls = target, fail_on, []
        self.real_run = subprocess.run

    def __call__(self, cmd, **kw):
        if cmd[0] != "apt-get":
            return self.real_run(cmd, **kw)
        self.calls.append((list(cmd), kw.get("env", {}).get("DEBIAN_FRONTEND")))
        if self.fail_on and self.fail_on in cmd:
            return subprocess.CompletedProcess(cmd, 100, "", "E: Unable to locate package\n")
        if "install" in cmd:
            fake_browser(self.target)
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def as_root_with_apt(monkeypatch, tmp_path):
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    monkeypatch.setattr(browser.shutil, "which", lambda name: "/usr/bin/apt-get")
    monkeypatch.setattr(browser, "_LOCK", tmp_path / "install.lock")


def test_ci_installs_with_apt_get_update_first(tmp_path, monkeypatch, as_root_with_apt):
    target = tmp_path / "chromium"
    apt = FakeApt(target)
    monkeypatch.setattr(browser.subprocess, "run", apt)
    monkeypatch.setenv("CI", "true")
    found = browser.ensure_chromium(path=str(target), log=lambda m: None)
    assert found and "installed" in found.reason and "apt-get" in found.reason
    assert [c for c, _ in apt.calls] == [
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]]
    assert {frontend for _, frontend in apt.calls} == {"noninteractive"}


def test_a_failed_install_says_which_command(tmp_path, monkeypatch, as_root_with_apt):
    apt = FakeApt(tmp_path / "chromium", fail_on="install")
    monkeypatch.setattr(browser.subprocess, "run", apt)
    found = browser.ensure_chromium(install=True, path=str(tmp_path / "chromium"),
                                    log=lambda m: None)
    assert not found
    assert "apt-get install -y -q --no-install-recommends chromium` failed (exit 100)" in \
        found.reason and "Unable to locate package" in found.reason


def test_a_hanging_apt_get_is_stopped(tmp_path, monkeypatch, as_root_with_apt):
    def hang(cmd, **kw):
        if cmd[0] != "apt-get":
            return subprocess.CompletedProcess(cmd, 0, "", "")
        assert kw.get("timeout") == browser.APT_TIMEOUT_S
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])
    monkeypatch.setattr(browser.subprocess, "run", hang)
    found = browser.ensure_chromium(install=True, path=str(tmp_path / "chromium"),
                                    log=lambda m: None)
    assert not found
    assert found.reason == f"`apt-get update -q` did not finish within {browser.APT_TIMEOUT_S} s"


def test_bad_arguments():
    with pytest.raises(TypeError, match="install must be True, False or None"):
        browser.ensure_chromium(install="yes")
    with pytest.raises(ValueError, match="path must be an absolute path"):
        browser.ensure_chromium(path="chromium")


def test_launch_wants_a_fresh_profile(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "Local State").write_text("{}")
    with pytest.raises(ValueError, match="user_data_dir must be a new or empty directory"):
        browser.launch(object(), tmp_path / "used")


def test_command_line_reports_and_exits(tmp_path):
    # without CI in its environment it only looks: installing is the browser fixture's job
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    r = subprocess.run([sys.executable, "-m", "course_utils.browser", "--bogus"], cwd=ROOT,
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "python -m course_utils.browser --install" in r.stdout
    r = subprocess.run([sys.executable, "-m", "course_utils.browser"], cwd=ROOT,
                       capture_output=True, text=True, env=env)
    assert r.returncode in (0, 1) and r.stdout.strip(), "one line: where it is, or why not"
