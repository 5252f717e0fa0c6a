"""formgrader's own buttons, pressed in chromium, on the course directory course-grader grades.

A course directory is laid out as ``nbgrader collect`` leaves it (submitted/<student>/
01_similarity/ of sample_class's ada and chloe, and ren, who submitted chloe's notebook
renamed "my similarity (final).ipynb"; each with the submission_secret.txt
nbgrader's submit writes and a timestamp.txt, and submission_times.csv with the same
times) and graded by ``grader.grade.grade_class``. Its nbgrader_config.py (the one the
grader wrote, loading the course's) then gets a temporary exchange, and a Jupyter
server with formgrader is started in it (tests/lab.py ``serve_workspace``). In the
browser, as an instructor would:

* Manage Submissions of 01_similarity lists both students as graded, with their
  submission times, not as "needs autograding";
* chloe's Autograde button (the lightning icon in her row) regrades her as course-grader
  grade does (grader/formgrading.py): the page and the gradebook give the score
  course-grader gave (2 / 10, sample_class/chloe/expected.json), and no graded cell is
  flagged for manual grading;
* ren's Autograde button grades the renamed notebook as course-grader did (2 / 10, the
  same points); pressed again after a second notebook appeared in ren's folder (which
  course-grader does not grade: which one is it?), it says why in its error dialog and
  keeps ren's graded copy and grades;
* on Manage Assignments, Generate Feedback and then Release Feedback of 01_similarity
  succeed (no error dialog), and the exchange holds each student's feedback under the
  name nbgrader's fetch_feedback looks for (the hash of the student's secret and the
  notebook's name in the student's own copy: ren's renamed one), ada's saying "Your
  feedback: 10 / 10 points".

Screenshots of both pages go to the test's temporary folder. Without chromium at
/usr/bin/chromium the tests fail, and say how to install it.
"""
from __future__ import annotations

import csv
import json
import secrets
import shutil
from pathlib import Path

import pytest

from grader import course
from tests import lab as browser_lab

pytestmark = [pytest.mark.browser, pytest.mark.kernel]

A = "01_similarity"
TIMES = {"ada": "2026-12-01 11:00:00.000000 UTC", "chloe": "2026-12-01 11:30:00.000000 UTC",
         "ren": "2026-12-01 11:45:00.000000 UTC"}
PERSONA = {"ada": "ada", "chloe": "chloe", "ren": "chloe"}  # whose sample_class notebook each submitted
RENAMED = {"ren": "my similarity (final).ipynb"}  # the name each renamed notebook was submitted under
EXPECTED = {s: json.loads((course.SAMPLE_CLASS / p / "expected.json").read_text())[A] for s, p in PERSONA.items()}
SHOWN = {s: t.replace(".000000", "") for s, t in TIMES.items()}  # formgrader's timestamp_format
COURSE_ID = "attention-from-scratch"  # c.CourseDirectory.course_id of nbgrader_config.py
# formgrader's table rows and result modals: tests/lab.py (shared with tests/test_hub.py).
ROWS = browser_lab.FORMGRADER_ROWS


@pytest.fixture(scope="module")
def chromium_context(tmp_path_factory):
    browser_lab.require_chromium()
    with browser_lab.browser(tmp_path_factory.mktemp("chromium")) as context:
        yield context


@pytest.fixture(scope="module")
def graded(tmp_path_factory, chromium_context) -> dict:
    """The course directory graded by grade_class, with a temporary exchange in its config:
    {"course", "exchange", "keys", "rows", "workdir"}."""
    from grader.grade import grade_class

    root = tmp_path_factory.mktemp("formgrader-buttons")
    course_dir = root / "course"
    keys = {}
    for student, time in TIMES.items():
        dest = course_dir / "submitted" / student / A
        shutil.copytree(course.SAMPLE_CLASS / PERSONA[student] / A, dest)
        if student in RENAMED:
            (dest / f"{A}.ipynb").rename(dest / RENAMED[student])
        keys[student] = secrets.token_hex(64)  # as nbgrader submit writes it
        (dest / "submission_secret.txt").write_text(keys[student])
        (dest / "timestamp.txt").write_text(time)
    with open(course_dir / "submission_times.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student_id", "assignment_id", "timestamp"])
        writer.writerows([s, A, t] for s, t in TIMES.items())
    rows = {r.student_id: r for r in grade_class(course_dir, progress=False, jobs=2)}
    exchange = root / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)
    config = course_dir / "nbgrader_config.py"
    assert config.is_file(), "grade_class wrote no nbgrader_config.py in the course directory"
    with open(config, "a", encoding="utf-8") as f:
        f.write(f"c.Exchange.root = {str(exchange)!r}\n")
    return {"course": course_dir, "exchange": exchange, "keys": keys, "rows": rows, "workdir": root}


@pytest.fixture(scope="module")
def formgrader(graded, chromium_context):
    """(the running server, a page on it recording its browser dialogs)."""
    with browser_lab.serve_workspace(graded["course"], graded["workdir"]) as server:
        page = browser_lab.record_dialogs(chromium_context.new_page())
        # Log in as an instructor does, on a page of the server itself: formgrader's own
        # pages, opened with ?token=, set the login cookie without Path=/ (their base_url
        # has its slash stripped), so the browser would not send it to formgrader's API.
        page.goto(f"{server.url}/api/status?token={server.token}")
        yield server, page
        page.close()  # before the server stops


def _open(page, server, path: str) -> None:
    browser_lab.open_formgrader(page, server.url, path)


_rows = browser_lab.formgrader_rows


def _press(page, server, button, what: str, shot: Path | None = None) -> str:
    return browser_lab.press_formgrader(page, button, what, lambda: server.log_tail(60), shot)


def test_manage_submissions_lists_both_students_graded_with_their_times(graded, formgrader):
    server, page = formgrader
    _open(page, server, f"manage_submissions/{A}")
    rows = _rows(page)
    assert sorted(rows) == sorted(TIMES), rows
    for student, cells in rows.items():
        assert cells["status"] == "graded", (student, cells)  # not "needs autograding"
        assert cells["timestamp"] == SHOWN[student], (student, cells)
        assert cells["score"] == f"{graded['rows'][student].score:g} / 10", (student, cells)
    assert "needs autograding" not in page.inner_text("#main-table")


def test_formgraders_autograde_button_agrees_with_course_grader(graded, formgrader, tmp_path_factory):
    from nbgrader.api import Gradebook

    from grader.coursedir import CourseDir

    server, page = formgrader
    chloe_row = graded["rows"]["chloe"]
    assert chloe_row.score == EXPECTED["chloe"]["score"] == 2 and chloe_row.status.startswith("graded"), chloe_row
    _open(page, server, f"manage_submissions/{A}")
    chloe = page.locator(ROWS).filter(has=page.locator("td.student-id", has_text="chloe"))
    autograded = graded["course"] / "autograded" / "chloe" / A / f"{A}.ipynb"
    before = autograded.stat().st_mtime_ns
    shots = tmp_path_factory.getbasetemp()
    text = _press(page, server, chloe.locator("td.autograde a:has(span.glyphicon-flash)"), "Autograde of chloe",
                  shots / "formgrader-autograde-modal.png")
    assert f"Successfully autograded '{A}' for student 'chloe'" in text, text
    assert autograded.stat().st_mtime_ns != before, "the Autograde button did not regrade chloe"
    page.wait_for_function("""(rows) => Array.from(document.querySelectorAll(rows)).some(tr =>
        tr.querySelector('td.student-id') && tr.querySelector('td.student-id').innerText.trim() === 'chloe'
        && tr.querySelector('td.score').innerText.trim() !== '')""", arg=ROWS, timeout=30_000)
    shot = shots / "formgrader-manage-submissions.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    rows = _rows(page)
    assert rows["chloe"]["score"] == "2 / 10" and rows["chloe"]["status"] == "graded", rows["chloe"]
    assert rows["chloe"]["timestamp"] == SHOWN["chloe"], rows["chloe"]
    assert rows["ada"]["score"] == "10 / 10", rows["ada"]
    with Gradebook(CourseDir.open(graded["course"]).db_url) as gb:
        submission = gb.find_submission(A, "chloe")
        assert submission.score == chloe_row.score == 2
        grades = {g.name: g for nb in submission.notebooks for g in nb.grades}
        assert grades and not [n for n, g in grades.items() if g.needs_manual_grade], (
            {n: (g.auto_score, g.needs_manual_grade) for n, g in grades.items()})
        points = {course.exercise_id(n): float(g.score) for n, g in grades.items()}
    assert points == chloe_row.points == EXPECTED["chloe"]["exercises"], points


def test_autograde_button_grades_a_renamed_notebook_as_course_grader_and_keeps_a_graded_copy(
        graded, formgrader, tmp_path_factory):
    from nbgrader.api import Gradebook

    from grader.coursedir import CourseDir

    server, page = formgrader
    row = graded["rows"]["ren"]
    assert row.score == EXPECTED["ren"]["score"] and "renamed" in row.status, row  # course-grader's grading
    autograded = graded["course"] / "autograded" / "ren" / A / f"{A}.ipynb"
    before = autograded.stat().st_mtime_ns
    _open(page, server, f"manage_submissions/{A}")
    ren = page.locator(ROWS).filter(has=page.locator("td.student-id", has_text="ren"))
    text = _press(page, server, ren.locator("td.autograde a:has(span.glyphicon-flash)"), "Autograde of ren")
    assert f"Successfully autograded '{A}' for student 'ren'" in text, text
    assert autograded.stat().st_mtime_ns != before, "the Autograde button did not regrade ren"
    graded_copy = autograded.read_bytes()

    def gradebook() -> dict:
        with Gradebook(CourseDir.open(graded["course"]).db_url) as gb:
            grades = [g for nb in gb.find_submission(A, "ren").notebooks for g in nb.grades]
            return {course.exercise_id(g.name): (float(g.score), g.needs_manual_grade) for g in grades}

    points = gradebook()
    assert {e: p for e, (p, _) in points.items()} == row.points == EXPECTED["ren"]["exercises"], points
    assert not [e for e, (_, needs) in points.items() if needs], points
    # a second notebook appears: course-grader cannot tell which to grade, and says so; the graded copy stays
    extra = graded["course"] / "submitted" / "ren" / A / "copy.ipynb"
    shutil.copyfile(extra.with_name(RENAMED["ren"]), extra)
    try:
        _open(page, server, f"manage_submissions/{A}")
        with pytest.raises(AssertionError) as failed:
            _press(page, server, ren.locator("td.autograde a:has(span.glyphicon-flash)"), "Autograde of ren")
    finally:
        extra.unlink()
    assert f"'{A}.ipynb' is missing (found copy.ipynb, {RENAMED['ren']})" in str(failed.value), failed.value
    assert autograded.read_bytes() == graded_copy, "a failed Autograde changed or deleted ren's graded copy"
    assert gradebook() == points
    _open(page, server, f"manage_submissions/{A}")
    assert _rows(page)["ren"]["status"] == "graded", _rows(page)["ren"]  # not "needs autograding"


def test_generate_and_release_feedback_buttons_release_every_students_feedback(graded, formgrader,
                                                                               tmp_path_factory):
    from nbgrader.utils import notebook_hash

    server, page = formgrader
    shots = tmp_path_factory.getbasetemp()
    _open(page, server, "manage_assignments")
    row = page.locator(ROWS).filter(has=page.locator("td.name", has_text=A))
    feedback = graded["course"] / "feedback" / "ada" / A / f"{A}.html"
    before = feedback.stat().st_mtime_ns  # course-grader's
    text = _press(page, server, row.locator("td.generate-feedback a:has(span.glyphicon-comment)"),
                  f"Generate Feedback of {A}", shots / "formgrader-generate-feedback-modal.png")
    assert f"Successfully generated feedback of '{A}'" in text, text
    assert feedback.stat().st_mtime_ns != before, "the Generate Feedback button wrote no feedback"
    text = _press(page, server, row.locator("td.release-feedback a:has(span.glyphicon-envelope)"),
                  f"Release Feedback of {A}", shots / "formgrader-release-feedback-modal.png")
    assert f"Successfully released feedback of '{A}'" in text, text
    page.screenshot(path=str(shots / "formgrader-manage-assignments.png"), full_page=True)
    released = graded["exchange"] / COURSE_ID / "feedback"
    submitted = {s: RENAMED.get(s, f"{A}.ipynb").removesuffix(".ipynb") for s in graded["keys"]}
    expected = {s: f"{notebook_hash(secret=k, notebook_id=submitted[s])}.html" for s, k in graded["keys"].items()}
    assert sorted(p.name for p in released.iterdir()) == sorted(expected.values())
    html = (released / expected["ada"]).read_text(encoding="utf-8")
    assert "Your feedback: 10 / 10 points" in html
    assert "Your feedback: 2 / 10 points" in (released / expected["chloe"]).read_text(encoding="utf-8")
    assert "Your feedback: 2 / 10 points" in (released / expected["ren"]).read_text(encoding="utf-8")
