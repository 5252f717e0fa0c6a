"""One course directory, one gradebook: course-grader and nbgrader's own tools agree (issue 14).

A small class of notebook 01 is graded in a course directory laid out as ``nbgrader
collect`` leaves it (submitted/<student>/<assignment>/ with the student's
submission_secret.txt, and timestamp.txt and submission_times.csv holding the times
collect trusts), with a due date, a late student under the "zero" policy and one
student's extension. Then a manual grade with a comment, and one student regraded
alone. Each test reproduces a failure an instructor met when grading kept its own
workspace beside nbgrader's.
"""
from __future__ import annotations

import csv
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook
from nbgrader.utils import notebook_hash, parse_utc

from grader import course
from grader.cli import main as cli
from grader.coursedir import CourseDir
from grader.grade import grade_class

A = "01_similarity"
DUE = "2026-12-01 12:00:00.000000 UTC"
TIMES = {"ada": "2026-12-01 11:00:00.000000 UTC", "ben": "2026-12-01 11:30:00.000000 UTC",
         "chloe": "2026-12-01 13:00:00.000000 UTC", "dev": "2026-12-01 13:00:00.000000 UTC"}
DEV_DUE = "2026-12-01 14:00:00.000000 UTC"  # dev's extension
NBGRADER = str(Path(sys.executable).parent / "nbgrader")
MANUAL = ("similarity-score_matrix-test", "similarity-score_matrix")  # dev's manually graded cell, comment


def _csv(path: Path) -> dict[tuple[str, str], dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["student_id"], r["assignment_id"]): r for r in csv.DictReader(f)}


def _nbgrader(course_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """An nbgrader command run where an instructor runs it: in the course directory, from
    the venv's bin/ without the venv on PATH."""
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    return subprocess.run([NBGRADER, *args], cwd=course_dir, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def term(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("workflow")
    course_dir = root / "course"
    keys = {}
    for student in TIMES:
        dest = course_dir / "submitted" / student / A
        shutil.copytree(course.SAMPLE_CLASS / student / A, dest)
        keys[student] = secrets.token_hex(64)  # as nbgrader submit writes it
        (dest / "submission_secret.txt").write_text(keys[student])
        (dest / "timestamp.txt").write_text(TIMES[student])  # as our collect writes it
    with open(course_dir / "submission_times.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "assignment_id", "timestamp"])
        writer.writerows([s, A, t] for s, t in TIMES.items())
    first = {r.student_id: r for r in grade_class(course_dir, progress=False, jobs=2, duedates={A: DUE},
                                                  extensions={("dev", A): DEV_DUE})}
    table_before = _csv(course_dir / "grades.csv")
    url = CourseDir.open(course_dir).db_url
    with Gradebook(url) as gb:  # what an instructor does in formgrader: 1 of 3 points, a comment
        grade = gb.find_grade(MANUAL[0], A, A, "dev")
        grade.manual_score = 1.0
        grade.needs_manual_grade = False
        gb.find_comment(MANUAL[1], A, A, "dev").manual_comment = "Nearly: the scores are right, mind the $\\sqrt{d}$."
        gb.db.commit()
    again = {r.student_id: r for r in grade_class(course_dir, students=["dev"], progress=False, jobs=1)}
    return {"course": course_dir, "url": url, "first": first, "again": again, "keys": keys, "root": root,
            "table_before": table_before, "table": _csv(course_dir / "grades.csv")}


@pytest.mark.kernel
def test_lateness_uses_collected_times_and_one_students_extension(term):
    first = term["first"]
    assert (first["ada"].score, first["ben"].score, first["dev"].score) == (10, 10, 4)
    assert first["chloe"].score == 0 and "late by 1 h 0 min" in first["chloe"].status  # the zero policy
    with Gradebook(term["url"]) as gb:
        assert gb.find_assignment(A).duedate == parse_utc(DUE)  # dev's extension is dev's alone
        assert gb.find_submission(A, "dev").duedate == parse_utc(DEV_DUE)
        assert gb.find_submission(A, "ben").duedate == parse_utc(DUE)
        assert gb.find_submission(A, "chloe").timestamp == parse_utc(TIMES["chloe"])


@pytest.mark.kernel
def test_formgrader_sees_every_submission_autograded_with_its_time(term):
    from grader.release import nbgrader_api

    api = nbgrader_api(CourseDir.open(term["course"]).config)
    found = {s["student"]: s for s in api.get_submissions(A)}
    assert sorted(found) == sorted(TIMES)
    for student, submission in found.items():
        assert submission["autograded"], student  # not "needs autograding"
        assert parse_utc(submission["timestamp"]) == parse_utc(TIMES[student])


@pytest.mark.kernel
def test_a_manual_grade_and_comment_survive_a_regrade_everywhere(term):
    with Gradebook(term["url"]) as gb:
        grade = gb.find_grade(MANUAL[0], A, A, "dev")
        assert (grade.manual_score, grade.auto_score, grade.needs_manual_grade) == (1.0, 0.0, False)
    assert term["again"]["dev"].score == 5  # 4 + the manual 1
    assert term["table"][("dev", A)]["score"] == "5"
    html = (term["course"] / "feedback" / "dev" / A / f"{A}.html").read_text()
    assert "Your feedback: 5 / 10 points" in html
    assert "Nearly: the scores are right" in html
    from grader.report import write_report

    with open(write_report(term["course"], progress=False)[-2], newline="") as f:  # canvas.csv
        assert {r["Student"]: r[A] for r in csv.DictReader(f)}["dev"] == "5"


@pytest.mark.kernel
def test_regrading_one_student_leaves_the_other_rows_alone(term):
    before, after = term["table_before"], term["table"]
    assert sorted(after) == sorted(before) == [(s, A) for s in sorted(TIMES)]
    for key in before:
        if key[0] != "dev":
            assert after[key] == before[key]
    assert list(term["again"]) == ["dev"]


@pytest.mark.kernel
def test_release_feedback_finds_every_students_feedback(term):
    exchange = term["root"] / "exchange"
    exchange.mkdir(mode=0o777)
    done = _nbgrader(term["course"], "release_feedback", A, f"--Exchange.root={exchange}")
    assert done.returncode == 0, done.stderr
    released = sorted(p.name for p in (exchange / "attention-from-scratch" / "feedback").iterdir())
    assert released == sorted(f"{notebook_hash(secret=k, notebook_id=A)}.html" for k in term["keys"].values())


@pytest.mark.kernel
def test_nbgraders_own_autograde_and_export_agree_with_course_grader(term):
    """formgrader's Autograde button runs nbgrader's autograde with the course's config: the
    late penalty, the manual grade and the flag come out as course-grader left them."""
    for student in ("chloe", "dev"):
        done = _nbgrader(term["course"], "autograde", A, "--student", student, "--force")
        assert done.returncode == 0, done.stderr[-2000:]
    stock = term["root"] / "stock.csv"
    done = _nbgrader(term["course"], "export", "--ExportApp.plugin_class=nbgrader.plugins.CsvExportPlugin",
                     f"--CsvExportPlugin.to={stock}")
    assert done.returncode == 0, done.stderr
    with open(stock, newline="") as f:
        exported = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)}
    assert exported == {k[0]: float(r["score"]) for k, r in term["table"].items()}
    with Gradebook(term["url"]) as gb:
        assert gb.find_grade(MANUAL[0], A, A, "dev").needs_manual_grade is False
    done = _nbgrader(term["course"], "export")  # the course's export plugin: grades.csv itself
    assert done.returncode == 0, done.stderr
    assert _csv(term["course"] / "grades.csv") == term["table"]


@pytest.mark.kernel
def test_a_due_date_is_never_given_to_one_student(term, capsys):
    assert cli(["grade", "--course", str(term["course"]), "--student", "dev", "--duedate", f"{A}=2027-01-01"]) == 2
    assert "--extensions" in capsys.readouterr().err


@pytest.mark.kernel
def test_make_quotes_a_database_url_for_the_shell():
    url = "postgresql://grader@db/course?sslmode=require&target_session_attrs=any"
    done = subprocess.run(["make", "-n", "grade", f"DB_URL={url}", "STUDENT=ada ben"], cwd=course.ROOT,
                          capture_output=True, text=True, check=True)
    assert f"--db-url '{url}'" in done.stdout and "--student 'ada' --student 'ben'" in done.stdout


def test_the_tutor_says_which_points_were_given_by_hand():
    """The checks give all or nothing: part of the points, or full points over a failed check,
    came from the instructor, and the summary says so with their comment."""
    from grader.tutor import comments, summary_html

    max_points = {"similarity-dot_product": 2.0, "similarity-cosine_similarity": 2.0, "similarity-score_matrix": 3.0}
    found = {c.exercise: c for c in comments(
        A, {"similarity-dot_product": 2.0, "similarity-cosine_similarity": 2.0, "similarity-score_matrix": 1.0},
        max_points, {"similarity-cosine_similarity": "cosine_similarity(a, b): not normalised"},
        {"similarity-score_matrix": "mind the <axis>"})}
    assert found["similarity-score_matrix"].diagnosis == "1 of 3 points, given by hand"
    assert not found["similarity-score_matrix"].passed and found["similarity-cosine_similarity"].passed
    html = summary_html(list(found.values()), 5.0, 7.0)
    assert "full points, given by hand" in html and "<em>Your instructor:</em> mind the &lt;axis&gt;" in html
