"""grades.csv: the whole gradebook as one table, written after every grading run and by
``nbgrader export`` (``GradeTable``, the course's export plugin in nbgrader_config.py).

One row per student and assignment of the gradebook, as nbgrader counts it (manual
grades and the late penalty included: ``score`` is what nbgrader's own CSV export
calls score), with the row's status line from the last grading run
(``grader.coursedir.Statuses``), then the rows of folders that were not submissions.
Text cells are escaped and neutralised against formulas (``grader.names.csv_cell``);
scores stay numbers.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.plugins import CsvExportPlugin

from . import classgrades
from .coursedir import CourseDir, Statuses
from .names import csv_row


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


def export(course_dir: CourseDir, statuses: Statuses | None = None) -> list[Row]:
    """Every row the gradebook holds, as nbgrader's export counts it (every student by every
    assignment; manual grades and late penalties included), each with its status; then
    the rows of folders that are not submissions. Sorted by student, then assignment."""
    statuses = statuses or Statuses(course_dir)
    grades = classgrades.read(course_dir.db_url, progress=False)
    found = {(s.student_id, s.assignment_id): s for s in grades.submissions}
    rows = []
    for student in grades.students:
        for assignment, per in grades.assignments.items():
            total = sum(per.values())
            sub = found.get((student, assignment))
            status = statuses.rows.get((student, assignment))
            if sub is None:
                waiting = (course_dir.folder("submitted") / student / assignment).is_dir()
                rows.append(Row(student, assignment, 0.0, total, status or (
                    "not graded yet: grade it (make grade)" if waiting else "not graded: no submission"),
                    dict.fromkeys(per, 0.0)))
            else:
                rows.append(Row(student, assignment, sub.score, total,
                                status or ("graded" if sub.graded else "not graded"),
                                {e: sub.points.get(e, 0.0) for e in per}, sub.diagnoses))
    rows += [Row(s, a, 0.0, 0.0, status) for s, a, status in statuses.extra]
    return sorted(rows, key=lambda r: (r.student_id, r.assignment_id))


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




class GradeTable(CsvExportPlugin):
    """``nbgrader export`` writes grades.csv (``--to`` elsewhere) as ``course-grader grade``
    does; nbgrader's own table stays one flag away
    (``--ExportApp.plugin_class=nbgrader.plugins.CsvExportPlugin``). A subclass of
    nbgrader's CSV plugin, so its options (``--to``, ``--student``) apply."""

    def export(self, gradebook) -> None:
        root = Path(self.parent.coursedir.root) if self.parent is not None else Path.cwd()
        course_dir = CourseDir.open(root)
        rows = export(course_dir)
        if self.student:
            rows = [r for r in rows if r.student_id in set(map(str, self.student))]
        if self.assignment:
            rows = [r for r in rows if r.assignment_id in set(map(str, self.assignment))]
        dest = Path(self.to) if self.to else course_dir.grades_csv
        self.log.info("Exporting grades to %s", dest)
        write_csv(rows, dest)
