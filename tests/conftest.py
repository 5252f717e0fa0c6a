"""Shared fixtures: the reference solutions loaded in process, the course released once,
the in-process judge, and one class graded by the real pipeline.

Markers (registered in pyproject.toml): a test that leaves this process is marked
``kernel`` (a Jupyter kernel, server or command), ``browser`` (chromium), ``cluster`` (Dask
processes, PostgreSQL) or ``hub`` (real accounts, the exchange, JupyterHub). `make
test-fast` runs the others, and ``processes_need_a_marker`` below makes any unmarked test
that starts a process fail, so that the fast run stays in process.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing.util
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from grader import course
from grader.course import solution_namespace  # noqa: F401  (the test modules import it from here)
from tests.accounts import accounts  # noqa: F401  (real student accounts: test_exchange, test_term)

OUT_OF_PROCESS = ("kernel", "browser", "cluster", "hub")  # the markers of tests that start processes
# The sample class's assignment graded by the real pipeline for every student; the other
# assignments' submissions are judged in process (tests/inprocess.py).
KERNEL_ASSIGNMENTS = ("01_similarity",)


# ---------------------------------------------------------------------------- markers

_allowed = {"now": True}  # whether the running test may start processes (outside a test: yes)
# Quick system tools that libraries run while imported (matplotlib's font list, ctypes'
# library search): allowed in any test.
SYSTEM_TOOLS = {"fc-list", "ldconfig", "ldconfig.real", "uname", "gcc", "cc", "ld", "objdump"}


def _refuse(what: str):
    raise RuntimeError(f"this test starts {what} but carries none of the markers {', '.join(OUT_OF_PROCESS)}: "
                       "mark it (pytestmark in its module), so that `make test-fast` stays in process")


def _guard_subprocess(execute_child):
    def start(self, args, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if not _allowed["now"] and os.path.basename(os.fsdecode(argv[0]).split()[0]) not in SYSTEM_TOOLS:
            _refuse(f"the process {os.fsdecode(argv[0])!r}")
        return execute_child(self, args, *rest, **kwargs)
    return start


def _guard(start_process, what: str):
    def start(*args, **kwargs):
        if not _allowed["now"]:
            _refuse(what)
        return start_process(*args, **kwargs)
    return start


def pytest_configure(config):
    # A new process is started by subprocess (kernels, servers, commands), by
    # multiprocessing (Dask's local workers) or by a fork; each is refused to unmarked tests.
    subprocess.Popen._execute_child = _guard_subprocess(subprocess.Popen._execute_child)
    multiprocessing.util.spawnv_passfds = _guard(multiprocessing.util.spawnv_passfds, "a process (multiprocessing)")
    os.fork = _guard(os.fork, "a process (os.fork)")


# Fixtures that start processes mark the tests that use them.
FIXTURE_MARKERS = {"graded_class": "kernel", "accounts": "hub"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


def _guarded(item):
    _allowed["now"] = any(item.get_closest_marker(m) for m in OUT_OF_PROCESS)
    try:
        yield
    finally:
        _allowed["now"] = True


# Setup and call of a test without an out-of-process marker may start no process. Teardown
# may: a wider-scoped fixture of a marked test (real accounts, a cluster) is finalized in the
# teardown of whichever test runs last, and stopping what it started is not that test's doing.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _guarded(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _guarded(item)


# ---------------------------------------------------------------------------- in process

@pytest.fixture(scope="session")
def similarity() -> dict:
    """The reference functions of notebook 01 (dot_product, cosine_similarity, ...)."""
    return solution_namespace("01_similarity")


@pytest.fixture(scope="session")
def released(tmp_path_factory) -> dict:
    """Every assignment released once, as `make release` does (nbgrader's generate_assignment
    with the course's preprocessors, without touching notebooks/), and registered in a
    gradebook: {"notebooks": the notebooks written, "folder": where, "db_url": the gradebook}."""
    from grader.release import release

    root = tmp_path_factory.mktemp("released")
    url = f"sqlite:///{root / 'gradebook.db'}"
    return {"notebooks": release(root / "release", update_sources=False, db_url=url), "folder": root / "release",
            "db_url": url}


@pytest.fixture(scope="session")
def judge(released, tmp_path_factory):
    """Grades a submitted folder in this process, by grading's own steps without the kernel
    (tests/inprocess.py): ``judge.grade(folder, student_id, assignment_id)``."""
    from tests.inprocess import Judge

    return Judge(released["db_url"], tmp_path_factory.mktemp("judged"))


@pytest.fixture(scope="session")
def judged(judge):
    """``judged(student_id, assignment_id)``: that sample-class submission graded in process
    (``tests.inprocess.Judged``), each once a session."""
    done = {}

    def get(student_id: str, assignment_id: str):
        key = (student_id, assignment_id)
        if key not in done:
            done[key] = judge.grade(course.SAMPLE_CLASS / student_id / assignment_id, student_id, assignment_id)
        return done[key]

    return get


def expected_grades() -> dict:
    """(student_id, assignment_id) -> the recorded expectation in sample_class/<student>/expected.json."""
    out = {}
    for path in sorted(course.SAMPLE_CLASS.glob("*/expected.json")):
        for assignment_id, expected in json.loads(path.read_text()).items():
            out[(path.parent.name, assignment_id)] = expected
    return out


def graded_in_kernels(key: tuple[str, str]) -> bool:
    """Whether ``graded_class`` grades this sample-class row with the real pipeline: every
    student's submission of KERNEL_ASSIGNMENTS, and every missing folder (a row of the
    batch without a kernel). The other rows are judged in process."""
    student, assignment = key
    return assignment in KERNEL_ASSIGNMENTS or not (course.SAMPLE_CLASS / student / assignment).is_dir()


# ---------------------------------------------------------------------------- the real pipeline

@pytest.fixture(scope="session")
def graded_class(tmp_path_factory) -> dict:
    """One batch graded once by the real pipeline (a sandboxed kernel per submission), as an
    instructor would, at the smallest set of submissions that covers each of its
    behaviours: every sample-class student's notebooks of KERNEL_ASSIGNMENTS (right in
    other styles, typical mistakes, a foreign kernel, a warning on stderr, an endless
    loop, a renamed notebook, a truncated file, a deleted test cell), the solution and the
    untouched release notebook of every assignment as two more students, a student with no
    assignment folder, the tamper corpus and the malformed-input corpus (tests/corpora/),
    with a due date and a trusted submission time for the one student who forged a
    timestamp. The sample class's other submissions are judged in process (``judge``), so a
    new assignment adds two submissions here. Two local Dask workers grade it, as `make
    grade JOBS=2` would."""
    from grader.grade import grade_class
    from grader.sandbox import bwrap
    from tests.corpora import harms, malformed, tamper

    # without bubblewrap's PID namespace the tamper corpus's kill_grader attack, run as this user, takes
    # this pytest and its process group down with SIGKILL (exit 137, no report)
    assert bwrap(), "bubblewrap is not installed: apt-get install bubblewrap (.ci/run does it)"
    root = tmp_path_factory.mktemp("class")
    submissions = root / "course" / "submitted"  # as nbgrader collect leaves it
    for student in sorted(p for p in course.SAMPLE_CLASS.iterdir() if p.is_dir()):
        for assignment_id in KERNEL_ASSIGNMENTS:
            if (student / assignment_id).is_dir():
                shutil.copytree(student / assignment_id, submissions / student.name / assignment_id)
    for student, source in [("zz_solution", course.SOLUTIONS), ("zz_release", course.NOTEBOOKS)]:
        for assignment_id in course.assignments():
            shutil.copytree(source / assignment_id, submissions / student / assignment_id)
    (submissions / "zz_absent").mkdir()
    # The batch's own temporary folder, with /tmp's mode (sandboxed kernels run as other uids): what is
    # left in it is the batch's, never a neighbour's on a shared /tmp. The workers inherit TMPDIR.
    batch_tmp = Path(tempfile.mkdtemp(prefix="course-batch-"))
    os.chmod(batch_tmp, 0o1777)
    with pytest.MonkeyPatch.context() as patch, tamper.serve_cheats(port=0) as cheat:
        patch.setenv("TMPDIR", str(batch_tmp))
        patch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
        corpora = {"tamper": tamper.build(submissions, cheat_port=cheat.server_address[1],
                                          private=root / "private"),
                   "malformed": malformed.build(submissions)}
        malformed.materialize_huge(submissions)
        before = _digest(submissions)
        started = time.monotonic()
        rows = grade_class(root / "course", progress=False, jobs=2,
                           duedates={tamper.ASSIGNMENT: tamper.DUE_DATE},
                           timestamps={("t12_forged_timestamp", tamper.ASSIGNMENT): tamper.TRUE_TIMESTAMP})
        seconds = time.monotonic() - started
    left_in_tmp = sorted(os.listdir(batch_tmp))
    shutil.rmtree(batch_tmp, ignore_errors=True)
    return {"rows": {(r.student_id, r.assignment_id): r for r in rows}, "out": root / "course",
            "submissions": submissions, "unchanged": _digest(submissions) == before,
            "corpora": corpora, "cheat_requests": cheat.requests, "seconds": seconds,
            "survivors": _processes_named(harms.SURVIVOR_MARK),
            "left_in_tmp": left_in_tmp}


def _digest(folder: Path) -> dict:
    """Every entry under ``folder`` as it is on disk, links and special files included
    (never followed): a file's bytes, a link's target, a FIFO's type."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(folder)):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                found[path] = b"link:" + os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    found[path] = hashlib.sha256(f.read()).hexdigest().encode()
            elif not stat.S_ISDIR(info.st_mode):
                found[path] = f"special:{stat.S_IFMT(info.st_mode)}".encode()
    return found


def _processes_named(marker: str) -> list[int]:
    """PIDs of processes whose command line holds ``marker``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids
