"""The instructor's nbgrader course directory: the one place grading reads and writes.

It is the folder nbgrader's own tools work in, ``c.CourseDirectory.root`` of its
``nbgrader_config.py`` (the repository root by default): ``submitted/`` as ``nbgrader
collect`` leaves it, ``autograded/``, ``feedback/``, ``release/`` and the gradebook
(``c.CourseDirectory.db_url``, else ``gradebook.db`` in the root). Beside them the
grader keeps ``grades.csv`` (an export of the whole gradebook), ``submission_times.csv``
(the trusted times ``nbgrader collect`` records, ``grader.exchange``), ``report/`` and
``.course-grader/`` (the lock and each row's status line).

Any other folder becomes a course directory when the grader first writes there: it
gets an ``nbgrader_config.py`` that loads the course's and names the folder as the
root, so formgrader, ``nbgrader autograde``, ``generate_feedback``,
``release_feedback``, ``export`` and ``db`` run there agree with ``course-grader``.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from . import course

CONFIG_NAME = "nbgrader_config.py"
STATE = ".course-grader"  # the grader's own files in a course directory


class CourseDirError(RuntimeError):
    """The course directory cannot be used as asked; the message says what to do."""


class CourseBusy(CourseDirError):
    """Another grader is working in the course directory."""


def default_root() -> Path:
    """The course directory nbgrader_config.py names (the repository root unless changed)."""
    return Path(course.load_config().CourseDirectory.root).resolve()


def _config_text(root: Path, db_url: str | None, submitted: Path | None) -> str:
    return ('"""Written by course-grader: this folder is an nbgrader course directory of the course\n'
            'in the repository below; nbgrader\'s commands and formgrader run here use it."""\n'
            "c = get_config()  # noqa: F821\n"
            f"load_subconfig({str(course.CONFIG_FILE)!r})  # noqa: F821 - the course's configuration\n"
            f"c.CourseDirectory.root = {str(root)!r}\n"
            f"c.CourseDirectory.source_directory = {str(course.SOLUTIONS)!r}\n"
            + (f"c.CourseDirectory.db_url = {db_url!r}\n" if db_url else "")
            + (f"c.CourseDirectory.submitted_directory = {str(submitted)!r}\n" if submitted else ""))


@contextlib.contextmanager
def undone_if_new(root: Path | str | None = None):
    """Around a run that may make ``root`` (default: ``default_root()``) a course directory:
    if the folder was not one (no nbgrader_config.py) and the run raises an Exception, what
    the run added to it (its nbgrader_config.py, gradebook, release/, ...; the folder itself
    and its parents if the run made them) is removed, so that the corrected run starts as the
    first would have (a leftover nbgrader_config.py would pin the failed run's gradebook and
    submitted folder). A course directory that existed is left as it is: its gradebook and
    folders are the term's. So is one that another run made meanwhile: a ``CourseDirError``
    (its configuration is not this run's, or its grader holds it) removes nothing. A
    gradebook on a database server keeps what the run wrote.
    """
    root = Path(root).resolve() if root is not None else default_root()
    if (root / CONFIG_NAME).is_file():
        yield
        return
    made = root
    while not made.parent.exists():
        made = made.parent
    before = set(os.listdir(root)) if root.is_dir() else None
    try:
        yield
    except CourseDirError:
        raise
    except Exception:
        if before is None:
            shutil.rmtree(made, ignore_errors=True)
        else:
            for name in set(os.listdir(root)) - before:
                path = root / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        raise


@dataclass
class CourseDir:
    """One nbgrader course directory and its configuration (see the module's docs)."""

    root: Path
    config: Config

    @classmethod
    def open(cls, root: Path | str | None = None, db_url: str | None = None,
             submitted: Path | str | None = None, create: bool = True) -> "CourseDir":
        """The course directory at ``root`` (default: ``default_root()``).

        A folder without an nbgrader_config.py gets one (see the module's docs), naming
        ``db_url`` as its gradebook and ``submitted`` as its submitted folder (default:
        ``root/submitted``) when given. A folder with one keeps its own: ``db_url`` and
        ``submitted`` must then be the ones it names (or None).

        Raises:
            CourseDirError: ``db_url`` or ``submitted`` differs from what the folder's
                configuration names, or the configuration names another root; or
                ``create`` is False and the folder has no nbgrader_config.py.
        """
        root = Path(root).resolve() if root is not None else default_root()
        submitted = Path(submitted).resolve() if submitted is not None else None
        config_file = root / CONFIG_NAME
        if not config_file.is_file():
            if not create:
                raise CourseDirError(f"{root} is not a course directory yet (no {CONFIG_NAME})")
            root.mkdir(parents=True, exist_ok=True)
            config_file.write_text(_config_text(root, db_url, submitted), encoding="utf-8")
        config = PyFileConfigLoader(CONFIG_NAME, path=str(root)).load_config()
        configured_root = Path(config.CourseDirectory.get("root", root)).resolve()
        if configured_root != root:
            raise CourseDirError(f"{config_file} names another course root ({configured_root}): "
                                 "grade there, or set c.CourseDirectory.root to this folder")
        config.CourseDirectory.root = str(root)
        found = cls(root, config)
        if db_url and db_url != found.db_url:
            raise CourseDirError(f"{config_file} names the gradebook {found.shown_db_url}: grade with that one, "
                                 "or set c.CourseDirectory.db_url there (every nbgrader tool reads it)")
        if submitted and submitted != found.folder("submitted").resolve():
            raise CourseDirError(f"{config_file} names the submitted folder {found.folder('submitted')}: "
                                 "grade that one, or set c.CourseDirectory.submitted_directory there")
        return found

    @property
    def db_url(self) -> str:
        """The gradebook's SQLAlchemy URL, as every nbgrader command here opens it."""
        if "db_url" in self.config.CourseDirectory and self.config.CourseDirectory.db_url:
            return self.config.CourseDirectory.db_url
        return f"sqlite:///{self.root / 'gradebook.db'}"

    @property
    def shown_db_url(self) -> str:
        from sqlalchemy.engine import make_url

        try:
            return make_url(self.db_url).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - a malformed URL is reported when it is opened
            return "(a malformed URL)"

    def folder(self, step: str) -> Path:
        """nbgrader's folder for ``step`` ("submitted", "autograded", "feedback", "release")."""
        name = self.config.CourseDirectory.get(f"{step}_directory", step)
        return self.root / name  # an absolute name stays as it is

    @property
    def state(self) -> Path:
        path = self.root / STATE
        path.mkdir(exist_ok=True)
        return path

    @property
    def grades_csv(self) -> Path:
        return self.root / "grades.csv"


class Statuses:
    """Each row's one-line status ("graded: late by 5 min", "not graded: ..."), kept beside
    the gradebook, which has no place for it. Rows of folders that are not submissions (a
    name that is no student id, an assignment the course does not have) are kept as
    ``extra`` rows; the gradebook knows nothing of them."""

    def __init__(self, course_dir: CourseDir):
        self.path = course_dir.state / "status.json"
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        self.rows: dict[tuple[str, str], str] = {tuple(k.split("\t", 1)): v for k, v in saved.get("rows", {}).items()}
        self.extra: list[tuple[str, str, str]] = [tuple(r) for r in saved.get("extra", [])]

    def save(self) -> None:
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps({"rows": {f"{s}\t{a}": v for (s, a), v in sorted(self.rows.items())},
                                       "extra": sorted(self.extra)}, indent=1), encoding="utf-8")
        os.replace(partial, self.path)
