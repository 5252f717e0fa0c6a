"""The class report and the LMS grade tables, on the class graded once by `graded_class`."""
from __future__ import annotations

import csv
from collections import Counter

import nbformat
import pytest

from grader import course
from grader.classgrades import gradebook_url, read
from grader.cli import main
from grader.lms import BadRoster, read_roster, write_canvas, write_moodle
from grader.report import common_mistakes, pass_rates, write_report

PNG = b"\x89PNG\r\n\x1a\n"


def _max_points() -> dict[str, float]:
    """Exercise id -> points, read from the source notebooks' graded test cells."""
    out = {}
    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and not meta.get("solution"):
                out[course.exercise_id(meta["grade_id"])] = float(meta["points"])
    return out


@pytest.fixture(scope="module")
def graded_rows(graded_class) -> list[dict]:
    """The graded rows of grades.csv (status "graded..."), as the instructor reads them."""
    with open(graded_class["out"] / "grades.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["status"].startswith("graded")]


@pytest.fixture(scope="module")
def report(graded_class, tmp_path_factory) -> dict:
    written = write_report(graded_class["out"], progress=False)
    return {p.name: p for p in written} | {"grades": read(gradebook_url(graded_class["out"]), progress=False)}


def test_report_counts_equal_grades_csv(report, graded_rows):
    grades = report["grades"]
    top = _max_points()
    assignments = sorted({r["assignment_id"] for r in graded_rows})
    assert assignments == sorted(grades.assignments)
    rates, mistakes = pass_rates(grades), common_mistakes(grades)
    page = report["index.html"].read_text()
    for a in assignments:
        rows = [r for r in graded_rows if r["assignment_id"] == a]
        assert sorted(s.score for s in grades.of(a)) == sorted(float(r["score"]) for r in rows), a
        assert f"<tr><td>{a}</td><td>{len(rows)}</td>" in page, a
        for exercise in grades.assignments[a]:
            passed = sum(float(r[exercise]) >= top[exercise] for r in rows)
            assert rates[(a, exercise)] == (passed, len(rows)), (a, exercise)
            assert f"<td><code>{exercise}</code></td><td>{passed} of {len(rows)}</td>" in page
            failed = sum(m.count for m in mistakes if (m.assignment_id, m.exercise) == (a, exercise))
            assert failed == len(rows) - passed, (a, exercise)


def test_common_mistakes_are_grouped_by_diagnosis_with_percentages(report, graded_class):
    grades = report["grades"]
    mistakes = common_mistakes(grades)
    answered = [m for m in mistakes if not m.unanswered]
    assert answered and mistakes[:len(answered)] == answered  # real mistakes first, unanswered last
    assert [m.count for m in answered] == sorted((m.count for m in answered), reverse=True)
    # chloe applied softmax over the query axis in 01's soft_lookup: that mistake is counted
    chloe = graded_class["rows"][("chloe", "01_similarity")].diagnoses["similarity-soft_lookup"]
    found = [m for m in mistakes if m.exercise == "similarity-soft_lookup" and "softmax over the key axis" in m.diagnosis]
    assert found and found[0].diagnosis == chloe
    graded = len(grades.of("01_similarity"))
    assert found[0].sentence().startswith(f"{round(100 * found[0].count / graded)}% of graded submissions of "
                                          f"01_similarity ({found[0].count} of {graded}): ")
    page = report["index.html"].read_text()
    top = mistakes[0]
    assert f"<strong>{top.percent:.0f}%</strong> ({top.count} of {top.graded})" in page


def test_figures_are_png_files_the_page_shows(report):
    import matplotlib.image

    page = report["index.html"].read_text()
    for name in ("scores.png", "pass_rate.png", "mistakes.png"):
        assert report[name].read_bytes()[:8] == PNG, name
        height, width = matplotlib.image.imread(report[name]).shape[:2]
        assert height > 150 and width > 300, name
        assert f'<img src="{name}"' in page


def _table(path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_canvas_and_moodle_csvs_parse_with_the_lms_headers(report, graded_class):
    grades = report["grades"]
    scores = {(r.student_id, r.assignment_id): r.score for r in graded_class["rows"].values()
              if r.status.startswith("graded")}
    canvas = _table(report["canvas.csv"])
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *grades.assignments]
    assert canvas[1][0].strip() == "Points Possible"
    assert canvas[1][5:] == [f"{grades.max_score(a):g}" for a in grades.assignments]
    moodle = _table(report["moodle.csv"])
    assert moodle[0] == ["Full name", "Email address", "ID number", *grades.assignments]
    for table, first in ((canvas[2:], 5), (moodle[1:], 3)):
        assert sorted(r[0] for r in table) == grades.students
        for row in table:
            for a, cell in zip(grades.assignments, row[first:]):
                want = scores.get((row[0], a))
                assert cell == ("" if want is None else f"{want:g}"), (row[0], a)


def test_a_roster_fills_the_lms_identity_columns(report, tmp_path):
    grades = report["grades"]
    roster = tmp_path / "roster.csv"
    roster.write_text("student_id,name,email,sis_user_id,sis_login_id,canvas_id,section\n"
                      'ada,"Lovelace, Ada",ada@example.org,S001,alovelace,101,A\n', encoding="utf-8")
    people = read_roster(roster)
    canvas = {r[0]: r for r in _table(write_canvas(grades, tmp_path / "c.csv", people))}
    assert canvas["Lovelace, Ada"][:5] == ["Lovelace, Ada", "101", "S001", "alovelace", "A"]
    assert canvas["ben"][1:5] == ["", "", "", ""]  # unknown to the course: left empty
    moodle = {r[0]: r for r in _table(write_moodle(grades, tmp_path / "m.csv", people))}
    assert moodle["Lovelace, Ada"][:3] == ["Lovelace, Ada", "ada@example.org", "S001"]
    bad = tmp_path / "bad.csv"
    bad.write_text("name,email\nAda,ada@example.org\n")
    with pytest.raises(BadRoster, match="student_id column"):
        read_roster(bad)


def test_the_command_prints_only_file_names_on_stdout_and_one_line_for_bad_input(graded_class, tmp_path, capsys):
    assert main(["report", "--course", str(graded_class["out"])]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() and all(line.startswith("wrote ") for line in captured.out.splitlines())
    assert "class report" in captured.err  # tqdm's bar, on stderr
    assert main(["report", "--course", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("course-grader report: no gradebook at") and "make grade" in err[0]
    assert not (tmp_path / "nothing").exists()  # looking left nothing behind
    bad = tmp_path / "roster.csv"
    bad.write_text("who\nada\n")
    assert main(["report", "--course", str(graded_class["out"]), "--roster", str(bad)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_mistake_grouping_ignores_numbers_only():
    from grader.classgrades import mistake_key

    assert mistake_key("f(a) for a of shape (2, 4, 3): wrong") == mistake_key("f(a) for a of shape (3, 5, 2): wrong")
    assert mistake_key("rows sum to 1") != mistake_key("columns sum to 1")
    assert Counter(map(mistake_key, ["x 1", "x 2", "y 1"])) == Counter({"x #": 2, "y #": 1})


def test_a_manual_comment_reaches_only_its_student(tmp_path):
    """An instructor's comment in formgrader is written to one student: the class's common
    mistakes (the report page and mistakes.png, both drawn from ``common_mistakes``) hold
    the automatic diagnoses only, however many students have a manual comment."""
    from nbgrader.api import Gradebook

    import grader.release  # noqa: F401  (nbgrader's alembic revision in process, not a subprocess)
    from grader.report import _html

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    private = "You raised on purpose? Partial credit, see me."
    automatic = "the softmax is over the query axis: take it over the key axis"
    with Gradebook(url) as gb:
        gb.add_assignment("03_masking")
        gb.add_notebook("03_masking", "03_masking")
        gb.add_grade_cell("masking-causal_mask-test", "03_masking", "03_masking", max_score=2, cell_type="code")
        gb.add_solution_cell("masking-causal_mask", "03_masking", "03_masking")
        for student in ("ada", "kai", "lee"):
            gb.add_student(student)
            gb.add_submission("03_masking", student)
            grade = gb.find_grade("masking-causal_mask-test", "03_masking", "03_masking", student)
            grade.auto_score = 0.0
            comment = gb.find_comment("masking-causal_mask", "03_masking", "03_masking", student)
            comment.auto_comment = automatic
            if student != "lee":
                comment.manual_comment = private
        gb.db.commit()
    grades = read(url, progress=False)
    mistakes = common_mistakes(grades)
    assert [(m.exercise, m.diagnosis, m.count) for m in mistakes] == [("masking-causal_mask", automatic, 3)]
    assert "Partial credit" not in _html(grades, pass_rates(grades), mistakes)
