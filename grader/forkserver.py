"""Kernels forked from a process that imported their libraries once: one fork server per worker.

Starting a kernel costs the grader about a second of CPU for ipykernel and 2-3 s for
numpy, torch and matplotlib, more than most notebooks compute. ``ForkServer`` starts
``grader/zygote.py`` once per grading process, in a bubblewrap sandbox of its own (the
kernels' read-only view of the system, nothing of the course), where it imports those
libraries (``SandboxedKernelManager.preload``) and then waits. For each kernel:

1. ``SandboxedKernelManager`` builds the kernel's sandbox exactly as without a fork
   server: its cgroup, bubblewrap with the same namespaces, mounts and scratch, the copy
   of the submission's files. The process left in it (the *holder*: ``sleep`` under
   setpriv and prlimit, as the kernel's throwaway uid) keeps the sandbox alive.
2. ``ForkedKernelProvisioner`` (jupyter_client's provisioner interface) waits until the
   copy is done, opens the sandbox's namespaces, root folder and cgroup files, and
   hands them to the fork server.
3. The fork server forks; the child enters the kernel's cgroup, namespaces and root,
   sets the rlimits, drops every privilege, becomes the throwaway uid and only then
   creates the kernel (``grader/zygote.py``). So every submission gets a kernel process
   that no other submission has touched, in its own sandbox; what it shares with its
   siblings is the fork server's memory image (copy-on-write: a change is its own),
   which never held student code or anything of the course.

The provisioner follows that kernel process (a pidfd) for liveness, signals and kills;
ending the holder ends the sandbox's PID namespace, and with it every process in it.
"""
from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable

from jupyter_client.provisioning import LocalProvisioner

MAX_MESSAGE = 1 << 20
# the fork server's imports (3 CPU-s) on a loaded machine; a unit's own deadline bounds it too
STARTUP_SECONDS = 300
SANDBOX_SECONDS = 120  # bubblewrap's start and the copy of the files, or one fork
log = logging.getLogger(__name__)


class ForkServerUnavailable(RuntimeError):
    """The fork server could not be started or did not answer; the message says why."""


class ForkServer:
    """One ``grader/zygote.py`` process and its socket. ``spawn`` is thread-safe."""

    def __init__(self, command: Callable[[int], list[str]], env: dict[str, str]):
        """``command(fd)``: the command that runs the zygote with its socket on ``fd``."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(command(theirs.fileno()), pass_fds=[theirs.fileno()], env=env,
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        self.channel = ours
        self._lock = threading.Lock()
        self.spawn_cpu = 0.0
        hello = self._receive(STARTUP_SECONDS, "start")
        self.pid, self.preload_cpu, self.failed = hello["pid"], hello["cpu"], hello["failed"]
        self.preloaded_bytes = hello["preloaded_bytes"]  # every forked kernel maps these from the start
        for module, error in self.failed.items():
            log.warning("the fork server could not preload %s (%s); kernels import it themselves", module, error)

    def _receive(self, seconds: float, what: str) -> dict:
        ready, _, _ = select.select([self.channel], [], [], seconds)
        message = self.channel.recv(MAX_MESSAGE) if ready else b""
        if not message:
            self.close()
            raise ForkServerUnavailable(f"the fork server did not {what} "
                                        f"({'it ended' if ready else f'no answer in {seconds:g} s'})")
        return json.loads(message)

    def alive(self) -> bool:
        return self.process.poll() is None

    def spawn(self, request: dict, fds: dict[str, list[int]]) -> tuple[int, float]:
        """Fork a kernel into a sandbox; return its PID (this PID namespace's) and the CPU
        seconds the forking took.

        Raises:
            ForkServerUnavailable: the fork server ended or refused; the message says why.
        """
        names = [name for name, numbers in fds.items() for _ in numbers]
        numbers = [fd for numbers in fds.values() for fd in numbers]
        with self._lock:
            try:
                socket.send_fds(self.channel, [json.dumps({**request, "fds": names}).encode()], numbers)
            except OSError as error:
                self.close()
                raise ForkServerUnavailable(f"the fork server is gone ({error.strerror})") from None
            answer = self._receive(SANDBOX_SECONDS, "fork a kernel")
        if "error" in answer:
            raise ForkServerUnavailable(f"the fork server could not start the kernel: {answer['error']}")
        self.spawn_cpu += answer["cpu"]
        return answer["pid"], answer["cpu"]

    def cpu_seconds(self) -> float:
        """CPU seconds of this fork server: its imports, and forking each kernel."""
        return self.preload_cpu + self.spawn_cpu

    def close(self) -> None:
        """Close the socket: the fork server reaps what it forked and ends (else it is killed)."""
        self.channel.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_servers: dict[tuple, ForkServer] = {}
_servers_lock = threading.Lock()


def server(key: tuple, command: Callable[[int], list[str]], env: dict[str, str]) -> ForkServer:
    """This process's fork server for ``key`` (the preload list and the sandbox's view),
    started on first use and again when it has ended."""
    with _servers_lock:
        found = _servers.get(key)
        if found is None or not found.alive():
            if found is not None:
                log.warning("the fork server ended; starting a new one")
                found.close()
            _servers[key] = found = ForkServer(command, env)
        return found


def cpu_seconds() -> float:
    """CPU seconds of this process's fork servers so far (imports and forks)."""
    return sum(s.cpu_seconds() for s in list(_servers.values()))


def shutdown() -> None:
    """Stop this process's fork servers (they also die with it, unreaped)."""
    with _servers_lock:
        for found in _servers.values():
            found.close()
        _servers.clear()


atexit.register(shutdown)


def _read_json(fd: int, deadline: float) -> dict:
    """bubblewrap's --info-fd JSON, read until it parses."""
    text = b""
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            raise ForkServerUnavailable("the kernel's sandbox did not start (bubblewrap ended or hung)")
        text += chunk
        try:
            return json.loads(text)
        except ValueError:
            continue


def _wait_ready(fd: int, deadline: float) -> None:
    ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    if not ready or not os.read(fd, 64):
        raise ForkServerUnavailable("the kernel's sandbox ended before the submission's files were copied")


class Handshake:
    """The two pipes between a kernel's sandbox and its provisioner: bubblewrap's
    --info-fd (the sandbox's first process) and the holder's stdout, on which it says
    "ready" once the files are copied (fd numbers above 9 are not shell syntax). Each end
    is closed once (a number closed twice could be another file's by then)."""

    def __init__(self):
        self.info_read, self.info_write = os.pipe()
        self.ready_read, self.ready_write = os.pipe()
        self._open = {self.info_read, self.info_write, self.ready_read, self.ready_write}

    def inherited(self) -> list[int]:
        """The sandbox's ends: the info pipe (passed as is) and the holder's stdout."""
        return [self.info_write, self.ready_write]

    def close_inherited(self) -> None:
        for fd in self.inherited():
            self._close(fd)

    def close(self) -> None:
        for fd in list(self._open):
            self._close(fd)

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            _close(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class ForkedKernelProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, for a kernel forked into its sandbox.

    ``process`` stays the sandbox's bubblewrap (the holder); the kernel is the forked
    process, followed through a pidfd. The kernel manager (``parent``) provides
    ``handshake``, ``fork_request(server)`` (the request without file descriptors),
    ``sandbox_fds(info)`` (name -> descriptors to hand over) and ``fork_server()``.
    """

    kernel_pid: int | None = None
    _pidfd: int | None = None
    fork_cpu = 0.0

    async def launch_kernel(self, cmd: list[str], **kwargs) -> dict:
        km = self.parent
        handshake = km.handshake
        deadline = time.monotonic() + SANDBOX_SECONDS
        try:
            kwargs["pass_fds"] = [handshake.info_write]
            info = await super().launch_kernel(cmd, **kwargs)
            handshake.close_inherited()
            sandbox = _read_json(handshake.info_read, deadline)
            _wait_ready(handshake.ready_read, deadline)
            fds = km.sandbox_fds(sandbox)
            try:
                server = km.fork_server()
                self.kernel_pid, self.fork_cpu = server.spawn(km.fork_request(server), fds)
            finally:
                for numbers in fds.values():
                    for fd in numbers:
                        _close(fd)
            self._pidfd = os.pidfd_open(self.kernel_pid)
        except BaseException:
            if self.process is not None:
                self._kill_holder()
                self.process.wait()
                self.process = None
            raise
        finally:
            handshake.close()
        return info

    def _kernel_ended(self) -> bool:
        if self._pidfd is None:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], 0)
        return bool(ready)

    async def poll(self) -> int | None:
        code = await super().poll()
        if code is not None:
            return code
        return 1 if self._kernel_ended() else None  # its parent, the fork server's child, has its status

    def _kill_holder(self) -> None:
        """SIGKILL the sandbox's bubblewrap: its PID namespace ends, with every process in it."""
        try:
            if self.pgid:
                os.killpg(self.pgid, signal.SIGKILL)
            else:
                self.process.kill()
        except OSError:
            pass

    async def wait(self) -> int | None:
        while await self.poll() is None:
            await asyncio.sleep(0.1)
        if self.process is not None:  # the kernel has ended: end its sandbox too
            self._kill_holder()
        return await super().wait()

    async def send_signal(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            await self.kill()
        elif self._pidfd is not None and not self._kernel_ended():
            signal.pidfd_send_signal(self._pidfd, signum)

    async def kill(self, restart: bool = False) -> None:
        if self._pidfd is not None and not self._kernel_ended():
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process is not None:
            self._kill_holder()

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        if self._pidfd is not None:
            _close(self._pidfd)
            self._pidfd = None
        await super().cleanup(restart)

