"""Check my work: `course-grader check PATH.ipynb` and the last cell of every student notebook.

Three notebooks are really graded here (about 25 s each): a right one through the
notebook cell (which runs the command), the same as a real student account with its
own HOME and an install it cannot write, and one with known mistakes in process. How
the cell finds its notebook in real kernels is tests/test_find_notebook.py's; the hub's
check service is tests/test_checkservice.py's.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys

import nbformat
import pytest

from coursekit import check as client
from coursekit.check import check_my_work
from grader import course
from grader.cli import main
from grader.release import check_cell_source
from tests.conftest import expected_grades

pytestmark = pytest.mark.kernel

FIRST = course.assignments()[0]


def _hidden_test_lines() -> set[str]:
    """Every line of every hidden test block in solutions/: none may ever be printed."""
    lines = set()
    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            hidden = re.search(r"### BEGIN HIDDEN TESTS\n(.*?)\n### END HIDDEN TESTS", cell.source, re.S)
            if hidden:
                lines |= {line.strip() for line in hidden.group(1).splitlines() if line.strip()}
    assert lines
    return lines


def _assert_reveals_nothing(text: str) -> None:
    for line in _hidden_test_lines():
        assert line not in text, line
    for secret in ("grader.checks", "coursekit.probe", "Traceback", "attention-course.answer", "HIDDEN"):
        assert secret not in text, secret


@pytest.mark.parametrize("assignment", course.assignments())
def test_every_student_notebook_ends_with_the_check_cell(assignment):
    for path in sorted((course.NOTEBOOKS / assignment).glob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        assert cells[-1].cell_type == "code" and cells[-1].source == check_cell_source(), path.name
        assert cells[-2].cell_type == "markdown" and "Ctrl-S" in cells[-2].source, path.name


def test_the_cell_is_one_line_while_nbgrader_runs_the_notebook(monkeypatch, capsys):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert check_my_work(f"{FIRST}.ipynb") is None
    assert capsys.readouterr().out.strip().splitlines() == [
        "check my work: skipped while this notebook is graded or validated"]


@pytest.fixture
def learner(monkeypatch, tmp_path):
    """A learner's own machine: a data folder of their own, no hub's check service."""
    for name in ("NBGRADER_EXECUTION", "COURSE_CHECK_URL", "JPY_SESSION_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_the_cell_prints_full_marks_for_a_right_notebook(monkeypatch, capsys, learner):
    """The notebook cell, run as a kernel started with its notebook's path would; it
    returns None, so Jupyter displays nothing after the comments."""
    solution = course.SOLUTIONS / FIRST / f"{FIRST}.ipynb"
    monkeypatch.setenv("JPY_SESSION_NAME", str(solution))
    assert check_my_work() is None
    out = capsys.readouterr().out
    top = sum(expected_grades()[("ada", FIRST)]["exercises"].values())
    assert f"Score: {top:g}/{top:g}" in out, out
    assert "FAIL" not in out and out.count("PASS") == len(course.sections(FIRST)), out
    assert "What to revisit: nothing" in out
    _assert_reveals_nothing(out)


def test_the_secret_is_the_user_s_own_in_their_data_folder(learner, capsys):
    secret = learner / "attention-from-scratch" / "check_secret"
    assert not secret.exists()
    from grader.selfcheck import secret_file, user_secret

    assert secret_file() == secret
    first = user_secret()
    assert user_secret() == first and len(first) == 64
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    assert not (course.ROOT / ".check_secret").exists()


def test_without_a_checker_the_cell_says_so_in_one_line(learner, monkeypatch, capsys):
    """The student wheel has no grader package and, off a hub, no check service."""
    real = client.importlib.util.find_spec
    monkeypatch.setattr(client.importlib.util, "find_spec", lambda name: None if name == "grader" else real(name))
    assert check_my_work(course.NOTEBOOKS / FIRST / f"{FIRST}.ipynb") is None
    assert capsys.readouterr().out.splitlines() == [client.NO_CHECKER]
    assert f"run %pip install {client.SELF_LEARNER_WHEEL} in a cell" in client.NO_CHECKER, "a command, not prose"


def test_a_student_account_checks_with_an_install_it_cannot_write(accounts):
    """A real account with its own HOME runs the cell's function on a renamed copy: the
    install (this checkout, root's) is not writable to it; the secret is made in its own
    data folder, and the account leaves nothing of its own anywhere another account may
    write (the temporary folders) nor in the install."""
    user = "afs_chk1"
    accounts.add(user)
    home = accounts.home(user)
    mine = home / "my copy.ipynb"
    shutil.copyfile(course.SOLUTIONS / FIRST / f"{FIRST}.ipynb", mine)
    shutil.chown(mine, user, user)
    assert not stat.S_IMODE(os.stat(course.ROOT).st_mode) & 0o022, "the install must not be writable by others"
    def owned() -> set[str]:
        return set(subprocess.run(["find", "/tmp", "/var/tmp", "/dev/shm", str(course.ROOT), "-xdev", "-path",
                                   str(home), "-prune", "-o", "-user", user, "-print"],
                                  capture_output=True, text=True).stdout.split())

    # files an earlier account with the same uid left behind are not this account's doing
    before = owned()
    script = f"from coursekit.check import check_my_work; print(repr(check_my_work({str(mine)!r})))"
    done = accounts.run(user, "env", f"PYTHONPATH={course.ROOT}", sys.executable, "-c", script, python=True)
    lines = done.stdout.splitlines()
    top = sum(expected_grades()[("ada", FIRST)]["exercises"].values())
    assert f"Score: {top:g}/{top:g}" in done.stdout and lines[-1] == "None", done.stdout + done.stderr
    assert "PermissionError" not in done.stdout + done.stderr
    secret = home / ".local" / "share" / "jupyter" / "attention-from-scratch" / "check_secret"
    assert secret.stat().st_uid == pwd_uid(user) and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    left = sorted(owned() - before)
    assert left == [], left


def pwd_uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


def test_a_known_mistake_prints_its_diagnosis_hint_and_what_to_revisit(tmp_path, capsys, learner):
    """chloe's notebook 01 (a renamed copy): cosine over squared lengths, keys @ queries^T,
    softmax over the query axis. The second line tells how the renamed copy is graded."""
    mine = tmp_path / "my copy.ipynb"
    mine.write_bytes((course.SAMPLE_CLASS / "chloe" / "01_similarity" / "01_similarity.ipynb").read_bytes())
    assert main(["check", str(mine)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == ("Note: 'my copy.ipynb' is not named as released: it will be graded as "
                                   "'01_similarity.ipynb' (its feedback keeps your name)"), out
    expected = expected_grades()[("chloe", "01_similarity")]
    assert f"Score: {expected['score']:g}/10" in out, out
    for exercise, points in expected["exercises"].items():
        assert re.search(rf"{'PASS' if points else 'FAIL'}  {exercise} +{points:g}/", out), (exercise, out)
    assert "softmax over the key axis" in out and "hint: re-read section" in out
    revisit = out.split("What to revisit:")[1]
    assert "5. From scores to a soft lookup (soft_lookup)" in revisit and "dot_product" not in revisit
    _assert_reveals_nothing(out)


def test_a_broken_notebook_file_is_one_line(tmp_path, capsys, learner):
    broken = tmp_path / f"{FIRST}.ipynb"
    broken.write_text(json.dumps({"cells": []})[:9], encoding="utf-8")  # truncated, as a crash leaves it
    assert main(["check", str(broken)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"{broken.name}: not graded: ") and "JSON" in out[0], out


@pytest.mark.parametrize("name", ["missing.ipynb", "notes.txt"])
def test_a_wrong_path_is_one_line_saying_what_to_pass(tmp_path, capsys, name):
    path = tmp_path / name
    if name.endswith(".txt"):
        path.write_text("hello")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("course-grader check: no notebook at"), err
