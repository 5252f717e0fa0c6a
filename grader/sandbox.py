"""The jail a student's kernel runs in while it is graded: bubblewrap, rlimits, IPC sockets.

``SandboxedKernelManager`` is the kernel manager of ``grader.execute.BudgetedExecute``.
It starts the kernel through Debian's ``bwrap`` with:

- no network (a new, empty network namespace) and its own PID, IPC and UTS namespaces,
  so it can neither reach a server nor see or signal the grader's processes;
- a whitelisted, read-only view of the system: /usr, /etc, the Python installation,
  the virtual environment, the ``coursekit`` package and ``assets/``. The course folder
  (solutions, the ``grader`` package with its references, the secret), the gradebook,
  the workspace and other students' files are simply not there;
- size-limited tmpfs scratch at ``/home/student/work`` (the working directory, holding
  a copy of the submission's non-notebook files) and ``/tmp``;
- rlimits (``prlimit``): address space, processes, CPU seconds, file size, no core
  dumps; run as a throwaway unprivileged uid when the grader is root, so that the
  process limit holds;
- ZeroMQ over Unix sockets (IPC transport) in a private directory, the only path
  between kernel and grader; the grader makes it read-only once the kernel is up
  (when grading as root), and caps the size of every message it accepts.

Without bwrap the kernel runs with rlimits only, after a loud warning, unless
``require_sandbox`` is set, in which case grading refuses to start a kernel.
"""
from __future__ import annotations

import functools
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Integer

import coursekit

from .course import ASSETS

WORK = "/home/student/work"
FILES = "/home/student/submission"
FONTS = "/home/student/.font-cache"
_MB = 1024 * 1024
_warned = False


class SandboxUnavailable(RuntimeError):
    """bwrap is missing and ``require_sandbox`` is set."""


class SandboxedKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose kernels start inside a bubblewrap sandbox."""

    memory_mb = Integer(4096, help="Address-space limit of the kernel (RLIMIT_AS), MiB.").tag(config=True)
    processes = Integer(256, help="Processes and threads the kernel's uid may have (RLIMIT_NPROC).").tag(config=True)
    cpu_seconds = Integer(180, help="CPU seconds for the whole kernel (RLIMIT_CPU), all threads.").tag(config=True)
    file_size_mb = Integer(128, help="Largest file the kernel may write (RLIMIT_FSIZE), MiB.").tag(config=True)
    scratch_mb = Integer(256, help="Size of each writable tmpfs (working directory, /tmp), MiB.").tag(config=True)
    max_message_mb = Integer(16, help="Largest message accepted from the kernel, MiB; larger "
                                      "ones are dropped by ZeroMQ before they reach memory.").tag(config=True)
    require_sandbox = Bool(False, help="Refuse to grade when bwrap is not installed.").tag(config=True)

    _run_dir: str | None = None
    _uid: int | None = None
    _files: str | None = None

    # --- set-up -----------------------------------------------------------------

    async def _async_pre_start_kernel(self, **kw):
        self._run_dir = tempfile.mkdtemp(prefix="kernel-")
        self.transport = "ipc"
        self.ip = os.path.join(self._run_dir, "k")
        self.connection_file = os.path.join(self._run_dir, "connection.json")
        self._files = self._stage_files(kw.get("cwd"))
        if os.geteuid() == 0 and bwrap():
            self._uid = 200_000 + secrets.randbelow(100_000)
        try:
            return await super()._async_pre_start_kernel(**kw)
        except BaseException:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            raise

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
        if self._uid is not None:  # the kernel's uid must read the connection file and bind its sockets
            os.chown(self._run_dir, self._uid, self._uid)
            os.chown(self.connection_file, self._uid, self._uid)
        kw["env"] = _kernel_env()
        # the kernel process's own stdout/stderr (start-up notices, os.write(1, ...)
        # floods) never reach the instructor's terminal; cell output goes over ZeroMQ
        kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
        return await super()._async_launch_kernel(kernel_cmd, **kw)

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        limits = ["prlimit", f"--as={self.memory_mb * _MB}", f"--nproc={self.processes}",
                  f"--cpu={self.cpu_seconds}", f"--fsize={self.file_size_mb * _MB}", "--core=0", "--"]
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
        copy = ["sh", "-c", f'cp -R {FILES}/. {WORK}/ 2>/dev/null; mkdir -m 1777 /tmp/matplotlib; '
                f'cp {FONTS}/fontlist-*.json /tmp/matplotlib/ 2>/dev/null; exec "$@"', "sandbox"]
        return [path, *self._bwrap_args(), "--", *copy, *user, *limits, *cmd]

    def _bwrap_args(self) -> list[str]:
        # ipykernel would take the sandbox's PID 1 for an orphaned parent and quit;
        # --die-with-parent does that job instead
        args = ["--die-with-parent", "--new-session", "--unsetenv", "JPY_PARENT_PID"]
        if self._uid is not None:  # root: no user namespace, so that setpriv's uid is a real one
            args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            args += ["--unshare-all", "--cap-drop", "ALL"]
        for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(name):
                args += ["--symlink", os.readlink(name), name]
            elif os.path.isdir(name):
                args += ["--ro-bind", name, name]
        # scratch first: later mounts go on top, so a course or venv under /tmp stays visible
        args += ["--dev", "/dev", "--proc", "/proc",
                 "--perms", "1777", "--size", str(self.scratch_mb * _MB), "--tmpfs", "/tmp",
                 "--perms", "1777", "--size", str(self.scratch_mb * _MB), "--tmpfs", "/home/student",
                 "--perms", "0777", "--dir", WORK]
        readable = {"/usr", "/etc", sys.base_prefix, sys.prefix, str(Path(coursekit.__file__).parent),
                    str(ASSETS)}
        # bwrap makes missing parent folders 0700: the kernel's uid could not pass through
        parents = {str(p) for path in readable | {self._run_dir} for p in Path(path).parents}
        for folder in sorted(parents - {"/", "/tmp", "/home/student"}, key=len):
            args += ["--perms", "0755", "--dir", folder]
        for path in sorted(readable, key=len):
            args += ["--ro-bind", path, path]
        args += ["--ro-bind", self._files, FILES,
                 "--ro-bind-try", _font_cache(), FONTS,
                 "--bind", self._run_dir, self._run_dir,
                 "--chdir", WORK]
        return args

    # --- after start --------------------------------------------------------------

    def seal(self) -> None:
        """Once the kernel's sockets exist, take away its write access to their folder."""
        if self._uid is not None and self._run_dir:
            os.chown(self._run_dir, 0, 0)
            os.chmod(self._run_dir, 0o755)

    def kernel_pid(self) -> int | None:
        """The host PID of the kernel's Python process (below bwrap, setpriv and prlimit)."""
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
        """CPU seconds (all threads) the kernel's process has used, or None if it is gone."""
        pid = self.kernel_pid()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, TypeError, ValueError, IndexError):
            return None

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
        if self._run_dir and not restart:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None


def bwrap() -> str | None:
    """The path of bubblewrap, or None when this machine lacks it."""
    return shutil.which("bwrap")


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
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
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
