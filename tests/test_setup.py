"""The README's two commands: `python course.py lab` serves the course, and the
set-up they share is idempotent."""
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_usage_and_unknown_command():
    r = subprocess.run([sys.executable, "course.py"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "python course.py lab" in r.stdout
    r = subprocess.run([sys.executable, "course.py", "nonsense"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2


def test_lab_command_serves_the_course(tmp_path):
    port, token = free_port(), "course-test-token"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    cmd = [sys.executable, "course.py", "lab", "--here", "--no-browser", f"--port={port}",
           "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
           "--ServerApp.port_retries=0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        body, deadline = None, time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}",
                                            timeout=5) as r:
                    assert r.status == 200
                    body = r.read().decode()
                    break
            except OSError:
                time.sleep(1)
        assert body is not None, "JupyterLab did not answer on /lab"
        assert "JupyterLab" in body
        url = f"http://127.0.0.1:{port}/api/contents/notebooks?token={token}"
        with urllib.request.urlopen(url, timeout=10) as r:
            listing = r.read().decode()
        assert "00_setup.ipynb" in listing  # it serves the course's notebooks
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
