"""The fork server's own program: imports the kernel's libraries once, then forks kernels.

Run by ``grader.forkserver`` inside a bubblewrap sandbox of its own (the kernels' read-only
view of the system and nothing of the course; its own /tmp; no network), as root with
only the capabilities that entering a kernel's sandbox takes. It imports only the
standard library and the modules it is told to preload, never runs student code, never
reads a connection file, and is the same process for every kernel of one worker: what
a kernel can read of its memory is the preloaded libraries and this file.

    python zygote.py SOCKET_FD PRELOAD_JSON

Protocol on the SOCK_SEQPACKET socket SOCKET_FD (one message each way per kernel):

- it first sends ``{"ready": true, "pid": <its pid>, "failed": {module: error}, "cpu": <CPU
  seconds of its imports>, "preloaded_bytes": <address space the imports mapped>}``;
- a request is a JSON object with file descriptors attached (SCM_RIGHTS), in the order
  of its ``"fds"`` names: the kernel sandbox's namespaces (``ipc``, ``uts``, ``net``,
  ``cgroupns``, ``pid``, ``mnt``), its root folder (``root``) and each ``cgroup.procs``
  file of the kernel's cgroup (``cgroup``). Besides: ``argv`` (the kernel command:
  python, -m, ipykernel_launcher, its arguments), ``env``, ``cwd``, ``uid``, ``rlimits``
  (name -> value, e.g. ``"AS": 4294967296``) and ``readable`` (the folders both
  sandboxes mount read-only);
- the answer is ``{"pid": <the kernel's PID, this PID namespace>, "cpu": <CPU seconds
  spent forking it>}`` or ``{"error": "<one line>"}``.

Per request it forks a child (the *waiter*) that enters the kernel's PID namespace and
forks the kernel, then waits for it, so that the kernel has a parent outside its sandbox
that reaps it. The kernel, before anything else: joins the kernel's cgroup, enters the
sandbox's other namespaces and root, starts a new session, sets the rlimits, drops
every capability (bounding, ambient and inheritable sets too) and becomes ``uid``, sets
no_new_privs; it keeps no descriptor of the zygote's but the read-only library files a
preloaded module holds open, each opened anew (an offset of its own); it takes the
kernel's own environment, reseeds numpy's and torch's global generators (``random`` reseeds itself),
and only then creates the kernel application (and its ZeroMQ context) from ``argv``.
"""
from __future__ import annotations

import ctypes
import fcntl
import gc
import importlib
import importlib.util
import json
import os
import resource
import signal
import socket
import stat
import sys
import time
import traceback

MAX_FDS = 16
MAX_MESSAGE = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
# <linux/prctl.h>, <linux/capability.h>
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_PDEATHSIG = 1
LINUX_CAPABILITY_VERSION_3 = 0x20080522
NAMESPACES = ("ipc", "uts", "net", "cgroupns", "pid", "mnt")  # mnt last: it changes what paths mean


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _setns(fd: int, what: str) -> None:
    _check(_libc.setns(fd, 0), f"setns({what})")


def _drop_capabilities() -> None:
    """Empty the bounding set while we may, then the ambient set (setuid empties the
    permitted and effective sets; capset below the inheritable one)."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read()) if os.path.exists(
        "/proc/sys/kernel/cap_last_cap") else 63
    for cap in range(last + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            _check(-1, f"dropping capability {cap} from the bounding set")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")


def _clear_capability_sets() -> None:
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _become(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _clear_capability_sets()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _capabilities_left() -> list[str]:
    """The capability sets of this process that are not empty (should be none)."""
    left = []
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")):
                name, value = line.split()
                if int(value, 16):
                    left.append(name.rstrip(":"))
    return left


def _inherited_files(keep: set[int], roots: list[str]) -> dict[int, tuple[str, int, bool]]:
    """Close every descriptor inherited from the zygote (its socket, pipes, folders...)
    but ``keep`` and the read-only regular files under ``roots`` that a preloaded
    library holds open (matplotlib keeps its fonts open). Returns those: fd -> (path,
    offset, inheritable), to be opened anew in the sandbox (``_reopen``)."""
    files = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd < 3 or fd in keep:
            continue
        try:
            info, flags, path = os.fstat(fd), fcntl.fcntl(fd, fcntl.F_GETFL), os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if (stat.S_ISREG(info.st_mode) and (flags & os.O_ACCMODE) == os.O_RDONLY
                and any(path.startswith(root.rstrip("/") + "/") for root in roots)):
            files[fd] = (path, os.lseek(fd, 0, os.SEEK_CUR), os.get_inheritable(fd))
        else:
            os.close(fd)
    return files


def _reopen(files: dict[int, tuple[str, int, bool]]) -> None:
    """Give each kept file a description of its own, opened by the kernel's uid in its
    sandbox: one shared with the zygote and every sibling would share its offset."""
    for fd, (path, offset, inheritable) in files.items():
        try:
            new = os.open(path, os.O_RDONLY)
        except OSError:
            os.close(fd)
            continue
        os.dup2(new, fd, inheritable=inheritable)
        os.close(new)
        os.lseek(fd, offset, os.SEEK_SET)


def _kernel(request: dict, fds: dict[str, list[int]], report: int) -> None:
    """In the kernel's process: enter its sandbox as described above, then run the kernel.
    Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        given = [fd for numbers in fds.values() for fd in numbers]
        files = _inherited_files({report, *given}, request["readable"])
        for fd in fds.get("cgroup", []):  # "0": the writing process; born outside, joins first
            os.write(fd, b"0\n")
        for name in NAMESPACES:
            if name in fds and name != "pid":  # pid: the waiter entered it, so we were born in it
                _setns(fds[name][0], name)
        os.fchdir(fds["root"][0])
        os.chroot(".")
        os.chdir(request["cwd"])
        for fd in given:
            os.close(fd)
        os.setsid()
        for name, value in request["rlimits"].items():
            resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (value, value))
        _drop_capabilities()
        _become(request["uid"])
        left = _capabilities_left()
        if left or os.getuid() == 0 or os.geteuid() == 0:
            raise RuntimeError(f"privileges left after dropping them: {left or 'uid 0'}")
        _reopen(files)
        os.environ.clear()
        os.environ.update(request["env"])
        importlib.invalidate_caches()
        sys.path_importer_cache.clear()
        # a fresh kernel seeds these from the OS when it imports them; a fork inherits ours
        # (Python's random reseeds itself in a forked child)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if "torch" in sys.modules:
            sys.modules["torch"].seed()
        argv = request["argv"]
        if argv[1:3] != ["-m", "ipykernel_launcher"]:
            raise RuntimeError(f"the fork server starts ipykernel only, not {argv[:3]}")
        sys.argv = [importlib.util.find_spec("ipykernel_launcher").origin, *argv[3:]]
        os.write(report, b"ok\n")
        os.close(report)
    except BaseException as error:  # noqa: BLE001 - reported, then this process ends
        message = f"{type(error).__name__}: {error}".replace("\n", " ")[:500]
        try:
            os.write(report, f"error {message}\n".encode())
        finally:
            os._exit(1)
    status = 1
    try:
        from ipykernel import kernelapp

        kernelapp.launch_new_instance()
        status = 0
    except SystemExit as end:
        status = end.code if isinstance(end.code, int) else 1
    except BaseException:  # noqa: BLE001 - as a kernel that crashes: it ends
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _waiter(request: dict, fds: dict[str, list[int]], report: int) -> None:
    """The child of the zygote: enter the kernel's PID namespace, fork the kernel there,
    report its PID (this namespace's), then wait for it and end with it. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if "pid" in fds:
            _setns(fds["pid"][0], "pid")
        pid = os.fork()
        if pid == 0:
            _kernel(request, fds, report)
        used = resource.getrusage(resource.RUSAGE_SELF)
        os.write(report, f"pid {pid} {used.ru_utime + used.ru_stime:.6f}\n".encode())
        os.close(report)
        for fd_list in fds.values():
            for fd in fd_list:
                os.close(fd)
    except BaseException as error:  # noqa: BLE001
        os.write(report, f"error {type(error).__name__}: {error}\n".encode())
        os._exit(1)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(0)


def _spawn(request: dict, fds: dict[str, list[int]]) -> dict:
    read, write = os.pipe()
    start = time.process_time()
    child = os.fork()
    if child == 0:
        os.close(read)
        _waiter(request, fds, write)
    os.close(write)
    forking = time.process_time() - start
    text = b""
    while chunk := os.read(read, 4096):
        text += chunk
    os.close(read)
    answer: dict = {}
    lines = text.decode(errors="replace").splitlines()  # the waiter's and the kernel's, in any order
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "pid":
            pid, cpu = rest.split()
            answer.update(pid=int(pid), cpu=forking + float(cpu))
        elif kind == "error":
            return {"error": rest}
    if "pid" not in answer or "ok" not in lines:
        return {"error": "the kernel process ended before it was ready"}
    return answer


def _reap(seconds: float = 0.0) -> None:
    """Reap the waiters that have ended; wait up to ``seconds`` for the others."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)


def serve(channel: socket.socket) -> None:
    """Answer requests until the grader closes the socket."""
    while True:
        _reap()
        try:
            message, fd_list, _, _ = socket.recv_fds(channel, MAX_MESSAGE, MAX_FDS)
        except InterruptedError:
            continue
        if not message:  # the grader is done: its kernels are gone, so are their waiters
            _reap(5.0)
            return
        fds: dict[str, list[int]] = {}
        try:
            request = json.loads(message)
            for name, fd in zip(request["fds"], fd_list, strict=True):
                fds.setdefault(name, []).append(fd)
            answer = _spawn(request, fds)
        except Exception as error:  # noqa: BLE001 - a bad request gets its answer
            answer = {"error": f"{type(error).__name__}: {error}"}
        finally:
            for fd in fd_list:
                os.close(fd)
        channel.send(json.dumps(answer).encode())


def _address_space() -> int:
    """This process's virtual memory size, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str]) -> int:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
    channel = socket.socket(fileno=int(argv[1]))
    bare = _address_space()
    failed = {}
    for module in json.loads(argv[2]):
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - the kernel imports it itself, or fails as it would
            failed[module] = f"{type(error).__name__}: {error}"
    # garbage of the imports (a font file left open in a cycle) is closed here, once, not in
    # each kernel at a moment when its descriptor number may be another file's; what
    # survives is frozen, so that no kernel's collector touches (and copies) those pages
    gc.collect()
    gc.freeze()
    channel.send(json.dumps({"ready": True, "pid": os.getpid(), "failed": failed, "cpu": time.process_time(),
                             "preloaded_bytes": _address_space() - bare}).encode())
    serve(channel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
