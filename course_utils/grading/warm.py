"""Warm starts: every graded run forked from one process that has already
imported what each run imports.

    python warm.py FD        (started by the grader, once per grading process and starting
                              environment; FD: its socket)

A graded run starts two Pythons, the runner and then its Jupyter kernel, and each spends
most of its first seconds importing PyTorch and the Jupyter machinery (about 1.5 CPU
seconds for PyTorch alone on a small CPU machine). This process imports them once, with
the environment that every run it serves shares (the grader starts another for a class
whose runs would start otherwise), and then forks one child per run.
The child enters the run's sandbox as ``sandbox_exec.py`` does for a fresh process, but
from inside (:func:`sandbox_exec.enter_namespaces`), becomes the runner in-process, and
the runner forks the kernel from itself (``runner.main(..., warm=True)``).

Why this keeps the runs apart: nothing here runs student code, and it imports nothing
of the course but the two standard-library scripts beside it, so a run is a copy of this
process taken before anything of that run, or of any other, existed; it learns its own
settings only after the fork, from its configuration file (so runs of different classes
are as far apart as runs of one class). The grader uses it only where
the namespaces are in force: then a run cannot see or signal this process or another
run, and everything a run starts dies with the first process of its pid namespace.
Elsewhere, and whenever this process is missing, each run starts fresh.

The protocol, one line each way over the socket:

* it says ``ready`` once, after its imports;
* ``run CONFIG`` -> ``PID`` of the run's first process (or ``no REASON``). The run is not
  collected until
* ``reap PID``, which the grader sends once it has seen the run end, so the pid cannot
  be reused while the grader may still signal it;
* the end of input ends it.
"""
import gc
import importlib
import json
import os
import sys
import tempfile

import runner
import sandbox_exec

# what a run would otherwise import again: the runner's notebook client, the checking
# run's pytest, the kernel's Jupyter machinery, PyTorch, and the part of PyTorch that the
# guards' first call imports (torch._dynamo: more than a second of CPU, once per kernel).
# Not the kernel's debugger: importing it sets a variable in the environment, which a
# forked kernel would then lack
WARM_MODULES = ("torch", "numpy", "torch._dynamo", "ipykernel.kernelapp", "ipykernel.ipkernel",
                "nbformat", "nbclient", "pytest")


def _imports():
    sys.dont_write_bytecode = True
    for name in WARM_MODULES:
        importlib.import_module(name)
    # Triton decides at import whether it interprets; only the CPU machine's runs ask for
    # the interpreter, and there importing it touches no GPU (this process must never
    # start CUDA: a forked child could not use it)
    if os.environ.get("TRITON_INTERPRET") == "1":
        importlib.import_module("triton")
    if sys.modules["torch"].cuda.is_initialized():
        raise RuntimeError("the imports started CUDA, which a forked run could not use")


def _become_run(config_path):
    """In the fork: enter the run's sandbox and become its runner. Never returns."""
    code = 121
    try:
        os.setsid()                       # the grader stops the run by its process group
        with open(config_path, encoding="utf-8") as f:
            cfg = json.load(f)
        os.unlink(config_path)
        log = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 20)         # the grader's socket above all
        if cfg["namespaces"]:
            sandbox_exec.enter_namespaces(cfg.get("drop"))
        sandbox_exec.prepare(cfg)
        os.environ.clear()
        os.environ.update(cfg["env"])
        tempfile.tempdir = None           # chosen again from this run's TMPDIR
        argv = cfg["argv"]                # [python, script, args...]: this same Python
        if os.path.basename(str(argv[1])) == "runner.py":
            sys.argv = [str(a) for a in argv[1:]]
            code = runner.main(sys.argv[1:], warm=True)
        else:                             # anything else starts fresh inside the sandbox
            os.execve(argv[0], argv, cfg["env"])
    except BaseException as e:  # noqa: BLE001 - say why, then fail the run
        try:
            print(f"sandbox: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            os._exit(121)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code or 0)


def serve(fd: int):
    import socket
    sock = socket.socket(fileno=fd)
    lines = sock.makefile("rb")

    def say(text):
        sock.sendall(text.encode() + b"\n")

    _imports()
    # Everything imported so far lives as long as this process: out of the garbage
    # collector's sight, a run's collections neither walk it (a full one over PyTorch
    # takes a fifth of a second) nor write to its pages, which the fork shares until then
    gc.collect()
    gc.freeze()
    say("ready")
    for raw in lines:
        verb, _, arg = raw.decode("utf-8", "replace").strip().partition(" ")
        if verb == "run":
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as e:
                say(f"no {e}")
                continue
            if pid == 0:
                _become_run(arg)
            say(str(pid))
        elif verb == "reap":
            try:
                os.waitpid(int(arg), os.WNOHANG)
            except (ChildProcessError, ValueError):
                pass


if __name__ == "__main__":
    serve(int(sys.argv[1]))
