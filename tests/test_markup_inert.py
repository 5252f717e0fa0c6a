"""Student markup is inert in the pages the instructor and the student open, in chromium
(issue 32, failures 2 and 3).

A student (sample_class's ada, renamed) submits 01_similarity with one more markdown
cell near the top: for every grade cell of the notebook, formgrader's own markup (a
``.nbgrader_cell`` holding elements with the grade cell's ids, ``<grade_id>``,
``<grade_id>_extra_credit`` and ``<grade_id>-comment``, of classes ``score`` and
``comment``), and a "full credit" button made an invisible layer over the whole page
with Bootstrap's classes (``full-credit modal-backdrop fade``: fixed, full page,
transparent, above everything); and a fake "Score: 10.0 / 10.0" header fixed over the
top of the page (``navbar-fixed-top``). No script, no style attribute: classes and ids
alone, which is how the issue's attack worked.

The class is graded by ``grade_class`` (one kernel), a Jupyter server with formgrader is
started on the course directory, and in one browser session:

* formgrader's submission view: every grade widget formgrader made (its Backbone views)
  is bound to the real input of its own cell, every comment widget to the real
  textarea; each real score input, the navigation bar and the submission header are
  the topmost element at their position (``document.elementFromPoint``); a click on the
  first score input focuses it, and what is typed there and in a comment box is saved
  to that grade and that comment in the gradebook, and no other grade changes;
* the feedback page course-grader wrote: its score header, its table of contents and
  the tutor's summary are topmost where they are drawn.

Screenshots of both pages go to the test's temporary folder.
"""
from __future__ import annotations

import csv
import secrets
import shutil
import time

import nbformat
import pytest

from grader import course
from tests import lab as browser_lab

pytestmark = [pytest.mark.browser, pytest.mark.kernel]

A = "01_similarity"
STUDENT = "markup_mallory"
TIME = "2026-12-01 11:00:00.000000 UTC"

# Is the element at the centre of ``el`` (scrolled into view) ``el`` or inside it?
TOPMOST = """(el) => {
    el.scrollIntoView({block: "center", inline: "center"});
    const r = el.getBoundingClientRect();
    const top = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return top === el || el.contains(top) ? "" :
        (top ? top.tagName + "." + top.className + ": " + top.innerText.slice(0, 80) : "nothing");
}"""


def hijacking_markdown(grade_ids: list[str]) -> str:
    """formgrader's markup for each grade cell, a transparent full-page "full credit"
    layer, and a fake score header fixed at the top: classes and ids only."""
    cells = "".join(
        f'<div class="panel panel-primary nbgrader_cell"><div class="panel-heading">'
        f'<span class="score tabbable" id="{g}">0</span><span class="extra-credit" id="{g}_extra_credit">0</span>'
        f'<span class="comment tabbable" id="{g}-comment">x</span>'
        f'<div class="btn btn-success full-credit modal-backdrop fade">Full credit</div></div></div>'
        for g in grade_ids)
    fake = ('<div class="navbar navbar-default navbar-fixed-top"><h4 class="navbar-text">'
            "Score: 10.0 / 10.0</h4></div>")
    return f"{fake}\n\n{cells}\n"


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """The attacking submission collected and graded: {"course", "workdir", "grade_ids"}."""
    from grader.grade import grade_class

    browser_lab.require_chromium()  # before grading: fail at once where there is none

    root = tmp_path_factory.mktemp("markup-inert")
    course_dir = root / "course"
    dest = course_dir / "submitted" / STUDENT / A
    shutil.copytree(course.SAMPLE_CLASS / "ada" / A, dest)
    nb = nbformat.read(dest / f"{A}.ipynb", as_version=4)
    grade_ids = [c.metadata.nbgrader["grade_id"] for c in nb.cells
                 if c.metadata.get("nbgrader", {}).get("grade") or c.metadata.get("nbgrader", {}).get("solution")]
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(hijacking_markdown(grade_ids)))
    nbformat.write(nb, dest / f"{A}.ipynb")
    (dest / "submission_secret.txt").write_text(secrets.token_hex(64))  # as nbgrader submit writes it
    (dest / "timestamp.txt").write_text(TIME)
    with open(course_dir / "submission_times.csv", "w", newline="") as f:
        csv.writer(f).writerows([["student_id", "assignment_id", "timestamp"], [STUDENT, A, TIME]])
    rows = grade_class(course_dir, progress=False, jobs=1)
    assert [r.status for r in rows if r.student_id == STUDENT][0].startswith("graded"), rows
    return {"course": course_dir, "workdir": root, "grade_ids": grade_ids}


def _grades(course_dir) -> tuple[int, dict, dict]:
    """(the notebook submission's id, {grade: (manual score, max)}, {comment: manual text})."""
    from nbgrader.api import Gradebook

    from grader.coursedir import CourseDir

    with Gradebook(CourseDir.open(course_dir).db_url) as gb:
        notebook = gb.find_submission_notebook(A, A, STUDENT)  # notebook, assignment, student
        return (notebook.id, {g.name: (g.manual_score, g.max_score) for g in notebook.grades},
                {c.name: c.manual_comment for c in notebook.comments})


def _wait_for(what: str, check, seconds: float = 20):
    deadline = time.monotonic() + seconds
    while not (found := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds:g} s")
        time.sleep(0.2)
    return found


def test_student_markup_cannot_capture_formgraders_widgets_or_cover_the_pages(graded, tmp_path_factory):
    shots = tmp_path_factory.getbasetemp()
    with browser_lab.browser(graded["workdir"]) as context:
        _check_formgrader(context, graded, shots)
        _check_feedback(context, graded, shots)


def _check_formgrader(chromium_context, graded, shots) -> None:
    submission_id, before, comments_before = _grades(graded["course"])
    assert before and all(manual is None for manual, _ in before.values()), before
    with browser_lab.serve_workspace(graded["course"], graded["workdir"]) as server:
        page = browser_lab.record_dialogs(chromium_context.new_page())
        try:
            page.goto(f"{server.url}/api/status?token={server.token}")  # log in (tests/test_formgrader_buttons.py)
            page.goto(f"{server.url}/formgrader/submissions/{submission_id}/?index=0")
            page.wait_for_function("() => window.formgrader && formgrader.grades.loaded && formgrader.comments.loaded",
                                   timeout=60_000)
            # Each widget formgrader made is bound to its own cell's real input.
            bindings = page.evaluate("""() => [
                ...formgrader.grade_uis.map(ui => {
                    const name = ui.model.get("name"), real = document.getElementById(name);
                    return [name, real && real.tagName === "INPUT" && ui.$score.length === 1 && ui.$score[0] === real
                            && ui.$el.find(".full-credit").length === 1
                            && ui.$el.find(".full-credit")[0].tagName === "BUTTON"];
                }),
                ...formgrader.comment_uis.map(ui => {
                    const name = ui.model.get("name"), real = document.getElementById(name + "-comment");
                    return [name + "-comment", real && real.tagName === "TEXTAREA" && ui.$comment.length === 1
                            && ui.$comment[0] === real];
                })]""")
            assert len(bindings) == len(before) + len(comments_before), bindings
            assert all(bound for _, bound in bindings), [name for name, bound in bindings if not bound]
            # The page's own controls are on top where they are drawn.
            covered = {}
            for selector in ("nav.navbar", ".panel-title", "input.score", "textarea.comment", "button.full-credit"):
                for i, element in enumerate(page.locator(selector).element_handles()):
                    if (what := page.evaluate(TOPMOST, element)):
                        covered[f"{selector}[{i}]"] = what
            page.screenshot(path=str(shots / "markup-formgrader.png"), full_page=False)
            assert not covered, covered
            # A click on the first score input lands in it; what is typed is saved there.
            first, note = next(iter(before)), bindings[len(before)][0][:-len("-comment")]
            score = page.locator(f"input.score#{first}")
            score.scroll_into_view_if_needed()
            box = score.bounding_box()
            page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            assert page.evaluate("(id) => document.activeElement && document.activeElement.id === id", first)
            value = before[first][1] / 4
            page.keyboard.type(f"{value:g}")
            page.keyboard.press("Escape")  # formgrader: defocus and save
            comment = page.locator(f"textarea.comment#{note}-comment")
            comment.click()
            page.keyboard.type("see the docstring")
            page.keyboard.press("Tab")  # formgrader: on to the next input, which saves this one
            _, after, comments = _wait_for("the typed score and comment saved", lambda: (
                (found := _grades(graded["course"]))[1][first][0] is not None and found[2][note] and found))
            assert after[first][0] == value and comments[note] == "see the docstring", (after, comments)
            assert {n: g for n, g in after.items() if n != first} == {n: g for n, g in before.items() if n != first}
            assert not page.dialogs, page.dialogs
        finally:
            page.close()  # before the server stops


def _check_feedback(chromium_context, graded, shots) -> None:
    """The feedback page course-grader wrote: its score, contents and summary on top."""
    feedback = graded["course"] / "feedback" / STUDENT / A / f"{A}.html"
    page = chromium_context.new_page()
    try:
        page.goto(feedback.as_uri())
        covered = {}
        for selector in (".panel-heading h4", "#toc", ".tutor-summary h2", ".tutor-summary table"):
            element = page.locator(selector).first.element_handle()
            if (what := page.evaluate(TOPMOST, element)):
                covered[selector] = what
        page.evaluate("() => window.scrollTo(0, 0)")
        page.screenshot(path=str(shots / "markup-feedback.png"))
        assert not covered, covered
        assert "Score: 10.0 / 10.0" in page.inner_text("body")  # the student's text is still there, as text
    finally:
        page.close()
