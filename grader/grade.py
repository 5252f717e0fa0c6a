"""Grade a class: submitted notebooks -> nbgrader gradebook, grades.csv and feedback HTML.

The input is nbgrader's submitted layout, ``DIR/<student_id>/<assignment_id>/<notebook>.ipynb``.
Each submission is checked and copied into a private workspace (the input folder is
never written), autograded by nbgrader, and its feedback generated. Whatever is wrong
with one submission becomes that row's status; it never stops the batch.
"""
from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook
from tqdm import tqdm

from . import course
from .feedback import is_test_cell, verdict_of
from .release import generate, nbgrader_api

MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024
MAX_EXTRA_BYTES = 20 * 1024 * 1024


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


class BadSubmission(Exception):
    """A submission that cannot be graded; the message is the row's status."""


@dataclass
class Workspace:
    """The folders nbgrader works in for one grading run, all under ``out/course``."""

    out: Path

    @property
    def course(self) -> Path:
        return self.out / "course"

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.course / 'gradebook.db'}"

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


def _read_notebook(path: Path) -> tuple[nbformat.NotebookNode, int]:
    """Parse a submitted notebook as nbformat 4, or say in one line what is wrong with it.

    Returns the notebook and the nbformat major version it was saved in.
    """
    size = path.stat().st_size
    if size == 0:
        raise BadSubmission(f"'{path.name}' is an empty file: save the notebook in Jupyter and resubmit")
    if size > MAX_NOTEBOOK_BYTES:
        raise BadSubmission(f"'{path.name}' is {size / 2**20:.0f} MB, over the "
                            f"{MAX_NOTEBOOK_BYTES // 2**20} MB limit: clear all outputs and resubmit")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise BadSubmission(f"'{path.name}' is not UTF-8 text: resubmit the .ipynb file Jupyter saved") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadSubmission(f"'{path.name}' is not valid notebook JSON (line {error.lineno}, column "
                            f"{error.colno}): open it in Jupyter, save it, and resubmit") from None
    if not isinstance(raw, dict) or "cells" not in raw and "worksheets" not in raw:
        raise BadSubmission(f"'{path.name}' is JSON but not a notebook: resubmit the .ipynb file")
    try:
        return nbformat.reads(text, as_version=4), raw.get("nbformat", 4)
    except Exception as error:  # nbformat raises several kinds for broken notebooks
        raise BadSubmission(f"'{path.name}' is not a valid notebook ({type(error).__name__}): "
                            "open it in Jupyter, save it, and resubmit") from None


def _dedupe_grade_ids(nb: nbformat.NotebookNode) -> list[str]:
    """Make copied cells ordinary cells: nbgrader aborts on a grade id seen twice.

    The first cell with a grade id keeps it; later copies lose their nbgrader
    metadata and still run. Returns the grade ids that were duplicated.
    """
    seen, copied = set(), []
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id is None:
            continue
        if grade_id in seen:
            del cell.metadata["nbgrader"]
            copied.append(grade_id)
        seen.add(grade_id)
    return sorted(set(copied))


def _restore_metadata(nb: nbformat.NotebookNode, released: Path) -> int:
    """Give back nbgrader metadata that a tool or a copy stripped, matching cells by id.

    The released notebook's cells carry ids; a cell that kept its id but lost its
    nbgrader metadata gets the released cell's. Returns how many cells were restored.
    """
    if not released.is_file():
        return 0
    known = {c.get("id"): c.metadata["nbgrader"] for c in nbformat.read(released, as_version=4).cells
             if "nbgrader" in c.get("metadata", {})}
    restored = 0
    for cell in nb.cells:
        if "nbgrader" not in cell.get("metadata", {}) and cell.get("id") in known:
            cell.metadata["nbgrader"] = dict(known[cell["id"]])
            restored += 1
    return restored


def _stage(source: Path, dest: Path, notebooks: list[str], timestamp: str | None) -> str:
    """Copy one submission into the workspace; return a note on what was fixed up.

    In a one-notebook assignment, a lone notebook under another name is graded as the
    expected one (students rename and copy files). Copied cells lose their grade ids.
    Other files are copied up to ``MAX_EXTRA_BYTES`` each. The student's own
    timestamp.txt is never used: ``timestamp`` is the instructor's record, if any.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    notes, used = [], set()
    for notebook in notebooks:
        found = source / f"{notebook}.ipynb"
        if not found.is_file():
            candidates = sorted(p for p in source.glob("*.ipynb") if p.is_file())
            if len(candidates) != 1 or len(notebooks) != 1:
                names = ", ".join(p.name for p in candidates) or "no notebook"
                raise BadSubmission(f"'{notebook}.ipynb' is missing (found {names}): "
                                    "submit the notebook under its original name")
            found = candidates[0]
            notes.append(f"graded '{found.name}' as '{notebook}.ipynb' (renamed)")
        used.add(found.name)
        nb, version = _read_notebook(found)
        if version != 4:
            notes.append(f"converted from nbformat {version}")
        restored = _restore_metadata(nb, course.NOTEBOOKS / dest.name / f"{notebook}.ipynb")
        if restored:
            notes.append(f"restored the nbgrader metadata of {restored} cells")
        copied = _dedupe_grade_ids(nb)
        if copied:
            notes.append(f"copied cells ({', '.join(copied)}) were run as ordinary cells")
        nbformat.write(nb, dest / f"{notebook}.ipynb")
    skipped = []
    for extra in sorted(source.iterdir()):
        if extra.name in used or extra.suffix == ".ipynb" or extra.name == "timestamp.txt" \
                or extra.name.startswith(".") or not extra.is_file() or extra.is_symlink():
            continue
        if extra.stat().st_size > MAX_EXTRA_BYTES:
            skipped.append(f"{extra.name} ({extra.stat().st_size / 2**20:.0f} MB)")
        else:
            shutil.copyfile(extra, dest / extra.name)
    if skipped:
        notes.append(f"left out files over {MAX_EXTRA_BYTES // 2**20} MB: {', '.join(skipped)}")
    if timestamp:
        (dest / "timestamp.txt").write_text(timestamp + "\n", encoding="utf-8")
    return "; ".join(notes)


def _collect(ws: Workspace, student_id: str, assignment_id: str, notebook: str,
             limits: str) -> tuple[dict[str, float], dict[str, str]]:
    """Points per exercise from the gradebook, diagnoses from the autograded notebook."""
    points: dict[str, float] = {}
    with Gradebook(ws.db_url) as gb:
        for grade in gb.find_submission_notebook(notebook, assignment_id, student_id).grades:
            points[course.exercise_id(grade.name)] = float(grade.score)
    graded = ws.course / "autograded" / student_id / assignment_id / f"{notebook}.ipynb"
    diagnoses = {}
    for cell in nbformat.read(graded, as_version=4).cells:
        verdict = verdict_of(cell) if is_test_cell(cell) else None
        if verdict and not verdict["passed"]:
            message = verdict["diagnosis"]
            if message.startswith("stopped at the time limit"):
                message = message.replace("stopped at the time limit", f"stopped at the time limit{limits}", 1)
            diagnoses[verdict["exercise"]] = message
    return points, diagnoses


def _status(note: str, diagnoses: dict[str, str]) -> str:
    parts = [note] if note else []
    timed_out = [e for e, d in diagnoses.items() if d.startswith("stopped at")]
    if timed_out:
        parts.append(f"a cell was stopped at the time limit ({', '.join(timed_out)})")
    return "graded" + (": " + "; ".join(parts) if parts else "")


class Grader:
    """Grades submissions into one workspace; build it once per batch."""

    def __init__(self, out: Path, duedates: dict[str, str] | None = None,
                 timestamps: dict[tuple[str, str], str] | None = None):
        self.ws = Workspace(Path(out).resolve())
        self.ws.course.mkdir(parents=True, exist_ok=True)
        self.ws.write_nbgrader_config()
        # one grader per workspace: it alone writes the gradebook
        self._lock = open(self.ws.course / ".grader.lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another grader is already working in {self.ws.out}; "
                               "wait for it to finish or use another --out") from None
        self.duedates = duedates or {}
        self.timestamps = timestamps or {}
        config = self.ws.config()
        self.limits = (f" ({config.Execute.timeout} s a cell, "
                       f"{config.BudgetedExecute.notebook_timeout} s a notebook)")
        self.api = nbgrader_api(config)
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

    def grade(self, submission: Path, student_id: str, assignment_id: str) -> Row:
        """Grade one student's submission of one assignment; never raises for bad input."""
        if assignment_id not in course.assignments():
            return Row(student_id, assignment_id, 0.0, 0.0,
                       f"not graded: there is no assignment '{assignment_id}' in this course")
        total, per = self.max_points(assignment_id)
        zero = {e: 0.0 for e in per}
        if not submission.is_dir():
            return Row(student_id, assignment_id, 0.0, total, "not graded: no submission", zero)
        notebooks = course.notebook_names(assignment_id)
        try:
            note = _stage(submission, self.ws.course / "submitted" / student_id / assignment_id, notebooks,
                          self.timestamps.get((student_id, assignment_id)))
        except BadSubmission as error:
            return Row(student_id, assignment_id, 0.0, total, f"not graded: {error}", zero)
        result = self.api.autograde(assignment_id, student_id, force=True, create=True)
        if not result["success"]:
            return Row(student_id, assignment_id, 0.0, total, f"not graded: {_autograde_failure(result)}", zero)
        points, diagnoses = dict(zero), {}
        for notebook in notebooks:
            got, why = _collect(self.ws, student_id, assignment_id, notebook, self.limits)
            points.update(got)
            diagnoses.update(why)
        with Gradebook(self.ws.db_url) as gb:
            graded = gb.find_submission(assignment_id, student_id)
            late, penalty = graded.total_seconds_late, graded.late_submission_penalty or 0.0
        if late > 0:
            note = "; ".join(filter(None, [note, f"late by {_duration(late)}, penalty {penalty:g} points"]))
        self.api.generate_feedback(assignment_id, student_id, force=True)
        feedback_dir = self.ws.course / "feedback" / student_id / assignment_id
        feedback = [feedback_dir / f"{nb}.html" for nb in notebooks if (feedback_dir / f"{nb}.html").is_file()]
        return Row(student_id, assignment_id, max(0.0, sum(points.values()) - penalty), total,
                   _status(note, diagnoses), points, diagnoses, feedback)


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{max(minutes, 1)} min"


def _autograde_failure(result: dict) -> str:
    text = f"{result.get('error', '')}\n{result.get('log', '')}"
    if "DeadKernelError" in text or "Kernel died" in text:
        return "the notebook stopped the Python kernel (os._exit, a crash or running out of memory)"
    if "add_missing_grade_cells" in text:
        return ("the notebook lost the course's cell metadata (answers pasted into a new notebook?): "
                "start from the released notebook, paste the answers in, and resubmit")
    if "Duplicate grade id" in text:
        return "two cells have the same grade id (a copied test cell?): delete the copy and resubmit"
    last = [line for line in text.splitlines() if line.startswith("[ERROR]")]
    return f"nbgrader could not grade it ({last[-1][8:] if last else 'see the grader log'})"


def submissions(class_dir: Path) -> list[tuple[str, str, Path]]:
    """(student_id, assignment_id, folder) for every submission in a class folder.

    Every student gets a row for every assignment that anyone in the class submitted,
    so that a missing assignment folder shows as a row, not as silence.
    """
    students = sorted(p for p in class_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    assignment_ids = sorted({a.name for s in students for a in s.iterdir()
                             if a.is_dir() and not a.name.startswith(".")})
    return [(s.name, a, s / a) for s in students for a in assignment_ids]


def read_timestamps(path: Path) -> dict[tuple[str, str], str]:
    """The instructor's submission times: a CSV with student_id, assignment_id, timestamp."""
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["student_id"], r["assignment_id"]): r["timestamp"] for r in csv.DictReader(f)}


def grade_class(class_dir: Path, out: Path, progress: bool = True, duedates: dict[str, str] | None = None,
                timestamps: dict[tuple[str, str], str] | None = None) -> list[Row]:
    """Grade every submission in ``class_dir``; write ``out/grades.csv``; return the rows.

    ``duedates`` maps assignment ids to due dates and ``timestamps`` (student_id,
    assignment_id) to submission times, both as nbgrader accepts them
    ("2026-12-01 23:59:00 UTC"); students' own timestamp.txt files are not trusted.
    Running it again after an interruption regrades and ends with the same grades.
    """
    class_dir = Path(class_dir)
    if not class_dir.is_dir():
        raise FileNotFoundError(f"no submissions folder at {class_dir}")
    grader = Grader(out, duedates, timestamps)
    todo = submissions(class_dir)
    rows = [grader.grade(folder, student, assignment)
            for student, assignment, folder in tqdm(todo, desc="grading", unit="submission",
                                                     disable=not progress)]
    write_csv(rows, Path(out) / "grades.csv")
    return rows


def write_csv(rows: list[Row], path: Path) -> None:
    """grades.csv: student_id, assignment_id, score, max_score, status, one column per exercise."""
    exercises = sorted({e for r in rows for e in r.points})
    partial = path.with_name(path.name + ".partial")  # a kill mid-write leaves the old file whole
    with open(partial, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "assignment_id", "score", "max_score", "status", *exercises])
        for r in rows:
            writer.writerow([r.student_id, r.assignment_id, f"{r.score:g}", f"{r.max_score:g}", r.status,
                             *(f"{r.points[e]:g}" if e in r.points else "" for e in exercises)])
    os.replace(partial, path)


def format_table(rows: list[Row]) -> str:
    """The grade table as aligned text, for the terminal."""
    header = ["student", "assignment", "score", "status"]
    lines = [[r.student_id, r.assignment_id, f"{r.score:g}/{r.max_score:g}", r.status] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join(fmt.format(*line) for line in [header, *lines])
