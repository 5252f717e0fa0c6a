"""Feedback that reads like a tutor's comments, on the class graded once by `graded_class`."""
from __future__ import annotations

import html
import re

import nbformat
import pytest

from grader import course


def _feedback(graded_class, student: str, assignment: str) -> str:
    return (graded_class["out"] / "feedback" / student / assignment / f"{assignment}.html").read_text()


def _figures_after(assignment: str) -> dict[str, int]:
    """Exercise id -> the figure cells (grade ids <topic>-fig-...) between its test cell and the next exercise."""
    figures: dict[str, int] = {}
    current = None
    for cell in nbformat.read(course.SOLUTIONS / assignment / f"{assignment}.ipynb", as_version=4).cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if grade_id.endswith(course.TEST_SUFFIX):
            current = course.exercise_id(grade_id)
            figures[current] = 0
        elif current and cell.cell_type == "code" and "-fig-" in grade_id:
            figures[current] += 1
    return figures


def test_summary_at_the_top_gives_score_points_diagnosis_and_hint(graded_class):
    row = graded_class["rows"][("chloe", "01_similarity")]
    page = _feedback(graded_class, "chloe", "01_similarity")
    summary = page[page.index('class="tutor-summary"'):page.index("</div>", page.index('class="tutor-summary"'))]
    assert page.index('class="tutor-summary"') < page.index('class="tutor-comment"')
    assert f"{row.score:g} / {row.max_score:g} points" in summary
    for exercise, points in row.points.items():
        assert f'href="#tutor-{exercise}"' in summary
        assert re.search(rf'href="#tutor-{exercise}">.*?</td><td>{points:g} / \d+</td>', summary), exercise
    for diagnosis in row.diagnoses.values():
        assert html.escape(diagnosis) in summary
    assert summary.count("<em>Hint:</em>") == len(row.diagnoses)
    assert "What to revisit" in summary and "5. From scores to a soft lookup (soft_lookup)" in summary


@pytest.mark.parametrize("assignment", course.assignments())
def test_each_exercise_is_followed_by_its_comment_and_the_learner_s_figures(graded_class, assignment):
    page = _feedback(graded_class, "zz_solution", assignment)
    figures = _figures_after(assignment)
    starts = [page.index(f'class="tutor-comment" id="tutor-{e}"') for e in figures]
    assert starts == sorted(starts), "comments in notebook order"
    for (exercise, count), start, end in zip(figures.items(), starts, starts[1:] + [len(page)]):
        assert "all hidden checks passed" in page[start:start + 400], exercise
        assert page[start:end].count("<img") >= count, f"{exercise}: {count} figure(s) expected"


@pytest.mark.parametrize("student", ["chloe", "gus", "zz_release", "kai"])
def test_feedback_shows_no_traceback_or_hidden_input(graded_class, student):
    for assignment in course.assignments():
        path = graded_class["out"] / "feedback" / student / assignment / f"{assignment}.html"
        if not path.is_file():
            continue
        page = path.read_text()
        for secret in ("most recent call last", "site-packages", 'File "', "/home/student", "BEGIN HIDDEN", "check(\""):
            assert secret not in page, (student, assignment, secret)


def test_the_check_cell_is_one_line_when_the_release_notebook_is_graded(graded_class):
    """zz_release submitted the released notebooks, which end with the check-my-work cell."""
    for assignment in course.assignments():
        graded = graded_class["out"] / "autograded" / "zz_release" / assignment / f"{assignment}.ipynb"
        last = nbformat.read(graded, as_version=4).cells[-1]
        assert "check_my_work" in last.source
        assert [o.get("text", "").strip() for o in last.outputs] == [
            "check my work: skipped while this notebook is graded or validated"], assignment


def test_the_tutor_s_cells_are_valid_nbformat_4_5_cells():
    """Cells added to the feedback carry ids (nbformat warns on every feedback page otherwise)."""
    from grader.tutor import _markdown

    cell = _markdown("<div>comment</div>")
    nb = nbformat.v4.new_notebook(cells=[cell])
    nbformat.validate(nb)
    assert cell.get("id")


def test_check_my_work_says_in_one_line_that_the_hidden_checks_try_other_inputs(tmp_path):
    """Issue 33: a learner whose visible tests and Validate pass must not read that as the grade."""
    from grader.selfcheck import Checked

    text = Checked("12_gpt", "graded", 3.0, 3.0, []).text(tmp_path / "12_gpt.ipynb")
    lines = text.splitlines()
    assert lines[0].startswith("Checked 12_gpt.ipynb") and "hidden checks try other inputs" in lines[1], text
