"""Kernels forked from the fork server (grader/forkserver.py, grader/zygote.py), seen from inside.

A forked kernel must be as isolated as one started from scratch: its own sandbox,
cgroup, /tmp and uid, no privilege left, nothing of a sibling kernel (files, processes,
patched modules, environment), nothing of the course in what it inherited. The other
sandbox tests run with the fork server too (it is the default as root); these check
what forking adds. Needs root and bubblewrap.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path

import pytest

from grader import course, forkserver
from grader.forkserver import ForkedKernelProvisioner
from grader.sandbox import readable_roots
from tests.kernels import Kernel, kernel

pytestmark = pytest.mark.kernel

# what a student's kernel leaves behind, to be looked for from the next one
LEAVE_MARKS = """
import os, sys, json, subprocess, numpy, coursekit.plots
open('/tmp/mark-of-the-sibling', 'w').write('x')
open('mark-of-the-sibling', 'w').write('x')
numpy.dot = lambda *a, **k: 42          # a library patched
numpy.MARK_OF_THE_SIBLING = True
coursekit.plots.MARK_OF_THE_SIBLING = True
sys.modules['mark_of_the_sibling'] = numpy
os.environ['MARK_OF_THE_SIBLING'] = '1'
sibling = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', 'mark-of-the-sibling'])
print(json.dumps([os.getpid(), sibling.pid, os.getuid()]))
"""
LOOK_FOR_MARKS = """
import os, sys, json, numpy, coursekit.plots
cmdlines = []
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            cmdlines.append(open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace'))
        except OSError:
            pass
print(json.dumps({
    "tmp": sorted(os.listdir('/tmp')), "work": os.listdir('.'),
    "dot": int(numpy.dot(numpy.array([1, 2]), numpy.array([3, 4]))),
    "numpy mark": hasattr(numpy, 'MARK_OF_THE_SIBLING'),
    "coursekit mark": hasattr(coursekit.plots, 'MARK_OF_THE_SIBLING'),
    "module": 'mark_of_the_sibling' in sys.modules,
    "environment": os.environ.get('MARK_OF_THE_SIBLING'),
    "processes": [c for c in cmdlines if 'mark-of-the-sibling' in c], "uid": os.getuid(),
}))
"""


def _need_root():
    if os.geteuid() != 0:
        pytest.fail("run the tests as root (as CI does): forking into a sandbox needs it")


def test_kernels_are_forked_by_default_as_root(tmp_path):
    _need_root()
    with kernel(tmp_path) as k:
        assert isinstance(k.km.provisioner, ForkedKernelProvisioner)
        assert k.km.kernel_pid() == k.km.provisioner.kernel_pid
        assert k.run("print(1 + 1)") == 2
    with kernel(tmp_path, fork_kernels=False) as k:  # the knob turns it off
        assert not isinstance(k.km.provisioner, ForkedKernelProvisioner)
        assert k.run("print(1 + 1)") == 2


def test_a_kernel_sees_nothing_of_a_sibling_forked_before_it(tmp_path):
    """A sibling alive beside it patched a library, wrote files, set its environment and
    left a process: none of it shows in the next kernel forked from the same server."""
    _need_root()
    with kernel(tmp_path) as first:
        _, _, first_uid = first.run(LEAVE_MARKS)
        with kernel(tmp_path) as second:
            seen = second.run(LOOK_FOR_MARKS)
            own_run_folder = os.path.basename(os.path.dirname(second.km.connection_file))
        assert first.run("import numpy, json; print(json.dumps(numpy.dot(1, 2)))") == 42  # it did patch its own
    # /tmp: the font cache, the folder above its own socket folder and any read-only root
    # that lives under /tmp, such as a checkout cloned there (as for any kernel)
    shared = {Path(root).relative_to("/tmp").parts[0] for root in readable_roots()
              if Path(root).is_relative_to("/tmp")}
    assert seen == {"tmp": sorted({"matplotlib", own_run_folder} | shared), "work": [], "dot": 11, "numpy mark": False,
                    "coursekit mark": False, "module": False, "environment": None, "processes": [],
                    "uid": seen["uid"]}
    assert seen["uid"] != first_uid


def test_a_forked_kernel_holds_no_privilege_and_the_configured_limits(tmp_path):
    _need_root()
    code = ("import json, os, resource\nstatus = open('/proc/self/status').read()\n"
            "print(json.dumps({'status': status, 'groups': os.getgroups(), 'ids': [os.getresuid(), os.getresgid()],"
            " 'session': os.getsid(0) == os.getpid(), 'limits': {n: resource.getrlimit(getattr(resource, 'RLIMIT_' + n))"
            " for n in ['AS', 'NPROC', 'CPU', 'FSIZE', 'CORE']}}))")
    with kernel(tmp_path, memory_mb=1024, processes=48, cpu_seconds=77, file_size_mb=5) as k:
        seen = k.run(code)
        uid = k.km._uid
        preloaded = k.km.fork_server().preloaded_bytes
    fields = dict(re.findall(r"^(\w+):\s+(.*)$", seen["status"], re.M))
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[name], 16) == 0, (name, fields[name])
    assert fields["NoNewPrivs"] == "1"
    assert seen["ids"] == [[uid] * 3, [uid] * 3] and uid != 0 and seen["groups"] == []
    assert seen["session"]  # its own session, as bwrap --new-session gives
    mib = 2**20
    assert seen["limits"] == {"AS": [1024 * mib + preloaded] * 2, "NPROC": [48, 48], "CPU": [77, 77],
                              "FSIZE": [5 * mib] * 2, "CORE": [0, 0]}
    assert 0 < preloaded < 4096 * mib


def test_a_forked_kernel_and_all_it_starts_are_in_its_cgroup(tmp_path):
    _need_root()
    with kernel(tmp_path) as k:
        group = k.km.cgroup
        assert group is not None, "no cgroup on this machine: see the warning"
        child = k.run("import subprocess, sys, json\np = subprocess.Popen([sys.executable, '-c', "
                      "'import time; time.sleep(60)'])\nprint(json.dumps(p.pid))")
        members = group.pids()
        assert k.km.kernel_pid() in members
        with open(f"/proc/{k.km.kernel_pid()}/cgroup") as f:
            memberships = f.read()
        assert all(d.name in memberships for d in group.dirs.values()), memberships
        # the child, seen from the host: a process of the kernel's uid, in the group
        uid = k.km._uid
        theirs = [p for p in members if _uid_of(p) == uid]
        assert len(theirs) >= 3, theirs  # the holder, the kernel and its child at least
        assert isinstance(child, int)
    assert not any(d.exists() for d in group.dirs.values())
    assert not [p for p in theirs if os.path.exists(f"/proc/{p}")], "a process of the kernel survived it"


def test_the_fork_server_holds_nothing_of_the_course(tmp_path):
    """Everything a forked kernel inherited comes from the libraries the sandbox mounts:
    no module of the grader, the solutions or the tests, and no course file's name."""
    _need_root()
    code = ("import sys, json, os\nfiles = sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})\n"
            f"print(json.dumps({{'files': files, 'root': sorted(os.listdir({str(course.ROOT)!r}))}}))")
    with kernel(tmp_path) as k:
        seen = k.run(code)
    allowed = (sys.prefix, sys.base_prefix, "/usr/", str(course.ROOT / "coursekit"), "/run/forkserver/")
    # (torch names two of its modules' files without a folder: '_ops.py', '_classes.py')
    strangers = [f for f in seen["files"] if f.startswith("/") and not f.startswith(allowed)]
    assert strangers == [], strangers
    assert not [f for f in seen["files"] if "/grader/" in f.replace("/run/forkserver/", "")]
    # assets/: the font that coursekit/assets links to, mounted read-only, nothing else of the course
    assert set(seen["root"]) <= {"coursekit", ".venv", "assets"}, seen["root"]


# every descriptor the kernel holds: where it points
OPEN_FILES = """
import json, os, stat
found = {}
for name in os.listdir('/proc/self/fd'):
    try:
        mode = os.fstat(int(name)).st_mode
        found[name] = [os.readlink('/proc/self/fd/' + name), stat.S_ISDIR(mode)]
    except OSError:
        continue
print(json.dumps(found))
"""


def test_a_forked_kernel_holds_no_descriptor_of_the_fork_server(tmp_path):
    """No folder, no socket of the fork server, no file but the libraries' and its own."""
    _need_root()
    with kernel(tmp_path) as k:
        seen = k.run(OPEN_FILES)
        server = k.km.fork_server()
        theirs = {os.readlink(f"/proc/{server.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{server.pid}/fd")}
    allowed = (sys.prefix, sys.base_prefix, "/usr/", str(course.ROOT / "coursekit"), "/tmp/", "/home/student/",
               "/dev/null", "pipe:", "socket:", "anon_inode:")
    assert [p for p, is_dir in seen.values() if is_dir or not p.startswith(allowed)] == [], seen
    assert not {p for p, _ in seen.values() if p.startswith("socket:")} & theirs, (seen, theirs)


def test_inherited_library_files_are_opened_anew_and_the_rest_closed(tmp_path):
    """grader/zygote.py's hand-over, in a forked child of this process: a read-only file
    under the readable folders is kept at its number and offset but with a description of
    its own; a folder, a socket, a writable file and a file elsewhere are closed."""
    from grader import zygote

    library = tmp_path / "lib"
    library.mkdir()
    (library / "font.ttf").write_bytes(b"x" * 1000)
    (tmp_path / "elsewhere.txt").write_text("secret")
    font = os.open(library / "font.ttf", os.O_RDONLY)
    os.lseek(font, 100, os.SEEK_SET)
    others = {"folder": os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY),
              "elsewhere": os.open(tmp_path / "elsewhere.txt", os.O_RDONLY),
              "writable": os.open(library / "font.ttf", os.O_RDWR)}
    left, right = socket.socketpair()
    others["socket"] = left.fileno()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the kernel's side
        try:
            files = zygote._inherited_files({write, read}, [str(library)])
            zygote._reopen(files)
            os.lseek(font, 500, os.SEEK_SET)
            still_open = sorted(name for name, fd in others.items() if _is_open(fd))
            os.write(write, json.dumps([sorted(files), os.lseek(font, 0, os.SEEK_CUR), still_open]).encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = json.loads(os.read(read, 4096))
    os.waitpid(child, 0)
    assert answer == [[font], 500, []]
    assert os.lseek(font, 0, os.SEEK_CUR) == 100  # ours did not move
    for fd in [font, read, *others.values()]:
        os.close(fd)
    right.close()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_a_forked_kernel_draws_with_the_fonts_the_fork_server_loaded(tmp_path):
    """The Korean font and matplotlib's fallback font were loaded in the fork server
    (matplotlib drops its open fonts in a forked child); Hangul draws in each kernel."""
    _need_root()
    code = ("import warnings, json, io\nwarnings.simplefilter('error')\n"
            "import matplotlib.pyplot as plt\nfrom coursekit.plots import use_korean_font\nuse_korean_font()\n"
            "fig, ax = plt.subplots()\nax.set_title('고양이가 앉았다')\nbuf = io.BytesIO()\n"
            "fig.savefig(buf, format='png')\nprint(json.dumps(len(buf.getvalue())))")
    for _ in range(2):  # two siblings, one after the other, read the same font files
        with kernel(tmp_path) as k:
            assert k.run(code) > 1000


def test_forked_kernels_draw_fresh_random_numbers(tmp_path):
    _need_root()
    code = ("import json, random, numpy, torch\n"
            "print(json.dumps([random.random(), float(numpy.random.rand()), torch.initial_seed()]))")
    draws = []
    for _ in range(2):
        with kernel(tmp_path) as k:
            draws.append(k.run(code))
    assert all(first != second for first, second in zip(*draws)), draws


# what a notebook can tell about the kernel it runs in, after a figure was drawn
KERNEL_STATE = r"""
import sys, os, json, warnings, signal, resource, locale
import numpy, torch, matplotlib, matplotlib.pyplot as plt, coursekit.plots
ip = get_ipython()
print(json.dumps({
    "path": sys.path, "cwd": os.getcwd(), "argv0": os.path.basename(sys.argv[0]),
    "environment": {k: v for k, v in os.environ.items()},
    "warning filters": sorted(repr(f) for f in warnings.filters),
    "signals": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD,
                                                              signal.SIGPIPE, signal.SIGHUP)},
    "limits": {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n)) for n in ("NOFILE", "STACK", "NPROC", "CPU")},
    "umask": os.umask(0o022), "locale": locale.getlocale(), "recursion": sys.getrecursionlimit(),
    "torch threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
    "torch dtype": str(torch.get_default_dtype()), "numpy": [numpy.get_printoptions(), numpy.geterr()],
    "backend": matplotlib.get_backend(), "interactive": matplotlib.is_interactive(),
    "rc": {k: str(v) for k, v in matplotlib.rcParams.items()},
    "formats": sorted(k for k, v in ip.display_formatter.formatters.items() if v.enabled),
    "after each cell": sorted(getattr(f, "__name__", repr(f)) for f in ip.events.callbacks["post_execute"]),
}))
"""


def test_a_forked_kernel_behaves_as_a_kernel_started_anew(tmp_path):
    """What a notebook sees of its kernel is the same forked or started anew: paths,
    environment, warning filters, signals, limits, numpy's, torch's and matplotlib's
    settings, and a figure drawn in a cell is shown at its end (image/png)."""
    _need_root()
    seen, shown = {}, {}
    for fork in (True, False):
        with kernel(tmp_path, fork_kernels=fork) as k:
            outputs = []
            k.loop.run_until_complete(k.kc.execute_interactive(
                "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('a figure');",
                output_hook=lambda m: outputs.append(sorted(m["content"].get("data", {}))), timeout=60))
            shown[fork] = [o for o in outputs if "image/png" in o]
            seen[fork] = k.run(KERNEL_STATE)
    assert shown[True] and shown[True] == shown[False]
    differ = {key: (seen[True][key], seen[False][key]) for key in seen[False] if seen[True][key] != seen[False][key]}
    assert differ == {}, differ


def test_a_fork_server_that_ended_is_replaced(tmp_path):
    _need_root()
    with kernel(tmp_path) as k:
        server = k.km.fork_server()
    server.process.kill()
    server.process.wait()
    with kernel(tmp_path) as k:
        assert k.km.fork_server() is not server and k.km.fork_server().alive()
        assert k.run("print(2 + 2)") == 4


def test_a_kernel_that_exits_is_seen_dead(tmp_path):
    _need_root()
    import asyncio

    k = Kernel(tmp_path)
    try:
        pid = k.km.kernel_pid()
        k.kc.execute("import os; os._exit(3)")
        for _ in range(100):
            if not k.loop.run_until_complete(k.km.is_alive()):
                break
            k.loop.run_until_complete(asyncio.sleep(0.1))
        assert not k.loop.run_until_complete(k.km.is_alive())
        assert not os.path.exists(f"/proc/{pid}/status") or "Z" in _state(pid)
    finally:
        k.shutdown()


def test_a_kernel_that_cannot_be_forked_leaves_nothing(tmp_path, monkeypatch):
    """The fork server refuses (here: a command that is not ipykernel's): the start fails
    with the reason, and the sandbox, its run folder and its cgroup are gone."""
    _need_root()
    import asyncio

    from grader.sandbox import SandboxedKernelManager

    real = SandboxedKernelManager.fork_request
    monkeypatch.setattr(SandboxedKernelManager, "fork_request",
                        lambda self, server: {**real(self, server), "argv": ["python", "-c", "pass"]})
    km = SandboxedKernelManager(kernel_name="python3")
    made = {}
    real_cgroup = SandboxedKernelManager._make_cgroup
    monkeypatch.setattr(SandboxedKernelManager, "_make_cgroup",
                        lambda self: made.setdefault("group", real_cgroup(self)))
    loop = asyncio.new_event_loop()
    with pytest.raises(forkserver.ForkServerUnavailable, match="starts ipykernel only"):
        loop.run_until_complete(km.start_kernel(cwd=str(tmp_path)))
    loop.close()
    assert not os.path.exists(os.path.dirname(km.connection_file)), "the run folder was left"
    assert not any(d.exists() for d in made["group"].dirs.values()), "the cgroup was left"
    assert not _uid_processes(km._uid)


def _uid_processes(uid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _uid_of(int(p)) == uid]


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(f.read().split("\nUid:")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read().split("\nState:")[1].split()[0]
    except (OSError, IndexError):
        return ""


def teardown_module():
    forkserver.shutdown()
