"""Grade a class: the course directory's submitted/ -> gradebook, autograded/, feedback/, grades.csv.

The input is nbgrader's submitted layout, ``submitted/<student_id>/<assignment_id>/<notebook>.ipynb``
of the instructor's nbgrader course directory (``grader.coursedir``), as ``nbgrader
collect`` leaves it. Each submission is one unit of work
(``grader.unit.grade_submission``), run by Dask workers (``grader.parallel``): on this
machine by default, on a cluster when a scheduler is given. This module is the
collector: the one process that writes the gradebook (any SQLAlchemy URL nbgrader
accepts: SQLite by default, PostgreSQL for a large course) and the course directory's
autograded/ and feedback/, as nbgrader's autograde and generate_feedback would, so
formgrader and nbgrader's commands work on the same folders and agree. grades.csv is
then written anew from the whole gradebook (``grader.gradetable``). submitted/ is never
written. Whatever is wrong with one submission becomes that row's status; it never
stops the batch. Folder names are the students' text: they become ids only when valid
(``submissions``), and every name and status is escaped in the terminal table and
neutralised in grades.csv (``grader.names``).
"""
from __future__ import annotations

import csv
import datetime
import fcntl
import logging
import os
import shutil
import time
import warnings
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import AssignLatePenalties
from nbgrader.utils import parse_utc
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from . import course
from .coursedir import CourseBusy, CourseDir, Statuses, undone_if_new
from .exchange import read_submission_times
from .gradetable import Row, export, write_csv  # noqa: F401 - Row and write_csv are part of this API
from .names import quoted, shown, student_id_problem
from .release import generate, nbgrader_api
from .stage import folder_problem
from .unit import Settings, course_version, grade_submission
from .verify import CourseSecret

log = logging.getLogger(__name__)


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


def _utc(text: str, what: str) -> datetime.datetime:
    try:
        return parse_utc(text)
    except (ValueError, OverflowError, TypeError):
        raise RuntimeError(f"{what}: {shown(repr(text))} is not a date and time "
                           '(e.g. "2026-12-01 23:59:00 UTC")') from None


def parse_duedates(values: list[str]) -> dict[str, str]:
    """Due dates as given to ``--duedate`` (and make's DUEDATE): each value holds one or more
    ASSIGNMENT=DATE pairs, separated by spaces ("03_masking=2026-12-01 23:59 UTC
    04_softmax=2026-12-08T23:59Z"): a word with "=" starts a pair, the words after it up to
    the next such word are its date (an assignment id has no space, a date no "=").

    Raises:
        RuntimeError: a value does not start with ASSIGNMENT=, an assignment is not one of the
            course's, is given two dates, or a date cannot be read; the message says which.
    """
    pairs: list[list[str]] = []
    for value in values:
        words = value.split()
        if not words or "=" not in words[0]:
            raise RuntimeError(f"--duedate wants ASSIGNMENT=DATE, got {shown(repr(value))}")
        for word in words:
            if "=" in word:
                pairs.append(word.split("=", 1))
            else:
                pairs[-1][1] += " " + word
    duedates: dict[str, str] = {}
    for assignment, date in pairs:
        if assignment not in course.assignments():
            raise RuntimeError(f"--duedate: there is no assignment {quoted(assignment)} in this course "
                               f"({', '.join(course.assignments())})")
        _utc(date, f"the due date of {assignment}")
        if duedates.setdefault(assignment, date) != date:
            raise RuntimeError(f"--duedate gives {assignment} two due dates ({shown(repr(duedates[assignment]))} "
                               f"and {shown(repr(date))}): give one")
    return duedates


def _late_penalties(gb: Gradebook, assigner: AssignLatePenalties, assignment_id: str, student_id: str) -> None:
    """Each notebook's late penalty, as nbgrader's AssignLatePenalties computes it (the
    course's plugin and penalty method), from the gradebook's scores, manual grades
    included, and the student's due date, extension included."""
    submission = gb.find_submission(assignment_id, student_id)
    for notebook in submission.notebooks:
        notebook.late_submission_penalty = None
        if submission.total_seconds_late > 0:
            penalty = assigner.plugin_inst.late_submission_penalty(student_id, notebook.score,
                                                                   submission.total_seconds_late)
            if penalty is not None:
                notebook.late_submission_penalty = assigner._check_late_penalty(notebook, penalty)


def _has_manual(gb: Gradebook, assignment_id: str, student_id: str) -> bool:
    submission = gb.find_submission(assignment_id, student_id)
    return any(g.manual_score is not None for nb in submission.notebooks for g in nb.grades) or any(
        c.manual_comment for nb in submission.notebooks for c in nb.comments)


class Grader:
    """The collector of one grading run: it alone writes the course directory while it runs.

    It writes what nbgrader's autograde and generate_feedback would write in the course
    directory (``grader.coursedir``): autograded/ and feedback/ of each submission, and the
    gradebook. ``duedates`` (assignment id -> date) are set as the assignments' due
    dates in the gradebook; without one, the gradebook's due date stands.
    ``extensions`` ((student, assignment) -> that student's due date) become nbgrader's
    extensions. Submission times are what ``nbgrader collect`` recorded in
    submission_times.csv (``grader.exchange``), or ``timestamps`` where given (the
    instructor's override, e.g. from an LMS); a student's own timestamp.txt never.

    Raises:
        grader.coursedir.CourseBusy: another grader holds this course directory.
        RuntimeError: the gradebook cannot be opened, or a due date or extension cannot be
            used (an extension needs its assignment's due date).
    """

    def __init__(self, course_dir: CourseDir | Path | str | None = None, duedates: dict[str, str] | None = None,
                 timestamps: dict[tuple[str, str], str] | None = None,
                 extensions: dict[tuple[str, str], str] | None = None):
        # every date is read before anything is written
        self.duedates = {a: _utc(d, f"the due date of {a}") for a, d in (duedates or {}).items()}
        self.extensions = {k: _utc(d, f"the extension of {k[0]} on {k[1]}") for k, d in (extensions or {}).items()}
        self.course = course_dir if isinstance(course_dir, CourseDir) else CourseDir.open(course_dir)
        self.db_url = self.course.db_url
        # one grader per course directory: it alone writes the gradebook
        self._lock = open(self.course.state / "lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CourseBusy(f"another grader is already working in {shown(self.course.root)}; "
                               "wait for it to finish") from None
        _check_gradebook(self.db_url)
        self._check_extensions()
        self.timestamps = {**read_submission_times(self.course.root), **(timestamps or {})}  # yours win
        self.secret = CourseSecret(config=self.course.config).secret()
        self.statuses = Statuses(self.course)
        self._penalties = AssignLatePenalties(config=self.course.config)  # the course's plugin, made once
        self._penalties.init_plugin()
        self._registered: set[str] = set()
        self._max: dict[str, tuple[float, dict[str, float]]] = {}

    def _check_extensions(self) -> None:
        """Every extension is for an assignment of the course that has a due date, given to
        this run or in the gradebook: checked before any assignment is generated.

        Raises:
            RuntimeError: an extension's assignment is unknown or has no due date.
        """
        for student, assignment_id in sorted(self.extensions):
            if assignment_id not in course.assignments():
                raise RuntimeError(f"an extension for {shown(student)} on {quoted(assignment_id)}, which is not an "
                                   f"assignment of this course ({', '.join(course.assignments())})")
            if assignment_id in self.duedates:
                continue
            with Gradebook(self.db_url) as gb:
                try:
                    due = gb.find_assignment(assignment_id).duedate
                except MissingEntry:
                    due = None
            if due is None:
                raise RuntimeError(f"an extension for {shown(student)} on {assignment_id}, which has no due date: "
                                   f"give one (--duedate {assignment_id}=..., make grade DUEDATE=\"{assignment_id}=...\")")

    def _register(self, assignment_id: str) -> None:
        """Generate the assignment into the course's release/ and register it in the gradebook,
        as ``nbgrader generate_assignment`` does; set a due date given to this run."""
        if assignment_id not in self._registered:
            generate(self.course.folder("release"), self.db_url, [assignment_id])
            with Gradebook(self.db_url) as gb:
                if assignment_id in self.duedates:
                    gb.update_or_create_assignment(assignment_id, duedate=self.duedates[assignment_id])
                for (student, assignment), duedate in self.extensions.items():
                    if assignment == assignment_id:
                        self._extend(gb, student, assignment, duedate)
            self._registered.add(assignment_id)

    @staticmethod
    def _extend(gb: Gradebook, student_id: str, assignment_id: str, duedate: datetime.datetime) -> None:
        assignment = gb.find_assignment(assignment_id)  # it has a due date (_check_extensions)
        gb.update_or_create_student(student_id)
        submission = gb.update_or_create_submission(assignment_id, student_id)
        submission.extension = duedate - assignment.duedate if duedate > assignment.duedate else None
        gb.db.commit()

    def max_points(self, assignment_id: str) -> tuple[float, dict[str, float]]:
        """The assignment's total and per-exercise maximum points."""
        if assignment_id not in self._max:
            self._register(assignment_id)
            with Gradebook(self.db_url) as gb:
                per = {}
                for nb in gb.find_assignment(assignment_id).notebooks:
                    for cell in nb.grade_cells:
                        per[course.exercise_id(cell.name)] = float(cell.max_score)
            self._max[assignment_id] = (sum(per.values()), per)
        return self._max[assignment_id]

    def duedate(self, student_id: str, assignment_id: str) -> str | None:
        """The student's due date in the gradebook (the assignment's, or their extension's)."""
        self._register(assignment_id)
        with Gradebook(self.db_url) as gb:
            try:
                due = gb.find_submission(assignment_id, student_id).duedate
            except MissingEntry:
                due = gb.find_assignment(assignment_id).duedate
        return f"{due.isoformat()} UTC" if due else None

    def settings(self, student_id: str, assignment_id: str) -> Settings:
        """What the unit of this submission needs besides its files."""
        return Settings(self.secret, self.duedate(student_id, assignment_id),
                        self.timestamps.get((student_id, assignment_id)), course_version())

    def precheck(self, submission: Path, student_id: str, assignment_id: str) -> Row | None:
        """The row of a submission that needs no worker, else None: an unknown assignment, or a
        folder that is missing, a link or not a folder (``grader.stage.folder_problem``)."""
        if assignment_id not in course.assignments():
            return Row(shown(student_id), shown(assignment_id), 0.0, 0.0,
                       f"not graded: there is no assignment {quoted(assignment_id)} in this course")
        self.max_points(assignment_id)
        problem = folder_problem(submission)
        if problem:
            return self._ungraded(student_id, assignment_id, f"not graded: {problem}")
        return None

    def grade(self, submission: Path, student_id: str, assignment_id: str) -> Row:
        """Grade one student's submission of one assignment in this process; never raises for bad input."""
        row = self.precheck(submission, student_id, assignment_id) or self.record(grade_submission(
            str(submission), student_id, assignment_id, self.settings(student_id, assignment_id)))
        self.statuses.save()
        return row

    def failed(self, student_id: str, assignment_id: str, why: str) -> Row:
        """The row of a unit that did not come back (its worker died, the grader failed)."""
        return self._ungraded(student_id, assignment_id, f"not graded: {why}")

    def _ungraded(self, student_id: str, assignment_id: str, status: str) -> Row:
        """The row of a submission that was not graded now. The student is put in the
        gradebook (nbgrader's export lists them); a submission graded before keeps its grades."""
        self.max_points(assignment_id)
        with Gradebook(self.db_url) as gb:
            gb.update_or_create_student(student_id)
        self.statuses.rows[(student_id, assignment_id)] = status
        return self._row(student_id, assignment_id)

    def _row(self, student_id: str, assignment_id: str, diagnoses: dict[str, str] | None = None) -> Row:
        """The row as the gradebook has it now (manual grades and the late penalty included),
        with its status: what grades.csv and nbgrader's export say of it."""
        total, per = self.max_points(assignment_id)
        points, penalty = dict.fromkeys(per, 0.0), 0.0
        with Gradebook(self.db_url) as gb:
            try:
                notebooks = gb.find_submission(assignment_id, student_id).notebooks
            except MissingEntry:
                notebooks = []
            for notebook in notebooks:
                penalty += float(notebook.late_submission_penalty or 0.0)
                for grade in notebook.grades:
                    points[course.exercise_id(grade.name)] = float(grade.score or 0.0)
        feedback = sorted((self.course.folder("feedback") / student_id / assignment_id).glob("*.html"))
        return Row(student_id, assignment_id, max(0.0, sum(points.values()) - penalty), total,
                   self.statuses.rows[(student_id, assignment_id)], points, diagnoses or {}, feedback)

    def _write(self, step: str, student_id: str, assignment_id: str, texts: dict[str, str], suffix: str,
               keys: dict[str, str]) -> Path:
        dest = self.course.folder(step) / student_id / assignment_id
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for notebook, text in texts.items():
            (dest / f"{notebook}{suffix}").write_text(text, encoding="utf-8")
        for name, text in keys.items():  # nbgrader's release_feedback reads both
            (dest / name).write_text(text, encoding="utf-8")
        return dest

    def record(self, result: dict) -> Row:
        """Write one unit's result into the course directory and the gradebook; return its row.

        The gradebook gets what nbgrader's autograde wrote in the unit's own gradebook:
        the student, the submission and its timestamp, then (when it was graded) each
        grade's auto score and each autograder comment, in one transaction, and the late
        penalty computed here, from the gradebook's scores. A manual grade or comment
        stays and counts, and a cell graded by hand is not flagged for grading again;
        the feedback of a submission with one is generated here by nbgrader from the
        gradebook, so it shows them. The row's points are read back from the gradebook.
        Recording the same result twice changes nothing.
        """
        student_id, assignment_id = result["student_id"], result["assignment_id"]
        self.max_points(assignment_id)
        snapshot = result["gradebook"]
        if snapshot is None:  # never reached nbgrader: a grade recorded before stands
            return self._ungraded(student_id, assignment_id, result["status"])
        keys = result.get("keys", {})
        if result["autograded"]:
            self._write("autograded", student_id, assignment_id, result["autograded"], ".ipynb", keys)
        with Gradebook(self.db_url) as gb:
            gb.update_or_create_student(student_id)
            kwargs = {"timestamp": snapshot["timestamp"]} if snapshot["timestamp"] else {}
            submission = gb.update_or_create_submission(assignment_id, student_id, **kwargs)
            if not snapshot["timestamp"]:
                submission.timestamp = None
            # the latest submission's grades, also when it could not be graded (no auto
            # score: formgrader then flags it), the late penalty from them
            for name, saved in snapshot["notebooks"].items():
                notebook = gb.find_submission_notebook(name, assignment_id, student_id)
                for grade in notebook.grades:
                    grade.auto_score, needs_manual = saved["grades"].get(grade.name, (None, True))
                    grade.needs_manual_grade = needs_manual and grade.manual_score is None
                for comment in notebook.comments:
                    comment.auto_comment = saved["comments"].get(comment.name)
            _late_penalties(gb, self._penalties, assignment_id, student_id)
            gb.db.commit()
            manual = _has_manual(gb, assignment_id, student_id)
        self.statuses.rows[(student_id, assignment_id)] = result["status"]
        if result["graded"] and manual:
            feedback_dir = self.course.folder("feedback") / student_id / assignment_id
            shutil.rmtree(feedback_dir, ignore_errors=True)
            with warnings.catch_warnings():  # nbgrader 0.9.6 warns on every run (SQLAlchemy, cell ids)
                warnings.simplefilter("ignore")
                made = nbgrader_api(self.course.config).generate_feedback(assignment_id, student_id, force=True)
            if not made["success"]:
                self.statuses.rows[(student_id, assignment_id)] += "; the feedback could not be generated"
        elif result["graded"] and result["feedback"]:
            self._write("feedback", student_id, assignment_id, result["feedback"], ".html", keys)
        return self._row(student_id, assignment_id, result["diagnoses"] if result["graded"] else None)


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


def _read_csv(path: Path, value: str) -> dict[tuple[str, str], str]:
    """(student_id, assignment_id) -> the ``value`` column of an instructor's CSV.

    Raises:
        RuntimeError: the file cannot be read or lacks a column; the message says which.
    """
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = {"student_id", "assignment_id", value} - set(reader.fieldnames or [])
            if missing:
                raise RuntimeError(f"{shown(path)} has no {', '.join(sorted(missing))} column: its header must be "
                                   f"student_id,assignment_id,{value}")
            return {(r["student_id"], r["assignment_id"]): r[value] for r in reader}
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise RuntimeError(f"cannot read {shown(path)}: {shown(error)}") from None


def read_timestamps(path: Path) -> dict[tuple[str, str], str]:
    """Submission times you trust: a CSV with student_id, assignment_id, timestamp (the
    format of submission_times.csv, which ``nbgrader collect`` writes)."""
    return _read_csv(path, "timestamp")


def read_extensions(path: Path) -> dict[tuple[str, str], str]:
    """Per-student due dates: a CSV with student_id, assignment_id, duedate."""
    return _read_csv(path, "duedate")


def grade_class(course_dir: CourseDir | Path | str | None = None, *, assignments: list[str] | None = None,
                students: list[str] | None = None, progress: bool = True,
                duedates: dict[str, str] | None = None, timestamps: dict[tuple[str, str], str] | None = None,
                extensions: dict[tuple[str, str], str] | None = None, jobs: int | None = None,
                scheduler: str | None = None, db_url: str | None = None, submitted: Path | str | None = None,
                roster=None) -> list[Row]:
    """Grade the submissions in the course directory's submitted/; return this run's rows.

    ``course_dir`` is the nbgrader course directory (``grader.coursedir``; default: the
    one nbgrader_config.py names): its submitted/ is read as ``nbgrader collect`` left
    it and never written; autograded/, feedback/ and the gradebook are written; then
    ``grades.csv`` is written anew as an export of the whole gradebook. ``assignments``
    and ``students``, when given, grade only those: every other row stays as it was.

    ``duedates`` (assignment id -> date) become the assignments' due dates in the
    gradebook; ``extensions`` ((student, assignment) -> date) that student's due date
    (nbgrader's extension); ``timestamps`` ((student, assignment) -> time) override the
    submission times collect recorded. Dates as nbgrader reads them
    ("2026-12-01 23:59:00 UTC"). ``jobs`` local worker processes grade at once (default:
    one per core), or the Dask scheduler at ``scheduler`` ("tcp://host:8786",
    "tls://...") runs the units on its workers. ``db_url`` and ``submitted``: the
    gradebook and the submitted folder of a new course directory (an existing one keeps
    its own; ``grader.coursedir.CourseDir.open``). ``roster``: the student ids of
    the class (e.g. ``grader.lms.read_roster``'s keys); a folder not on it is one row
    with its status, and a student on it without a folder gets "no submission" rows.
    Without a roster, ids must follow ``grader.names``' rule. A folder that is not a
    valid student id or assignment is one row for that folder alone (see
    ``submissions``). Running it again after an interruption regrades and ends with
    the same grades. Dates and extensions are checked before anything is written, and a
    run that fails in a folder that was not a course directory yet leaves it as it was
    (``grader.coursedir.undone_if_new``).

    Raises:
        FileNotFoundError: the course directory has no submitted/ folder.
        RuntimeError: another grader holds the course directory, it cannot be used, or a due
            date or extension cannot be used (an extension needs the assignment's due date).
        grader.parallel.EngineUnavailable: the scheduler cannot be reached.
    """
    if isinstance(course_dir, CourseDir):
        return _grade_class(course_dir, assignments, students, progress, duedates, timestamps, extensions, jobs,
                            scheduler, roster)
    with undone_if_new(course_dir):  # a failed first run leaves no half-made course directory
        return _grade_class(CourseDir.open(course_dir, db_url, submitted), assignments, students, progress,
                            duedates, timestamps, extensions, jobs, scheduler, roster)


def _grade_class(course_dir: CourseDir, assignments, students, progress, duedates, timestamps, extensions, jobs,
                 scheduler, roster) -> list[Row]:
    from .parallel import Unit, run
    from .stage import read_files

    class_dir = course_dir.folder("submitted")
    if not class_dir.is_dir():
        raise FileNotFoundError(f"no submissions at {shown(class_dir)}: collect them first "
                                "(nbgrader collect ASSIGNMENT, or formgrader's Collect button)")
    grader = Grader(course_dir, duedates, timestamps, extensions)
    todo = _chosen(submissions(class_dir, roster), class_dir, assignments, students)
    rows: dict[tuple[str, str], Row] = {}
    odd: dict[int, Row] = {}  # rows of folders that are not submissions; escaped names may coincide

    def units():  # read by run() as the workers start: these checks overlap the first units
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
                yield Unit(student, assignment, files, grader.settings(student, assignment))

    for unit, outcome in run(units(), jobs=jobs, scheduler=scheduler, progress=progress):
        key = (unit.student_id, unit.assignment_id)
        if key in rows:  # recorded already: a result is written once
            continue
        received = time.time()
        rows[key] = (grader.failed(*key, outcome) if isinstance(outcome, str) else grader.record(outcome))
        grader.statuses.save()
        # the run's timeline (bench/throughput.py --timeline)
        log.debug("recorded %s/%s", *key, extra={"unit": key, "received": received, "recorded": time.time(),
                                                  "ran": {} if isinstance(outcome, str) else outcome.get("ran", {})})
    # a whole run lists every odd folder anew; a chosen run keeps the others' rows
    kept = [] if not (students or assignments) else [
        r for r in grader.statuses.extra if not students or r[0] not in students]
    grader.statuses.extra = kept + [(r.student_id, r.assignment_id, r.status) for r in odd.values()]
    grader.statuses.save()
    write_csv(export(course_dir, grader.statuses), course_dir.grades_csv)
    return [odd[n] if n in odd else rows[(student, assignment)] for n, (student, assignment, _, _) in enumerate(todo)]


def _chosen(todo: list, class_dir: Path, assignments: list[str] | None, students: list[str] | None) -> list:
    """The rows of ``submissions`` that a run for these assignments and students grades;
    a chosen student without a folder gets rows that say "no submission"."""
    if assignments:
        todo = [t for t in todo if t[1] in assignments]
    if not students:
        return todo
    todo = [t for t in todo if t[0] in students]
    seen = {t[0] for t in todo}
    for student in students:
        if student not in seen and not student_id_problem(student, None):
            todo += [(student, a, class_dir / student / a, None) for a in (assignments or course.assignments())]
    return sorted(todo, key=lambda t: (t[0], t[1]))


def format_table(rows: list[Row]) -> str:
    """The grade table as aligned text, for the terminal: every cell escaped (``grader.names.shown``)."""
    header = ["student", "assignment", "score", "status"]
    lines = [[shown(r.student_id), shown(r.assignment_id), f"{r.score:g}/{r.max_score:g}", shown(r.status)]
             for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join(fmt.format(*line) for line in [header, *lines])
