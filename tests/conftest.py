"""Shared fixtures: the reference solutions loaded in process, and one graded class."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest

from grader import course
from grader.course import solution_namespace  # noqa: F401  (the test modules import it from here)
from tests.accounts import accounts  # noqa: F401  (real student accounts: test_exchange, test_term)


@pytest.fixture(scope="session")
def similarity() -> dict:
    """The reference functions of notebook 01 (dot_product, cosine_similarity, ...)."""
    return solution_namespace("01_similarity")


@pytest.fixture(scope="session")
def graded_class(tmp_path_factory) -> dict:
    """One batch, graded once, as an instructor would: the sample class, the solution and
    the untouched release notebook as two more students, a student with no assignment
    folder, the tamper corpus and the malformed-input corpus (tests/corpora/), with a due
    date and a trusted submission time for the one student who forged a timestamp.
    Two local Dask workers grade it, as `make grade JOBS=2` would."""
    from grader.grade import grade_class
    from tests.corpora import harms, malformed, tamper

    root = tmp_path_factory.mktemp("class")
    submissions = root / "course" / "submitted"  # as nbgrader collect leaves it
    shutil.copytree(course.SAMPLE_CLASS, submissions)
    for student, source in [("zz_solution", course.SOLUTIONS), ("zz_release", course.NOTEBOOKS)]:
        for assignment_id in course.assignments():
            dest = submissions / student / assignment_id
            shutil.copytree(source / assignment_id, dest)
    (submissions / "zz_absent").mkdir()
    scratch = set(os.listdir(tempfile.gettempdir()))
    with tamper.serve_cheats(port=0) as cheat:
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
    return {"rows": {(r.student_id, r.assignment_id): r for r in rows}, "out": root / "course",
            "submissions": submissions, "unchanged": _digest(submissions) == before,
            "corpora": corpora, "cheat_requests": cheat.requests, "seconds": seconds,
            "survivors": _processes_named(harms.SURVIVOR_MARK),
            "left_in_tmp": sorted(set(os.listdir(tempfile.gettempdir())) - scratch)}


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


def expected_grades() -> dict:
    """(student_id, assignment_id) -> the recorded expectation in sample_class/<student>/expected.json."""
    out = {}
    for path in sorted(course.SAMPLE_CLASS.glob("*/expected.json")):
        for assignment_id, expected in json.loads(path.read_text()).items():
            out[(path.parent.name, assignment_id)] = expected
    return out

