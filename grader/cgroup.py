"""One cgroup for one sandbox: CPU, memory and process limits for all of a kernel's processes.

rlimits hold per process: five children of one kernel may each take the memory limit,
and background processes take CPU from a classmate graded beside it. A cgroup bounds
the kernel and everything it starts, together:

- memory: all processes' resident memory (and swap) together, in MiB;
- CPU: a quota in cores (``cpus=1.0``: one core's worth of time per period, however
  many processes spin), and the CPU seconds all of them used, for the cell watchdog;
- processes: at most ``pids`` processes and threads together;
- kill: every process in the group, in one step, when the kernel is shut down.

Two kinds, chosen at run time by ``Cgroup.create``:

- cgroup v2 (the unified hierarchy with the cpu, memory and pids controllers, as on
  current distributions): ``memory.max``, ``memory.swap.max``, ``pids.max``,
  ``cpu.max``, ``cpu.stat``, ``cgroup.kill`` (or ``cgroup.freeze`` before Linux 5.14);
- cgroup v1 (one hierarchy per controller, as in many containers): memory
  (``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes`` when swap accounting is
  on), cpu (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), cpuacct (``cpuacct.usage``),
  pids (``pids.max``) and freezer (``freezer.state``, so that a fork loop cannot outrun
  the kill).

Each sandbox's cgroup is ``<base>/attention-grader/kernel-<pid>-<random>``. For v1 the
base is the grader's own cgroup in each hierarchy, so the sandboxes stay inside
whatever limits the grader itself runs under. For v2 it is ``parent`` when given (a
delegated cgroup, e.g. a systemd unit with ``Delegate=yes``), else the grader's own
cgroup or the hierarchy's root, whichever lets the controllers be enabled for children
(a v2 cgroup holding processes cannot). Creating cgroups needs root.

A process joins the group before it runs anything: ``wrap(cmd)`` prefixes the launch
command with a shell that writes its own PID into the group and then execs ``cmd``,
so the kernel and all it starts are born inside.
"""
from __future__ import annotations

import errno
import os
import secrets
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

_MB = 1024 * 1024
PERIOD_US = 100_000  # CFS period: the quota is granted per 100 ms
V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "freezer")
V1_REQUIRED = ("memory", "cpu", "pids")
V2_CONTROLLERS = ("cpu", "memory", "pids")
GROUP = "attention-grader"


class CgroupUnavailable(RuntimeError):
    """No usable cgroup hierarchy (not root, controllers missing or not delegated); the
    message says why, in one line."""


@dataclass
class Mount:
    point: Path
    root: str
    fstype: str
    options: set[str]


def mounts(mountinfo: str) -> list[Mount]:
    """The cgroup mounts listed in a ``/proc/self/mountinfo`` text."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append(Mount(Path(fields[4]), fields[3], tail[0], set(tail[2].split(","))))
    return out


def memberships(proc_cgroup: str) -> dict[str, str]:
    """Controller -> cgroup path of a ``/proc/<pid>/cgroup`` text; "" is the v2 hierarchy."""
    out = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                out[name] = parts[2]
    return out


def _inside(mount: Mount, path: str) -> Path:
    """The folder of cgroup ``path`` (as /proc/self/cgroup shows it) under ``mount``."""
    root = mount.root.rstrip("/")
    rel = path[len(root):] if root and (path == root or path.startswith(root + "/")) else path
    return mount.point / rel.lstrip("/")


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as error:
        raise CgroupUnavailable(f"cannot write {value.strip()!r} to {path} ({error.strerror})") from None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


@dataclass
class Cgroup:
    """The cgroup(s) of one sandbox. ``kind`` is "v2" or "v1"; ``dirs`` maps each
    controller to its folder (v2: one folder under the key "")."""

    kind: str
    dirs: dict[str, Path]
    made: list[Path] = field(default_factory=list)

    # --- creation -------------------------------------------------------------------

    @classmethod
    def create(cls, memory_mb: int, cpus: float, pids: int, kind: str = "auto", parent: str = "",
               mountinfo: str | None = None, proc_cgroup: str | None = None) -> Cgroup:
        """A new cgroup with these limits for all of its processes together.

        Args:
            memory_mb: memory (resident and swap) of all processes together, MiB.
            cpus: CPU quota in cores (1.0: one core); 0 or less for no quota.
            pids: processes and threads together.
            kind: "auto" (v2 if usable, else v1), "v2" or "v1".
            parent: v2 only: the cgroup folder to create under (delegated to us).
            mountinfo, proc_cgroup: the texts of /proc/self/mountinfo and
                /proc/self/cgroup (read when None; given by tests with a fake tree).

        Raises:
            CgroupUnavailable: neither kind can be used here; the message says why.
        """
        if mountinfo is None:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        if proc_cgroup is None:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        found, own = mounts(mountinfo), memberships(proc_cgroup)
        name = f"kernel-{os.getpid()}-{secrets.token_hex(4)}"
        reasons = []
        for attempt in (("v2", "v1") if kind == "auto" else (kind,)):
            try:
                make = cls._create_v2 if attempt == "v2" else cls._create_v1
                group = make(found, own, name, parent)
            except CgroupUnavailable as error:
                reasons.append(f"{attempt}: {error}")
                continue
            try:
                group._limit(memory_mb, cpus, pids)
            except CgroupUnavailable as error:
                group.remove()
                reasons.append(f"{attempt}: {error}")
                continue
            return group
        raise CgroupUnavailable("; ".join(reasons))

    @classmethod
    def _create_v2(cls, found: list[Mount], own: dict[str, str], name: str, parent: str) -> Cgroup:
        mount = next((m for m in found if m.fstype == "cgroup2"), None)
        if mount is None:
            raise CgroupUnavailable("no cgroup2 hierarchy is mounted")
        available = set((_read(mount.point / "cgroup.controllers") or "").split())
        if not set(V2_CONTROLLERS) <= available:
            raise CgroupUnavailable(f"the cgroup2 hierarchy at {mount.point} lacks controllers "
                                    f"{sorted(set(V2_CONTROLLERS) - available)}")
        bases = [Path(parent)] if parent else [_inside(mount, own.get("", "/")), mount.point]
        errors = []
        for base in dict.fromkeys(bases):
            try:
                _enable(base)  # fails (EBUSY) on a non-root cgroup that holds processes
                group = base / GROUP
                group.mkdir(exist_ok=True)
                _enable(group)
                return cls._mkdir("v2", {"": group / name})
            except (CgroupUnavailable, OSError) as error:
                errors.append(str(error))
        raise CgroupUnavailable("; ".join(errors))

    @classmethod
    def _create_v1(cls, found: list[Mount], own: dict[str, str], name: str, parent: str) -> Cgroup:
        dirs = {}
        for controller in V1_CONTROLLERS:
            mount = next((m for m in found if m.fstype == "cgroup" and controller in m.options), None)
            if mount is None:
                if controller in V1_REQUIRED:
                    raise CgroupUnavailable(f"no cgroup v1 '{controller}' hierarchy is mounted")
                continue
            dirs[controller] = _inside(mount, own.get(controller, "/")) / GROUP / name
        return cls._mkdir("v1", dirs)

    @classmethod
    def _mkdir(cls, kind: str, dirs: dict[str, Path]) -> Cgroup:
        group = cls(kind, dirs)
        try:
            for folder in dict.fromkeys(dirs.values()):  # cpu and cpuacct may share a hierarchy
                folder.parent.mkdir(exist_ok=True)
                _remove_stale(folder.parent)
                folder.mkdir()
                group.made.append(folder)
        except OSError as error:
            group.remove()
            raise CgroupUnavailable(f"cannot create {folder} ({error.strerror})") from None
        return group

    def _limit(self, memory_mb: int, cpus: float, pids: int) -> None:
        quota = int(cpus * PERIOD_US) if cpus > 0 else None
        memory = str(memory_mb * _MB)
        if self.kind == "v2":
            d = self.dirs[""]
            _write(d / "memory.max", memory)
            if (d / "memory.swap.max").exists():  # absent when the kernel has no swap accounting
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(pids))
            _write(d / "cpu.max", f"{quota if quota else 'max'} {PERIOD_US}")
            return
        _write(self.dirs["memory"] / "memory.limit_in_bytes", memory)
        memsw = self.dirs["memory"] / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # swap accounting on: memory + swap, so that nothing is swapped out past it
            _write(memsw, memory)
        _write(self.dirs["pids"] / "pids.max", str(pids))
        _write(self.dirs["cpu"] / "cpu.cfs_period_us", str(PERIOD_US))
        _write(self.dirs["cpu"] / "cpu.cfs_quota_us", str(quota if quota else -1))

    # --- use ------------------------------------------------------------------------

    def procs_files(self) -> list[Path]:
        """The cgroup.procs file of each folder: writing a PID there moves that process."""
        return [d / "cgroup.procs" for d in dict.fromkeys(self.dirs.values())]

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` run by a shell that first joins this group: the command's first
        instruction already runs inside, and so does every process it starts. The
        shell exits with status 125, running nothing, if it cannot join."""
        join = " && ".join(f"echo $$ > {shlex.quote(str(p))}" for p in self.procs_files())
        return ["/bin/sh", "-c", f'{join} || exit 125; exec "$@"', "cgroup-join", *cmd]

    def pids(self) -> set[int]:
        """The PIDs (host namespace) of every process in the group."""
        out = set()
        for path in self.procs_files():
            out.update(int(p) for p in (_read(path) or "").split())
        return out

    def threads(self) -> set[int]:
        """The thread ids (host namespace) of every thread of every process in the group."""
        path = self.dirs[""] / "cgroup.threads" if self.kind == "v2" else next(iter(self.dirs.values())) / "tasks"
        return {int(t) for t in (_read(path) or "").split()}

    def cpu_seconds(self) -> float | None:
        """CPU seconds used by all processes of the group since it was made, or None."""
        if self.kind == "v2":
            for line in (_read(self.dirs[""] / "cpu.stat") or "").splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        text = _read(self.dirs["cpuacct"] / "cpuacct.usage") if "cpuacct" in self.dirs else None
        return int(text) / 1e9 if text and text.strip().isdigit() else None

    def memory_peak_mb(self) -> float | None:
        """The most memory the group held at once, MiB (None if the kernel does not say)."""
        path = (self.dirs[""] / "memory.peak" if self.kind == "v2"
                else self.dirs["memory"] / "memory.max_usage_in_bytes")
        text = _read(path)
        return int(text) / _MB if text and text.strip().isdigit() else None

    # --- end ------------------------------------------------------------------------

    def kill(self, timeout: float = 10.0) -> set[int]:
        """SIGKILL every process of the group, frozen first so that none can fork away.

        Returns the PIDs still in the group after ``timeout`` seconds (empty when all
        are gone).
        """
        deadline = time.monotonic() + timeout
        if self.kind == "v2" and (self.dirs[""] / "cgroup.kill").exists():
            _try_write(self.dirs[""] / "cgroup.kill", "1")  # the kernel kills all, atomically
        else:
            freeze = self._freezer()
            while True:
                if freeze:
                    freeze(True)
                for pid in self.pids():
                    try:
                        os.kill(pid, signal.SIGKILL)  # frozen processes die once thawed
                    except OSError:
                        pass
                if freeze:
                    freeze(False)
                if not self.pids() or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.pids()

    def _freezer(self):
        if self.kind == "v2":
            path, states = self.dirs[""] / "cgroup.freeze", ("1", "0")
        elif "freezer" in self.dirs:
            path, states = self.dirs["freezer"] / "freezer.state", ("FROZEN", "THAWED")
        else:
            return None

        def freeze(on: bool) -> None:
            _try_write(path, states[0] if on else states[1])
            if on and self.kind == "v1":  # v1 freezes asynchronously: wait until it has
                for _ in range(100):
                    if (_read(path) or "").strip() == "FROZEN":
                        break
                    time.sleep(0.01)
        return freeze

    def remove(self) -> list[str]:
        """Remove the group's folders (its processes must be gone). Returns one line
        per folder that could not be removed; empty when all are gone."""
        left = []
        for folder in reversed(self.made):
            for attempt in range(50):  # a process that just died may linger for a moment
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as error:
                    if error.errno != errno.EBUSY or attempt == 49:
                        left.append(f"{folder} ({error.strerror})")
                        break
                    time.sleep(0.05)
        self.made = []
        return left


def busy(threads: set[int]) -> bool:
    """Whether any of these threads is running or waiting for a CPU (state R), or in an
    uninterruptible wait (D, e.g. for a disk the machine shares): not sleeping of its own accord."""
    for tid in threads:
        try:
            with open(f"/proc/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split(None, 1)[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state in ("R", "D"):
            return True
    return False


def _remove_stale(group: Path) -> None:
    """Remove the empty cgroups left by grader processes that died (a worker restarted at a
    unit's deadline, a killed run): their names carry the creator's PID, now gone."""
    for folder in group.glob("kernel-*-*"):
        try:
            pid = int(folder.name.split("-")[1])
            if pid != os.getpid() and not os.path.exists(f"/proc/{pid}") and not _read(folder / "cgroup.procs"):
                folder.rmdir()
        except (ValueError, OSError):
            continue


def _enable(folder: Path) -> None:
    """Make the v2 controllers available to ``folder``'s children."""
    enabled = set((_read(folder / "cgroup.subtree_control") or "").split())
    missing = [c for c in V2_CONTROLLERS if c not in enabled]
    if missing:
        _write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))


def _try_write(path: Path, value: str) -> None:
    try:
        _write(path, value)
    except CgroupUnavailable:
        pass
