"""Run one graded notebook in a fresh kernel and save what came out of it.

    python course_utils/grading/runner.py NOTEBOOK RESULT --cwd DIR \
        --cell-timeout S --timeout S

The grader starts this in its own process (one per run), inside the sandbox
(:mod:`course_utils.grading.sandbox`). With ``--nbval`` (the checking run) the
notebook runs under pytest's nbval plugin instead, each cell a test item, and
the result also holds a JUnit report. It executes
every cell in order with a per-cell limit (an over-long cell is interrupted and
recorded as a timeout) and an overall limit (cells left when it runs out are
recorded as not run), keeps at most a few kilobytes of each cell's printed
output, keeps each cell's error, and collects the grading records the kernel
publishes (see :mod:`course_utils.grading.kernel_side`). The result is JSON,
written atomically. Nothing here judges an answer.

Started by ``warm.py`` instead (``main(..., warm=True)``), this process already holds
PyTorch and the Jupyter kernel in memory, so it forks its kernel from itself rather
than starting a fresh Python (:func:`_prefork_kernel`).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# nbformat imports jsonschema, which builds an IRI grammar (most of a second of CPU) when
# rfc3987-syntax is installed. This process never checks IRIs: skip it, since the runner
# starts once per graded notebook.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402
from nbclient import NotebookClient  # noqa: E402
from nbclient.exceptions import CellTimeoutError, DeadKernelError  # noqa: E402


# Started as a script (``python .../runner.py``), so it imports nothing from
# course_utils and stays light; kernel_side.MIME must stay equal to this.
MIME = "application/x-course-grade+json"

_ANSI = __import__("re").compile(r"(\x1b|#x1B)\[[0-9;]*[A-Za-z]")
TEXT_CAP = 4000           # characters of printed output kept per cell
RECORD_CAP = 64 * 2**20   # bytes of records kept per run


def write_atomic(path: Path, text: str):
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Client(NotebookClient):
    """An nbclient that keeps records and errors and caps everything else."""

    def __init__(self, nb, **kw):
        super().__init__(nb, **kw)
        self.cells_info = [{"status": "not_run", "stdout": "", "dropped_chars": 0,
                            "records": []} for _ in nb.cells]
        self.record_bytes = 0

    def output(self, outs, msg, display_id, cell_index):
        info = self.cells_info[cell_index]
        kind, content = msg["msg_type"], msg["content"]
        if kind in ("display_data", "execute_result"):
            rec = content.get("data", {}).get(MIME)
            if isinstance(rec, dict):
                size = len(json.dumps(rec))
                if self.record_bytes + size > RECORD_CAP:
                    info["records_dropped"] = info.get("records_dropped", 0) + 1
                else:
                    self.record_bytes += size
                    info["records"].append(rec)
            return None
        if kind == "stream":
            text = str(content.get("text", ""))
            room = TEXT_CAP - len(info["stdout"])
            info["stdout"] += text[:max(room, 0)]
            info["dropped_chars"] += max(len(text) - max(room, 0), 0)
            return None
        if kind == "error":
            info["ename"] = str(content.get("ename", ""))[:200]
            info["evalue"] = str(content.get("evalue", ""))[:2000]
            tb = "\n".join(str(t) for t in content.get("traceback", []))
            info["traceback"] = tb[-3000:]
        return None


def _responsive(client, wait=5) -> bool:
    """After an interrupted timeout: does the kernel answer a trivial request?"""
    saved = client.timeout
    client.timeout = wait
    try:
        msg_id = client.kc.execute("pass", store_history=False)
        reply = client.wait_for_reply(msg_id)
    except Exception:  # noqa: BLE001 - a dead or wedged kernel is simply not responsive
        reply = None
    finally:
        client.timeout = saved
    return bool(reply) and reply.get("content", {}).get("status") == "ok"


START_TRIES = 3           # a kernel that dies before it answers is started again

# how this process's kernels were started: forked from this process, or a fresh Python
_STARTS = {"warm": 0, "cold": 0}


class _ForkedKernel:
    """The part of :class:`subprocess.Popen` that jupyter_client uses to keep a kernel it
    started, for a kernel forked from this process."""
    stdin = stdout = stderr = None

    def __init__(self, pid):
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(["kernel"], timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)


def _prefork_kernel():
    """Fork, while this process is still single-threaded and has no event loop, a child
    that waits for its kernel's command, environment and folder, then becomes that
    kernel in-process. ``(pid, pipe)``: write the request into ``pipe`` and close it;
    closing it unwritten lets the child go."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()    # a process group of its own, as jupyter_client starts kernels
            os.close(w)
            os.close(ready_r)
            os.write(ready_w, b"1")
            os.close(ready_w)
            data = b""
            while True:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                data += chunk
            os.close(r)
            if data:
                _become_kernel(json.loads(data))
        except BaseException:  # noqa: BLE001 - the runner sees a kernel that died
            pass
        os._exit(0)
    os.close(r)
    os.close(ready_w)
    os.read(ready_r, 1)       # the child is in its own session now: its group is its pid
    os.close(ready_r)
    return pid, w


def _become_kernel(req):
    """In the forked child: the kernel jupyter_client asked for, in the folder and
    environment it asked for (``python -m ipykernel_launcher ARGS`` without a new
    Python). Never returns."""
    import importlib.util
    cmd = req["cmd"]
    args = cmd[cmd.index("ipykernel_launcher") + 1:]
    if req["cwd"]:
        os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    tempfile.tempdir = None
    null = os.open(os.devnull, os.O_RDWR)
    for fd, keep in enumerate(req["inherit"]):
        if not keep:
            os.dup2(null, fd)
    os.closerange(3, 1 << 20)
    # the launcher's path without the folder it started in (ipykernel_launcher drops it)
    sys.path[:] = sys.path[1:]
    sys.argv = [importlib.util.find_spec("ipykernel_launcher").origin] + args
    from ipykernel import kernelapp
    kernelapp.launch_new_instance(argv=args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _is_devnull(f) -> bool:
    return f == subprocess.DEVNULL or getattr(f, "name", None) == os.devnull


# Tracebacks in plain Python form: nobody reads a graded kernel's tracebacks beyond the
# error's last line (the result keeps the error's name and message), and IPython's
# default context mode reads and parses the source of every frame to show it
# (a tenth of a second of CPU for each error a wrong answer raises)
KERNEL_ARGS = ["--InteractiveShell.xmode=Plain"]


def _use_warm_kernels(waiting):
    """Start kernels from the forked children in ``waiting`` (one each) instead of a fresh
    Python, for as long as there are any; then as jupyter_client always does."""
    import jupyter_client.provisioning.local_provisioner as lp
    cold = lp.launch_kernel

    def launch(cmd, stdin=None, stdout=None, stderr=None, env=None, independent=False,
               cwd=None, **kw):
        if "ipykernel_launcher" in cmd:
            cmd = list(cmd) + KERNEL_ARGS
        stdio = (stdin, stdout, stderr)
        if not waiting or "ipykernel_launcher" not in cmd or independent or kw or \
                not all(f is None or _is_devnull(f) for f in stdio):
            _STARTS["cold"] += 1
            return cold(cmd, stdin=stdin, stdout=stdout, stderr=stderr, env=env,
                        independent=independent, cwd=cwd, **kw)
        pid, pipe = waiting.pop()
        req = {"cmd": [str(c) for c in cmd], "env": dict(os.environ if env is None else env),
               "cwd": str(cwd) if cwd else None, "inherit": [f is None for f in stdio]}
        with os.fdopen(pipe, "wb") as f:
            f.write(json.dumps(req).encode())
        _STARTS["warm"] += 1
        return _ForkedKernel(pid)
    lp.launch_kernel = launch


class _StartFailed(RuntimeError):
    """The kernel did not come up (no student code has run yet)."""


def _kernel_config(sock_dir):
    """Kernel sockets in a folder of this run's own (Unix), not on TCP ports that
    kernels started at the same moment could both pick."""
    from traitlets.config import Config
    cfg = Config()
    if os.name == "posix" and sock_dir and len(str(sock_dir)) < 80:
        cfg.KernelManager.transport = "ipc"
        cfg.KernelManager.ip = str(Path(sock_dir) / "kernel")
    return cfg


def run(nb_path, result_path, cwd, cell_timeout=60.0, timeout=600.0):
    nb = nbformat.read(nb_path, as_version=4)
    os.unlink(nb_path)  # read once; nothing of the run stays where the kernel can reach it
    start = time.monotonic()
    sock_dir = tempfile.mkdtemp(prefix="course-grade-ipc-")
    try:
        for attempt in range(START_TRIES):
            try:
                return _run_once(nb, result_path, cwd, cell_timeout, timeout, start, sock_dir)
            except _StartFailed as e:
                if attempt == START_TRIES - 1 or time.monotonic() - start > timeout:
                    raise RuntimeError(f"the kernel did not start ({START_TRIES} tries): "
                                       f"{e.__cause__}") from e
                time.sleep(0.5 + random.random())
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def _run_once(nb, result_path, cwd, cell_timeout, timeout, start, sock_dir):
    nb = copy.deepcopy(nb)
    deadline = start + timeout
    client = _Client(nb, timeout=int(cell_timeout), allow_errors=True, kernel_name="python3",
                     interrupt_on_timeout=True, startup_timeout=120,
                     # every cell has run and every output has arrived: stop the kernel at
                     # once rather than wait most of a second for a polite exit (the
                     # sandbox removes whatever else the run left behind)
                     shutdown_kernel="immediate",
                     error_on_timeout={"ename": "CellTimeoutError",
                                       "evalue": f"the cell ran longer than {cell_timeout:g} s"},
                     resources={"metadata": {"path": str(cwd)}},
                     config=_kernel_config(sock_dir))
    replies = {}

    def on_executed(cell, cell_index, execute_reply):
        replies[cell_index] = (execute_reply or {}).get("content", {})

    client.on_cell_executed = on_executed
    client.reset_execution_trackers()
    outcome = "completed"
    # (named apart from the result, whose name the kernel must not see in the folder)
    pid_file = Path(result_path).with_name("run.kernel-pid")
    started = False
    try:
        with client.setup_kernel(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL):
            started = True
            outcome = _cells(client, nb, replies, pid_file, deadline, cell_timeout, timeout)
    except Exception as e:
        if started:
            raise
        with contextlib.suppress(Exception):
            client._cleanup_kernel()
        raise _StartFailed(str(e)) from e
    result = {"outcome": outcome, "seconds": round(time.monotonic() - start, 3),
              "cells": client.cells_info, "kernels": dict(_STARTS)}
    _alone()
    write_atomic(Path(result_path), json.dumps(result))
    try:
        pid_file.unlink()
    except OSError:
        pass
    return result


def _cells(client, nb, replies, pid_file, deadline, cell_timeout, timeout):
    """Run every cell in order; returns the run's outcome."""
    outcome = "completed"
    try:
        pid = client.km.provisioner.process.pid
        write_atomic(pid_file, str(pid))
    except AttributeError:  # pragma: no cover - another provisioner
        pass
    for i, cell in enumerate(nb.cells):
        info = client.cells_info[i]
        left = deadline - time.monotonic()
        if left <= 1:
            info["status"] = "not_run"
            info["why"] = f"the notebook ran out of its {timeout:g} s"
            outcome = "total timeout"
            continue
        client.timeout = int(max(1, min(cell_timeout, left)))
        t0 = time.monotonic()
        store = (cell.get("metadata", {}).get("course_grade") or {}).get("store_history", True)
        try:
            client.execute_cell(cell, i, store_history=store is not False)
        except DeadKernelError:
            info["status"] = "dead"
            info["why"] = "the kernel died (the code exited or crashed the process)"
            for j in range(i + 1, len(nb.cells)):
                client.cells_info[j]["why"] = "not run: the kernel had died"
            outcome = "kernel died"
            break
        except CellTimeoutError:
            reply = {"ename": "CellTimeoutError"}
        else:
            reply = replies.get(i, {})
        info["seconds"] = round(time.monotonic() - t0, 3)
        if reply.get("ename") == "CellTimeoutError":
            info["status"] = "timeout"
            info["why"] = f"the cell ran longer than {client.timeout} s and was interrupted"
            if not _responsive(client):
                info["why"] = (f"the cell ran longer than {client.timeout} s and could not "
                               "be interrupted")
                for j in range(i + 1, len(nb.cells)):
                    client.cells_info[j]["why"] = "not run: an earlier cell could not be stopped"
                outcome = "stuck cell"
                break
        elif reply.get("status") == "error" or "ename" in info:
            info["status"] = "error"
            info.setdefault("ename", str(reply.get("ename", ""))[:200])
            info.setdefault("evalue", str(reply.get("evalue", ""))[:2000])
        else:
            info["status"] = "ok"
    return outcome


def run_nbval(nb_path, result_path, cwd, cell_timeout=60.0, junit=None):
    """The checking run: execute the notebook under pytest's nbval plugin (each
    code cell a test item; a check cell fails when one of its checks does) and
    collect the records its kernel writes to ``records.jsonl`` beside the result."""
    import xml.etree.ElementTree as ET

    import pytest
    nb_path, result_path = Path(nb_path), Path(result_path)
    n_cells = len(nbformat.read(nb_path, as_version=4).cells)
    records_path = result_path.with_name("records.jsonl")
    os.environ["COURSE_GRADE_RECORDS"] = str(records_path)
    junit = Path(junit) if junit else result_path.with_name("junit.xml")
    ini = nb_path.parent / "pytest.ini"
    ini.write_text("[pytest]\n", encoding="utf-8")
    # only nbval (named below) and pytest's own plugins: whatever else the machine has
    # installed (a plugin that shuffles test order, say, which would run check cells out
    # of order) stays out of the checking run, which also starts a second faster
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    start = time.monotonic()
    args = [str(nb_path), "--nbval-lax", "--nbval-current-env", "-p", "nbval.plugin",
            "-p", "no:cacheprovider", "-c", str(ini), "--rootdir", str(nb_path.parent),
            f"--nbval-cell-timeout={int(cell_timeout)}", f"--junit-xml={junit}", "-q",
            "-o", "junit_suite_name=course-grade", "-o", "junit_logging=no"]
    with contextlib.redirect_stdout(sys.stderr):
        rc = int(pytest.main(args))
    cells = [{"status": "not_run", "records": []} for _ in range(n_cells)]
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        root = None
    for case in (root.iter("testcase") if root is not None else []):
        name = case.get("name", "")
        if not name.startswith("Cell ") or not name[5:].isdigit() or int(name[5:]) >= n_cells:
            continue
        info = cells[int(name[5:])]
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None:
            info["status"] = "skipped"
        elif bad is None:
            info["status"] = "ok"
        else:
            text = _ANSI.sub("", (bad.text or bad.get("message") or "")).strip()
            last = [ln for ln in text.splitlines() if ln.strip()][-1:] or [""]
            ename, _, evalue = last[0].partition(": ")
            if not evalue or " " in ename:
                ename, evalue = "CellError", last[0]
            info.update(status="error", ename=ename[:200], evalue=evalue[:2000],
                        traceback=text[-3000:])
    records, size = [], 0
    with contextlib.suppress(OSError):
        with open(records_path, encoding="utf-8") as f:
            for line in f:
                size += len(line)
                if size > RECORD_CAP:
                    break
                with contextlib.suppress(ValueError):
                    rec = json.loads(line)
                    if isinstance(rec, dict):
                        records.append(rec)
    result = {"outcome": "completed" if root is not None else "no report", "pytest_exit": rc,
              "seconds": round(time.monotonic() - start, 3), "cells": cells, "records": records,
              "kernels": dict(_STARTS)}
    _alone()
    write_atomic(result_path, json.dumps(result))
    return result


def _alone():
    """Before the result is written: as the first process of the run's pid namespace, end
    every other process in it (one a kernel's hook started could be watching the folder
    for the result's name, to replace the file)."""
    if os.getpid() == 1:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass


RESULT_NAME = re.compile(r"[0-9a-f]{32}\.json")


def private_result(result) -> Path:
    """Where this run writes its result: the file named in ``RESULT.name`` (the grader's
    random name, read and removed here before any notebook code runs), beside RESULT.
    The kernel may write in the run's folder, but it cannot learn that name (not from
    this process's arguments, environment or memory, see :func:`_keep_to_itself`), so a
    result it forges under any name is never read. RESULT itself when there is no name."""
    p = Path(result)
    holder = p.with_name(p.name + ".name")
    try:
        name = holder.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return p
    holder.unlink()
    if not RESULT_NAME.fullmatch(name):
        raise SystemExit(f"runner: {holder.name} does not hold a result file's name")
    return p.with_name(name)


def _keep_to_itself():
    """What the kernel (a child of this process, under the same user) could do to this
    process: read its memory through /proc (refused once it is not dumpable), or stop it
    with a signal before it writes the result (the signals a process may handle are
    handled, doing nothing; as the first process of a pid namespace the others do not
    reach it from inside)."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)     # PR_SET_DUMPABLE = 4
    for sig in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM"):
        if hasattr(signal, sig):
            signal.signal(getattr(signal, sig), lambda *_: None)


def main(argv=None, warm=False):
    """``warm``: this process already holds the kernel's imports (``warm.py``), so its
    kernel is forked from it (before this process learns where its result goes)."""
    waiting = [_prefork_kernel()] if warm else []
    _use_warm_kernels(waiting)
    ap = argparse.ArgumentParser(prog="runner.py")
    ap.add_argument("notebook")
    ap.add_argument("result")
    ap.add_argument("--cwd", required=True)
    ap.add_argument("--cell-timeout", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--nbval", action="store_true",
                    help="run under pytest --nbval (the checking run)")
    ap.add_argument("--junit-xml", default=None)
    a = ap.parse_args(argv)
    _keep_to_itself()
    result = private_result(a.result)
    if a.nbval:
        run_nbval(a.notebook, result, a.cwd, a.cell_timeout, a.junit_xml)
    else:
        run(a.notebook, result, a.cwd, a.cell_timeout, a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
