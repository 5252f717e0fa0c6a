"""A submission graded in this process: grading's own steps, without the kernel.

Whole-notebook grading (a sandboxed kernel for each submission, ``graded_class`` in
tests/conftest.py) runs only where the pipeline itself is under test. Every other
expectation of the sample class (sample_class/<student>/expected.json) is judged here,
by the steps of grading that decide the points:

1. staging, ``grader.stage.stage``: the notebook is found (a lone renamed one is graded
   under the expected name, and the status says so), copied cells become ordinary
   cells; a submission that cannot be staged gets its "not graded: ..." status;
2. the cells nbgrader puts back, by nbgrader's own ``OverwriteCells`` with the course's
   ``add_missing_cells`` against a gradebook that holds the assignment: read-only cells
   as the source has them, a deleted test cell restored;
3. the code cells run in order in one namespace, with ``NBGRADER_EXECUTION`` set as
   nbgrader sets it; an error ends the cell, not the notebook, as in nbgrader. Time
   limits are the kernel's business (graded in ``graded_class``: an endless loop in
   notebook 01); here a cell is only stopped after ``SAFETY_SECONDS``, so that a loop
   fails its test instead of hanging the suite. Figure and demonstration cells
   (``is_drawing``) are not run: they draw and train, and no check reads what they
   make (``tests/test_pipeline.py`` grades the solution and release notebooks here
   too, so a check that needed one would fail there);
4. each hidden ``check("<id>", fn)`` line collects ``fn``'s answers to the questions of
   this student's seed (``grader.verify.seed_for`` of the submission's digest, as
   ``AskQuestions`` draws it) through ``grader.checks.answers_of``, that is
   ``coursekit.probe.collect`` and ``grader.wire.decode_payload``; a test cell that
   raises before its check line hands back nothing;
5. ``grader.checks.verdict`` and ``with_upstream`` judge them; a right answer earns the
   test cell's points;
6. then, on the namespace the whole notebook left, the check of one exercise in the
   learner's kernel (``grader.kernelcheck.verdicts``, what ``check_my_work("name")`` runs)
   judges every exercise with the same seeds: ``Judged.fast``, which tests/test_fast_check.py
   holds to the verdicts of step 5.

The read-only cells that open a notebook (set-up, data: up to its first cell a learner
writes) are the same for every submission, so they run once per assignment
(``Opening``: notebook 09's and 10's task data is made once); each submission starts from
a fresh copy of what they made. The learner's code runs in this process, unsandboxed:
only the course's own sample submissions are judged here, never the tamper corpus.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import io
import os
import pickle
import random
import signal
import sys
import tempfile
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np
from nbgrader.preprocessors import OverwriteCells

import grader.checks
from grader import course, kernelcheck
from grader.feedback import is_test_cell
from grader.stage import BadSubmission, stage
from grader.verify import seed_for, submission_digest

SECRET = b"the in-process judge's course secret"
# Far above the course's cell limit (45 s): a slow import on a loaded machine must never be
# cut short, which would leave the module half-imported in this process.
SAFETY_SECONDS = 600


@dataclass
class Judged:
    """What grading gives one submission: its status line, points and most points per
    exercise, and the diagnosis of each exercise that failed."""

    status: str
    points: dict[str, float] = field(default_factory=dict)
    max_points: dict[str, float] = field(default_factory=dict)
    diagnoses: dict[str, str] = field(default_factory=dict)
    # the fast check's verdict per exercise (None: passed), or for an exercise whose function
    # the namespace does not define, what the fast check says instead (grader.kernelcheck)
    fast: dict[str, str | None] = field(default_factory=dict)
    undefined: dict[str, str] = field(default_factory=dict)

    @property
    def score(self) -> float:
        return sum(self.points.values())

    @property
    def max_score(self) -> float:
        return sum(self.max_points.values())


class TimeLimit(Exception):
    """A cell ran past ``SAFETY_SECONDS``."""


class Opening:
    """The namespace made by an assignment's opening read-only cells, run once.

    ``start()`` gives the next submission that namespace as the cells left it: the same
    dict (the functions they defined look their globals up there, as in a kernel), every
    value but a module, function or class a fresh copy, and the random generators
    (Python's, numpy's legacy, torch's) as they left them. A class the cells defined is
    shared: a submission that changed one would change it for the next.
    """

    def __init__(self, cells: list, run):
        self.sources = [c.source for c in cells]
        self.namespace = _fresh_namespace()
        for cell in cells:
            run(cell, self.namespace)
        self.values = dict(self.namespace)
        self.random = _random_state()

    def start(self) -> dict:
        namespace = self.namespace
        namespace.clear()
        collecting = gc.isenabled()
        gc.disable()  # a copy makes many objects and no cycles: the collector would run for nothing
        try:
            namespace.update({name: _copied(value) for name, value in self.values.items()})
        finally:
            if collecting:
                gc.enable()
        _set_random_state(self.random)
        return namespace


def _copied(value):
    """A fresh copy of a value the opening cells made; modules, functions and classes
    (and what cannot be copied, e.g. a lock) are shared. Pickling copies at C speed
    (notebook 09's task holds 200,000 token lists); what pickle cannot reach (an instance
    of a class the notebook defines) is deep-copied."""
    if isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)):
        return value
    try:
        return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - pickle refuses many kinds of objects
        pass
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001
        return value


def _fresh_namespace() -> dict:
    return {"__name__": "__main__", "__builtins__": __builtins__}


def _random_state() -> tuple:
    torch = sys.modules.get("torch")
    return random.getstate(), np.random.get_state(), torch.get_rng_state() if torch else None


def _set_random_state(state: tuple) -> None:
    python, numpy_state, torch_state = state
    random.setstate(python)
    np.random.set_state(numpy_state)
    if torch_state is not None:
        sys.modules["torch"].set_rng_state(torch_state)


def _grade_id(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")


def is_drawing(cell) -> bool:
    """A figure cell (cell metadata ``{"course": {"exercise": ...}}``, or a grade id
    ``<topic>-fig-...``) or a demonstration (``<topic>-demo-...``): it draws or trains."""
    grade_id = _grade_id(cell)
    return cell.cell_type == "code" and (bool(cell.get("metadata", {}).get("course", {}).get("exercise"))
                                         or "-fig-" in grade_id or "-demo-" in grade_id)


def _max_points(cells: list) -> dict[str, float]:
    """Exercise id -> the points of its test cell, for the test cells among ``cells``."""
    return {course.exercise_id(_grade_id(c)): float(c.metadata.nbgrader["points"]) for c in cells if is_test_cell(c)}


def _opening(cells: list) -> list:
    """The code cells before the first one a learner writes (not read-only)."""
    opening = []
    for cell in cells:
        if cell.cell_type != "code":
            continue
        if not cell.get("metadata", {}).get("nbgrader", {}).get("locked"):
            break
        opening.append(cell)
    return opening


class Judge:
    """Grades submissions of the course's assignments in this process (see the module's docs).

    ``db_url`` is a gradebook in which the assignments are registered (``grader.release.
    generate``); ``workspace`` a folder for staged copies.
    """

    def __init__(self, db_url: str, workspace: Path):
        self.db_url = db_url
        self.workspace = workspace
        self.add_missing_cells = bool(course.load_config().OverwriteCells.add_missing_cells)
        self.openings: dict[str, Opening] = {}

    def grade(self, folder: Path, student_id: str, assignment_id: str) -> Judged:
        """Grade ``folder``, a submitted ``<student_id>/<assignment_id>`` folder."""
        [notebook] = course.notebook_names(assignment_id)  # the course's assignments have one notebook each
        staged = self.workspace / student_id / assignment_id
        try:
            note = stage(folder, staged, [notebook], None)
        except BadSubmission as error:
            most = _max_points(self._source_cells(assignment_id))
            return Judged(f"not graded: {error}", dict.fromkeys(most, 0.0), most)
        nb = nbformat.read(staged / f"{notebook}.ipynb", as_version=4)
        digest = submission_digest(nb, str(staged))
        resources = {"nbgrader": {"notebook": notebook, "assignment": assignment_id, "db_url": self.db_url}}
        nb, _ = OverwriteCells(add_missing_cells=self.add_missing_cells).preprocess(nb, resources)
        nb = nbformat.from_dict(nb)
        answers: dict[str, tuple[int, list]] = {}

        def check(exercise_id: str, fn: object) -> None:  # the hidden line's check, as grading asks it
            seed = seed_for(SECRET, student_id, assignment_id, exercise_id, digest)
            answers[exercise_id] = (seed, grader.checks.answers_of(exercise_id, fn, seed))

        timed_out = []
        with _grading(check):
            namespace = _fresh_namespace()
            cells = [c for c in nb.cells if c.cell_type == "code" and not is_drawing(c)]
            opening = _opening(cells)
            known = self.openings.get(assignment_id)
            if known is None:
                known = self.openings[assignment_id] = Opening(_opening(self._source_cells(assignment_id)),
                                                               self._run)
            if known.sources == [c.source for c in opening]:
                namespace = known.start()
                cells = cells[len(opening):]
            for cell in cells:
                if not self._run(cell, namespace):
                    timed_out.append(course.exercise_id(_grade_id(cell)) if _grade_id(cell) else "a cell")
            judged = self._verdicts(nb, answers, note, timed_out)
            for exercise in judged.max_points:  # what check_my_work("name") says at the notebook's end
                try:
                    judged.fast[exercise] = kernelcheck.verdicts(
                        namespace, exercise, lambda e: seed_for(SECRET, student_id, assignment_id, e, digest))[exercise]
                except kernelcheck.CannotCheck as error:
                    judged.undefined[exercise] = str(error)
        return judged

    def _source_cells(self, assignment_id: str) -> list:
        [notebook] = course.notebook_names(assignment_id)
        nb = nbformat.read(course.SOLUTIONS / assignment_id / f"{notebook}.ipynb", as_version=4)
        return [c for c in nb.cells if c.cell_type == "code" and not is_drawing(c)]

    def _run(self, cell, namespace: dict) -> bool:
        """Run one cell; False when it was stopped at the time limit. What it printed is dropped."""
        def stop(signum, frame):
            raise TimeLimit

        previous = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, SAFETY_SECONDS)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                exec(compile(cell.source, _grade_id(cell) or "<cell>", "exec"), namespace)
        except TimeLimit:
            return False
        except Exception:  # noqa: BLE001 - the learner's code may raise anything; the next cell runs
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            pyplot = sys.modules.get("matplotlib.pyplot")
            if pyplot is not None:  # figures a cell left open are the kernel's to show, not ours to keep
                pyplot.close("all")
        return True

    def _verdicts(self, nb, answers: dict, note: str, timed_out: list[str]) -> Judged:
        tests = [c for c in nb.cells if is_test_cell(c)]
        verdicts = {}
        for cell in tests:
            exercise = course.exercise_id(_grade_id(cell))
            seed, given = answers.get(exercise, (0, None))
            verdicts[exercise] = grader.checks.verdict(exercise, seed, given)
        verdicts = grader.checks.with_upstream(verdicts)
        judged = Judged("", max_points=_max_points(tests))
        for exercise, most in judged.max_points.items():
            judged.points[exercise] = most if verdicts[exercise] is None else 0.0
            if verdicts[exercise] is not None:
                judged.diagnoses[exercise] = verdicts[exercise]
        parts = [note] if note else []
        if timed_out:
            parts.append(f"a cell was stopped at the time limit ({', '.join(timed_out)})")
        judged.status = "graded" + (": " + "; ".join(parts) if parts else "")
        return judged


@contextlib.contextmanager
def _grading(check):
    """While a submission runs: nbgrader's NBGRADER_EXECUTION, the hidden lines' ``check``
    collecting answers, no warnings (the kernel's stderr decides nothing), matplotlib
    drawing off screen."""
    import matplotlib

    matplotlib.use("Agg")
    saved = os.environ.get("NBGRADER_EXECUTION")
    os.environ["NBGRADER_EXECUTION"] = "1"
    original = grader.checks.check
    grader.checks.check = check
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        grader.checks.check = original
        if saved is None:
            del os.environ["NBGRADER_EXECUTION"]
        else:
            os.environ["NBGRADER_EXECUTION"] = saved
