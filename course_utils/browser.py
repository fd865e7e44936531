"""A headless Chromium for the course's browser tests.

The browser tests drive Debian's ``chromium`` package with Playwright for Python.
Playwright never downloads a browser here: :func:`ensure_chromium` finds the
system Chromium and, on a CI machine (or when asked), installs it with
``apt-get``. :func:`launch` starts it with the flags the tests need on a machine
without outside network access.

    python -m course_utils.browser            # where is Chromium? (exit 1 if missing)
    python -m course_utils.browser --install  # install it with apt-get if missing (root)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "Chromium", "ensure_chromium", "launch"]

#: Where Debian's ``chromium`` package puts the browser.
CHROMIUM = "/usr/bin/chromium"

#: Flags for every launch. The background-networking, component-update and sync
#: flags stop Chromium from dialling out at start-up, which a closed network
#: answers with refused connections; ``--no-sandbox`` is needed as root.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

_LOCK = Path("/tmp/course-chromium-install.lock")
#: Seconds each apt-get step may take (the install is about 100 MB).
APT_TIMEOUT_S = 600


class Chromium(NamedTuple):
    """What :func:`ensure_chromium` found: ``path`` (None when unavailable) and a
    one-line ``reason`` saying how it was found or why not."""
    path: str | None
    reason: str

    def __bool__(self):
        return self.path is not None


def _working(path: str) -> str | None:
    """The browser's version line, or None when it does not run."""
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout.strip() or "chromium") if r.returncode == 0 else None


def _find(path: str | None) -> str | None:
    if path and os.access(path, os.X_OK):
        return path
    return None


def _apt_install(log) -> str | None:
    """Install Debian's ``chromium`` with apt-get; returns an error line or None."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    steps = (["apt-get", "update", "-q"],
             ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"])
    for cmd in steps:
        log("$ " + " ".join(cmd))
        t = time.time()
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True,
                               timeout=APT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(cmd)}` did not finish within {APT_TIMEOUT_S} s"
        log(f"  exit {r.returncode} in {time.time() - t:.0f} s")
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            return f"`{' '.join(cmd)}` failed (exit {r.returncode}): " + " | ".join(tail)
    return None


def ensure_chromium(install: bool | None = None, path: str = CHROMIUM, log=None) -> Chromium:
    """Find Debian's Chromium at ``path``; install it with apt-get if it is missing.

    ``install``: ``True`` installs when missing, ``False`` never installs, ``None``
    (the default) installs only when the environment variable ``CI`` is set.
    Installing needs root and ``apt-get``. Returns a :class:`Chromium` whose
    ``path`` is None, with the reason in ``reason``, when no browser can be had.
    """
    if install is not None and not isinstance(install, bool):
        raise TypeError(f"install must be True, False or None, got {install!r}")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"path must be an absolute path to the browser, got {path!r}")
    log = log or (lambda msg: print(f"[browser] {msg}", file=sys.stderr, flush=True))
    found = _find(path)
    if found:
        version = _working(found)
        if version:
            return Chromium(found, f"found {version} at {found}")
        return Chromium(None, f"{found} exists but `{found} --version` fails")
    wanted = bool(os.environ.get("CI")) if install is None else install
    if not wanted:
        return Chromium(None, f"{path} is missing; install it with `apt-get install chromium` "
                              "or call ensure_chromium(install=True) as root (CI does)")
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return Chromium(None, f"{path} is missing and installing it with apt-get needs root")
    if shutil.which("apt-get") is None:
        return Chromium(None, f"{path} is missing and there is no apt-get to install it with")
    import fcntl  # POSIX only; apt-get implies it
    with open(_LOCK, "w") as lock:   # two test workers must not run apt-get at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _find(path):
            error = _apt_install(log)
            if error:
                return Chromium(None, error)
    if not _find(path):
        return Chromium(None, f"apt-get installed chromium but {path} is still missing")
    version = _working(path)
    if not version:
        return Chromium(None, f"installed {path}, but `{path} --version` fails")
    return Chromium(path, f"installed {version} at {path} with apt-get")


def launch(playwright, user_data_dir, path: str = CHROMIUM, **options):
    """Start headless Chromium through ``playwright`` (from ``sync_playwright()``)
    with a fresh profile in ``user_data_dir`` (which must be empty or absent).
    Returns the persistent browser context; close it when done."""
    user_data_dir = Path(user_data_dir)
    if user_data_dir.exists() and any(user_data_dir.iterdir()):
        raise ValueError(f"user_data_dir must be a new or empty directory, got {user_data_dir} "
                         "(it holds files from an earlier run)")
    options.setdefault("viewport", {"width": 1400, "height": 1000})
    return playwright.chromium.launch_persistent_context(
        str(user_data_dir), executable_path=path, headless=True, args=list(CHROMIUM_ARGS),
        **options)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = [a for a in argv if a != "--install"]
    if unknown:
        print(__doc__)
        return 2
    found = ensure_chromium(install=True if "--install" in argv else None)
    print(found.reason)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
