"""Trusted grading, hooked into nbgrader's autograde as two preprocessors.

``AskQuestions`` runs before execution. For every hidden ``check("<id>", fn)`` line
of a test cell (the source comes from the gradebook, not from the student) it draws
the exercise's questions from a seed that only the grader can compute, and rewrites
the line to hand the questions' inputs to ``coursekit.probe.answer`` in the kernel.

``SaveVerifiedGrades`` runs after execution, in place of nbgrader's
``SaveAutoGrades``. It reads each test cell's one answer payload (plain JSON data),
judges it against the reference in this process, and writes points and diagnosis to
the gradebook in one transaction. What the kernel printed, raised or claimed has no
say in the points: a test cell without a readable answer earns nothing.

The seed of an exercise is ``HMAC(course secret, student, assignment, exercise,
submission digest)``: neither fixed nor guessable by students, the same when the same
submission is regraded, and new when anything in the submission changes (so hidden
inputs seen in feedback are worth nothing to a resubmission).
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
from pathlib import Path

from nbformat import NotebookNode
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.utils import compute_checksum, determine_grade, is_grade, is_solution, is_task
from traitlets import Unicode, default

from coursekit.probe import encode_questions
from coursekit.protocol import MIME

from . import course
from . import checks
from .feedback import diagnose, is_test_cell
from .seeds import seed_for
from .wire import Unreadable, decode_payload

VERDICT_KEY = "attention_course"  # cell metadata: {"exercise", "passed", "diagnosis"}
_IGNORED_FILES = {"timestamp.txt"}


class CourseSecret(NbGraderPreprocessor):
    """Where the course secret lives; created (mode 0600) on first use."""

    secret_file = Unicode(help="File holding the course secret that seeds hidden inputs. "
                               "Keep it out of the repository and out of students' reach."
                          ).tag(config=True)

    @default("secret_file")
    def _secret_file_default(self) -> str:
        return str(course.ROOT / ".grader_secret")

    def secret(self) -> bytes:
        path = Path(self.secret_file)
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32).hex().encode())
        return path.read_bytes().strip()


def submission_digest(nb: NotebookNode, folder: str | None) -> str:
    """A digest of what the student submitted: code cells and the other files beside it."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode("utf-8", "replace") + b"\0")
    if folder and os.path.isdir(folder):
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and path.suffix != ".ipynb" and path.name not in _IGNORED_FILES:
                h.update(str(path.relative_to(folder)).encode() + b"\0")
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
    return h.hexdigest()


def _hidden_calls(source: str) -> list[tuple[int, str, str]]:
    """(line number, exercise id, function expression) of each ``check("<id>", fn)`` line."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    calls = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "check"
                and len(call.args) == 2 and not call.keywords and node.lineno == node.end_lineno
                and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
            calls.append((node.lineno, call.args[0].value, ast.get_source_segment(source, call.args[1])))
    return calls


class AskQuestions(CourseSecret):
    """Before execution: put the grader's questions into each hidden check line."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        digest = submission_digest(nb, resources.get("metadata", {}).get("path"))
        secret = self.secret()
        seeds = resources.setdefault("attention_course", {}).setdefault("seeds", {})
        for cell in nb.cells:
            if not is_test_cell(cell):
                continue
            lines = cell.source.split("\n")
            for lineno, exercise, fn in _hidden_calls(cell.source):
                try:
                    asked = checks.questions(exercise, seed := seed_for(
                        secret, info["student"], info["assignment"], exercise, digest))
                except LookupError:
                    self.log.warning("no check registered for %s; its test cell earns nothing", exercise)
                    continue
                seeds[exercise] = seed
                questions = encode_questions([q.call() for q in asked])
                driver = checks.get(exercise).driver  # a class or a loader is called through it
                lines[lineno - 1] = (f'__import__("coursekit.probe", fromlist=["answer"]).answer('
                                     f'{exercise!r}, {fn}, {questions!r}'
                                     f'{"" if driver is None else f", driver={driver!r}"})')
            # grader.checks is not importable in the sandbox, and not needed there
            cell.source = "\n".join(line for line in lines
                                    if line.strip() != "from grader.checks import check")
        return nb, resources


def _payloads(cell: NotebookNode) -> list[object]:
    return [o["data"][MIME] for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result") and MIME in o.get("data", {})]


def judge_cell(cell: NotebookNode, exercise: str, seed: int | None, event: str | None) -> str | None:
    """The verdict on one executed test cell: None when right, else the diagnosis."""
    if seed is None:
        return "this test cell has no hidden check the grader could ask; ask the instructor"
    payloads = _payloads(cell)
    if len(payloads) > 1:
        return (f"the test cell handed back {len(payloads)} answers where one was expected: "
                "something in the notebook changes how cells run")
    if not payloads:
        return event or diagnose(cell) or "no answer reached the grader: the test cell did not run to the end"
    payload = payloads[0]
    if isinstance(payload, str):  # some front ends store JSON mime data as text
        try:
            payload = json.loads(payload)
        except ValueError:
            payload = None
    try:
        answers = decode_payload(payload, exercise)
    except Unreadable as error:
        return f"the answers could not be read ({error}): something in the notebook interferes with the check"
    return checks.verdict(exercise, seed, answers)


class SaveVerifiedGrades(NbGraderPreprocessor):
    """After execution: judge answers outside the kernel; save points and diagnoses.

    Every grade and comment of the notebook is written in one gradebook transaction.
    Cells that are not autograded tests (manually graded answers, tasks) are handled
    as nbgrader's SaveAutoGrades handles them.
    """

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        state = resources.get("attention_course", {})
        seeds, events = state.get("seeds", {}), state.get("events", {})
        verdicts: dict[str, str | None] = {}
        tests = []
        for index, cell in enumerate(nb.cells):
            if is_test_cell(cell):
                exercise = course.exercise_id(cell.metadata.nbgrader["grade_id"])
                verdicts[exercise] = judge_cell(cell, exercise, seeds.get(exercise), events.get(index))
                tests.append((exercise, cell))
        verdicts = checks.with_upstream(verdicts)
        for exercise, cell in tests:
            cell.metadata[VERDICT_KEY] = {"exercise": exercise, "passed": verdicts[exercise] is None,
                                          "diagnosis": verdicts[exercise]}
        with Gradebook(info["db_url"]) as gb:
            for cell in nb.cells:
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                key = (grade_id, info["notebook"], info["assignment"], info["student"])
                exercise = course.exercise_id(grade_id) if grade_id else None
                if is_grade(cell):
                    grade = gb.find_grade(*key)
                    if is_test_cell(cell):
                        grade.auto_score = grade.max_score if verdicts[exercise] is None else 0.0
                    else:
                        grade.auto_score, _ = determine_grade(cell, self.log)
                    # a cell graded by hand stays graded (nbgrader's SaveAutoGrades would flag it again)
                    grade.needs_manual_grade = grade.auto_score is None and grade.manual_score is None
                if is_solution(cell) or is_task(cell):
                    comment = gb.find_comment(*key)
                    unchanged = cell.metadata.nbgrader.get("checksum") == compute_checksum(cell) and not is_task(cell)
                    comment.auto_comment = ("No response." if unchanged else None) or verdicts.get(exercise)
            gb.db.commit()
        return nb, resources
