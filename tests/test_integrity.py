"""Kill the grader mid-batch, run it again: the grades are those of an uninterrupted run."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from grader import course
from grader.grade import Grader

pytestmark = pytest.mark.kernel

STUDENTS = ["ada", "chloe", "dev", "femi"]


def _grade(class_dir: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "grader.cli", "grade", "--course", str(out),
                             "--submitted", str(class_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _gradebook(out: Path) -> list[tuple]:
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        return sorted((sub.student_id, g.name, g.auto_score, g.manual_score, g.needs_manual_grade)
                      for sub in gb.assignment_submissions("01_similarity")
                      for nb in sub.notebooks for g in nb.grades)


@pytest.fixture(scope="module")
def class_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("integrity") / "class"
    for student in STUDENTS:  # notebook 01 only: one submission each keeps the three runs short
        shutil.copytree(course.SAMPLE_CLASS / student / "01_similarity", folder / student / "01_similarity")
    return folder


@pytest.fixture(scope="module")
def uninterrupted(class_dir) -> Path:
    out = class_dir.parent / "uninterrupted"
    assert _grade(class_dir, out).wait(timeout=600) == 0
    return out


def test_killed_mid_batch_then_rerun_gives_the_same_grades(class_dir, uninterrupted):
    out = class_dir.parent / "killed"
    grader = _grade(class_dir, out)
    # kill -9 while the second student's notebook is being graded (its kernel running)
    marker = out / "autograded" / STUDENTS[1]
    deadline = time.monotonic() + 300
    while not marker.exists() and grader.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert grader.poll() is None, "the grader finished before it could be killed"
    os.killpg(grader.pid, signal.SIGKILL)
    grader.wait()
    assert not (out / "grades.csv").exists()

    assert _grade(class_dir, out).wait(timeout=600) == 0
    assert (out / "grades.csv").read_text() == (uninterrupted / "grades.csv").read_text()
    assert _gradebook(out) == _gradebook(uninterrupted)
    for student in STUDENTS:
        assert (out / "feedback" / student / "01_similarity" / "01_similarity.html").is_file()


def test_regrading_is_idempotent(class_dir, uninterrupted):
    before = ((uninterrupted / "grades.csv").read_text(), _gradebook(uninterrupted))
    assert _grade(class_dir, uninterrupted).wait(timeout=600) == 0
    assert ((uninterrupted / "grades.csv").read_text(), _gradebook(uninterrupted)) == before


def test_one_grader_per_workspace(uninterrupted):
    first = Grader(uninterrupted)
    with pytest.raises(RuntimeError, match="another grader is already working"):
        Grader(uninterrupted)
    del first
