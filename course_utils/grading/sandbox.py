"""The sandbox every graded kernel runs in (the student's and the checking one).

What Linux offers is detected once per class and used; what is missing is
reported, never assumed (the score table's ``isolation`` says which was in force):

* **namespaces** (``unshare --user --map-root-user --pid --mount --net``): the
  run sees its own processes only, and everything it starts dies with it (the
  first process of a pid namespace takes the rest with it; ``--kill-child``
  ties that process to the grader's handle). The course checkout, the
  submissions, the output folder, the grader's scratch space, the user's home,
  ``/tmp`` and ``/dev/shm`` are covered by empty folders; the Python
  installation comes back read-only and the run's own folder read-write, and
  every other mount (``/``, ``/etc``, ``/opt``, ``/sys`` ...) is read-only too, but for
  the run's ``/proc`` (whose ``sys``, ``sysrq-trigger``, ``irq``, ``bus`` and ``fs`` are
  read-only) and ``/dev``. Its network is a private loopback; UTS and IPC are its own.
  A grader running as root runs it as a fresh unprivileged uid (``RUN_IDS``).
* **Landlock**: file access limited to an allow-list (system and Python
  folders and the staged course package read-only; the run's folder, ``/tmp``
  (inside namespaces) and the device files of ``DEVICES`` writable); where the kernel has
  signal scoping (ABI 6+), no signal reaches a process outside the sandbox.
* without namespaces, a supervisor outside the sandbox (``sandbox_exec.supervise``, a
  child subreaper) kills every process of the run when it ends and counts them, and the
  runs of one grading process go one at a time.
* **limits**, always: a session and process group of its own, resource limits
  (private memory, file size, CPU time, processes, no core files), a fresh environment
  with its own ``HOME``, IPython and Jupyter folders, and a marker variable
  by which any process that left the group (``setsid``) is found and killed.

The kernel imports ``course_utils`` from a private staged copy of the package
(no ``solutions/``, ``tests/`` or other file of the checkout), never from the
checkout.

Where the namespaces are in force, each run is forked from a warm process
(``warm.py``) that has imported PyTorch and the Jupyter machinery once, instead of
starting two fresh Pythons; it enters the same sandbox. ``COURSE_GRADE_WARM=0`` turns
that off. There the staged package and the warm process belong to the grading process,
not to one class: a process that grades several classes (a script over every problem set,
the course's own tests) stages and imports once, and both end with it. Each run still
learns everything of its class (folders, limits, environment) from its own configuration
after the fork, and the warm process serves only classes whose runs would start with the
same environment it has.
"""
from __future__ import annotations

import atexit
import compileall
import contextlib
import hashlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from course_utils.grading import sandbox_exec

PACKAGE = Path(__file__).resolve().parents[1]          # course_utils/
UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child",
           "--mount", "--mount-proc", "--net", "--uts", "--ipc"]
MAX_PROCS = 256          # processes of one run (threads included)
# a grader running as root runs each namespaced run as a fresh unprivileged uid and gid
# of this range (no account has them): root's processes are not bound by RLIMIT_NPROC,
# and what the machine's root owns (/dev, /proc/sys, ...) must not be the run's
RUN_IDS = (0x5F000000, 1 << 20)
# the device files a kernel writes to (GPU ones where present); the rest of /dev is
# read-only under Landlock
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/urandom", "/dev/random")
MARKER = "COURSE_GRADE_RUN"
LEVELS = ("auto", "namespaces", "landlock", "limits")
_PASS_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
             "TRITON_INTERPRET", "CUDA_HOME", "COURSE_DEVICE")


class SandboxError(RuntimeError):
    """The isolation asked for is not available here."""


@dataclass(frozen=True)
class Isolation:
    namespaces: bool
    landlock: int          # Landlock ABI version in force, 0 for none
    note: str = ""         # why a level that exists here is not in force

    def describe(self) -> str:
        parts = [self.note] if self.note else []
        if self.namespaces:
            parts.append("user+pid+mount+net+uts+ipc namespaces")
        if self.landlock:
            parts.append(f"Landlock ABI {self.landlock}"
                         + (" with signal scoping" if self.landlock >= 6 else ""))
        parts.append("rlimits, own session, fresh HOME and environment")
        if not self.namespaces:
            parts.append("one run at a time")
        return "; ".join(parts)


_probe_cache: dict = {}


def _namespaces_work() -> bool:
    if "ns" not in _probe_cache:
        try:
            r = subprocess.run(UNSHARE + [sys.executable, "-c", "pass"], capture_output=True,
                               timeout=60, stdin=subprocess.DEVNULL)
            _probe_cache["ns"] = r.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _probe_cache["ns"] = False
    return _probe_cache["ns"]


def _cuda_present() -> bool:
    """Does this machine's torch see a CUDA GPU (without starting one if torch is absent)?"""
    if os.environ.get("COURSE_GRADE_ASSUME_GPU") == "1":      # tests of the GPU path
        return True
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def detect(level: str = "auto") -> Isolation:
    """The isolation to grade with. ``auto``: all that works here; ``namespaces``
    or ``landlock``: that one (and Landlock too where it exists), or an error;
    ``limits``: process limits, session and environment only."""
    if level not in LEVELS:
        raise SandboxError(f"isolation: expected one of {', '.join(LEVELS)}, got {level!r}")
    ll = sandbox_exec.landlock_abi() if sys.platform.startswith("linux") else 0
    note = ""
    if ll and _cuda_present():
        # measured on an H100: under a Landlock ruleset the CUDA driver fails to start
        # (cudaGetDeviceCount: error 304, "OS call failed"), and the kernels would fall
        # back to the CPU; a GPU machine relies on the namespaces instead
        if level == "landlock":
            raise SandboxError("isolation 'landlock': CUDA does not start under Landlock on "
                               "this GPU machine; use 'namespaces' or 'auto'")
        ll, note = 0, "Landlock off (CUDA does not start under it)"
    if level == "limits":
        return Isolation(False, 0)
    if level == "landlock":
        if not ll:
            raise SandboxError("isolation 'landlock': this Linux kernel has no Landlock")
        return Isolation(False, ll)
    ns = sys.platform.startswith("linux") and shutil.which("unshare") is not None \
        and _namespaces_work()
    if level == "namespaces" and not ns:
        raise SandboxError("isolation 'namespaces': `unshare --user --pid --mount --net` does "
                           "not work here (run the grader in a container, see the README)")
    return Isolation(ns, ll, note)


def _nproc_in_use() -> int:
    uid = os.getuid()
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += 1
    return n


def _library_paths(hidden) -> list[str]:
    """Folders on the grader's own ``sys.path`` that hold installed packages outside the
    interpreter's prefix (a ``pip install --target`` folder on PYTHONPATH, say): the
    graded kernels need them too. The course checkout (with its solutions) and anything
    hidden from students are never among them."""
    checkout = os.path.realpath(PACKAGE.parent)
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for entry in sys.path:
        if not entry:
            continue
        real = os.path.realpath(entry)
        if not os.path.isdir(real) or real in out:
            continue
        inside = lambda top: real == top or real.startswith(top.rstrip(os.sep) + os.sep)  # noqa: E731
        if inside(checkout) or any(inside(p) for p in prefixes):
            continue
        if any(inside(os.path.realpath(h)) for h in hidden if h not in ("/tmp", "/dev/shm")) \
                or not any(f.endswith((".dist-info", ".egg-info")) for f in os.listdir(real)):
            continue                      # only folders that hold installed distributions
        out.append(real)
    return out


def _stage_package(dest: Path):
    """Copy ``course_utils`` (and the committed measurements it reads) to ``dest``."""
    shutil.copytree(PACKAGE, dest / "course_utils",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # compiled here, once: the kernels see the copy read-only, so each of them would
    # otherwise compile every course module it imports again
    compileall.compile_dir(dest / "course_utils", quiet=2)
    # the committed measurements are course material the problem sets read (a profile
    # to interpret, say); only the data files, never the scripts
    bench = PACKAGE.parent / "benchmarks"
    if bench.is_dir():
        shutil.copytree(bench, dest / "benchmarks", ignore=_bench_data_only)


def _bench_data_only(d, names):
    return [n for n in names if not (os.path.isdir(os.path.join(d, n)) and n != "verify"
                                     or n.endswith((".json", ".txt", ".md")))]


def _package_fingerprint() -> str:
    """Names, sizes and times of every file the stage copies: a changed package (an
    edit between two classes of a long-lived process) gets a new stage."""
    h = hashlib.sha256()
    for top in (PACKAGE, PACKAGE.parent / "benchmarks"):
        for d, dirs, files in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for f in sorted(files):
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(d, f))
                    h.update(f"{os.path.join(d, f)}\0{st.st_size}\0{st.st_mtime_ns}\n"
                             .encode())
    return h.hexdigest()


class _Shared:
    """What every class graded by this process shares where the namespaces hold: the
    staged package and the warm processes (one per distinct starting environment).
    Both live in one private folder and end with the process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = None
        self._top = None
        self._stages = {}            # fingerprint -> staged folder
        self._warm = {}              # starting argv and environment -> _WarmParent

    def _mine(self):
        """(under the lock) this process's folder; a forked child starts its own"""
        if self._pid != os.getpid():      # the parent's warm processes are not ours
            self._pid, self._top, self._stages, self._warm = os.getpid(), None, {}, {}
        if self._top is None or not self._top.is_dir():
            for parent in self._warm.values():  # their folder is gone: start afresh
                parent.close()
            self._top = Path(tempfile.mkdtemp(prefix="course-grade-shared-"))
            self._stages, self._warm = {}, {}
        return self._top

    def stage(self) -> Path:
        fp = _package_fingerprint()
        with self._lock:
            top = self._mine()
            if fp not in self._stages:
                dest = top / f"stage-{len(self._stages)}"
                _stage_package(dest)
                self._stages[fp] = dest
            return self._stages[fp]

    def warm(self, box: "Sandbox") -> "_WarmParent":
        argv = [box.python, str(box.stage / "course_utils" / "grading" / "warm.py")]
        key = (tuple(argv), tuple(sorted(box._env(Path("/"), "/tmp", "").items())))
        with self._lock:
            top = self._mine()
            parent = self._warm.get(key)
            if parent is None or parent.dead:
                token = secrets.token_hex(12)
                home = top / f"warm-{token[:8]}"
                # PyTorch asks NVML rather than the CUDA driver whether a GPU is there,
                # since a process that started CUDA cannot fork a child that uses it
                env = dict(box._env(home / "home", "/tmp", token),
                           PYTORCH_NVML_BASED_CUDA_CHECK="1")
                parent = self._warm[key] = _WarmParent(argv, env, home, token)
            return parent

    def release(self):
        """Stop the warm processes and remove the shared folder."""
        with self._lock:
            if self._pid != os.getpid():
                return
            for parent in self._warm.values():
                parent.close()
            if self._top is not None:
                shutil.rmtree(self._top, ignore_errors=True)
            self._top, self._stages, self._warm = None, {}, {}


_SHARED = _Shared()
atexit.register(_SHARED.release)


def release_shared():
    """End this process's warm processes and remove its staged package (they are
    otherwise kept for the next class until the process exits)."""
    _SHARED.release()


class Sandbox:
    """One class run's sandbox: the staged package, what to hide, the limits."""

    def __init__(self, scratch: Path, hide, isolation: Isolation, *, memory_mb: int = 8192,
                 cpu_seconds: float = 1200):
        self.scratch = Path(scratch)
        self.isolation = isolation
        # under the namespaces the stage is mounted read-only in every run, so one copy
        # serves every class this process grades; elsewhere a run could write to it
        if isolation.namespaces:
            self.stage = _SHARED.stage()
        else:
            self.stage = self.scratch / "stage"
            _stage_package(self.stage)
        home = os.path.expanduser("~")
        self.hide = sorted({str(Path(p).resolve()) for p in hide if p} |
                           {str(self.scratch.resolve()), "/tmp", "/dev/shm",
                            str(Path(home).resolve()) if home not in ("/", "") else "/tmp"})
        self.python = sys.executable
        self.libraries = _library_paths(self.hide)
        self.readable = sorted({os.path.realpath(p) for p in (
            sys.prefix, sys.base_prefix, sys.exec_prefix, self.stage)} |
            {sys.prefix, sys.base_prefix, str(self.stage)} | set(self.libraries))
        self.memory = int(memory_mb) * 2**20
        self.cpu = int(cpu_seconds)
        self._live = {}                     # pid -> marker token of each run in progress
        self._lock = threading.Lock()
        # without namespaces, runs share the machine's /tmp, loopback network and unix
        # sockets: a kernel could reach another run's kernel (its IOPub broadcasts answers
        # and records), so only one run is alive at a time (other grading work overlaps)
        self._serial = threading.Lock() if not isolation.namespaces else None
        self.root = os.geteuid() == 0
        self._warm = _SHARED.warm(self) if warm_starts_possible(isolation) else None
        # the warm process's marker (every process it starts carries it)
        self.token = self._warm.token if self._warm is not None else secrets.token_hex(12)
        self.warm_runs = self.cold_runs = 0

    def _limits(self):
        lim = {"RLIMIT_CORE": 0, "RLIMIT_FSIZE": 2**30, "RLIMIT_CPU": self.cpu,
               "RLIMIT_NOFILE": 4096}
        if self.memory > 0:
            # private writable memory: CUDA's address-space reservations do not count
            lim["RLIMIT_DATA"] = self.memory
        if self.root and self.isolation.namespaces:
            lim["RLIMIT_NPROC"] = MAX_PROCS   # the run's own uid (see RUN_IDS)
        else:
            # processes are counted per user across the machine: allow this many more
            # (without namespaces the supervisor counts the run's, see sandbox_exec)
            lim["RLIMIT_NPROC"] = _nproc_in_use() + MAX_PROCS
        return lim

    def _env(self, home: Path, tmp: str, token: str) -> dict:
        """A run's whole environment: its own home, IPython, Jupyter and cache folders."""
        env = {"PATH": os.pathsep.join([str(Path(self.python).parent), "/usr/local/bin",
                                        "/usr/bin", "/bin"]),
               "HOME": str(home), "USER": "student", "LOGNAME": "student", "LANG": "C.UTF-8",
               "TMPDIR": tmp, "IPYTHONDIR": str(home / ".ipython"),
               "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
               "JUPYTER_DATA_DIR": str(home / ".local" / "share" / "jupyter"),
               "JUPYTER_RUNTIME_DIR": str(home / ".local" / "share" / "jupyter" / "runtime"),
               "JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_ALLOW_INSECURE_WRITES": "1",
               "MPLCONFIGDIR": str(home / ".matplotlib"), "MPLBACKEND": "Agg",
               "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
               "TRITON_CACHE_DIR": str(home / ".triton"),
               "PYTHONPATH": os.pathsep.join([str(self.stage)] + self.libraries),
               "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYDEVD_DISABLE_FILE_VALIDATION": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
               MARKER: token}
        env.update({k: os.environ[k] for k in _PASS_ENV if k in os.environ})
        return env

    def command(self, job_dir: Path, argv: list, cwd: Path, log: Path | None = None):
        """``(cmd, token)``: start ``argv`` (run by the sandbox's Python) in the sandbox;
        its configuration is ``job_dir/sandbox.json`` (``log``: where a warm start sends
        the run's output)."""
        job_dir = Path(job_dir).resolve()
        token = secrets.token_hex(12)
        home = job_dir / "home"
        for d in ("home", "tmp"):
            (job_dir / d).mkdir(exist_ok=True)
        tmp = "/tmp" if self.isolation.namespaces else str(job_dir / "tmp")
        env = self._env(home, tmp, token)
        drop = None
        if self.root and self.isolation.namespaces:
            run_id = RUN_IDS[0] + secrets.randbelow(RUN_IDS[1])
            drop = [run_id, run_id]
            # the run's own folders become its uid's (the rest stays root's, read-only)
            for d in [job_dir] + [p for p in job_dir.iterdir() if p.is_dir()
                                  and not p.is_symlink()]:
                os.chown(d, run_id, run_id)
        devices = list(DEVICES) + sorted(str(p) for p in Path("/dev").glob("nvidia*"))
        if self.isolation.namespaces:
            devices.append("/dev/shm")        # a private tmpfs there
        cfg = {"namespaces": self.isolation.namespaces, "hide": self.hide,
               "keep": [[p, False] for p in self.readable] + [[str(job_dir), True]],
               "landlock": bool(self.isolation.landlock),
               "landlock_ro": ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc",
                               "/proc", "/sys", "/dev"] + self.readable,
               "landlock_rw": [str(job_dir)] + devices + (["/tmp"] if self.isolation.namespaces
                                                          else []),
               "rlimits": self._limits(), "max_procs": MAX_PROCS, "drop": drop,
               "cwd": str(cwd), "env": env,
               "argv": [self.python] + [str(a) for a in argv],
               "log": str(log) if log is not None else os.devnull}
        cfg_path = job_dir / "sandbox.json"
        cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
        entry = self.stage / "course_utils" / "grading" / "sandbox_exec.py"
        # as root, sandbox_exec enters the namespaces itself (it maps two ids)
        cmd = (UNSHARE if self.isolation.namespaces and not drop else []) + \
            [self.python, "-I", "-S", str(entry), str(cfg_path)]
        return cmd, token

    def run(self, job_dir: Path, argv: list, cwd: Path, log: Path, wall: float) -> bool:
        """Run ``argv`` in the sandbox and wait; kill everything it started at the end
        (or at ``wall`` seconds). Returns False when it had to be killed."""
        if self._serial is None:
            return self._run(job_dir, argv, cwd, log, wall)
        with self._serial:
            return self._run(job_dir, argv, cwd, log, wall)

    def _run(self, job_dir, argv, cwd, log, wall) -> bool:
        cmd, token = self.command(job_dir, argv, cwd, log)
        pid = self._warm.start(Path(job_dir).resolve() / "sandbox.json") \
            if self._warm is not None else None
        if pid is not None:
            self.warm_runs += 1
            return self._wait_warm(pid, token, wall)
        self.cold_runs += 1
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        with self._lock:
            self._live[proc.pid] = token
        finished = True
        try:
            proc.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            finished = False
            if not self.isolation.namespaces:
                # the supervisor kills everything below it, then ends
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        finally:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.wait(timeout=30)
            sweep(token)
            with self._lock:
                self._live.pop(proc.pid, None)
        return finished

    def _wait_warm(self, pid: int, token: str, wall: float) -> bool:
        """Wait for a run forked by the warm process (not this process's child: its exit
        is watched through a pidfd, and the warm process collects it only when told,
        so its pid and process group stay this run's until then)."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            fd = None
        with self._lock:
            self._live[pid] = token
        finished = True
        try:
            finished = _exited(fd, wall)
        finally:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            _exited(fd, 30)
            sweep(token)
            if fd is not None:
                os.close(fd)
            self._warm.reap(pid)
            with self._lock:
                self._live.pop(pid, None)
        return finished

    def kill_all(self):
        """Stop every run still in progress (after an interruption) and all it started."""
        with self._lock:
            live = dict(self._live)
        for pid, token in live.items():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            sweep(token)

    def close(self):
        """Stop every run of this class. The warm process stays for the next class this
        process grades; it ends with the process (or :func:`release_shared`)."""
        self.kill_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _exited(fd, seconds: float) -> bool:
    """Wait up to ``seconds`` for the process behind pidfd ``fd`` to end."""
    if fd is None:
        return True
    p = select.poll()
    p.register(fd, select.POLLIN)
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        try:
            if p.poll(max(0, int(left * 1000))):
                return True
        except InterruptedError:
            continue
        if left <= 0:
            return False


def warm_starts_possible(isolation: Isolation) -> bool:
    """Runs are forked from a warm process only inside namespaces (their pid namespace
    holds everything a run starts), where pidfds let the grader watch a run it did not
    start, and unless ``COURSE_GRADE_WARM=0``."""
    return bool(isolation.namespaces and hasattr(os, "pidfd_open")
                and os.environ.get("COURSE_GRADE_WARM", "1") != "0")


class _WarmParent:
    """The grader's end of ``warm.py``, started at the first run that asks for it. Any
    trouble with it (it did not start, died, answered nonsense) turns it off: the runs
    then start fresh, as they would without it, and the next class starts another."""

    START_SECONDS = 300      # its imports, on a loaded machine
    ANSWER_SECONDS = 60

    def __init__(self, argv, env, top: Path, token: str):
        self.argv, self.env, self.top, self.token = list(argv), dict(env), Path(top), token
        self.proc = self.sock = self.lines = None
        self.ready = False
        self.dead = False
        self._lock = threading.Lock()

    def _start(self):
        (self.top / "home").mkdir(parents=True, exist_ok=True)
        (self.top / "work").mkdir(exist_ok=True)
        mine, theirs = socket.socketpair()
        with open(self.top / "warm.log", "wb") as out:
            self.proc = subprocess.Popen(
                self.argv + [str(theirs.fileno())], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.top / "work", env=self.env, start_new_session=True)
        theirs.close()
        self.sock, self.lines = mine, mine.makefile("rb")
        self._answer(self.START_SECONDS, "ready")
        self.ready = True

    def _answer(self, seconds, expect=None) -> str:
        self.sock.settimeout(seconds)
        line = self.lines.readline().decode("utf-8", "replace").strip()
        if not line or (expect is not None and line != expect):
            raise OSError(f"the warm process answered {line!r}")
        return line

    def start(self, config: Path) -> int | None:
        """Fork a run with this configuration; its pid, or None (start it fresh)."""
        with self._lock:
            if self.dead:
                return None
            try:
                if not self.ready:
                    self._start()
                self.sock.sendall(f"run {config}\n".encode())
                answer = self._answer(self.ANSWER_SECONDS)
                if not answer.isdigit():
                    raise OSError(f"the warm process could not fork: {answer}")
                return int(answer)
            except (OSError, ValueError):
                self._stop()
                return None

    def reap(self, pid: int):
        with self._lock:
            if not self.dead:
                try:
                    self.sock.sendall(f"reap {pid}\n".encode())
                except OSError:
                    self._stop()

    def _stop(self):
        self.dead = True
        for f in (self.lines, self.sock):
            with contextlib.suppress(Exception):
                f.close()
        if self.proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=30)

    def close(self):
        with self._lock:
            self._stop()


def sweep(token: str, passes: int = 5) -> list:
    """Kill every process that carries this run's marker (one that left its
    process group with ``setsid``, or that a pid namespace did not hold).
    Returns the pids killed."""
    needle = f"{MARKER}={token}".encode()
    killed = []
    for _ in range(passes):
        found = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(d))
            except OSError:
                continue
        if not found:
            break
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed += found
        time.sleep(0.05)
    return killed


def marked_processes(tokens=None) -> list:
    """Pids of live processes carrying any grading marker (for tests and checks)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{d}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except (OSError, IndexError):
            continue
        for item in env:
            if item.startswith(MARKER.encode() + b"=") and (
                    tokens is None or item.split(b"=", 1)[1].decode() in tokens):
                out.append(int(d))
    return out
