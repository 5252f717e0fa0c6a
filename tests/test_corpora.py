"""The tamper and malformed-input corpora, graded in the same batch as the sample class.

Each attack must earn nothing on what it attacks, and leave everyone else's grades,
files and feedback as they would be without it (the sample class is checked against
its recorded grades in test_pipeline.py, on this same batch). Each malformed
submission must get a row with a clear status, without stopping the batch.
"""
from __future__ import annotations

import pytest
from nbgrader.api import Gradebook

from tests.corpora import malformed, tamper
from tests.conftest import expected_grades

ASSIGNMENT = tamper.ASSIGNMENT


def test_corpora_are_big_enough(graded_class):
    assert len(tamper.ATTACKS) >= 15
    assert len(graded_class["corpora"]["malformed"]) >= 12


@pytest.mark.parametrize("attack", tamper.ATTACKS, ids=lambda a: a.student_id)
def test_attack_earns_nothing_on_what_it_attacks(graded_class, attack):
    row = graded_class["rows"][(attack.student_id, ASSIGNMENT)]
    expected = attack.expected()[ASSIGNMENT]
    assert row.points == expected["exercises"], (attack.what, row.status, row.diagnoses)
    assert row.score == expected["score"], (attack.what, row.status)
    if not attack.late:
        assert all(row.points[t] == 0 for t in attack.targets)


def test_the_forged_timestamp_is_ignored_for_the_trusted_one(graded_class):
    row = graded_class["rows"][("t12_forged_timestamp", ASSIGNMENT)]
    assert row.score == 0 and "late by" in row.status


def test_the_cheat_server_was_never_reached(graded_class):
    assert graded_class["cheat_requests"] == 0


def test_no_grade_was_written_by_anyone_but_the_grader(graded_class):
    db_url = f"sqlite:///{graded_class['out'] / 'course' / 'gradebook.db'}"
    with Gradebook(db_url) as gb:
        touched = [(sub.student_id, g.name) for sub in gb.assignment_submissions(ASSIGNMENT)
                   for nb in sub.notebooks for g in nb.grades if g.manual_score is not None]
    assert touched == []


def test_classmates_feedback_and_submissions_are_intact(graded_class):
    assert graded_class["unchanged"]
    feedback = graded_class["out"] / "course" / "feedback"
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
