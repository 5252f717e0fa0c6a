"""The whole grading pipeline on real notebooks: one nbgrader run over a class
(``graded_class``: every sample-class student's notebook 01, the solution and the
untouched release notebook of every assignment, a student with no assignment folder),
and the sample class's other submissions judged in process by grading's own steps
(``judge``, tests/inprocess.py), so that every recorded grade is asserted.
"""
from __future__ import annotations

import csv

import nbformat
import pytest

from grader import course
from grader.checks import exercise_ids
from tests.conftest import expected_grades, graded_in_kernels
from tests.inprocess import is_drawing
from tests.scope import slow_if_costly, some_of_each

ASSIGNMENT = "01_similarity"
RECORDED = sorted(expected_grades().items())
# Judged in process: every recorded submission but those stopped at the time limit (an
# endless loop would cost the limit here too); each of those is graded in kernels.
IN_PROCESS = [(key, expected) for key, expected in RECORDED if (course.SAMPLE_CLASS.joinpath(*key)).is_dir()
              and "time limit" not in expected["status"]]
JUDGED = some_of_each(IN_PROCESS)


def _key_id(value) -> str:
    return "/".join(value) if isinstance(value, tuple) else ""


# what grader.parallel adds to the status of a unit that tripped a time limit beside another
# one and was graded again alone: whether it did depends on what ran beside it
REGRADED = "; regraded alone: a time limit tripped while "


@pytest.mark.parametrize("key,expected", [(k, e) for k, e in RECORDED if graded_in_kernels(k)], ids=_key_id)
def test_sample_class_grades_as_recorded(graded_class, key, expected):
    row = graded_class["rows"][key]
    status, regraded, _ = row.status.partition(REGRADED)
    assert status == expected["status"], row.diagnoses
    assert not regraded or "time limit" in expected["status"], row.status  # only a limit is regraded
    assert row.points == expected["exercises"], row.diagnoses
    assert row.score == expected["score"]
    assert row.max_score == max_points(key[1])


@pytest.mark.parametrize("key,expected", [slow_if_costly(k[1], k, e, id=_key_id(k)) for k, e in JUDGED])
def test_sample_class_judged_in_process_as_recorded(judged, key, expected):
    """The same expectations through grading's steps in process; for notebook 01 this
    agrees with the real pipeline above, student by student."""
    row = judged(*key)
    assert row.status == expected["status"], row.diagnoses
    assert row.points == expected["exercises"], row.diagnoses
    assert row.score == expected["score"]
    assert row.max_score == max_points(key[1])


def test_every_recorded_grade_is_asserted():
    """Each expectation is checked by the real pipeline, in process, or both."""
    judged = {key for key, _ in IN_PROCESS}
    assert [key for key, _ in RECORDED if not graded_in_kernels(key) and key not in judged] == []


@pytest.mark.parametrize("key", [slow_if_costly(k[1], k, id=_key_id(k)) for k, _ in JUDGED])
def test_diagnoses_judged_in_process_show_no_traceback_or_hidden_input(judged, key):
    """What feedback shows of a wrong answer is its diagnosis (the feedback of notebook
    01's students is checked whole in test_feedback.py)."""
    for exercise, diagnosis in judged(*key).diagnoses.items():
        assert "\n" not in diagnosis and diagnosis.isprintable(), (exercise, diagnosis)
        for secret in ("most recent call last", "site-packages", 'File "', "BEGIN HIDDEN", "check(\"",
                       "grader.checks", "CheckFailed"):
            assert secret not in diagnosis, (exercise, secret, diagnosis)


@pytest.mark.slow
@pytest.mark.parametrize("assignment", course.assignments())
def test_in_process_the_solution_scores_full_marks_and_the_release_nothing(judge, assignment):
    """The figure and demonstration cells the in-process judge leaves out hold nothing a
    check needs: the solution notebook still earns every point; and every test cell can
    fail: the untouched release notebook earns none."""
    solution = judge.grade(course.SOLUTIONS / assignment, "zz_solution", assignment)
    assert solution.status == "graded" and solution.score == solution.max_score == max_points(assignment), \
        solution.diagnoses
    release = judge.grade(course.NOTEBOOKS / assignment, "zz_release", assignment)
    assert release.points == dict.fromkeys(exercise_ids(assignment.split("_", 1)[1]), 0.0)
    assert set(release.diagnoses) == set(release.points)
    assert all("not answered yet" in d for d in release.diagnoses.values()), release.diagnoses


def max_points(assignment_id: str) -> float:
    """The points of an assignment, read from its source notebook's graded cells."""
    path = course.SOLUTIONS / assignment_id / f"{assignment_id}.ipynb"
    return sum(c.metadata["nbgrader"].get("points", 0) for c in nbformat.read(path, as_version=4).cells
               if c.metadata.get("nbgrader", {}).get("grade"))


def expected_max():
    return {"similarity-dot_product": 2, "similarity-cosine_similarity": 2,
            "similarity-score_matrix": 3, "similarity-soft_lookup": 3}


def test_sample_class_is_a_real_class():
    """At least 8 submissions, all recorded, with every kind of student the course promises."""
    recorded = expected_grades()
    assert len(recorded) >= 8
    statuses = [e["status"] for e in recorded.values()]
    assert any("renamed" in s for s in statuses)
    assert any("not valid notebook JSON" in s for s in statuses)
    assert any("time limit" in s for s in statuses)
    scores = [e["score"] for e in recorded.values()]
    assert 0 in scores and 10 in scores and any(0 < s < 10 for s in scores)
    # every student has a recorded row for every assignment of the course
    students = {s for s, _ in recorded}
    assert {(s, a) for s in students for a in course.assignments()} <= set(recorded)


@pytest.mark.parametrize("assignment", course.assignments())
def test_solution_scores_full_marks_and_runs_without_error(graded_class, assignment):
    """The solution earns every point, and runs as a learner who solved it sees it run: no
    error, nothing on stderr, and each figure cell shows a PNG (the browser test runs one
    notebook in JupyterLab; `make screenshots` runs them all)."""
    row = graded_class["rows"][("zz_solution", assignment)]
    assert row.status == "graded" and row.score == row.max_score == max_points(assignment), row.diagnoses
    graded = graded_class["out"] / "autograded" / "zz_solution" / assignment / f"{assignment}.ipynb"
    figures = 0
    for cell in nbformat.read(graded, as_version=4).cells:
        outputs = cell.get("outputs", [])
        for output in outputs:
            assert output.output_type != "error", f"cell {cell.get('id')}: {output.get('evalue')}"
            assert output.get("name") != "stderr", f"cell {cell.get('id')} wrote on stderr: {output.get('text')}"
        if is_drawing(cell) and "-demo-" not in cell.metadata.get("nbgrader", {}).get("grade_id", ""):
            assert any("image/png" in o.get("data", {}) for o in outputs), f"figure cell {cell.get('id')} shows no PNG"
            figures += 1
    assert figures, "no figure cell"


@pytest.mark.parametrize("assignment", course.assignments())
def test_release_notebook_scores_zero_on_every_exercise(graded_class, assignment):
    """Every graded cell can fail: the untouched student version earns nothing anywhere."""
    row = graded_class["rows"][("zz_release", assignment)]
    exercises = exercise_ids(assignment.split("_", 1)[1])
    assert row.status == "graded"
    assert row.points == dict.fromkeys(exercises, 0.0)
    assert set(row.diagnoses) == set(exercises)
    assert all("not answered yet" in d for d in row.diagnoses.values())


def test_missing_assignment_folder_gets_a_row(graded_class):
    row = graded_class["rows"][("zz_absent", ASSIGNMENT)]
    assert (row.score, row.status) == (0, "not graded: no submission")


def test_grades_csv_has_one_row_per_submission_and_a_column_per_exercise(graded_class):
    with open(graded_class["out"] / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:5] == ["student_id", "assignment_id", "score", "max_score", "status"]
    assert set(list(rows[0])[5:]) == set(exercise_ids())
    assert len(rows) == len(graded_class["rows"])


def test_feedback_explains_without_hidden_code(graded_class):
    out = graded_class["out"] / "feedback"
    html = (out / "chloe" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "softmax over the key axis" in html  # chloe's diagnosis
    for student in ("chloe", "zz_release", "gus"):
        html = (out / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
        for secret in ("grader.checks", "HIDDEN TESTS", "CheckFailed", "coursekit.probe", "probe.py",
                       "grader/", "attention-course.answer", '"array"'):
            assert secret not in html, (student, secret)


def test_nbgrader_export_and_manual_grading_keep_working(graded_class, tmp_path):
    """The gradebook is nbgrader's own: a manual grade overrides, export reads it."""
    import subprocess
    import sys
    from pathlib import Path

    from nbgrader.api import Gradebook

    db_url = f"sqlite:///{graded_class['out'] / 'gradebook.db'}"
    with Gradebook(db_url) as gb:
        grade = gb.find_grade("similarity-score_matrix-test", ASSIGNMENT, ASSIGNMENT, "chloe")
        assert (grade.auto_score, grade.score) == (0, 0)
        grade.manual_score = 1.5  # the instructor gives partial credit in formgrader
        gb.db.commit()
    csv_path = tmp_path / "export.csv"
    nbgrader = Path(sys.executable).parent / "nbgrader"
    try:  # nbgrader's own command and its own table, run in the course directory
        subprocess.run([str(nbgrader), "export", "--ExportApp.plugin_class=nbgrader.plugins.CsvExportPlugin",
                        f"--to={csv_path}"], check=True, cwd=graded_class["out"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        ours = tmp_path / "ours.csv"  # the course's plugin: grades.csv's table, elsewhere with --to
        subprocess.run([str(nbgrader), "export", f"--to={ours}"], check=True, cwd=graded_class["out"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        with Gradebook(db_url) as gb:  # leave the shared fixture as it was
            gb.find_grade("similarity-score_matrix-test", ASSIGNMENT, ASSIGNMENT, "chloe").manual_score = None
            gb.db.commit()
    with open(csv_path, newline="") as f:
        exported = {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(f)}
    chloe = graded_class["rows"][("chloe", ASSIGNMENT)]
    assert exported[("chloe", ASSIGNMENT)] == chloe.score + 1.5
    assert exported[("ada", ASSIGNMENT)] == 10
    with open(ours, newline="") as f:
        table = {(r["student_id"], r["assignment_id"]): float(r["score"]) for r in csv.DictReader(f)}
    # and the rows of folders that are no submission (no student id, or no course assignment)
    assert table == exported | {k: v for k, v in table.items() if k[1] not in course.assignments()}


def test_grading_never_writes_the_submissions(graded_class):
    assert graded_class["unchanged"]


def test_regrading_is_idempotent(graded_class, tmp_path):
    from grader.grade import Grader

    before = graded_class["rows"][("chloe", ASSIGNMENT)]
    again = Grader(graded_class["out"]).grade(graded_class["submissions"] / "chloe" / ASSIGNMENT, "chloe", ASSIGNMENT)
    assert (again.score, again.points, again.status) == (before.score, before.points, before.status)
