"""Check one exercise in seconds: the hidden checks on what the learner's own kernel defines.

``check_my_work("masked_softmax")`` (``coursekit.check``), in a self-learner's install (one
where the course's checks are importable), comes here instead of re-executing the saved
notebook: the function or class that the kernel holds now is judged by the same code as
the full check, in this process:

- the exercise's questions are drawn (``grader.checks.questions``) from this user's
  self-check secret (``grader.selfcheck.user_secret``), the exercise and the word
  ``KERNEL``: the same inputs on every check of one exercise by one user, never shown;
- the learner's object answers them through the exercise's driver and the wire
  (``grader.checks.answers_of``: ``coursekit.probe.collect``, ``grader.wire.decode_payload``);
- ``grader.checks.verdict`` judges the answers, and ``with_upstream`` blames an upstream
  function that fails too, as in the full check (the upstream exercises the failed one
  calls are judged the same way, only then);
- ``grader.tutortext`` says it: the exercise's line of the full check, with its points, and
  for a failure what went wrong and the hint.

What the learner's code prints while it answers is not shown (the full check does not show
it either); the kernel's random generators and torch's thread count are as they were
before; a call that runs past the course's cell limit (``SECONDS``, nbgrader_config.py's
``BudgetedExecute.cell_cpu_seconds``, counted here on the wall clock) is stopped, and the exercise fails
with "stopped at the time limit", as in the full check.

This is not the trusted path of a class: the learner's code and the judge share one process,
which is fine for someone checking their own work, and nothing here is recorded. In a class
the saved notebook goes to the check service or ``course-grader check`` as before.
"""
from __future__ import annotations

import contextlib
import io
import json
import random
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import checks, course, tutortext
from .names import shown
from .seeds import seed_for
from .selfcheck import STUDENT, CannotCheck, user_secret

KERNEL = "kernel"  # what stands for the submission's digest in a fast check's seed
# The course's limit for one cell (BudgetedExecute.cell_cpu_seconds in nbgrader_config.py, which
# a kernel should not load: it sets PATH), the fast check's for one exercise's calls.
SECONDS = 45.0


class _TimeLimit(BaseException):
    """A call of the learner's code ran past the limit (a BaseException: ``collect`` records
    any Exception as the answer and goes on to the next question)."""


def _graded_cells(assignment_id: str) -> list[dict]:
    """The nbgrader metadata of the source notebook's graded and solution cells, read as
    plain JSON (nbformat's validation costs a learner's first check more than the check)."""
    found = []
    for name in course.notebook_names(assignment_id):
        path = course.SOLUTIONS / assignment_id / f"{name}.ipynb"
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("grade_id") and (meta.get("grade") or meta.get("solution")):
                found.append(meta)
    return found


def exercise_of(name: str) -> str:
    """The exercise id of ``name``: an exercise id ("masking-masked_softmax"), or the name of the
    function or class an exercise asks for ("masked_softmax"). Found among the solution cells'
    grade ids (the exercise ids), so that only the exercise's own checks are imported: those
    of notebook 01 import no torch, which its learner's kernel may not have imported yet.

    Raises:
        CannotCheck: no exercise of the course has that id or that function.
    """
    ids = [meta["grade_id"] for a in course.assignments() for meta in _graded_cells(a) if meta.get("solution")]
    found = [e for e in ids if name in (e, e.split("-", 1)[-1])]
    if len(found) == 1:
        try:
            if checks.get(found[0]).function == name or found[0] == name:
                return found[0]
        except LookupError:  # (a solution cell without a check: nothing to check it with)
            pass
    raise CannotCheck(f"no exercise of this course asks for {shown(name)}: pass the name of your function or "
                      'class as its notebook defines it, e.g. check_my_work("masked_softmax")')


def assignment_of(exercise_id: str) -> str:
    """The assignment an exercise belongs to ("masking-..." -> "03_masking")."""
    topic = exercise_id.split("-", 1)[0]
    return next(a for a in course.assignments() if a.split("_", 1)[-1] == topic)


def points_of(assignment_id: str) -> dict[str, float]:
    """Exercise id -> the points of its test cell, read from the assignment's source notebook
    (what ``nbgrader generate_assignment`` writes into the gradebook)."""
    return {course.exercise_id(meta["grade_id"]): float(meta.get("points", 0)) for meta in _graded_cells(assignment_id)
            if meta.get("grade") and meta["grade_id"].endswith(course.TEST_SUFFIX)}


def own_seed(exercise_id: str) -> int:
    """This user's seed for a fast check of ``exercise_id`` (see the module's docstring).

    Raises:
        OSError: the user's data folder, where the secret lives, cannot be written.
    """
    return seed_for(user_secret(), STUDENT, assignment_of(exercise_id), exercise_id, KERNEL)


@contextlib.contextmanager
def _as_it_was(seconds: float):
    """While the learner's code answers: its output and warnings kept out of the cell, a time
    limit (the main thread only: signals), and afterwards the random generators of Python,
    numpy and torch as they were, so that the notebook's next cells draw what they would have."""
    torch = sys.modules.get("torch")
    state = random.getstate(), np.random.get_state(), torch.get_rng_state() if torch is not None else None
    timed = threading.current_thread() is threading.main_thread() and seconds > 0

    def stop(signum, frame):
        raise _TimeLimit

    previous = signal.signal(signal.SIGALRM, stop) if timed else None
    try:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, seconds)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        random.setstate(state[0])
        np.random.set_state(state[1])
        if torch is not None:
            torch.set_rng_state(state[2])


def _verdict(exercise_id: str, fn: object, seed: int, seconds: float) -> str | None:
    """The full check's verdict on ``fn``'s answers to the questions of ``seed``."""
    try:
        with _as_it_was(seconds):
            answers = checks.answers_of(exercise_id, fn, seed)
    except _TimeLimit:
        return f"stopped at the time limit ({seconds:g} s for one exercise)"
    return checks.verdict(exercise_id, seed, answers)


def verdicts(namespace: dict, exercise_id: str, seed_of: Callable[[str], int] = own_seed,
             seconds: float | None = None) -> dict[str, str | None]:
    """The verdict on the exercise's function or class as ``namespace`` holds it (None when
    right, else the diagnosis), with ``grader.checks.with_upstream``'s blame: when it fails,
    the upstream exercises it calls that ``namespace`` defines are judged too, and returned.

    Args:
        namespace: the kernel's namespace (IPython's ``user_ns``), name -> object.
        exercise_id: a registered exercise id.
        seed_of: exercise id -> the seed of its questions (by default this user's own).
        seconds: the limit for one exercise's calls (by default the course's cell limit).

    Raises:
        CannotCheck: ``namespace`` does not define the exercise's function or class.
        OSError: the user's data folder, where the secret lives, cannot be written.
    """
    spec = checks.get(exercise_id)
    if spec.function not in namespace:
        raise CannotCheck(f"{spec.function} is not defined in this kernel: run the cell that defines it, "
                          "then check again")
    seconds = SECONDS if seconds is None else seconds
    found = {exercise_id: _verdict(exercise_id, namespace[spec.function], seed_of(exercise_id), seconds)}
    if found[exercise_id] is None:
        return found
    for upstream in spec.depends:
        function = checks.get(upstream).function
        if function in namespace:  # (not defined: its own cell says so when it runs)
            found[upstream] = _verdict(upstream, namespace[function], seed_of(upstream), seconds)
    return checks.with_upstream(found)


@dataclass
class Checked:
    """The outcome of a fast check of one exercise."""

    exercise: tutortext.Comment

    def text(self) -> str:
        """What the learner reads: a line saying what was judged, then the full check's lines
        of that exercise."""
        c = self.exercise
        head = f"Checked {c.function} as defined in this kernel now, with the hidden checks:"
        return "\n".join(shown(line) for line in [head, *tutortext.exercise_lines(c)])


def check_in_kernel(name: str, namespace: dict, seed_of: Callable[[str], int] = own_seed) -> Checked:
    """Judge the function or class ``name`` (or exercise id) that ``namespace`` defines.

    Raises:
        CannotCheck: ``name`` is no exercise's, or ``namespace`` does not define it.
        OSError: the user's data folder, where the secret lives, cannot be written.
    """
    exercise_id = exercise_of(name)
    assignment_id = assignment_of(exercise_id)
    diagnosis = verdicts(namespace, exercise_id, seed_of)[exercise_id]
    most = points_of(assignment_id).get(exercise_id, 0.0)
    [comment] = tutortext.comments(assignment_id, {exercise_id: most if diagnosis is None else 0.0},
                               {exercise_id: most}, {exercise_id: diagnosis})
    return Checked(comment)
