"""Plain-language diagnoses of graded test cells, for the grade table and feedback.

nbgrader's feedback would show each failed test cell's traceback: hidden test code
and grader internals. ``ExplainFailures`` replaces it with one line saying what went
wrong and where to look, taken from the check's diagnosis.

A diagnosis can quote the message of an exception the student's code raised, so it is
student-controlled text: ``diagnose`` makes it one printable line (``sanitize.one_line``)
and ``ExplainFailures`` hands it to nbgrader's feedback template as escaped text, never
as markdown or HTML.

``FeedbackExporter`` is the page's exporter (``c.GenerateFeedback.exporter_class``):
nbconvert's own, compiling its templates once per process instead of once per page.
"""
from __future__ import annotations

import re

from jinja2 import BytecodeCache
from nbconvert.exporters import HTMLExporter
from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.utils import is_grade, is_solution

from coursekit.probe import MIME

from .course import exercise_id
from .sanitize import NO_MATH, one_line, text_html

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def is_test_cell(cell: NotebookNode) -> bool:
    """An autograded test cell: graded, code, and not a solution cell."""
    return cell.cell_type == "code" and is_grade(cell) and not is_solution(cell)


def diagnose(cell: NotebookNode, limits: str = "") -> str | None:
    """What went wrong in an executed test cell, in one line; None when it passed.

    ``limits`` describes the time limits for the timeout message, e.g. " (45 s of CPU a cell)".
    The exception's name and message are the student's: only the first line of the
    message is kept, as ``sanitize.one_line`` makes it (no control characters, at most
    a few hundred characters), so the diagnosis is plain text wherever it is shown.
    """
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    if any(o.get("ename") == "CellTimeoutError" for o in errors):
        # the interrupt that stops a timed-out cell also shows up as a KeyboardInterrupt
        return f"stopped at the time limit{limits}: is there an endless loop?"
    if not errors:
        return None
    name = one_line(errors[0].get("ename", ""), 100)
    value = _ANSI.sub("", str(errors[0].get("evalue", ""))).strip()
    value = value.splitlines()[0] if value else ""
    if "NotImplementedError" in (name, value.split(":")[0]):
        return "not answered yet: the function still raises NotImplementedError"
    if name == "NameError":
        return one_line(f"{value}: run the solution cell above, or restore it if it was deleted")
    if name == "AssertionError":
        return one_line(f"a visible test failed: {value or '(no message)'}")
    return one_line(f"{name}: {value}")


AUTOGRADER_COMMENT = '<div class="autograder-comment'  # how an autograder's comment starts in feedback


def comment_text(comment: str) -> str:
    """An autograder comment (a diagnosis) as nbgrader's feedback template needs it.

    The template renders ``metadata.nbgrader.comment`` with ``markdown2html`` and
    nothing else. This returns one HTML block, ``<div class="tex2jax_ignore ...">``
    around ``sanitize.text_html(comment)``: markdown leaves an HTML block alone, so
    ``[x](...)``, ``*`` and ``$`` stay characters, and MathJax skips it.
    """
    return f'{AUTOGRADER_COMMENT} {NO_MATH}">{text_html(comment)}</div>'


def verdict_of(cell: NotebookNode) -> dict | None:
    """The trusted verdict ``grader.verify`` stored on a graded test cell, if any."""
    return cell.metadata.get("attention_course")


class ExplainFailures(NbGraderPreprocessor):
    """Show each graded test cell's verdict in one line, instead of errors and answers.

    The answers handed to the grader and any traceback (hidden test code, grader
    internals) are removed; a failed exercise gets its diagnosis. An error in any other
    cell (a figure drawn with a broken function) keeps only its last line, "Name: message":
    the learner sees what went wrong without the frames of the sandbox and the libraries.

    nbgrader's ``GetGrades`` put each answer cell's comment in its metadata; the
    autograder's comments (a diagnosis, "No response.") become ``comment_text``, plain
    text; a comment an instructor wrote stays markdown (cleaned by ``grader.sanitize``
    like every markdown of the page).
    """

    def preprocess(self, nb, resources):
        said = {"No response."}
        for cell in nb.cells:
            if is_test_cell(cell):
                verdict = verdict_of(cell) or {}
                said.add(verdict.get("diagnosis") if verdict else diagnose(cell))
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if isinstance(meta.get("comment"), str) and meta["comment"] in said:
                meta["comment"] = comment_text(meta["comment"])
        return super().preprocess(nb, resources)

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
                    output.traceback = [one_line(f"{output.get('ename', '')}: {output.get('evalue', '')}")]
        return cell, resources


class _CompiledTemplates(BytecodeCache):
    """Jinja's compiled templates, kept for the life of the process, keyed as Jinja keys
    them: the template's name and file, and a checksum of its source."""

    def __init__(self):
        self._code: dict[tuple[str, str], object] = {}

    def load_bytecode(self, bucket) -> None:
        code = self._code.get((bucket.key, bucket.checksum))
        if code is not None:
            bucket.code = code

    def dump_bytecode(self, bucket) -> None:
        self._code[(bucket.key, bucket.checksum)] = bucket.code


_TEMPLATES = _CompiledTemplates()


class FeedbackExporter(HTMLExporter):
    """nbconvert's ``HTMLExporter`` that compiles each template once per process
    (``c.GenerateFeedback.exporter_class``): nbgrader's generate_feedback makes a new
    exporter, and so a new Jinja environment, for every page, which compiled the
    feedback template and all it includes again each time. The pages are the same."""

    def _create_environment(self):
        environment = super()._create_environment()
        environment.bytecode_cache = _TEMPLATES
        return environment
