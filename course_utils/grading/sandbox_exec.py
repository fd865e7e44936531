"""Enter the sandbox of one graded run, then become the runner.

    python sandbox_exec.py CONFIG.json

Started by the grader (see :mod:`course_utils.grading.sandbox`), either as the
first process of fresh user, pid, mount and network namespaces (``unshare``)
or, where those are not available, as a plain child in a session of its own.
Standard library only: it runs before anything of the course is importable.
In order it:

1. (namespaces) makes every mount private, lays an empty ``tmpfs`` over each
   hidden path (the course checkout, the submissions, the output folder, the
   grader's scratch space, the user's home, ``/tmp``, ``/dev/shm``), binds back
   the few paths the run needs at their own names (the Python installation
   read-only, the run's own folder read-write), makes every other mount
   read-only (``/proc``, ``/sys`` and ``/dev`` aside), and brings up the loopback
   interface of its private network;
2. sets the resource limits (private memory, file size, CPU time, processes,
   core files);
3. (Landlock) restricts file access to an allow-list (read-only: system and
   Python folders and the staged course package; read-write: the run's folder,
   ``/tmp``, ``/dev``) and, where the kernel supports it, forbids signalling any
   process outside the sandbox;
4. changes to the run's folder and ``exec``s the command with the run's own
   environment (fresh ``HOME``, IPython and Jupyter folders).

Every step that is asked for and fails stops the run: a sandbox is never
silently weaker than the one the score table reports.
"""
import ctypes
import ctypes.util
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = \
    1, 2, 4, 32, 4096, 16384, 1 << 18
MS_NOEXEC, MS_NOATIME, MS_NODIRATIME, MS_STRICTATIME = 8, 1024, 2048, 1 << 24
# a mount's own options that a remount must repeat: in a user namespace the kernel
# refuses to drop any of them from a mount the parent namespace made
_KEPT_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                 "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME}
# left as they are: the run's own /proc (its writable parts are made read-only by
# protect_proc), and the devices (a GPU is opened read-write); /sys is read-only
_LIVE = ("/proc", "/dev")
# the parts of /proc that change the machine rather than show it (the namespace's /proc
# is the run's own, but a sysctl or the sysrq trigger acts on the host)
_PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _mount(src, target, fstype, flags, data=None):
    enc = (lambda s: s.encode() if isinstance(s, str) else s)
    if _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {target}: {os.strerror(err)}")


def _under(path, parent):
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def hide_and_bind(hide, keep):
    """``hide``: folders covered by an empty tmpfs. ``keep``: ``[(path, writable)]``
    made visible again at their own path, even inside a hidden folder."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    fds = []
    for path, writable in keep:
        if os.path.exists(path):
            fds.append((path, writable, os.open(path, os.O_PATH | os.O_CLOEXEC)))
    covered = []
    for path in sorted(set(hide), key=lambda p: p.count("/")):
        if not os.path.isdir(path) or any(_under(path, c) for c in covered):
            continue
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=1g,mode=1777")
        covered.append(path)
    for path, writable, fd in fds:
        if any(_under(path, c) for c in covered):
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            if not writable:
                _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        os.close(fd)
    read_only_elsewhere(covered + [path for path, writable in keep if writable])
    protect_proc()


def protect_proc():
    """Bind each of ``_PROC_READ_ONLY`` onto itself, read-only."""
    for path in _PROC_READ_ONLY:
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
                   | MS_NOEXEC)


def _mounts():
    """``[(mount point, its own options)]`` of this mount namespace, the topmost last."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split(" ")
            point = fields[4].encode().decode("unicode_escape").encode("latin-1").decode()
            out.append((point, fields[5].split(",")))
    return out


def read_only_elsewhere(writable):
    """Every mount of this namespace read-only, but for the ``writable`` folders (and
    whatever is mounted below them) and the kernel's and devices' own folders: with
    Landlock off (a GPU machine), nothing else bounds where a run may write, and the
    Python installation, ``/etc`` or ``/opt`` may belong to the user grading."""
    tops = {}
    for point, opts in _mounts():
        tops[point] = opts                      # a stack of mounts: the one on top counts
    for point, opts in sorted(tops.items(), key=lambda kv: kv[0].count("/")):
        if "ro" in opts or any(_under(point, w) for w in (*writable, *_LIVE)):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in _KEPT_OPTIONS.items():
            if name in opts:
                flags |= bit
        if "relatime" not in opts and "noatime" not in opts:
            flags |= MS_STRICTATIME
        _mount(None, point, None, flags)


def loopback_up():
    import fcntl
    import socket
    import struct
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifr)[:18])[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1 | 0x40))  # SIOCSIFFLAGS
    finally:
        s.close()


def set_limits(limits):
    for name, value in limits.items():
        res = getattr(resource, name)
        soft, hard = resource.getrlimit(res)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(res, (value, value))


# ------------------------------------------------------------------ Landlock
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446
_PATH_BENEATH = 1
_FS = {  # access rights of each Landlock ABI version
    "EXECUTE": 1 << 0, "WRITE_FILE": 1 << 1, "READ_FILE": 1 << 2, "READ_DIR": 1 << 3,
    "REMOVE_DIR": 1 << 4, "REMOVE_FILE": 1 << 5, "MAKE_CHAR": 1 << 6, "MAKE_DIR": 1 << 7,
    "MAKE_REG": 1 << 8, "MAKE_SOCK": 1 << 9, "MAKE_FIFO": 1 << 10, "MAKE_BLOCK": 1 << 11,
    "MAKE_SYM": 1 << 12, "REFER": 1 << 13, "TRUNCATE": 1 << 14, "IOCTL_DEV": 1 << 15}
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    abi = _libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(abi), 0)


def landlock(read_only, read_write):
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available")
    every = 0
    for i, bit in enumerate(_FS.values()):
        if i <= 12 or (i == 13 and abi >= 2) or (i == 14 and abi >= 3) or (i == 15 and abi >= 5):
            every |= bit
    ro = _FS["EXECUTE"] | _FS["READ_FILE"] | _FS["READ_DIR"]
    attr = _RulesetAttr(every, 0, (_SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET) if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    fd = _libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, access in ((read_only, ro), (read_write, every)):
            for path in paths:
                if not os.path.exists(path):
                    continue
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    allowed = access if os.path.isdir(path) else access & (
                        _FS["EXECUTE"] | _FS["READ_FILE"] | _FS["WRITE_FILE"]
                        | (_FS["TRUNCATE"] if abi >= 3 else 0) | (_FS["IOCTL_DEV"] if abi >= 5 else 0))
                    rule = _PathBeneath(allowed & every, pfd)
                    if _libc.syscall(_SYS_ADD_RULE, fd, _PATH_BENEATH, ctypes.byref(rule),
                                     ctypes.c_uint32(0)) != 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule {path} failed")
                finally:
                    os.close(pfd)
        if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if _libc.syscall(_SYS_RESTRICT, fd, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)
    return abi


# ------------------------------------------------------------------ namespaces, from inside
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = \
    0x00020000, 0x10000000, 0x20000000, 0x40000000
_CLONE_NEWUTS, _CLONE_NEWIPC = 0x04000000, 0x08000000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 1, 4, 36
RUN_ID = 1         # the unprivileged id inside the namespace of a run started by root
MS_NOEXEC = 8


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces(drop=None):
    """For a process that is already running (a warm start, see ``warm.py``), what
    ``unshare --user --map-root-user --pid --fork --kill-child --mount --mount-proc --net
    --uts --ipc`` does for a command: fresh user, mount, pid, network, UTS and IPC
    namespaces with root in them mapped to this user, then a fork. ``drop``: ``[uid,
    gid]`` (for a grader running as root): root in the namespace stays the machine's
    root only until :func:`prepare` has set the mounts up, and id ``RUN_ID`` in it is
    that unprivileged uid and gid of the machine, which the run then becomes. The parent stays outside the new pid namespace,
    waits for the child and exits with its status: it never returns. The child returns
    as the first process of the new pid namespace, with ``/proc`` showing only that
    namespace; it (and with it everything in the namespace) is killed when the parent
    dies."""
    uid, gid = os.getuid(), os.getgid()
    helper = None
    if drop:
        # a map of two ids is written from outside the new namespace (where root holds
        # CAP_SETUID): by a helper forked before the unshare
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()
        helper = os.fork()
        if helper == 0:
            ok = b"0"
            try:
                os.read(go_r, 1)
                me = os.getppid()
                _write(f"/proc/{me}/uid_map", f"0 {uid} 1\n{RUN_ID} {int(drop[0])} 1")
                _write(f"/proc/{me}/gid_map", f"0 {gid} 1\n{RUN_ID} {int(drop[1])} 1")
                ok = b"1"
            finally:
                os.write(done_w, ok)
                os._exit(0)
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET
                     | _CLONE_NEWUTS | _CLONE_NEWIPC) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    if drop:
        os.write(go_w, b"1")
        ok = os.read(done_r, 1)
        os.waitpid(helper, 0)
        for fd in (go_r, go_w, done_r, done_w):
            os.close(fd)
        if ok != b"1":
            raise OSError("could not map the run's user into its namespace")
    else:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    pid = os.fork()
    if pid:
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    if _libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0) != 0:      # SIGKILL when the parent dies
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def drop_root(uid, gid):
    """Become ``uid``/``gid`` with no supplementary groups (from root)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("could not leave root")
    _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)     # its own /proc/self, as after an exec


_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_LAST = 63                  # past the last capability any kernel has: EINVAL, ignored


def drop_capabilities():
    """For a run that stays uid 0 outside the namespaces (a root grader under Landlock or
    limits alone): empty the capability bounding set, so that the command it becomes
    starts with none (root's execve grants only what the bounding set keeps). It still
    owns root's files; Landlock decides what it may open."""
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(_CAP_LAST + 1):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap}) failed")


def prepare(cfg):
    """Steps 1-3 and the change of folder: everything but becoming the command."""
    if cfg.get("namespaces"):
        hide_and_bind(cfg["hide"], [(p, bool(w)) for p, w in cfg["keep"]])
        loopback_up()
    set_limits(cfg.get("rlimits", {}))
    if cfg.get("namespaces") and cfg.get("drop"):
        drop_root(RUN_ID, RUN_ID)
    elif not cfg.get("namespaces") and os.geteuid() == 0:
        drop_capabilities()
    if cfg.get("landlock"):
        landlock(cfg["landlock_ro"], cfg["landlock_rw"])
    os.chdir(cfg["cwd"])


def _descendants():
    """Pids of every process below this one."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [os.getpid()]
    while todo:
        for k in kids.get(todo.pop(), ()):
            out.append(k)
            todo.append(k)
    return out


def _kill_descendants():
    """(as a child subreaper) kill every process below this one, however it left its
    parent, session or environment, and collect them all."""
    import signal
    for _ in range(1000):
        pids = _descendants()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not pids:
            try:
                os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
        import time
        time.sleep(0.01)


def supervise(cfg):
    """Without namespaces: stay outside the sandbox as the run's supervisor, a child
    subreaper (every process of the run that loses its parent becomes its child, a
    ``setsid`` daemon that cleared its environment too), counting the run's processes
    (``max_procs``: the run is stopped beyond it, since as root ``RLIMIT_NPROC`` does not
    apply); when the command ends, or this is told to stop (SIGTERM), everything below
    it is killed. Returns the command's exit status."""
    import signal
    import time
    if _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            prepare(cfg)
            argv = cfg["argv"]
            os.execve(argv[0], argv, cfg["env"])
        except BaseException as e:  # noqa: BLE001 - say why, then fail the run
            print(f"sandbox: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(121)
    limit, code, tick = int(cfg.get("max_procs") or 0), None, 0
    while code is None and not stop:
        try:
            got, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if got == pid:
            code = os.waitstatus_to_exitcode(status)
            break
        if got:
            continue
        tick += 1
        if limit and tick % 5 == 0 and len(_descendants()) > limit:
            print(f"sandbox: the run started more than {limit} processes and was stopped",
                  file=sys.stderr, flush=True)
            code = 125
            break
        time.sleep(0.02 if tick < 50 else 0.05)
    _kill_descendants()
    return 124 if code is None else (code if code >= 0 else 128 - code)


def main(config_path):
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink(config_path)
    if not cfg.get("namespaces"):
        sys.stdout.flush()
        os._exit(supervise(cfg))
    if cfg.get("drop"):                      # root: no `unshare` in front, see Sandbox
        enter_namespaces(cfg["drop"])
    prepare(cfg)
    argv = cfg["argv"]
    os.execve(argv[0], argv, cfg["env"])


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except BaseException as e:  # noqa: BLE001 - say why, then fail the run
        print(f"sandbox: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(121)
