"""What every check shares: the registry, questions and verdicts, judging an answer.

An exercise's check is split in two so that grading never trusts the kernel:

- ``questions(rng)``: the inputs to call the learner's function with, each paired with
  a ``verify(answer)`` that knows the reference. Only the inputs enter the kernel.
- ``verify(answer)`` runs in the trusted grader on the answer as plain data
  (``numpy.ndarray``, a tuple of answers, :class:`Raised` or :class:`Unsupported`),
  decoded from the kernel's JSON by ``grader.wire``. It raises :class:`CheckFailed`
  with a diagnosis when the answer is wrong.

``check(exercise_id, fn)`` runs both halves in one process (an instructor running the
solution notebook, the tests); ``grader.verify`` runs them on either side of the
sandbox while grading.
"""
from __future__ import annotations

import hashlib
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from coursekit import probe

# Tolerances of exercise-standard.md for attention-sized float answers.
RTOL = 1e-4
ATOL = 1e-5


class CheckFailed(AssertionError):
    """A learner's answer is wrong; ``str(error)`` is the diagnosis shown as feedback."""


@dataclass(frozen=True)
class Raised:
    """The learner's function raised; ``message`` is ``"TypeError: ..."``."""

    message: str


@dataclass(frozen=True)
class Unsupported:
    """The learner's function returned something that is not numeric data."""

    kind: str  # e.g. "a str", "an array of dtype object"


Answer = "np.ndarray | tuple | Raised | Unsupported"


@dataclass(frozen=True)
class Question:
    """One call of the learner's function: its arguments and how to judge the answer.

    Arguments are numpy arrays (passed as arrays, or as torch tensors to torch code),
    or Python numbers, booleans, strings and None (passed as they are).
    """

    args: tuple
    verify: Callable[[object], None]
    kwargs: dict = field(default_factory=dict)

    def call(self) -> tuple[list, dict]:
        return list(self.args), dict(self.kwargs)


@dataclass(frozen=True)
class Exercise:
    id: str
    function: str  # the name the learner's function has in the notebook, for messages
    questions: Callable[[np.random.Generator], list[Question]]
    driver: str | None = None  # coursekit.probe.get_driver(driver): how to call a class or loader


_REGISTRY: dict[str, Exercise] = {}


def exercise(exercise_id: str, function: str, driver: str | None = None):
    """Register the decorated ``questions(rng)`` as the check of ``exercise_id``.

    ``driver`` names the kernel-side harness (``coursekit.probe.get_driver``) that turns the
    learner's object, a class or a weight loader, into a function of plain data; the
    questions' arguments are then that function's.
    """
    if driver is not None:
        try:
            probe.get_driver(driver)
        except LookupError as error:
            raise ValueError(f"{exercise_id}: {error}") from None

    def register(questions: Callable[[np.random.Generator], list[Question]]):
        if exercise_id in _REGISTRY:
            raise ValueError(f"two checks registered for {exercise_id!r}")
        _REGISTRY[exercise_id] = Exercise(exercise_id, function, questions, driver)
        return questions

    return register


def _topics() -> list[str]:
    package = importlib.import_module("grader.checks")
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def get(exercise_id: str) -> Exercise:
    """The registered exercise.

    Raises:
        LookupError: no check is registered under ``exercise_id`` (a course bug).
    """
    topic = exercise_id.split("-")[0]
    if topic not in _topics():
        raise LookupError(f"no checks for topic {topic!r}; known topics: {', '.join(_topics())}")
    importlib.import_module(f"grader.checks.{topic}")
    try:
        return _REGISTRY[exercise_id]
    except KeyError:
        raise LookupError(f"no check registered for exercise {exercise_id!r}") from None


def exercise_ids(topic: str | None = None) -> list[str]:
    """All registered exercise ids (of one topic, if given), sorted."""
    for name in [topic] if topic else _topics():
        importlib.import_module(f"grader.checks.{name}")
    return sorted(e for e in _REGISTRY if topic is None or e.split("-")[0] == topic)


def public_seed(exercise_id: str) -> int:
    """The seed of in-process checks (no course secret): fixed per exercise."""
    return int.from_bytes(hashlib.sha256(exercise_id.encode()).digest()[:8], "little")


def questions(exercise_id: str, seed: int) -> list[Question]:
    """The exercise's questions drawn from ``seed`` (the same seed, the same inputs)."""
    return get(exercise_id).questions(np.random.default_rng(seed))


def verdict(exercise_id: str, seed: int, answers: Sequence[object] | None) -> str | None:
    """Judge decoded ``answers`` to the questions of ``seed``: None if right, else the diagnosis.

    ``answers`` is None when the kernel handed back nothing for this exercise.
    """
    asked = questions(exercise_id, seed)
    if answers is None:
        return "no answer reached the grader: the test cell did not finish"
    if answers and all(isinstance(a, Raised) and a.message.startswith("NotImplementedError") for a in answers):
        return f"{get(exercise_id).function}: not answered yet, it still raises NotImplementedError"
    if len(answers) != len(asked):
        return f"the grader asked {len(asked)} questions and received {len(answers)} answers"
    try:
        for question, given in zip(asked, answers):
            question.verify(given)
    except CheckFailed as error:
        return str(error)
    return None


def check(exercise_id: str, fn: object) -> None:
    """Run the hidden check of ``exercise_id`` on the learner's ``fn`` in this process.

    Raises:
        CheckFailed: the answer is wrong; the message is the diagnosis.
        LookupError: no check is registered under ``exercise_id`` (a course bug).
    """
    from ..wire import decode_payload

    seed = public_seed(exercise_id)
    asked = questions(exercise_id, seed)
    payload = probe.collect(exercise_id, fn, [q.call() for q in asked], get(exercise_id).driver)
    answers = decode_payload(payload, exercise_id)
    message = verdict(exercise_id, seed, answers)
    if message:
        raise CheckFailed(message)
    print(f"{exercise_id}: all hidden checks passed")


def value(answer: object, name: str) -> object:
    """The answer as data, or a diagnosis when the function raised or returned non-data."""
    if isinstance(answer, Raised):
        if answer.message.startswith("NotImplementedError"):
            raise CheckFailed(f"{name}: not answered yet, it still raises NotImplementedError")
        raise CheckFailed(f"{name} raised {answer.message}")
    if isinstance(answer, Unsupported) and answer.kind == "a NoneType":
        raise CheckFailed(f"{name} returns nothing (None): is a `return` missing?")
    if isinstance(answer, Unsupported):
        raise CheckFailed(f"{name} should be a numpy array or torch tensor, but it is {answer.kind}")
    return answer


def to_array(answer: object, what: str) -> np.ndarray:
    """A decoded answer as a float64 array.

    Raises:
        CheckFailed: the answer is an error, a tuple or not numeric.
    """
    answer = value(answer, what)
    if isinstance(answer, tuple):
        raise CheckFailed(f"{what} should be one array, but it is a tuple or list of {len(answer)} "
                          "items: return one array (np.stack or np.array of them)")
    return np.asarray(answer, dtype=np.float64)


def close(a: np.ndarray, b: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Shapes equal and values within tolerance (NaN never matches)."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=False))


Mistake = tuple[str, np.ndarray]
Hint = Callable[[np.ndarray], "str | None"]


def judge(
    answer: object,
    expected: np.ndarray,
    what: str,
    mistakes: Iterable[Mistake] = (),
    hints: Sequence[Hint] = (),
    rtol: float = RTOL,
    atol: float = ATOL,
) -> np.ndarray:
    """Decide whether ``answer`` equals ``expected``; raise a diagnosis if not.

    The diagnosis is, in order: the message of the first known mistake the answer
    matches; a wrong shape; NaN or infinity where the reference is finite; the first
    hint (a function of the answer) that returns a message; otherwise a plain
    "values differ". Returns the answer as a float64 array when it is right.
    """
    got = to_array(answer, what)
    if close(got, expected, rtol, atol):
        return got
    for message, wrong in mistakes:
        wrong = np.asarray(wrong, dtype=np.float64)
        if close(got, wrong, rtol, atol):
            raise CheckFailed(f"{what}: {message}")
    if got.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {got.shape}; expected {expected.shape}")
    if not np.all(np.isfinite(got)) and np.all(np.isfinite(expected)):
        raise CheckFailed(f"{what} contains NaN or infinity where every value should be finite")
    for hint in hints:
        message = hint(got)
        if message:
            raise CheckFailed(f"{what}: {message}")
    raise CheckFailed(f"{what} has the right shape {expected.shape} but wrong values")
