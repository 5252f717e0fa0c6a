"""What a tutor says about a graded notebook: per exercise the points, the diagnosis, a
hint, and the sections to revisit; as text (``course-grader check``) and as the
summary at the top of the feedback HTML (``TutorSummary``, an nbgrader preprocessor).

Everything said comes from the grader's verdicts (``grader.verify``: the diagnosis
names the likely mistake, never the hidden inputs) and from the source notebook's
headings (``grader.course.sections``); no hidden test code is ever quoted.

A diagnosis may quote a student's exception message: in HTML it is text
(``grader.sanitize.text_html``), and the tutor's cells are of class ``NO_MATH`` so
MathJax leaves a ``$`` in it alone.
"""
from __future__ import annotations

import html

import nbformat
from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from . import course
from .feedback import AUTOGRADER_COMMENT, is_test_cell, verdict_of
from .sanitize import NO_MATH, mark_trusted, text_html
from .tutortext import Comment, as_text, comments, exercise_lines, revisit  # noqa: F401 - the tutor's API


def _remark(c: Comment) -> str:
    return f"<br><em>Your instructor:</em> {text_html(c.remark)}" if c.remark else ""


def _row(c: Comment) -> str:
    mark = "&#10003;" if c.passed else "&#10007;"
    said = ("all hidden checks passed" if c.diagnosis is None else "full points, given by hand") if c.passed else (
        f"{text_html(c.diagnosis or '')}<br><em>Hint:</em> {text_html(c.hint or '')}")
    said += _remark(c)
    return (f'<tr class="{"passed" if c.passed else "failed"}"><td>{mark}</td>'
            f'<td><a href="#tutor-{html.escape(c.exercise)}"><code>{html.escape(c.function)}</code></a></td>'
            f"<td>{c.points:g} / {c.max_points:g}</td><td>{said}</td></tr>")


def summary_html(found: list[Comment], score: float, max_score: float, late_penalty: float = 0.0) -> str:
    """The summary at the top of the feedback: score, a row per exercise, what to revisit.

    HTML on one line (a markdown cell holding it is one HTML block, never parsed as
    markdown); every string in it is escaped text.
    """
    late = f"<p>Late submission penalty: &minus;{late_penalty:g} points.</p>" if late_penalty else ""
    todo = revisit(found)
    advice = ("<p><strong>What to revisit:</strong></p><ul>"
              + "".join(f"<li>{text_html(t)}</li>" for t in todo) + "</ul>") if todo else (
        "<p>Every hidden check passed. Well done.</p>")
    return (f'<div class="tutor-summary"><div class="{NO_MATH}"><h2>Your feedback: {score:g} / {max_score:g} points</h2>{late}'
            '<table class="table table-condensed"><thead><tr><th></th><th>exercise</th><th>points</th>'
            "<th>the tutor's comment</th></tr></thead><tbody>"
            + "".join(_row(c) for c in found) + f"</tbody></table>{advice}</div></div>")


def comment_html(c: Comment) -> str:
    """The comment shown in the body, right under the exercise's test cell (one line of
    HTML, its strings escaped text)."""
    if c.passed:
        how = "all hidden checks passed" if c.diagnosis is None else "full points, given by hand"
        said = f"&#10003; <code>{html.escape(c.function)}</code>: {c.points:g} / {c.max_points:g}, {how}."
    else:
        said = (f"&#10007; <code>{html.escape(c.function)}</code>: {c.points:g} / {c.max_points:g}. "
                f"{text_html(c.diagnosis or '')}<br><em>Hint:</em> {text_html(c.hint or '')}")
    said += _remark(c)
    return f'<div class="tutor-comment" id="tutor-{html.escape(c.exercise)}"><span class="{NO_MATH}">{said}</span></div>'


def _markdown(source: str) -> NotebookNode:
    cell = nbformat.v4.new_markdown_cell(source)  # with a cell id, as nbformat 4.5 requires
    mark_trusted(cell)  # the course's own: keeps its anchors and table classes (grader/sanitize.py)
    return cell


class TutorSummary(NbGraderPreprocessor):
    """Feedback that reads like a tutor's comments.

    Runs after nbgrader's ``GetGrades`` (which puts each graded cell's score and the
    notebook's score in place) and ``ExplainFailures``. Adds a summary at the top, and
    under each exercise's test cell the comment on it; the learner's own figures, drawn
    by the cells that follow the exercise, stay where they are.
    """

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        points, max_points, diagnoses, anchors, remarks = {}, {}, {}, {}, {}
        for index, cell in enumerate(nb.cells):
            remark = cell.metadata.get("nbgrader", {}).get("comment")
            if isinstance(remark, str) and remark.strip() and remark.strip() != "No response." \
                    and not remark.startswith(AUTOGRADER_COMMENT):  # one an instructor wrote
                remarks[course.exercise_id(cell.metadata.nbgrader["grade_id"])] = remark.strip()
            if is_test_cell(cell):
                meta = cell.metadata.nbgrader
                exercise = course.exercise_id(meta["grade_id"])
                points[exercise] = float(meta.get("score") or 0.0)
                max_points[exercise] = float(meta.get("points") or 0.0)
                verdict = verdict_of(cell) or {}
                diagnoses[exercise] = verdict.get("diagnosis")
                anchors[index] = exercise
        found = {c.exercise: c for c in comments(info["assignment"], points, max_points, diagnoses, remarks)}
        cells = [_markdown(summary_html(list(found.values()), float(info.get("score") or 0.0),
                                        float(info.get("max_score") or 0.0), float(info.get("late_penalty") or 0.0)))]
        for index, cell in enumerate(nb.cells):
            cells.append(cell)
            if index in anchors:
                cells.append(_markdown(comment_html(found[anchors[index]])))
        nb.cells = cells
        return nb, resources
