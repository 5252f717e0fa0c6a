"""What the tutor says of each exercise, as data and as text for a terminal or a notebook's
output: no nbgrader here, so that the check of one exercise in a learner's kernel
(``grader.kernelcheck``) imports only this and the checks. ``grader.tutor`` re-exports
it beside the feedback's HTML.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import checks, course


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
        if self.diagnosis and "this kernel has not run its cell" in self.diagnosis:
            return (f"run the cell of `{self.function}` in {where} (or Run > Run All Cells), filled in where it "
                    "says YOUR CODE HERE, then check again")
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
