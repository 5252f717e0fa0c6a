"""The tamper and malformed-input corpora, graded in the same batch as the sample class.

Each attack must earn nothing on what it attacks, and leave everyone else's grades,
files and feedback as they would be without it (the sample class is checked against
its recorded grades in test_pipeline.py, on this same batch). Each malformed
submission must get a row with a clear status, without stopping the batch.
"""
from __future__ import annotations

import csv
import json

import pytest
from nbgrader.api import Gradebook

from grader.grade import format_table
from grader.names import shown
from tests.corpora import harms, malformed, tamper
from tests.conftest import expected_grades

pytestmark = pytest.mark.kernel

ASSIGNMENT = tamper.ASSIGNMENT


def test_corpora_are_big_enough(graded_class):
    assert len(tamper.ATTACKS) >= 50
    invented = [a for a in tamper.ATTACKS if a.what.startswith("invented")]
    assert len(invented) >= 10
    assert len(graded_class["corpora"]["malformed"]) >= 12


def _row(graded_class, attack):
    """The attack's row: its own, or, for a folder that is no student id, the folder's one row."""
    rows = graded_class["rows"]
    return rows.get((attack.student_id, ASSIGNMENT)) or rows[(shown(attack.student_id), "")]


@pytest.mark.parametrize("attack", tamper.ATTACKS, ids=lambda a: a.name)
def test_attack_earns_nothing_on_what_it_attacks(graded_class, attack):
    row = _row(graded_class, attack)
    expected = attack.expected()[ASSIGNMENT]
    assert row.points == expected["exercises"], (attack.what, row.status, row.diagnoses)
    assert row.score == expected["score"], (attack.what, row.status)
    if not attack.late:
        assert all(row.points[t] == 0 for t in attack.targets)
    assert expected["status"] in row.status.lower(), (attack.what, row.status)


def outcome(graded_class, attack) -> harms.Outcome:
    """What our grader left for one attack of the batch, as the judges read it."""
    student_id = attack.student_id
    out = graded_class["out"]
    row = _row(graded_class, attack)
    feedback = out / "feedback" / student_id / ASSIGNMENT / f"{ASSIGNMENT}.html"
    autograded = out / "autograded" / student_id / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    reference = out / "feedback" / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        csv_rows = list(csv.reader(f))
    return harms.Outcome(
        points=row.points, status=row.status,
        feedback=feedback.read_text(encoding="utf-8") if feedback.is_file() else None,
        autograded=json.loads(autograded.read_text(encoding="utf-8")) if autograded.is_file() else None,
        csv_rows=csv_rows, table=format_table(list(graded_class["rows"].values())),
        reference_feedback=reference.read_text(encoding="utf-8"))


@pytest.mark.parametrize("attack", [a for a in tamper.ATTACKS if a.harm != "points"], ids=lambda a: a.name)
def test_attack_achieves_nothing_around_the_kernel(graded_class, attack):
    said, harmed = harms.judge(attack.harm, outcome(graded_class, attack), list(attack.targets))
    assert not harmed, f"{attack.what}: {said}"


def test_nothing_of_a_submission_outlives_the_batch(graded_class):
    assert graded_class["survivors"] == []
    # the workers made their scratch space in the batch's own temporary folder, so its listing is theirs
    assert "dask-scratch-space" in graded_class["left_in_tmp"], graded_class["left_in_tmp"]
    assert [name for name in graded_class["left_in_tmp"] if name.startswith(("kernel-", "grader-", "unit-"))] == []


def test_an_extra_folder_makes_no_rows_for_anyone_else(graded_class):
    odd = [key for key in graded_class["rows"] if key[1].startswith("=")]
    assert all(student == "t46_extra_folder" for student, _ in odd), odd
    assert len(odd) <= 1


def test_no_formula_or_control_character_reaches_a_table(graded_class, tmp_path):
    from grader import classgrades
    from grader.lms import write_canvas, write_moodle

    grades = classgrades.read(f"sqlite:///{graded_class['out'] / 'gradebook.db'}", progress=False)
    tables = [graded_class["out"] / "grades.csv", write_canvas(grades, tmp_path / "canvas.csv"),
              write_moodle(grades, tmp_path / "moodle.csv")]
    for table in tables:
        with open(table, newline="", encoding="utf-8") as f:
            cells = [cell for row in csv.reader(f) for cell in row]
        assert [c for c in cells if harms.FORMULA.match(c)] == [], table.name
        assert [c for c in cells if harms.CONTROL.search(c)] == [], table.name
    assert not harms.CONTROL.search(format_table(list(graded_class["rows"].values())))


def test_the_forged_timestamp_is_ignored_for_the_trusted_one(graded_class):
    row = graded_class["rows"][("t12_forged_timestamp", ASSIGNMENT)]
    assert row.score == 0 and "late by" in row.status


def test_the_cheat_server_was_never_reached(graded_class):
    assert graded_class["cheat_requests"] == 0


def test_no_grade_was_written_by_anyone_but_the_grader(graded_class):
    db_url = f"sqlite:///{graded_class['out'] / 'gradebook.db'}"
    with Gradebook(db_url) as gb:
        touched = [(sub.student_id, g.name) for sub in gb.assignment_submissions(ASSIGNMENT)
                   for nb in sub.notebooks for g in nb.grades if g.manual_score is not None]
    assert touched == []


def test_classmates_feedback_and_submissions_are_intact(graded_class):
    assert graded_class["unchanged"]
    feedback = graded_class["out"] / "feedback"
    for student in {s for s, _ in expected_grades()} - {"ivan"}:
        html = (feedback / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
        assert "No feedback." not in html and "dot_product" in html, student


def test_every_malformed_submission_gets_a_row_with_a_clear_status(graded_class):
    wrong = []
    for student, expected in graded_class["corpora"]["malformed"].items():
        row = graded_class["rows"][(student, ASSIGNMENT)]
        want = expected[ASSIGNMENT]
        if not malformed.status_matches(want["status"], row.status) or row.score != want["score"]:
            wrong.append(f"{student}: got {row.score:g} '{row.status}', want {want['score']} "
                         f"'{want['status']}' ({expected['what']}) {row.diagnoses}")
    assert not wrong, "\n".join(wrong)
