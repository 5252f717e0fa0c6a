"""The jail a student's kernel runs in while it is graded: bubblewrap, rlimits, IPC sockets.

``SandboxedKernelManager`` is the kernel manager of ``grader.execute.BudgetedExecute``.
It starts the kernel through Debian's ``bwrap`` with:

- no network (a new, empty network namespace) and its own PID, IPC and UTS namespaces,
  so it can neither reach a server nor see or signal the grader's processes;
- a whitelisted, read-only view of the system: /usr, /etc, the Python installation,
  the virtual environment, the ``coursekit`` package and the course's ``assets/`` (the
  font, package data of coursekit). The course folder (solutions, the ``grader`` package
  with its references, the secret), the gradebook, the workspace and other students' files are simply not there;
- size-limited tmpfs scratch at ``/home/student/work`` (the working directory, holding
  a copy of the submission's non-notebook files) and ``/tmp``;
- rlimits (``prlimit``): address space, processes, CPU seconds, file size, no core
  dumps; run as a throwaway unprivileged uid when the grader is root, so that the
  process limit holds;
- a cgroup (``grader.cgroup``, when the grader is root) holding the kernel and all it
  starts, from its first instruction: memory, processes and a CPU quota (``cpus``)
  for all of them together, their CPU seconds for the cell watchdog, and one kill of
  them all at shutdown. Without one, a loud warning: the rlimits then hold per process;
- ZeroMQ over Unix sockets (IPC transport) in a private directory, the only path
  between kernel and grader; the grader makes it read-only (when grading as root)
  once the sockets exist, before any cell runs, and caps the size of every message
  it accepts. The connection file is root's and mounted read-only.

Nothing the student submitted runs at start-up or shadows a module. The kernel
starts in an empty read-only folder (``START``) with ``PYTHONSAFEPATH`` (no script or
working folder at the head of ``sys.path``) and IPython's ``ignore_cwd`` (no ``''``
in it). Once it is up, its start-up code (``exec_lines``, before any request is
served) changes to the working folder, so data files open by relative path, and
appends that folder at the END of ``sys.path``: a student's helper module imports,
but a submitted ``numpy.py``, ``site.py`` or ``ipykernel_launcher.py`` is found only
after the real one. (It still runs if the notebook itself imports a name nothing
else provides; that is the student's code running in the student's kernel.)

When grading as root (``fork_kernels``, the default), the kernel is not a new Python:
the sandbox above is built exactly so, with ``sleep`` as the process that keeps it
alive, and ``grader.forkserver`` forks the kernel into it from a process that imported
numpy, torch, matplotlib and ipykernel once (``preload``). The forked process enters
the sandbox's namespaces, root and cgroup and takes the same rlimits and uid before the
kernel exists (``grader/zygote.py``); its address-space limit counts from what the
preloaded libraries already map. Everything after that, sealing and clean-up included,
is the same.

Clean-up removes the kernel's folder with ``rm -rf --one-file-system`` (any depth,
any modes) and says loudly what it could not remove.

Without bwrap the kernel runs with rlimits only, after a loud warning, unless
``require_sandbox`` is set, in which case grading refuses to start a kernel.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Enum, Float, Integer, List, Unicode

import coursekit

from . import forkserver
from .cgroup import Cgroup, CgroupUnavailable
from .cgroup import busy as cgroup_busy

WORK = "/home/student/work"
START = "/run/kernel-start"  # empty and read-only: the kernel's working folder while it starts
FILES = "/home/student/submission"
FONTS = "/home/student/.font-cache"
ZYGOTE = "/run/forkserver/zygote.py"  # the fork server's program, in its own sandbox
HOLDER = ["sleep", "infinity"]  # what keeps a forked kernel's sandbox alive
# what the fork server may do, and only while it enters a kernel's sandbox (grader/zygote.py)
ZYGOTE_CAPS = ["CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]
# not matplotlib_inline.backend_inline: imported before IPython exists, it would not hook the
# figures' display into the kernel (it does that when pyplot first imports it, in the kernel)
PRELOAD = ["numpy", "matplotlib", "matplotlib.pyplot", "torch", "torch.nn", "torch.nn.functional",
           "coursekit", "coursekit.data", "coursekit.plots", "coursekit.testing", "coursekit.training",
           "coursekit.probe", "coursekit.translation", "ipykernel.kernelapp", "ipykernel.ipkernel"]
_MB = 1024 * 1024
_kernels_cpu = 0.0  # kernels_cpu_seconds(): the CPU of the removed kernels of this process
_warned = False
_warned_cgroup = False
# run once the kernel is up, before it serves any request; names nothing in the user namespace
STARTUP = (f"__import__('os').chdir({WORK!r}); __import__('sys').path.append({WORK!r})")
# matplotlib's font list, so that no kernel rebuilds it (see _font_cache)
_FONT_COPY = f"mkdir -m 1777 /tmp/matplotlib; cp {FONTS}/fontlist-*.json /tmp/matplotlib/ 2>/dev/null"


class SandboxUnavailable(RuntimeError):
    """bwrap is missing and ``require_sandbox`` is set, or cgroups are unusable and
    ``require_cgroups`` is set."""


class SandboxedKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose kernels start inside a bubblewrap sandbox."""

    memory_mb = Integer(4096, help="Memory of the kernel, MiB: for all its processes together (cgroup), "
                                   "and the address space of each (RLIMIT_AS).").tag(config=True)
    processes = Integer(256, help="Processes and threads of the kernel together (cgroup pids.max, and "
                                  "RLIMIT_NPROC of its uid).").tag(config=True)
    cpus = Float(1.0, help="CPU quota of all the kernel's processes together, in cores (cgroup); "
                           "0: no quota.").tag(config=True)
    cgroups = Enum(["auto", "v2", "v1", "off"], default_value="auto",
                   help="Which cgroup hierarchy holds each kernel: auto (v2 if usable, else v1), v2, "
                        "v1, or off (rlimits only, per process).").tag(config=True)
    cgroup_parent = Unicode("", help="cgroup v2 folder under which kernels' cgroups are made (one "
                                     "delegated to the grader); empty: found at run time.").tag(config=True)
    require_cgroups = Bool(False, help="Refuse to grade when no cgroup can hold the kernel.").tag(config=True)
    cpu_seconds = Integer(180, help="CPU seconds for the whole kernel (RLIMIT_CPU), all threads.").tag(config=True)
    file_size_mb = Integer(128, help="Largest file the kernel may write (RLIMIT_FSIZE), MiB.").tag(config=True)
    scratch_mb = Integer(256, help="Size of each writable tmpfs (working directory, /tmp), MiB.").tag(config=True)
    max_message_mb = Integer(16, help="Largest message accepted from the kernel, MiB; larger "
                                      "ones are dropped by ZeroMQ before they reach memory.").tag(config=True)
    require_sandbox = Bool(False, help="Refuse to grade when bwrap is not installed.").tag(config=True)
    fork_kernels = Bool(True, help="Fork each kernel, inside its own sandbox, from a fork server that "
                                   "imported `preload` once (grader/forkserver.py), instead of starting "
                                   "a new Python; only when grading as root with bwrap.").tag(config=True)
    preload = List(Unicode(), default_value=PRELOAD,
                   help="Modules the fork server imports once for all the kernels it forks: "
                        "library code only, never the course's or a student's.").tag(config=True)

    _run_dir: str | None = None
    _uid: int | None = None
    _files: str | None = None
    _sockets: str | None = None
    cgroup: Cgroup | None = None
    handshake: forkserver.Handshake | None = None
    kernel_argv: list[str] = []

    # --- set-up -----------------------------------------------------------------

    async def _async_pre_start_kernel(self, **kw):
        # run_dir (root, 0711): connection.json (root:kernel 0440, mounted read-only),
        # sockets/ (the kernel's until seal(), then root's), files/ (read-only copy)
        self._run_dir = tempfile.mkdtemp(prefix="kernel-")
        os.chmod(self._run_dir, 0o711)
        self._sockets = os.path.join(self._run_dir, "sockets")
        os.mkdir(self._sockets, 0o700)
        self.transport = "ipc"
        self.ip = os.path.join(self._sockets, "k")
        self.connection_file = os.path.join(self._run_dir, "connection.json")
        try:
            self._files = self._stage_files(kw.get("cwd"))
            if os.geteuid() == 0 and bwrap():
                self._uid = 200_000 + secrets.randbelow(100_000)
            self.cgroup = self._make_cgroup()  # before the command is formatted: it joins the group
            if self.forking():
                self.handshake = forkserver.Handshake()
                self.kernel_id = self.kernel_id or kw.pop("kernel_id", None) or str(uuid.uuid4())
                self.provisioner = forkserver.ForkedKernelProvisioner(
                    kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self)
            return await super()._async_pre_start_kernel(**kw)
        except BaseException:
            self._remove_all()
            raise

    def forking(self) -> bool:
        """Whether this kernel is forked from the fork server: asked for, and grading as root
        with bubblewrap (a throwaway uid), where the sandbox can be entered."""
        return self.fork_kernels and self._uid is not None

    def _make_cgroup(self) -> Cgroup | None:
        """The kernel's cgroup, or None (after a loud warning) when none can be made.

        Raises:
            SandboxUnavailable: none can be made and ``require_cgroups`` is set.
        """
        if self.cgroups == "off":
            why = "cgroups are turned off (SandboxedKernelManager.cgroups = 'off')"
        elif os.geteuid() != 0:
            why = "the grader is not root, and only root may create cgroups"
        else:
            try:
                return Cgroup.create(self.memory_mb, self.cpus, self.processes,
                                     kind=self.cgroups, parent=self.cgroup_parent)
            except (CgroupUnavailable, OSError) as error:
                why = f"no cgroup could be made ({error})"
        if self.require_cgroups:
            raise SandboxUnavailable(f"{why}; unset require_cgroups to grade with per-process rlimits")
        _warn_no_cgroup(self.log, why)
        return None

    def _stage_files(self, cwd: str | None) -> str:
        """The submission's non-notebook files, copied for the kernel to read."""
        files = os.path.join(self._run_dir, "files")
        os.mkdir(files)
        if cwd and os.path.isdir(cwd):
            for entry in Path(cwd).iterdir():
                if entry.suffix == ".ipynb" or entry.name == "timestamp.txt" or entry.is_symlink():
                    continue
                target = os.path.join(files, entry.name)
                if entry.is_dir():
                    shutil.copytree(entry, target, symlinks=True)
                elif entry.is_file() and entry.stat().st_size <= self.file_size_mb * _MB:
                    shutil.copyfile(entry, target)
        return files

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        if self._uid is not None:  # the kernel reads the connection file and binds its sockets, nothing more
            os.chown(self.connection_file, 0, self._uid)
            os.chmod(self.connection_file, 0o440)
            os.chown(self._sockets, self._uid, self._uid)
        kw["env"] = _kernel_env()
        # the kernel process's own stdout/stderr (start-up notices, os.write(1, ...)
        # floods) never reach the instructor's terminal; cell output goes over ZeroMQ
        kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
        if self.handshake is not None:  # the holder's stdout says when the files are copied
            kw["stdout"] = self.handshake.ready_write
        try:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        except BaseException:  # nothing of a kernel that did not start is left behind
            self._remove_all()
            raise

    def format_kernel_cmd(self, extra_arguments=None):
        """The launch command: [cgroup join], bwrap, copy of the files, setpriv, prlimit, kernel
        (or, when forking, the holder; the kernel's own command is ``kernel_argv``)."""
        self.kernel_argv = [*super().format_kernel_cmd(extra_arguments),
                            "--IPKernelApp.ignore_cwd=True", f"--IPKernelApp.exec_lines={STARTUP}"]
        cmd = self._sandbox_cmd(HOLDER if self.forking() else self.kernel_argv)
        return self.cgroup.wrap(cmd) if self.cgroup else cmd

    def rlimits(self) -> dict[str, int]:
        """Each kernel process's rlimits (prlimit's names, upper case)."""
        return {"AS": self.memory_mb * _MB, "NPROC": self.processes, "CPU": self.cpu_seconds,
                "FSIZE": self.file_size_mb * _MB, "CORE": 0}

    def _sandbox_cmd(self, cmd: list[str]) -> list[str]:
        limits = ["prlimit", *(f"--{name.lower()}={value}" for name, value in self.rlimits().items()), "--"]
        path = bwrap()
        if not path:
            if self.require_sandbox:
                raise SandboxUnavailable("bubblewrap (bwrap) is not installed; install it "
                                         "(apt-get install bubblewrap) or unset require_sandbox")
            _warn_unsandboxed(self.log)
            return limits + cmd
        user = ([] if self._uid is None else
                ["setpriv", f"--reuid={self._uid}", f"--regid={self._uid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"])
        # when forking, the holder tells the provisioner on its stdout once the files are copied
        ready = "echo ready; exec >/dev/null; " if self.handshake else ""
        info = ["--info-fd", str(self.handshake.info_write)] if self.handshake else []
        copy = ["sh", "-c", f'cp -R {FILES}/. {WORK}/ 2>/dev/null; {_FONT_COPY}; {ready}exec "$@"', "sandbox"]
        return [path, *self._bwrap_args(), *info, "--", *copy, *user, *limits, *cmd]

    def _bwrap_args(self) -> list[str]:
        # ipykernel would take the sandbox's PID 1 for an orphaned parent and quit;
        # --die-with-parent does that job instead
        args = ["--die-with-parent", "--new-session", "--unsetenv", "JPY_PARENT_PID"]
        if self._uid is not None:  # root: no user namespace, so that setpriv's uid is a real one
            args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            args += ["--unshare-all", "--cap-drop", "ALL"]
        # scratch first: later mounts go on top, so a course or venv under /tmp stays visible
        args += [*_system_links(), "--dev", "/dev", "--proc", "/proc",
                 "--perms", "1777", "--size", str(self.scratch_mb * _MB), "--tmpfs", "/tmp",
                 "--perms", "1777", "--size", str(self.scratch_mb * _MB), "--tmpfs", "/home/student",
                 "--perms", "0777", "--dir", WORK, *_readable(self._sockets)]
        # only the connection file (read-only) and the socket folder of the run folder
        args += ["--ro-bind", self._files, FILES,
                 "--ro-bind-try", _font_cache(), FONTS,
                 "--ro-bind", self.connection_file, self.connection_file,
                 "--bind", self._sockets, self._sockets,
                 "--perms", "0555", "--dir", START,
                 "--chdir", START]
        return args

    # --- forking (grader/forkserver.py) ---------------------------------------------

    def fork_server(self) -> forkserver.ForkServer:
        """This process's fork server for these preloads (started on first use)."""
        key = (tuple(self.preload), self.scratch_mb, sys.executable, coursekit.__file__)
        return forkserver.server(key, lambda fd: zygote_command(fd, list(self.preload), self.scratch_mb),
                                 _kernel_env())

    def fork_request(self, server: forkserver.ForkServer) -> dict:
        """What the fork server needs besides the sandbox's descriptors (grader/zygote.py).
        The address-space limit is ``memory_mb`` beyond what the preloaded libraries map,
        which a forked kernel holds from its start whether its notebook imports them or not."""
        rlimits = self.rlimits()
        rlimits["AS"] += server.preloaded_bytes
        # PWD: what the shell before a kernel started anew exports
        return {"argv": self.kernel_argv, "env": {**_kernel_env(), "PWD": START}, "cwd": START, "uid": self._uid,
                "rlimits": rlimits, "readable": sorted(readable_roots())}

    def sandbox_fds(self, info: dict) -> dict[str, list[int]]:
        """Descriptors of the sandbox bubblewrap reported (``--info-fd``): its namespaces
        (each checked against the one bubblewrap made), its root, the cgroup's files."""
        pid, fds = info["child-pid"], {}
        try:
            for name, ns in (("ipc", "ipc"), ("uts", "uts"), ("net", "net"), ("cgroupns", "cgroup"),
                             ("pid", "pid"), ("mnt", "mnt")):
                if f"{ns}-namespace" not in info:  # not unshared (cgroup: only where supported)
                    continue
                fd = os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
                fds[name] = [fd]
                if os.fstat(fd).st_ino != info[f"{ns}-namespace"]:
                    raise SandboxUnavailable(f"the kernel's sandbox (PID {pid}) ended while it was entered")
            fds["root"] = [os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
            if self.cgroup is not None:
                fds["cgroup"] = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in self.cgroup.procs_files()]
        except BaseException:
            for numbers in fds.values():
                for fd in numbers:
                    os.close(fd)
            raise
        return fds

    # --- after start --------------------------------------------------------------

    def seal(self) -> list[str]:
        """Once the kernel's sockets exist, and before any cell runs, take away its write
        access to their folder (root only; without root its uid is ours).

        Returns what the folder held besides the kernel's sockets (names), removed: it
        should be empty, since nothing of the student's runs while the kernel starts.
        """
        if self._uid is None or not self._sockets:
            return []
        os.chown(self._sockets, 0, 0)
        os.chmod(self._sockets, 0o755)
        extra = []
        with os.scandir(self._sockets) as entries:
            for entry in entries:
                if not (entry.name.startswith("k-") and stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode)):
                    extra.append(entry.name)
        if extra:
            self.log.error("the kernel wrote %d unexpected entries in its socket folder while it "
                           "started; removed: %s", len(extra), ", ".join(map(repr, extra[:5])))
            for name in extra:
                remove_tree(os.path.join(self._sockets, name), self.log)
        return extra

    def kernel_pid(self) -> int | None:
        """The host PID of the kernel's Python process (below bwrap, setpriv and prlimit, or
        forked into the sandbox)."""
        if isinstance(self.provisioner, forkserver.ForkedKernelProvisioner):
            return self.provisioner.kernel_pid
        process = getattr(self.provisioner, "process", None)
        todo = [process.pid] if process else []
        while todo:
            pid = todo.pop(0)
            try:
                if os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(sys.executable):
                    return pid
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    todo += [int(child) for child in f.read().split()]
            except OSError:
                continue
        return None

    def cpu_time(self) -> float | None:
        """CPU seconds used by all the kernel's processes together (its cgroup's count;
        without one, the kernel's process tree's, children reaped or alive), or None
        once the kernel is gone."""
        process = getattr(self.provisioner, "process", None)
        if process is None or process.poll() is not None:
            return None
        if self.cgroup is not None:
            return self.cgroup.cpu_seconds()
        return _tree_cpu(self.kernel_pid() if self.forking() else process.pid)

    def busy(self) -> bool | None:
        """Whether any thread of the kernel's processes is running or waiting for a CPU (or
        in an uninterruptible wait): False while all of them sleep or wait for something
        else (``time.sleep``, a lock, a message), None once the kernel is gone."""
        process = getattr(self.provisioner, "process", None)
        if process is None or process.poll() is not None:
            return None
        if self.cgroup is not None:
            return cgroup_busy(self.cgroup.threads())
        return cgroup_busy(_tree_threads(self.kernel_pid() if self.forking() else process.pid))

    def client(self, **kwargs):
        # a context whose sockets drop any message above the cap (output floods)
        context = zmq.asyncio.Context()
        context.setsockopt(zmq.MAXMSGSIZE, self.max_message_mb * _MB)
        kwargs.setdefault("context", context)
        return super().client(**kwargs)

    async def _async_interrupt_kernel(self):
        # Signals cannot cross into the sandbox's PID namespace: ask the kernel to
        # interrupt itself (ipykernel's interrupt_request, as for interrupt_mode "message").
        if self.has_kernel:
            self._connect_control_socket()
            self.session.send(self._control_socket, self.session.msg("interrupt_request", content={}))

    interrupt_kernel = _async_interrupt_kernel

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            self._remove_all()

    # AsyncKernelManager binds this name to jupyter_client's own coroutine; nbclient calls
    # it, and only it, for a kernel that died by itself (os._exit, out of memory)
    cleanup_resources = _async_cleanup_resources

    def _remove_all(self) -> None:
        """Kill every process of the kernel's cgroup, remove the cgroup and the run folder;
        what cannot be removed is logged as an error and printed, never ignored."""
        global _kernels_cpu
        problems = []
        if self.cgroup is not None:
            alive = self.cgroup.kill()
            _kernels_cpu += self.cgroup.cpu_seconds() or 0.0
            if alive:
                problems.append(f"{len(alive)} processes of the kernel survived SIGKILL: {sorted(alive)[:10]}")
            problems += [f"cgroup {p}" for p in self.cgroup.remove()]
            self.cgroup = None
        if self._run_dir:
            problems += remove_tree(self._run_dir, self.log)
            self._run_dir = None
        if self.handshake is not None:
            self.handshake.close()
            self.handshake = None
        for problem in problems:
            message = f"sandbox clean-up: {problem}"
            self.log.error(message)
            print(f"ERROR: {message}", file=sys.stderr)


def kernels_cpu_seconds() -> float:
    """CPU seconds that every kernel this process ran and removed used, each counted by its
    cgroup (0 without cgroups): what a unit's kernel cost, beside the grader's own CPU."""
    return _kernels_cpu


def remove_tree(path: str, log: logging.Logger | None = None) -> list[str]:
    """Remove ``path`` and all under it, however deep and whatever its modes.

    GNU ``rm -rf --one-file-system`` walks the tree with file descriptors (no depth
    limit, no path-length limit; Python 3.11's rmtree recurses and, with
    ignore_errors, gives up silently), and never crosses into a mount. When it fails
    (folders made unreadable by a kernel running under our own uid), modes are reset
    with ``chmod -R`` and it tries again.

    Returns one line per problem (empty when ``path`` is gone).
    """
    if not os.path.lexists(path):
        return []
    for attempt in range(2):
        done = subprocess.run(["rm", "-rf", "--one-file-system", "--", path],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if not os.path.lexists(path):
            return []
        if attempt == 0:
            subprocess.run(["chmod", "-R", "u+rwx", "--", path], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    left = sum(1 for _ in _walk(path))
    errors = done.stderr.strip().splitlines()
    return [f"could not remove {path}: {left} entries left ({errors[0] if errors else 'rm failed'})"]


def _walk(path: str):
    for root, dirs, files in os.walk(path):
        yield from dirs + files


def _tree_threads(pid: int | None) -> set[int]:
    """The thread ids of ``pid`` and of its living descendants."""
    out, todo = set(), [pid] if pid else []
    while todo:
        p = todo.pop()
        try:
            tasks = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        out.update(tasks)
        for task in tasks:
            try:
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(child) for child in f.read().split() if int(child) not in out]
            except OSError:
                continue
    return out


def _tree_cpu(pid: int) -> float | None:
    """CPU seconds of ``pid`` and its living descendants, with their reaped children's."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(child) for child in f.read().split()]
        except (OSError, ValueError, IndexError):
            if p == pid:
                return None
    return total / os.sysconf("SC_CLK_TCK")


def bwrap() -> str | None:
    """The path of bubblewrap, or None when this machine lacks it."""
    return shutil.which("bwrap")


def _system_links() -> list[str]:
    """bwrap arguments: /bin, /lib... as the host has them (links into /usr, or folders)."""
    args = []
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    return args


def readable_roots() -> set[str]:
    """The folders every sandbox mounts read-only: /usr, /etc, Python, the venv, coursekit,
    and the course's assets/ that coursekit/assets links to in the repository (in a wheel
    it is a folder inside coursekit)."""
    package = Path(coursekit.__file__).parent
    return {"/usr", "/etc", sys.base_prefix, sys.prefix, str(package), str((package / "assets").resolve())}


def _readable(*more: str) -> list[str]:
    """bwrap arguments: the read-only view every sandbox has (``readable_roots``), and the
    folders above them and above ``more``, passable by any uid."""
    readable = readable_roots()
    # bwrap makes missing parent folders 0700: the kernel's uid could not pass through
    parents = {str(p) for path in readable | set(more) for p in Path(path).parents}
    args = []
    for folder in sorted(parents - {"/", "/tmp", "/home/student"}, key=len):
        args += ["--perms", "0755", "--dir", folder]
    for path in sorted(readable, key=len):
        args += ["--ro-bind", path, path]
    return args


def zygote_command(fd: int, preload: list[str], scratch_mb: int) -> list[str]:
    """The fork server's command (``grader/zygote.py`` on socket ``fd``): a sandbox with the
    kernels' read-only view, its own /tmp, no network, in this PID namespace (it enters
    the kernels' child namespaces), as root with ``ZYGOTE_CAPS`` only."""
    caps = [arg for cap in ZYGOTE_CAPS for arg in ("--cap-add", cap)]
    return [bwrap(), "--die-with-parent", "--new-session", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--cap-drop", "ALL", *caps, *_system_links(), "--dev", "/dev", "--proc", "/proc",
            "--perms", "1777", "--size", str(scratch_mb * _MB), "--tmpfs", "/tmp", *_readable(),
            "--ro-bind-try", _font_cache(), FONTS,
            "--perms", "0755", "--dir", os.path.dirname(ZYGOTE),
            "--ro-bind", str(Path(__file__).with_name("zygote.py")), ZYGOTE,
            "--perms", "0555", "--dir", START, "--chdir", START, "--",
            "sh", "-c", f'{_FONT_COPY}; exec "$@"', "zygote", sys.executable, ZYGOTE, str(fd), json.dumps(preload)]


@functools.lru_cache(maxsize=1)
def _font_cache() -> str:
    """matplotlib's font list, built once by the grader, so that no kernel rebuilds it."""
    import matplotlib
    from matplotlib import font_manager  # noqa: F401 - builds the cache if it is missing

    return matplotlib.get_cachedir()


def _kernel_env() -> dict[str, str]:
    """The kernel's whole environment: nothing of the grader's leaks in, except nbgrader's
    NBGRADER_EXECUTION (set while it autogrades), by which a training notebook trains briefly."""
    return {
        "NBGRADER_EXECUTION": os.environ.get("NBGRADER_EXECUTION", "autograde"),
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/home/student",
        "TMPDIR": "/tmp",
        "MPLCONFIGDIR": "/tmp/matplotlib",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
        # no script folder or working folder at the head of sys.path, in the kernel and
        # in any Python it starts: a submitted file shadows nothing (see the module doc)
        "PYTHONSAFEPATH": "1",
        # the coursekit the sandbox mounts, whatever an editable install's finder says
        "PYTHONPATH": str(Path(coursekit.__file__).parent.parent),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        # the course's arithmetic (coursekit.ARITHMETIC), the same in a kernel forked from the
        # fork server, which imported coursekit, and in one started anew
        **coursekit.ARITHMETIC,
    }


def _warn_unsandboxed(log: logging.Logger) -> None:
    global _warned
    if not _warned:
        _warned = True
        message = ("bubblewrap (bwrap) is not installed: student code runs WITHOUT a sandbox "
                   "(rlimits only). It can read the course folder and the gradebook and use the "
                   "network. Install it: apt-get install bubblewrap")
        log.warning(message)
        print(f"WARNING: {message}", file=sys.stderr)


def _warn_no_cgroup(log: logging.Logger, why: str) -> None:
    global _warned_cgroup
    if not _warned_cgroup:
        _warned_cgroup = True
        message = (f"{why}: the kernel's memory, process and CPU limits hold PER PROCESS "
                   "(rlimits), not for all its processes together. One submission's processes "
                   "can take the CPU of a classmate graded beside it, and its children may each "
                   "use the memory limit. Grade as root on a machine with cgroups (v2, or v1 "
                   "memory, cpu and pids controllers).")
        log.warning(message)
        print(f"WARNING: {message}", file=sys.stderr)
