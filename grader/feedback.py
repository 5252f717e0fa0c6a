"""Plain-language diagnoses of graded test cells, for the grade table and feedback.

nbgrader's feedback would show each failed test cell's traceback: hidden test code
and grader internals. ``ExplainFailures`` replaces it with one line saying what went
wrong and where to look, taken from the check's diagnosis.
"""
from __future__ import annotations

import re

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.utils import is_grade, is_solution

from coursekit.probe import MIME

from .course import exercise_id

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def is_test_cell(cell: NotebookNode) -> bool:
    """An autograded test cell: graded, code, and not a solution cell."""
    return cell.cell_type == "code" and is_grade(cell) and not is_solution(cell)


def diagnose(cell: NotebookNode, limits: str = "") -> str | None:
    """What went wrong in an executed test cell, in one line; None when it passed.

    ``limits`` describes the time limits for the timeout message, e.g. " (45 s a cell)".
    """
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    if any(o.ename == "CellTimeoutError" for o in errors):
        # the interrupt that stops a timed-out cell also shows up as a KeyboardInterrupt
        return f"stopped at the time limit{limits}: is there an endless loop?"
    if not errors:
        return None
    name, value = errors[0].ename, _ANSI.sub("", str(errors[0].evalue)).strip()
    if "NotImplementedError" in (name, value.split(":")[0]):
        return "not answered yet: the function still raises NotImplementedError"
    if name == "NameError":
        return f"{value}: run the solution cell above, or restore it if it was deleted"
    if name == "AssertionError":
        return f"a visible test failed: {value.splitlines()[0] if value else '(no message)'}"
    return f"{name}: {value.splitlines()[0] if value else ''}".strip()


def verdict_of(cell: NotebookNode) -> dict | None:
    """The trusted verdict ``grader.verify`` stored on a graded test cell, if any."""
    return cell.metadata.get("attention_course")


class ExplainFailures(NbGraderPreprocessor):
    """Show each graded test cell's verdict in one line, instead of errors and answers.

    The answers handed to the grader and any traceback (hidden test code, grader
    internals) are removed; a failed exercise gets its diagnosis. An error in any other
    cell (a figure drawn with a broken function) keeps only its last line, "Name: message":
    the learner sees what went wrong without the frames of the sandbox and the libraries.
    """

    def preprocess_cell(self, cell, resources, index):
        if is_test_cell(cell):
            verdict = verdict_of(cell) or {}
            outputs = [o for o in cell.outputs
                       if o.output_type != "error" and MIME not in o.get("data", {})]
            message = verdict.get("diagnosis") if verdict else diagnose(cell)
            if message:
                exercise = exercise_id(cell.metadata.nbgrader["grade_id"])
                outputs.append(NotebookNode(
                    output_type="error", ename="Not yet", evalue=message,
                    traceback=[f"{exercise}: {message}"]))
            cell.outputs = outputs
        elif cell.cell_type == "code":
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    output.traceback = [f"{output.ename}: {_ANSI.sub('', str(output.evalue)).strip()}"]
        return cell, resources
