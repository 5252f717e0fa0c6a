"""nbgrader's own commands, run as an instructor runs them in the course root.

They never touch a committed file, they write exactly the committed student notebook, and
they work from this environment's bin/ when it is not activated. Each command is a
subprocess in a copy of the course (its nbgrader_config.py makes the copy the course
root), with this checkout's grader and coursekit on PYTHONPATH.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from nbgrader.dbutil import ALEMBIC_DIR

from grader import course

pytestmark = pytest.mark.kernel

NBGRADER = Path(sys.executable).with_name("nbgrader")
ACTIVATED = f"{NBGRADER.parent}{os.pathsep}{os.environ.get('PATH', '')}"  # as after `source .venv/bin/activate`
BARE = "/usr/bin:/bin"  # a shell where the venv is not activated
ASSIGNMENT = "01_similarity"
COMMITTED = ("solutions", "notebooks", "coursekit", "nbgrader_config.py")


def nbgrader(*args: str, cwd: Path, path: str = ACTIVATED) -> str:
    """Run `nbgrader ARGS` in ``cwd`` with ``path`` as PATH; returns what it printed."""
    env = dict(os.environ, PATH=path,  # this checkout's packages, not those the editable install names
               PYTHONPATH=os.pathsep.join(filter(None, [str(course.ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([str(NBGRADER), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=course.ROOT, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def checkout() -> None:
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=course.ROOT, capture_output=True, text=True)
    if top.returncode or Path(top.stdout.strip()).resolve() != course.ROOT:
        pytest.skip("the course is not a git checkout")


def _files(root: Path) -> dict[str, bytes]:
    """The committed folders and configuration of a course root: path -> bytes."""
    paths = [root / name for name in COMMITTED]
    files = [p for top in paths for p in ([top] if top.is_file() else top.rglob("*")) if p.is_file()]
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def _student_notebook(root: Path, folder: str) -> bytes:
    return (root / folder / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_bytes()


@pytest.fixture
def course_copy(tmp_path) -> Path:
    root = tmp_path / "course"
    root.mkdir()
    for name in COMMITTED:
        source = course.ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        else:
            shutil.copy2(source, root / name)
    return root


def test_generate_and_release_assignment_touch_no_committed_file(course_copy, tmp_path):
    """`nbgrader generate_assignment --force` empties the release directory's assignment
    folder; it must not be notebooks/. What it writes is the committed student notebook to
    the byte (check-my-work cells included), release_assignment hands out that folder, and
    `nbgrader list` shows it released."""
    before = _files(course_copy)
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777 | stat.S_ISVTX)
    nbgrader("generate_assignment", ASSIGNMENT, "--force", cwd=course_copy)
    nbgrader("release_assignment", ASSIGNMENT, f"--Exchange.root={exchange}", cwd=course_copy)
    after = _files(course_copy)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"nbgrader changed committed files: {changed}"
    released = _student_notebook(course_copy, "release")
    assert released == _student_notebook(course_copy, "notebooks")
    course_id = course.load_config().CourseDirectory.course_id
    assert (exchange / course_id / "outbound" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_bytes() == released
    assert f"{course_id} {ASSIGNMENT}" in nbgrader("list", f"--Exchange.root={exchange}", cwd=course_copy)


def test_generate_assignment_in_this_checkout_changes_nothing_git_sees(checkout, tmp_path):
    """The same command in the repository root, with its own configuration. An instructor's
    own release/<assignment> and gradebook.db are left alone; what the test makes, it removes."""
    release_dir = course.ROOT / course.load_config().CourseDirectory.release_directory
    tracked = git("ls-files", "--", str(release_dir))
    assert not tracked, f"generate_assignment --force would delete committed files: {tracked.split()[:3]}"
    if (release_dir / ASSIGNMENT).exists():
        pytest.skip(f"{release_dir / ASSIGNMENT} exists: an instructor's release, left alone")
    gradebook = course.ROOT / "gradebook.db"
    made = [p for p in (release_dir, gradebook) if not p.exists()]
    db = [] if gradebook in made else [f"--db=sqlite:///{tmp_path / 'gradebook.db'}"]
    status = git("status", "--porcelain")
    try:
        nbgrader("generate_assignment", ASSIGNMENT, "--force", *db, cwd=course.ROOT)
        assert git("status", "--porcelain") == status
        assert _student_notebook(course.ROOT, release_dir.name) == _student_notebook(course.ROOT, "notebooks")
    finally:
        shutil.rmtree(release_dir if release_dir in made else release_dir / ASSIGNMENT, ignore_errors=True)
        if gradebook in made:
            gradebook.unlink(missing_ok=True)


def test_nbgrader_db_commands_work_when_the_venv_is_not_activated(course_copy):
    """nbgrader 0.9.6 runs the `alembic` executable, found on PATH, to stamp a new gradebook;
    without it the command failed and left a gradebook with no alembic_version table."""
    db = course_copy / "gradebook.db"
    url = f"--db=sqlite:///{db}"
    nbgrader("db", "assignment", "add", ASSIGNMENT, url, cwd=course_copy, path=BARE)
    nbgrader("db", "student", "add", "ada", "--first-name=Ada", "--last-name=Lovelace", url,
             cwd=course_copy, path=BARE)
    assert ASSIGNMENT in nbgrader("db", "assignment", "list", url, cwd=course_copy, path=BARE)
    with sqlite3.connect(db) as connection:
        (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        students = connection.execute("SELECT id, first_name, last_name FROM student").fetchall()
    assert revision == ScriptDirectory(ALEMBIC_DIR).get_current_head()
    assert students == [("ada", "Ada", "Lovelace")]


def test_validate_runs_the_student_notebook_when_the_venv_is_not_activated(course_copy):
    """`nbgrader validate` on an untouched student notebook runs it in a kernel of this
    environment and flags its four exercises (nothing is written yet)."""
    printed = nbgrader("validate", f"notebooks/{ASSIGNMENT}/{ASSIGNMENT}.ipynb", cwd=course_copy, path=BARE)
    assert "VALIDATION FAILED ON 4 CELL(S)!" in printed, printed


IGNORED = ["submitted/ada/01_similarity/01_similarity.ipynb", "autograded/ada/01_similarity/01_similarity.ipynb",
           "feedback/ada/01_similarity/01_similarity.html", "release/01_similarity/01_similarity.ipynb",
           "gradebook.db", "grades.csv", "submission_times.csv", "report/index.html", ".course-grader/status.json"]
KEPT = ["notebooks/01_similarity/01_similarity.ipynb", "solutions/01_similarity/01_similarity.ipynb",
        "notebooks/01_similarity/new.ipynb", "solutions/11_new/11_new.ipynb",
        "sample_class/ada/feedback/x.html", "docs/release/x.md"]  # the rules hold at the root only


def test_nbgrader_s_folders_in_the_course_root_are_git_ignored(checkout):
    """Student work and grades in the course root are never one `git add` away from a commit."""
    done = subprocess.run(["git", "check-ignore", "--no-index", *IGNORED, *KEPT], cwd=course.ROOT,
                          capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr  # 1: none ignored
    assert done.stdout.split() == IGNORED
