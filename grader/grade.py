"""Grade a class: submitted notebooks -> nbgrader gradebook, grades.csv and feedback HTML.

The input is nbgrader's submitted layout, ``DIR/<student_id>/<assignment_id>/<notebook>.ipynb``.
Each submission is one unit of work (``grader.unit.grade_submission``), run by Dask
workers (``grader.parallel``): on this machine by default, on a cluster when a
scheduler is given. This module is the collector: the one process that writes the
gradebook (any SQLAlchemy URL nbgrader accepts: SQLite by default, PostgreSQL for a
large course), the autograded/ and feedback/ folders of the workspace and grades.csv.
The input folder is never written. Whatever is wrong with one submission becomes
that row's status; it never stops the batch. Folder names are the students' text:
they become ids only when valid (``submissions``), and every name and status is
escaped in the terminal table and neutralised in grades.csv (``grader.names``).
"""
from __future__ import annotations

import csv
import fcntl
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from . import course
from .names import csv_row, quoted, shown, student_id_problem
from .release import generate
from .stage import folder_problem
from .unit import Settings, course_version, grade_submission
from .verify import CourseSecret


@dataclass
class Row:
    """One student's result on one assignment: a row of grades.csv."""

    student_id: str
    assignment_id: str
    score: float
    max_score: float
    status: str
    points: dict[str, float] = field(default_factory=dict)  # exercise id -> points
    diagnoses: dict[str, str] = field(default_factory=dict)  # exercise id -> what went wrong
    feedback: list[Path] = field(default_factory=list)


@dataclass
class Workspace:
    """The folders nbgrader works in for one grading run, all under ``out/course``."""

    out: Path
    database: str | None = None  # a SQLAlchemy URL; None: course/gradebook.db (SQLite)

    @property
    def course(self) -> Path:
        return self.out / "course"

    @property
    def db_url(self) -> str:
        return self.database or f"sqlite:///{self.course / 'gradebook.db'}"

    def write_nbgrader_config(self) -> None:
        """Let nbgrader's own tools (formgrader, export, manual grading) open this workspace:
        ``cd out/grading/course && nbgrader export`` or ``jupyter lab`` there."""
        (self.course / "nbgrader_config.py").write_text(
            '"""Written by course-grader: nbgrader commands run here work on this grading workspace."""\n'
            "c = get_config()  # noqa: F821\n"
            f"load_subconfig({str(course.CONFIG_FILE)!r})  # noqa: F821 - the course's configuration\n"
            f"c.CourseDirectory.root = {str(self.course)!r}\n"
            f"c.CourseDirectory.source_directory = {str(course.SOLUTIONS)!r}\n"
            'c.CourseDirectory.release_directory = "release"\n'
            f"c.CourseDirectory.db_url = {self.db_url!r}\n", encoding="utf-8")

    def config(self):
        config = course.load_config()
        for step in ("release", "submitted", "autograded", "feedback"):
            setattr(config.CourseDirectory, f"{step}_directory", str(self.course / step))
        config.CourseDirectory.db_url = self.db_url
        return config


def configured_db_url() -> str | None:
    """The gradebook URL set in nbgrader_config.py (``c.CourseDirectory.db_url``), if any."""
    config = course.load_config()
    return config.CourseDirectory.db_url if "db_url" in config.CourseDirectory else None


def _check_gradebook(db_url: str) -> None:
    """Open the gradebook once, so that a wrong URL or an unreachable server is one clear line.

    Raises:
        RuntimeError: the URL is malformed, its driver is missing, or the database refuses.
    """
    try:
        shown = make_url(db_url).render_as_string(hide_password=True)
    except ArgumentError:
        raise RuntimeError("the gradebook URL is not a database URL "
                           "(e.g. postgresql://grader@dbhost/course)") from None
    try:
        with Gradebook(db_url):
            pass
    except (SQLAlchemyError, ImportError) as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise RuntimeError(f"cannot open the gradebook at {shown}: {reason}") from None


class Grader:
    """The collector of one grading run: it alone writes the workspace and its gradebook.

    Build it once per batch; ``record`` each unit's result, or ``grade`` one submission
    in this process. ``db_url`` (else nbgrader_config.py's, else SQLite in the
    workspace) may be any SQLAlchemy URL nbgrader accepts, e.g.
    ``postgresql://grader@dbhost/course``.

    Raises:
        RuntimeError: another grader holds this workspace, or the gradebook cannot be opened.
    """

    def __init__(self, out: Path, duedates: dict[str, str] | None = None,
                 timestamps: dict[tuple[str, str], str] | None = None, db_url: str | None = None):
        self.ws = Workspace(Path(out).resolve(), db_url or configured_db_url())
        self.ws.course.mkdir(parents=True, exist_ok=True)
        # one grader per workspace: it alone writes the gradebook
        self._lock = open(self.ws.course / ".grader.lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another grader is already working in {self.ws.out}; "
                               "wait for it to finish or use another --out") from None
        _check_gradebook(self.ws.db_url)
        self.ws.write_nbgrader_config()
        self.duedates = duedates or {}
        self.timestamps = timestamps or {}
        config = self.ws.config()
        self.secret = CourseSecret(config=config).secret()
        self._registered: set[str] = set()
        self._max: dict[str, tuple[float, dict[str, float]]] = {}

    def _register(self, assignment_id: str) -> None:
        if assignment_id not in self._registered:
            generate(self.ws.course / "release", self.ws.db_url, [assignment_id])
            with Gradebook(self.ws.db_url) as gb:
                gb.update_or_create_assignment(assignment_id, duedate=self.duedates.get(assignment_id))
            self._registered.add(assignment_id)

    def max_points(self, assignment_id: str) -> tuple[float, dict[str, float]]:
        """The assignment's total and per-exercise maximum points."""
        if assignment_id not in self._max:
            self._register(assignment_id)
            with Gradebook(self.ws.db_url) as gb:
                per = {}
                for nb in gb.find_assignment(assignment_id).notebooks:
                    for cell in nb.grade_cells:
                        per[course.exercise_id(cell.name)] = float(cell.max_score)
            self._max[assignment_id] = (sum(per.values()), per)
        return self._max[assignment_id]

    def settings(self, student_id: str, assignment_id: str) -> Settings:
        """What the unit of this submission needs besides its files."""
        return Settings(self.secret, self.duedates.get(assignment_id),
                        self.timestamps.get((student_id, assignment_id)), course_version())

    def precheck(self, submission: Path, student_id: str, assignment_id: str) -> Row | None:
        """The row of a submission that needs no worker, else None: an unknown assignment, or a
        folder that is missing, a link or not a folder (``grader.stage.folder_problem``)."""
        if assignment_id not in course.assignments():
            return Row(shown(student_id), shown(assignment_id), 0.0, 0.0,
                       f"not graded: there is no assignment {quoted(assignment_id)} in this course")
        total, per = self.max_points(assignment_id)
        problem = folder_problem(submission)
        if problem:
            return Row(student_id, assignment_id, 0.0, total, f"not graded: {problem}", dict.fromkeys(per, 0.0))
        return None

    def grade(self, submission: Path, student_id: str, assignment_id: str) -> Row:
        """Grade one student's submission of one assignment in this process; never raises for bad input."""
        return self.precheck(submission, student_id, assignment_id) or self.record(grade_submission(
            str(submission), student_id, assignment_id, self.settings(student_id, assignment_id)))

    def failed(self, student_id: str, assignment_id: str, why: str) -> Row:
        """The row of a unit that did not come back (its worker died, the grader failed)."""
        total, per = self.max_points(assignment_id)
        return Row(student_id, assignment_id, 0.0, total, f"not graded: {why}", dict.fromkeys(per, 0.0))

    def record(self, result: dict) -> Row:
        """Write one unit's result into the workspace and the gradebook; return its row.

        The gradebook gets what nbgrader's autograde wrote in the unit's own gradebook:
        the student, the submission and its timestamp, then (when it was graded) each
        grade's auto score, each autograder comment and the late penalty, these in one
        transaction. Manual
        grades are kept and override, so the row's points are read back from the
        gradebook. Recording the same result twice changes nothing.
        """
        student_id, assignment_id = result["student_id"], result["assignment_id"]
        total, per = self.max_points(assignment_id)
        snapshot = result["gradebook"]
        if snapshot is None:  # never reached nbgrader: nothing of it in the gradebook, as before
            return Row(student_id, assignment_id, 0.0, total, result["status"], dict.fromkeys(per, 0.0))
        for folder, texts, suffix in (("submitted", result["submitted"], ".ipynb"),
                                      ("autograded", result["autograded"], ".ipynb"),
                                      ("feedback", result["feedback"], ".html")):
            if texts:
                dest = self.ws.course / folder / student_id / assignment_id
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir(parents=True)
                for notebook, text in texts.items():
                    (dest / f"{notebook}{suffix}").write_text(text, encoding="utf-8")
        with Gradebook(self.ws.db_url) as gb:
            gb.update_or_create_student(student_id)
            kwargs = {"timestamp": snapshot["timestamp"]} if snapshot["timestamp"] else {}
            gb.update_or_create_submission(assignment_id, student_id, **kwargs)
            if result["graded"]:
                for name, saved in snapshot["notebooks"].items():
                    notebook = gb.find_submission_notebook(name, assignment_id, student_id)
                    notebook.late_submission_penalty = saved["late_submission_penalty"]
                    for grade in notebook.grades:
                        grade.auto_score, needs_manual = saved["grades"][grade.name]
                        # as SaveVerifiedGrades decides it, with this gradebook's manual score
                        grade.needs_manual_grade = needs_manual or grade.manual_score is not None
                    for comment in notebook.comments:
                        comment.auto_comment = saved["comments"][comment.name]
                gb.db.commit()
            points = dict.fromkeys(per, 0.0)
            for name in snapshot["notebooks"]:
                for grade in gb.find_submission_notebook(name, assignment_id, student_id).grades:
                    points[course.exercise_id(grade.name)] = float(grade.score)
        if not result["graded"]:
            return Row(student_id, assignment_id, 0.0, total, result["status"], dict.fromkeys(per, 0.0))
        feedback_dir = self.ws.course / "feedback" / student_id / assignment_id
        return Row(student_id, assignment_id, max(0.0, sum(points.values()) - result["penalty"]), total,
                   result["status"], points, result["diagnoses"], sorted(feedback_dir.glob("*.html")))


def submissions(class_dir: Path, roster=None) -> list[tuple[str, str, Path, str | None]]:
    """Every row of a class folder: (student_id, assignment_id, folder, problem).

    ``problem`` is None for a submission to grade (its folder may be missing: the row
    then says "no submission"), else the row's whole status. A folder of
    ``class_dir`` is a student's when its name is a valid student id: on ``roster``
    (student ids) when one is given, else by the rule of ``grader.names``; any other
    folder is one row, (its escaped name, "", problem). Every student gets a row for
    every course assignment (``grader.course.assignments()``) that a valid student
    submitted, so that a missing folder shows as a row, not as silence, and so does
    every student of the roster. A folder in a student's folder that is not a course
    assignment is one row for that student alone. Nothing is followed: a student folder
    that is a link gets its rows, which staging refuses; its contents are not listed.
    Hidden names and plain files are skipped. Sorted by student, then assignment.
    """
    known = set(course.assignments())
    roster = set(roster) if roster is not None else None
    own: dict[str, list[tuple[str, str, Path, str | None]]] = {}  # valid student -> own odd rows
    odd: list[tuple[str, tuple]] = []  # (sort key, row) of folders that are not students
    submitted: set[str] = set()
    with os.scandir(class_dir) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    for entry in entries:
        try:
            if entry.name.startswith(".") or not entry.is_dir():  # a link to a folder counts, below
                continue
        except OSError:
            continue
        why = student_id_problem(entry.name, roster)
        if why:
            odd.append((entry.name, (shown(entry.name), "", Path(entry.path),
                                     f"not graded: the folder {quoted(entry.name)} {why}")))
            continue
        own[entry.name] = []
        for name in ([] if entry.is_symlink() else _folders(Path(entry.path))):
            if name in known:
                submitted.add(name)
            else:
                own[entry.name].append((entry.name, shown(name), Path(entry.path),
                                        f"not graded: there is no assignment {quoted(name)} in this course"))
    for student in roster or ():
        if "/" not in student and student not in ("", ".", ".."):  # an id names folders
            own.setdefault(student, [])
    rows = [(student, (student, a, class_dir / student / a, None)) for student in own for a in sorted(submitted)]
    rows += [(student, row) for student, extra in own.items() for row in extra] + odd
    return [row for _, row in sorted(rows, key=lambda r: (r[0], r[1][1]))]


def _folders(student_dir: Path) -> list[str]:
    """The names in a student folder that may be assignment folders (folders, links, odd
    files; not plain files nor hidden names), listed without following a link."""
    try:
        fd = os.open(student_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with os.scandir(fd) as listing:
            return sorted(e.name for e in listing if not e.name.startswith(".") and not e.is_file(follow_symlinks=False))
    finally:
        os.close(fd)


def read_timestamps(path: Path) -> dict[tuple[str, str], str]:
    """The instructor's submission times: a CSV with student_id, assignment_id, timestamp."""
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["student_id"], r["assignment_id"]): r["timestamp"] for r in csv.DictReader(f)}


def grade_class(class_dir: Path, out: Path, progress: bool = True, duedates: dict[str, str] | None = None,
                timestamps: dict[tuple[str, str], str] | None = None, jobs: int | None = None,
                scheduler: str | None = None, db_url: str | None = None, roster=None) -> list[Row]:
    """Grade every submission in ``class_dir``; write ``out/grades.csv``; return the rows.

    ``duedates`` maps assignment ids to due dates and ``timestamps`` (student_id,
    assignment_id) to submission times, both as nbgrader accepts them
    ("2026-12-01 23:59:00 UTC"); students' own timestamp.txt files are not trusted.
    ``jobs`` local worker processes grade at once (default: one per core), or the
    Dask scheduler at ``scheduler`` ("tcp://host:8786", "tls://...") runs the units on
    its workers. ``db_url``: the gradebook (see ``Grader``). ``roster``: the student ids
    of the class (e.g. ``grader.lms.read_roster``'s keys); a folder not on it is one
    row with its status, and a student on it without a folder gets "no submission"
    rows. Without a roster, ids must follow ``grader.names``' rule. A folder that is
    not a valid student id or assignment is one row for that folder alone (see
    ``submissions``). Running it again after an interruption regrades and ends with
    the same grades.

    Raises:
        FileNotFoundError: ``class_dir`` is not a folder.
        RuntimeError: another grader holds ``out``.
        grader.parallel.EngineUnavailable: the scheduler cannot be reached.
    """
    from .parallel import Unit, run
    from .stage import read_files

    class_dir = Path(class_dir)
    if not class_dir.is_dir():
        raise FileNotFoundError(f"no submissions folder at {class_dir}")
    grader = Grader(out, duedates, timestamps, db_url)
    todo = submissions(class_dir, roster)
    rows: dict[tuple[str, str], Row] = {}
    odd: dict[int, Row] = {}  # rows of folders that are not submissions; escaped names may coincide
    units = []
    for n, (student, assignment, folder, problem) in enumerate(todo):
        if problem:
            odd[n] = Row(student, assignment, 0.0, 0.0, problem)
            continue
        row = grader.precheck(folder, student, assignment)
        if row:
            rows[(student, assignment)] = row
        else:  # a worker on another machine gets the files, a local one their path
            files = ((lambda folder=folder, names=course.notebook_names(assignment): read_files(folder, names))
                     if scheduler else str(folder))
            units.append(Unit(student, assignment, files, grader.settings(student, assignment)))
    for unit, outcome in run(units, jobs=jobs, scheduler=scheduler, progress=progress):
        key = (unit.student_id, unit.assignment_id)
        if key in rows:  # recorded already: a result is written once
            continue
        rows[key] = (grader.failed(*key, outcome) if isinstance(outcome, str) else grader.record(outcome))
    ordered = [odd[n] if n in odd else rows[(student, assignment)] for n, (student, assignment, _, _) in enumerate(todo)]
    write_csv(ordered, Path(out) / "grades.csv")
    return ordered


def write_csv(rows: list[Row], path: Path) -> None:
    """grades.csv: student_id, assignment_id, score, max_score, status, one column per exercise.

    Written to ``path.partial`` first, then moved over ``path``. Text cells are escaped
    and neutralised against formulas (``grader.names.csv_cell``); scores stay numbers.
    """
    exercises = sorted({e for r in rows for e in r.points})
    partial = path.with_name(path.name + ".partial")  # a kill mid-write leaves the old file whole
    with open(partial, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(csv_row(["student_id", "assignment_id", "score", "max_score", "status", *exercises]))
        for r in rows:
            writer.writerow(csv_row([r.student_id, r.assignment_id, float(r.score), float(r.max_score), r.status,
                                     *(float(r.points[e]) if e in r.points else None for e in exercises)]))
    os.replace(partial, path)


def format_table(rows: list[Row]) -> str:
    """The grade table as aligned text, for the terminal: every cell escaped (``grader.names.shown``)."""
    header = ["student", "assignment", "score", "status"]
    lines = [[shown(r.student_id), shown(r.assignment_id), f"{r.score:g}/{r.max_score:g}", shown(r.status)]
             for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join(fmt.format(*line) for line in [header, *lines])
