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
from dataclasses import dataclass

import nbformat
from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from . import course
from . import checks
from .feedback import AUTOGRADER_COMMENT, is_test_cell, verdict_of
from .sanitize import NO_MATH, mark_trusted, text_html


@dataclass(frozen=True)
class Comment:
    """The tutor's comment on one exercise."""

    exercise: str  # the exercise id, e.g. "softmax-stable_softmax"
    points: float
    max_points: float
    diagnosis: str | None  # None when the hidden checks passed
    section: str  # the notebook section the exercise sits in
    function: str  # the learner's function or class
    remark: str | None = None  # what the instructor wrote in formgrader, if anything

    @property
    def passed(self) -> bool:
        """Full points: the hidden checks passed, or the instructor gave them by hand."""
        return self.points >= self.max_points

    @property
    def hint(self) -> str | None:
        """Where to look next; None for a passed exercise."""
        if self.passed:
            return None
        where = f'section "{self.section}"' if self.section else "its section"
        if self.diagnosis and "not answered yet" in self.diagnosis:
            return f"fill in `{self.function}` in {where} (the cell marked YOUR CODE HERE), then run the test below it"
        if self.diagnosis and self.diagnosis.startswith("stopped at the time limit"):
            return f"look for a loop that never ends in `{self.function}` ({where})"
        return (f"re-read {where} and the docstring of `{self.function}`; the visible test under it "
                "is a small case you can work out by hand")


def _function(exercise: str) -> str:
    try:
        return checks.get(exercise).function
    except LookupError:  # a test cell without a registered check: name it by its id
        return exercise.split("-", 1)[-1]


def comments(assignment_id: str, points: dict[str, float], max_points: dict[str, float],
             diagnoses: dict[str, str | None], remarks: dict[str, str] | None = None) -> list[Comment]:
    """One comment per exercise of ``max_points``, in notebook order.

    ``points``/``max_points``: exercise id -> points; ``diagnoses``: exercise id -> the
    check's diagnosis of a failed exercise (absent or None when it passed); ``remarks``:
    exercise id -> the instructor's comment on the answer, when there is one.
    """
    titles = course.sections(assignment_id)
    order = list(titles) + sorted(set(max_points) - set(titles))
    remarks = remarks or {}
    return [Comment(e, float(points.get(e, 0.0)), float(max_points[e]),
                    diagnoses.get(e) or _short(points.get(e, 0.0), max_points[e]),
                    titles.get(e, ""), _function(e), remarks.get(e))
            for e in order if e in max_points]


def _short(points: float, max_points: float) -> str | None:
    """What to say of points short of the maximum that no check explains: the checks give all
    or nothing, so part of the points was given by hand."""
    if points >= max_points:
        return None
    return "no points" if points <= 0 else f"{points:g} of {max_points:g} points, given by hand"


def revisit(found: list[Comment]) -> list[str]:
    """The sections to revisit, each with the functions that failed there, in notebook order."""
    out: dict[str, list[str]] = {}
    for c in found:
        if not c.passed:
            out.setdefault(c.section or c.exercise, []).append(c.function)
    return [f"{section} ({', '.join(functions)})" for section, functions in out.items()]


def exercise_lines(c: Comment, width: int = 0) -> list[str]:
    """One exercise for a terminal: PASS or FAIL, its id (padded to ``width``) and points;
    for a failed one, what went wrong and the hint. The lines of ``as_text`` and of the
    check of one exercise in the learner's kernel (``grader.kernelcheck``)."""
    lines = [f"  {'PASS' if c.passed else 'FAIL'}  {c.exercise:<{width}}  {c.points:g}/{c.max_points:g}"]
    if not c.passed:
        lines.append(f"        what went wrong: {c.diagnosis}")
        lines.append(f"        hint: {c.hint}")
    return lines


def as_text(found: list[Comment], score: float, max_score: float) -> str:
    """The comments for a terminal: a line per exercise, the score, what to revisit."""
    width = max((len(c.exercise) for c in found), default=0)
    lines = [line for c in found for line in exercise_lines(c, width)]
    lines.append("")
    lines.append(f"Score: {score:g}/{max_score:g}")
    todo = revisit(found)
    lines.append("What to revisit: " + ("; ".join(todo) if todo else "nothing, every hidden check passed."))
    return "\n".join(lines)


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
