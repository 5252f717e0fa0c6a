"""The class's grades as read back from nbgrader's gradebook, for the report and the LMS.

Read through nbgrader's own API (``nbgrader.api.Gradebook``, SQLAlchemy), so any
gradebook URL that ``course-grader grade`` writes works: SQLite by default,
PostgreSQL for a large course. Manual grades given in formgrader count, as they do in
grades.csv. A submission is *graded* when every graded cell has a score; one that
nbgrader could not grade (a dead kernel, lost metadata) is recorded but not graded.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook
from sqlalchemy.engine import make_url

from . import course
from .coursedir import CourseDir, CourseDirError, default_root

UNANSWERED = "No response."  # nbgrader's comment on an answer cell left as released


class NoGrades(RuntimeError):
    """There is no gradebook to read; the message says what to run first."""


@dataclass
class Submission:
    """One student's graded (or not) submission of one assignment."""

    student_id: str
    assignment_id: str
    graded: bool
    score: float  # after the late penalty, never below 0 (as in grades.csv)
    points: dict[str, float] = field(default_factory=dict)  # exercise id -> points
    max_points: dict[str, float] = field(default_factory=dict)
    diagnoses: dict[str, str] = field(default_factory=dict)  # failed exercise id -> automatic diagnosis


@dataclass
class ClassGrades:
    students: list[str]
    assignments: dict[str, dict[str, float]]  # assignment id -> exercise id -> max points
    submissions: list[Submission]

    def max_score(self, assignment_id: str) -> float:
        return sum(self.assignments[assignment_id].values())

    def of(self, assignment_id: str, graded_only: bool = True) -> list[Submission]:
        return [s for s in self.submissions if s.assignment_id == assignment_id and (s.graded or not graded_only)]


def gradebook_url(course_dir: Path | str | None = None) -> str:
    """The gradebook of the course directory (``grader.coursedir``: its nbgrader_config.py's
    ``db_url``, else its gradebook.db), as ``course-grader grade`` and nbgrader use it.

    Raises:
        NoGrades: it is a SQLite file that does not exist yet.
    """
    try:
        url = CourseDir.open(course_dir, create=False).db_url
    except CourseDirError:
        where = Path(course_dir).resolve() if course_dir is not None else default_root()
        raise NoGrades(f"no gradebook at {where}: grade first (make grade, or make demo)") from None
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        raise NoGrades(f"no gradebook at {parsed.database}: grade first (make grade, or make demo)")
    return url


def _diagnosis(comment) -> str | None:
    """The grader's automatic diagnosis of one cell. An instructor's manual comment is
    written to one student (formgrader shows it in that student's feedback only), so it
    never reaches what the class sees: the report's common mistakes and their figure."""
    text = (comment.auto_comment or "").strip()
    if text == UNANSWERED:
        return "not answered yet: the answer cell is as it was released"
    return text or None


def read(db_url: str, progress: bool = True) -> ClassGrades:
    """Every student, assignment and submission of the gradebook at ``db_url``."""
    from tqdm import tqdm  # the bar goes to stderr: stdout and the files stay clean

    with Gradebook(db_url) as gb:
        assignments = {}
        for assignment in sorted(gb.assignments, key=lambda a: a.name):
            assignments[assignment.name] = {course.exercise_id(cell.name): float(cell.max_score)
                                            for nb in assignment.notebooks for cell in nb.grade_cells}
        students = sorted(s.id for s in gb.students)
        subs = [s for a in assignments for s in gb.assignment_submissions(a)]
        found = []
        for sub in tqdm(subs, desc="reading the gradebook", unit="submission", disable=not progress):
            points, diagnoses, penalty, graded = {}, {}, 0.0, True
            for nb in sub.notebooks:
                penalty += float(nb.late_submission_penalty or 0.0)
                for grade in nb.grades:
                    graded &= grade.auto_score is not None or grade.manual_score is not None
                    points[course.exercise_id(grade.name)] = float(grade.score or 0.0)
                for comment in nb.comments:
                    if (text := _diagnosis(comment)) is not None:
                        diagnoses[course.exercise_id(comment.name)] = text
            per = assignments[sub.assignment.name]
            failed = {e: diagnoses.get(e, "no points") for e in per if points.get(e, 0.0) < per[e]}
            found.append(Submission(sub.student.id, sub.assignment.name, graded,
                                    max(0.0, sum(points.values()) - penalty), points, per, failed))
    return ClassGrades(students, assignments, found)


_NUMBER = re.compile(r"\d+(\.\d+)?")


def mistake_key(diagnosis: str) -> str:
    """Diagnoses that differ only in numbers (a shape, a count) are the same mistake."""
    return _NUMBER.sub("#", diagnosis)
