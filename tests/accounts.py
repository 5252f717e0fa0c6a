"""Real Linux student accounts, and an instructor's course folder on nbgrader's real exchange.

Shared by ``tests/test_exchange.py`` and ``tests/test_term.py``; the ``accounts`` fixture
is registered for every test module in ``tests/conftest.py``.

Each student is a real Linux account (``useradd``, made by ``Accounts.add``; removed with
``userdel -r`` by ``Accounts.remove`` or at the end of the session) with its own HOME,
running nbgrader's commands as itself through ``runuser``. Every nbgrader command is the
venv's, by absolute path, with a PATH that does not hold the venv. The instructor is
root, as the tests run, in a course folder of the test's whose ``nbgrader_config.py``
loads the course's (``course_dir``).

The venv's interpreter for the student accounts: ``.venv/bin/python`` is a link to the
pyenv interpreter under ``/root``, which is mode 0700, so another account cannot run it
(the venv's own folders are world-readable). Each student command therefore runs in a
private mount namespace (``unshare --mount``, as root, before ``runuser`` becomes the
student) in which the topmost folder that other accounts cannot enter (``/root``) is an
empty tmpfs holding only a read-only bind mount of the interpreter's installation at
its own path. The student sees the same files at the same paths, nothing else of
``/root``, and nothing changes on the host. Where the interpreter is reachable (a system
Python), commands run without the namespace.
"""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grader import course

NBGRADER = Path(sys.prefix) / "bin" / "nbgrader"
COURSE_GRADER = Path(sys.prefix) / "bin" / "course-grader"
PATH = "/usr/bin:/bin"


def _hidden_above(path: Path) -> Path | None:
    """The topmost folder at or above ``path`` that other accounts cannot enter, or None."""
    for folder in [*reversed(path.parents), path]:
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def _readable_by_others(path: Path) -> bool:
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [*path.parents, path]) \
        and bool(os.stat(path).st_mode & stat.S_IROTH)


class Accounts:
    """The student accounts and how to run commands as them."""

    def __init__(self, base: Path):
        self.base = base
        self.prefix = Path(os.path.realpath(sys.base_prefix))  # the interpreter's installation
        self.hidden = _hidden_above(self.prefix)
        self.stash = base / "interpreter"
        self.made: list[str] = []

    def home(self, user: str) -> Path:
        return self.base / "home" / user

    def add(self, *users: str) -> None:
        """Create the accounts ``users`` (an account left by a killed run is made anew)."""
        for user in users:
            try:
                pwd.getpwnam(user)
                subprocess.run(["userdel", "-r", user], capture_output=True)  # left by a killed run
            except KeyError:
                pass
            subprocess.run(["useradd", "-m", "-d", str(self.home(user)), "-s", "/usr/sbin/nologin", "-U", user],
                           check=True, capture_output=True)
            self.made.append(user)

    def remove(self, *users: str) -> None:
        """``userdel -r`` the accounts ``users`` made here (default: all of them)."""
        for user in users or list(self.made):
            if user in self.made:
                subprocess.run(["userdel", "-r", user], capture_output=True)
                self.made.remove(user)

    def enroll(self, user: str, exchange: Path, course_id: str) -> Path:
        """Give ``user`` a course folder ``~/work`` and a ``~/.jupyter/nbgrader_config.py``
        naming the exchange, the course and the course's submit (as docs/deploying.md has it),
        written as themselves; return the folder."""
        work = self.home(user) / "work"
        self.run(user, "mkdir", work)
        jupyter = self.home(user) / ".jupyter"
        self.run(user, "mkdir", jupyter)
        config = (f"c = get_config()\nc.Exchange.root = {str(exchange)!r}\n"
                  f"c.CourseDirectory.course_id = {course_id!r}\nc.CourseDirectory.root = {str(work)!r}\n"
                  'c.ExchangeFactory.submit = "coursekit.submit.NamedSubmit"\n')
        (jupyter / "nbgrader_config.py").write_text(config)
        shutil.chown(jupyter / "nbgrader_config.py", user, user)
        return work

    def run(self, user: str, *argv, cwd: Path | None = None, python: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` as ``user`` with a clean environment; ``python``: it runs the venv's interpreter."""
        env = ["env", "-i", f"HOME={self.home(user)}", f"PATH={PATH}", "LANG=C.UTF-8", f"USER={user}",
               f"LOGNAME={user}"]
        command = ["runuser", "-u", user, "--", *env, *map(str, argv)]
        if python and self.hidden is not None:
            script = ('set -e; mount --bind "$1" "$2"; mount -t tmpfs -o mode=0755,size=1m afs-hidden "$3"; '
                      'mkdir -p "$1"; mount --bind "$2" "$1"; mount -o remount,bind,ro "$1"; shift 3; exec "$@"')
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                       str(self.prefix), str(self.stash), str(self.hidden), *command]
        done = subprocess.run(command, cwd=cwd or self.home(user), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{argv} as {user} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def nbgrader(self, user: str, *args) -> str:
        """The venv's ``nbgrader ARGS`` as ``user`` in their ``~/work``; its log (stderr)."""
        return self.run(user, NBGRADER, *args, cwd=self.home(user) / "work", python=True).stderr


@pytest.fixture(scope="session")
def accounts():
    """Student accounts are made with ``accounts.add``, each with a HOME in a world-readable
    temporary folder; every one still there is removed at the end of the session.

    Without what real accounts need, the tests that use them fail (never skip) with one line
    saying what to do: a skipped term would hide that it was never tested."""
    if os.geteuid() != 0:
        pytest.fail("these tests create real student accounts (useradd) and run as them: run the tests as root "
                    "(as .ci/run does)", pytrace=False)
    missing = [t for t in ("useradd", "userdel", "runuser", "unshare", "mount") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"these tests create real student accounts and need {', '.join(missing)}: "
                    "apt-get install passwd util-linux mount", pytrace=False)
    if not all(_readable_by_others(p) for p in (Path(sys.prefix), NBGRADER)):
        pytest.fail(f"other accounts cannot read the venv {sys.prefix}: make it and the folders above it "
                    f"readable and enterable by others (chmod o+rX), or make the venv in a folder that is",
                    pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="afs-exchange-"))
    os.chmod(base, 0o755)
    accounts = Accounts(base)
    try:
        accounts.stash.mkdir()
        (base / "home").mkdir()
        if accounts.hidden is not None:
            probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
            if probe.returncode:
                pytest.fail(f"the interpreter is under {accounts.hidden}, which students cannot enter, and no "
                            f"mount namespace can be made to show it to them ({probe.stderr.decode().strip()}): "
                            "allow unshare --mount here, or make the venv from a world-readable Python "
                            "(/usr/bin/python3.11 -m venv)", pytrace=False)
        yield accounts
    finally:
        accounts.remove()
        shutil.rmtree(base, ignore_errors=True)


def course_dir(folder: Path, exchange: Path, db: Path, course_id: str, extra: str = "",
               trusted_collect: bool = True) -> Path:
    """An instructor's course folder whose nbgrader_config.py loads the course's, names this
    exchange and course id and (``trusted_collect``) plugs TrustedCollect in itself."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "home").mkdir(exist_ok=True)
    collect = 'c.ExchangeFactory.collect = "grader.exchange.TrustedCollect"\n' if trusted_collect else ""
    (folder / "nbgrader_config.py").write_text(f"""\
c = get_config()
load_subconfig({str(course.CONFIG_FILE)!r})
c.CourseDirectory.root = {str(folder)!r}
c.CourseDirectory.source_directory = {str(course.SOLUTIONS)!r}
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.db_url = {f"sqlite:///{db}"!r}
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {str(exchange)!r}
{collect}{extra}""")
    return folder


def instructor_run(folder: Path, *argv, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``argv`` as the instructor in ``folder`` (HOME ``folder/home``, the venv not on
    PATH; the grader package is this checkout's); it must succeed."""
    env = {"HOME": str(folder / "home"), "PATH": PATH, "LANG": "C.UTF-8", "PYTHONPATH": str(course.ROOT)}
    done = subprocess.run([str(a) for a in argv], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{[str(a) for a in argv]} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def instructor(folder: Path, *args) -> str:
    """Run the venv's ``nbgrader ARGS`` as the instructor in ``folder``; its log (stderr)."""
    return instructor_run(folder, NBGRADER, *args).stderr
