"""Limits for all of a kernel's processes together, and no survivors (issue 21).

The kernel tests run on this machine's cgroups (v1 in CI's containers, v2 on most
servers; ``Cgroup.create`` picks one). The v2 file writes are also checked on a fake
cgroupfs tree, so that they are covered where only v1 is mounted. Needs root and
bubblewrap.
"""
from __future__ import annotations

import os
import time
import pytest

from grader.cgroup import Cgroup, CgroupUnavailable
from tests.kernels import Kernel, kernel, uid_processes

pytestmark = pytest.mark.kernel

# the honest workload: a fixed CPU budget; prints the wall time it took
WORK = """
import json, time
wall, cpu = time.time(), time.process_time()
while time.process_time() - cpu < {cpu_seconds}:
    pass
print(json.dumps(time.time() - wall))
"""
# 200 background spinners that pause while their own kernel runs a cell (/tmp/pause),
# so that a watchdog of the kernel's own cells sees nothing
SPINNERS = """
import os, json, time
open('/tmp/pause', 'w').close()
n = 0
for _ in range({n}):
    if os.fork() == 0:
        os.setsid()
        while True:
            if os.path.exists('/tmp/pause'):
                time.sleep(0.05)
                continue
            for _ in range(100_000):
                pass
    n += 1
os.unlink('/tmp/pause')
print(json.dumps(n))
"""


def _need_root():
    if os.geteuid() != 0:
        pytest.fail("run the tests as root (as CI does): cgroups and a kernel uid need it")


def test_an_attacker_does_not_take_a_classmates_cpu_and_leaves_nothing(tmp_path):
    """The honest kernel still gets its fixed CPU budget (1.5 s) well within a cell's
    time limit, and gets at least a third of what the attacker's 200 processes get
    together in the same window; the attacker stays under its quota. Both compare
    the two sandboxes in the same window, so other load on the machine cancels out.
    (Without cgroups, each of the 200 weighs as much as the honest kernel: ~1/200.)"""
    _need_root()
    with kernel(tmp_path) as honest:
        assert honest.km.cgroup is not None, "no cgroup on this machine: see the warning"
        alone = honest.run(WORK.format(cpu_seconds=1.5))
        attacker = Kernel(tmp_path, processes=256)
        try:
            uid, group = attacker.km._uid, attacker.km.cgroup
            assert attacker.run(SPINNERS.format(n=200)) == 200
            time.sleep(0.5)  # all spinning
            used, mine, wall = group.cpu_seconds(), honest.km.cpu_time(), time.monotonic()
            beside = honest.run(WORK.format(cpu_seconds=1.5), timeout=30)
            theirs, mine = group.cpu_seconds() - used, honest.km.cpu_time() - mine
            rate = theirs / (time.monotonic() - wall)
            assert len(uid_processes(uid)) >= 200
        finally:
            attacker.shutdown()
        print(f"honest 1.5 CPU-s took {alone:.1f} s alone, {beside:.1f} s beside the attacker; in that "
              f"window honest {mine:.2f} CPU-s, attacker's 200 processes {theirs:.2f} CPU-s ({rate:.2f} cores)")
        assert isinstance(beside, float)  # it finished within the cell's limit (30 s)
        assert theirs <= 3 * mine
        assert rate <= attacker.km.cpus * 1.15  # the quota (1 core) holds for all 200 together
        assert uid_processes(uid) == [], "attacker processes survived its kernel"
        assert not any(d.exists() for d in group.dirs.values()), "its cgroup was not removed"


def test_memory_limit_holds_for_all_the_kernels_processes_together(tmp_path):
    _need_root()
    code = """
import os, json
pids = []
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        block = bytes(range(256)) * (300 * 4096)  # 300 MiB, every page written
        import time; time.sleep(3)
        os._exit(0)
    pids.append(pid)
killed = 0
for pid in pids:
    _, status = os.waitpid(pid, 0)
    killed += os.WIFSIGNALED(status)
print(json.dumps(killed))
"""
    with kernel(tmp_path, memory_mb=1024) as k:
        killed = k.run(code)
        peak = k.km.cgroup.memory_peak_mb()
        assert k.run("print(1 + 1)") == 2  # the kernel itself goes on
    print(f"five children of 300 MiB under a 1024 MiB group limit: {killed} killed, peak {peak:.0f} MiB")
    assert killed >= 1
    assert peak is None or peak <= 1024


@pytest.mark.parametrize("cgroups", ["auto", "off"])
def test_no_process_survives_the_kernels_shutdown(tmp_path, cgroups, monkeypatch):
    _need_root()
    import grader.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_warned_cgroup", True)  # the warning is tested below
    # daemons: double fork and a new session, out of the kernel's process group
    code = ("import os, json, time\nfor _ in range(20):\n if os.fork() == 0:\n  os.setsid()\n"
            "  if os.fork() == 0:\n   time.sleep(600)\n  os._exit(0)\n else:\n  os.wait()\n"
            "print(json.dumps(len(os.listdir('/proc'))))")
    k = Kernel(tmp_path, cgroups=cgroups)
    uid = k.km._uid
    assert (k.km.cgroup is None) == (cgroups == "off")
    k.run(code)
    assert len(uid_processes(uid)) >= 21
    k.shutdown()
    for _ in range(50):  # without a cgroup, the PID namespace's end is asynchronous
        if not uid_processes(uid):
            break
        time.sleep(0.1)
    assert uid_processes(uid) == []


def test_without_cgroups_a_loud_warning_once(tmp_path, monkeypatch, capsys):
    import grader.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_warned_cgroup", False)
    monkeypatch.setattr(sandbox.Cgroup, "create", classmethod(
        lambda cls, *a, **kw: (_ for _ in ()).throw(CgroupUnavailable("v2: none; v1: none"))))
    km = sandbox.SandboxedKernelManager(kernel_name="python3")
    assert km._make_cgroup() is None and km._make_cgroup() is None
    err = capsys.readouterr().err
    assert err.count("WARNING:") == 1 and "PER PROCESS" in err and "v1: none" in err
    strict = sandbox.SandboxedKernelManager(kernel_name="python3", require_cgroups=True)
    with pytest.raises(sandbox.SandboxUnavailable, match="require_cgroups"):
        strict._make_cgroup()


def test_v2_writes_on_a_fake_cgroupfs(tmp_path):
    """The v2 files, written into a fake tree (this machine mounts v1 controllers)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    mountinfo = f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"
    group = Cgroup.create(512, 0.5, 64, kind="v2", mountinfo=mountinfo, proc_cgroup="0::/\n")
    d = group.dirs[""]
    assert d.parent == root / "attention-grader" and d.name.startswith("kernel-")
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (root / "attention-grader" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert {f: (d / f).read_text() for f in ("memory.max", "pids.max", "cpu.max")} == \
        {"memory.max": str(512 * 2**20), "pids.max": "64", "cpu.max": "50000 100000"}
    cmd = group.wrap(["bwrap", "--", "python"])
    assert cmd[:2] == ["/bin/sh", "-c"] and f"echo $$ > {d / 'cgroup.procs'}" in cmd[2]
    assert cmd[-3:] == ["bwrap", "--", "python"]
    (d / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (d / "memory.peak").write_text(str(300 * 2**20))
    assert group.cpu_seconds() == 2.5 and group.memory_peak_mb() == 300
    (d / "cgroup.threads").write_text("41\n42\n")  # the idle-time watchdog's threads
    assert group.threads() == {41, 42}
    (d / "cgroup.kill").write_text("")
    assert group.kill(timeout=1) == set() and (d / "cgroup.kill").read_text() == "1"
    # no cgroup2 with the controllers: v2 is refused with the reason
    (root / "cgroup.controllers").write_text("cpuset io\n")
    with pytest.raises(CgroupUnavailable, match="lacks controllers"):
        Cgroup.create(512, 0.5, 64, kind="v2", mountinfo=mountinfo, proc_cgroup="0::/\n")


def test_a_wrapped_command_runs_inside_the_group():
    _need_root()
    import subprocess

    group = Cgroup.create(256, 1.0, 16)
    try:
        out = subprocess.run(group.wrap(["cat", "/proc/self/cgroup"]), capture_output=True, text=True).stdout
        for d in group.dirs.values():
            assert d.name in out
    finally:
        group.kill()
        assert group.remove() == []
    assert not any(d.exists() for d in group.dirs.values())
