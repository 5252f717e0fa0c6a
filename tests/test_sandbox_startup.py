"""Attacks on the kernel's start-up and on the host folders it is given (issue 21).

A submission's files named like modules the kernel imports must never run at
start-up nor shadow a module later; nothing on the host is writable from a cell; the
clean-up removes any tree, however deep. Needs bubblewrap and root (as CI runs).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from grader.sandbox import WORK, remove_tree
from tests.kernels import kernel

pytestmark = pytest.mark.kernel

# each tries, when imported or executed, to leave a mark in the kernel's /tmp and to
# write into every host folder the kernel is given (the run folder's mounts)
ATTACK = """
import glob as _g, os as _o
open('/tmp/ATTACK-' + {name!r}, 'w').write('ran')
for _d in _g.glob('/tmp/kernel-*') + _g.glob('/tmp/kernel-*/*'):
    try:
        open(_o.path.join(_d, 'pwned-' + {name!r}), 'wb').write(b'x' * 2**20)
    except OSError:
        pass
"""
SHADOWS = ["ipykernel_launcher.py", "site.py", "sitecustomize.py", "usercustomize.py", "IPython.py",
           "traitlets.py", "numpy.py", "zmq.py", "tornado.py", "json.py", "coursekit.py",
           "ipython_config.py", "ipython_kernel_config.py", "jupyter_config.py",
           "encodings/__init__.py", "ipykernel/__init__.py"]


def _host_state(run_dir: Path) -> dict[str, str]:
    """Everything in the host run folder except the read-only copy of the files: name -> digest."""
    out = {}
    for path in sorted(run_dir.rglob("*")):
        rel = str(path.relative_to(run_dir))
        if rel == "files" or rel.startswith("files/"):
            continue
        out[rel] = "socket" if path.is_socket() else "dir" if path.is_dir() else \
            hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    submission = tmp_path_factory.mktemp("shadow")
    for name in SHADOWS:
        (submission / name).parent.mkdir(exist_ok=True)
        (submission / name).write_text(ATTACK.format(name=name))
    (submission / "helper_mod.py").write_text("VALUE = 42\n")
    (submission / "data.csv").write_text("a,b\n1,2\n")
    with kernel(submission) as k:
        run_dir = Path(k.km.connection_file).parent
        yield k, run_dir, _host_state(run_dir)
    assert not run_dir.exists(), "clean-up left the run folder"


def test_no_submitted_file_ran_at_start_up(attacked):
    k, run_dir, before = attacked
    assert k.sealed == [], "something wrote into the socket folder while the kernel started"
    assert k.run("import os, json; print(json.dumps([f for f in os.listdir('/tmp') if 'ATTACK' in f]))") == []
    assert not [p for p in run_dir.rglob("pwned-*")]
    assert set(before) == {"connection.json", "sockets"} | {f"sockets/k-{i}" for i in range(1, 6)}, before


def test_no_submitted_file_shadows_a_module_later(attacked):
    k, _, _ = attacked
    seen = k.run("import json, sys, os, numpy, IPython, traitlets, zmq, tornado, coursekit, encodings\n"
                 "print(json.dumps({m: sys.modules[m].__file__ for m in "
                 "['numpy', 'IPython', 'traitlets', 'zmq', 'tornado', 'json', 'coursekit', 'encodings']}))")
    assert not [f for f in seen.values() if f.startswith(WORK)], seen
    assert k.run("import os, json; print(json.dumps([f for f in os.listdir('/tmp') if 'ATTACK' in f]))") == []
    # the student's own helper module imports (the working folder is last on sys.path),
    # data files open by relative path, and '' is not on sys.path
    assert k.run("import json, sys, os, helper_mod\nprint(json.dumps([helper_mod.VALUE, os.getcwd(), "
                 "open('data.csv').read(), sys.path[-1], '' in sys.path]))") == [42, WORK, "a,b\n1,2\n", WORK, False]


def test_nothing_on_the_host_is_writable_from_a_cell(attacked):
    k, run_dir, before = attacked
    connection, sockets = str(run_dir / "connection.json"), str(run_dir / "sockets")
    tries = {
        "append to the connection file": f"open({connection!r}, 'ab').write(b'x' * 2**26)",
        "replace the connection file": f"os.rename({connection!r}, {connection!r} + '.x')",
        "chmod the connection file": f"os.chmod({connection!r}, 0o666)",
        "a file in the socket folder": f"open({sockets!r} + '/fill', 'wb').write(b'x' * 2**20)",
        "a deep folder in the socket folder": f"[os.mkdir({sockets!r} + '/d' * i) for i in range(1, 1101)]",
        "chmod the socket folder": f"os.chmod({sockets!r}, 0o777)",
        "unlink a socket": f"os.unlink({sockets!r} + '/k-1')",
        "a file in the run folder": f"open({str(run_dir)!r} + '/fill', 'wb').write(b'x')",
        "the submission's copy": "open('/home/student/submission/x', 'w').write('x')",
        "the course folder": f"open({str(Path(__file__).parent)!r} + '/x', 'w').write('x')",
    }
    code = ("import os, json\nresults = {}\n" + "".join(
        f"try:\n {action}\n results[{what!r}] = 'done'\nexcept OSError as e:\n results[{what!r}] = 'denied'\n"
        for what, action in tries.items()) + "print(json.dumps(results))")
    assert k.run(code) == dict.fromkeys(tries, "denied")
    assert _host_state(run_dir) == before  # same names, the connection file byte for byte
    assert k.run("print(1 + 1)") == 2  # the kernel still works


def test_clean_up_removes_any_tree(tmp_path):
    top = tmp_path / "left"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):  # deeper than Python's recursion limit, longer than PATH_MAX
        os.mkdir("d" * 8, dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o000, dir_fd=fd))
        child = os.open("d" * 8, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.chmod(fd, 0o000)  # an unreadable, unwritable folder, as a kernel could leave it
        os.close(fd)
        fd = child
    os.close(fd)
    for i in range(2000):  # and many files
        (top / f"many-{i}").touch()
    assert remove_tree(str(top)) == [] and not top.exists()


def test_clean_up_says_loudly_what_it_could_not_remove(tmp_path, monkeypatch):
    import subprocess

    import grader.sandbox as sandbox

    stuck = tmp_path / "stuck"
    stuck.mkdir()
    (stuck / "f").touch()
    real = subprocess.run
    monkeypatch.setattr(sandbox.subprocess, "run", lambda cmd, **kw: real(["false"], **kw))
    problems = remove_tree(str(stuck))
    assert len(problems) == 1 and "could not remove" in problems[0] and "1 entries left" in problems[0]
