"""nbgrader's own commands, run as an instructor runs them in the course root.

They never touch a committed file, they write exactly the committed student notebook, and
they work from this environment's bin/ when it is not activated. Each command is a
subprocess in a copy of the course (its nbgrader_config.py makes the copy the course
root), with this checkout's grader and coursekit on PYTHONPATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader import course

NBGRADER = Path(sys.executable).with_name("nbgrader")
BARE = "/usr/bin:/bin"  # a shell where the venv is not activated
ASSIGNMENT = "01_similarity"
COMMITTED = ("solutions", "notebooks", "assets", "nbgrader_config.py")


def nbgrader(*args: str, cwd: Path, path: str) -> str:
    """Run `nbgrader ARGS` in ``cwd`` with ``path`` as PATH; returns what it printed."""
    env = dict(os.environ, PATH=path,  # this checkout's packages, not those the editable install names
               PYTHONPATH=os.pathsep.join(filter(None, [str(course.ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([str(NBGRADER), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture
def course_copy(tmp_path) -> Path:
    root = tmp_path / "course"
    root.mkdir()
    for name in COMMITTED:
        source = course.ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        else:
            shutil.copy2(source, root / name)
    return root


def test_validate_runs_the_student_notebook_when_the_venv_is_not_activated(course_copy):
    """`nbgrader validate` on an untouched student notebook: its kernel starts from this
    environment, the exercises fail (nothing is written yet), the check-my-work cell runs."""
    printed = nbgrader("validate", f"notebooks/{ASSIGNMENT}/{ASSIGNMENT}.ipynb", cwd=course_copy, path=BARE)
    assert "VALIDATION FAILED ON 4 CELL(S)!" in printed, printed


IGNORED = ["submitted/ada/01_similarity/01_similarity.ipynb", "autograded/ada/01_similarity/01_similarity.ipynb",
           "feedback/ada/01_similarity/01_similarity.html", "release/01_similarity/01_similarity.ipynb",
           "gradebook.db", "grades.csv", "submission_times.csv", "report/index.html"]
KEPT = ["notebooks/01_similarity/01_similarity.ipynb", "solutions/01_similarity/01_similarity.ipynb",
        "notebooks/01_similarity/new.ipynb", "solutions/11_new/11_new.ipynb",
        "sample_class/ada/feedback/x.html", "docs/release/x.md"]  # the rules hold at the root only


def test_nbgrader_s_folders_in_the_course_root_are_git_ignored():
    """Student work and grades in the course root are never one `git add` away from a commit."""
    done = subprocess.run(["git", "check-ignore", "--no-index", *IGNORED, *KEPT], cwd=course.ROOT,
                          capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    assert done.stdout.split() == IGNORED
