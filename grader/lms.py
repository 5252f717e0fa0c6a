"""The grade table as CSV files an LMS imports: Canvas and Moodle.

Canvas (Grades > Import): the columns of Canvas's own gradebook export, ``Student``,
``ID``, ``SIS User ID``, ``SIS Login ID``, ``Section``, then one column per assignment,
and a second row ``Points Possible`` as Canvas's export has. Canvas names an assignment
column ``<name> (<Canvas assignment id>)``; the course does not know Canvas's ids, so
the columns carry the assignment id alone and Canvas matches them by name (or offers
to create the assignments). Canvas identifies a student by ``ID``, ``SIS User ID`` or
``SIS Login ID``: the course knows none of them, so they are empty unless a roster
fills them.

Moodle (Grades > Import > CSV file): ``Full name``, ``Email address``, ``ID number``,
then one column per grade item. On import, map "Email address" or "ID number" to the
user field of the same name, and each assignment column to its grade item. Empty
unless a roster fills them, like Canvas's.

The roster (``--roster roster.csv``) is a CSV with a ``student_id`` column (nbgrader's
id) and any of ``name``, ``email``, ``sis_user_id``, ``sis_login_id``, ``canvas_id``,
``section``. A cell is empty when the submission was not graded or is missing: an
LMS then shows it as missing rather than as a zero nobody decided.

Every text cell (names, ids, the roster's fields) goes through
``grader.names.csv_cell``: escaped, and neutralised when it could start a formula;
scores are numbers and stay numbers.
"""
from __future__ import annotations

import csv
from pathlib import Path

from .classgrades import ClassGrades
from .names import csv_row

ROSTER_FIELDS = ("name", "email", "sis_user_id", "sis_login_id", "canvas_id", "section")
CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_HEADER = ["Full name", "Email address", "ID number"]


class BadRoster(ValueError):
    """The roster file cannot be used; the message says how to fix it."""


def read_roster(path: Path) -> dict[str, dict[str, str]]:
    """student_id -> the roster's fields (missing ones are "").

    Raises:
        BadRoster: the file is missing, not UTF-8 CSV, or has no ``student_id`` column.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise BadRoster(f"cannot read the roster {path}: {error}") from None
    if not rows or "student_id" not in rows[0]:
        raise BadRoster(f"the roster {path} needs a header row with a student_id column "
                        f"(and any of {', '.join(ROSTER_FIELDS)})")
    return {r["student_id"].strip(): {k: (r.get(k) or "").strip() for k in ROSTER_FIELDS} for r in rows}


def _write(grades: ClassGrades, path: Path, roster: dict | None, header: list[str], identity,
           preamble: list[list[str]] = ()) -> Path:
    """One row per student (the gradebook's and the roster's): ``identity(student, roster
    fields)`` then a score per assignment, empty where not graded or not submitted."""
    roster = roster or {}
    scores = {(s.student_id, s.assignment_id): float(s.score) for s in grades.submissions if s.graded}
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(csv_row(header + list(grades.assignments)))
        writer.writerows(csv_row(row) for row in preamble)
        for student in sorted(set(grades.students) | set(roster)):
            writer.writerow(csv_row(identity(student, roster.get(student, {}))
                                    + [scores.get((student, a)) for a in grades.assignments]))
    return path


def write_canvas(grades: ClassGrades, path: Path, roster: dict | None = None) -> Path:
    """Canvas's gradebook import CSV (see the module's docs)."""
    points = [["    Points Possible", "", "", "", ""] + [float(grades.max_score(a)) for a in grades.assignments]]
    return _write(grades, path, roster, CANVAS_HEADER, lambda student, r: [
        r.get("name") or student, r.get("canvas_id", ""), r.get("sis_user_id", ""), r.get("sis_login_id", ""),
        r.get("section", "")], points)


def write_moodle(grades: ClassGrades, path: Path, roster: dict | None = None) -> Path:
    """Moodle's grade import CSV (see the module's docs)."""
    return _write(grades, path, roster, MOODLE_HEADER, lambda student, r: [
        r.get("name") or student, r.get("email", ""), r.get("sis_user_id", "")])
