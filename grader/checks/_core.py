"""What every check shares: the registry, calling the learner's code, judging an answer.

A check never trusts the objects a learner returns: answers are converted to plain
float64 numpy arrays of a known shape before anything is compared, and they are
compared with tolerances against a reference the check computes itself.
"""
from __future__ import annotations

import hashlib
import importlib
import pkgutil
import sys
from typing import Callable, Iterable, Sequence

import numpy as np

_REGISTRY: dict[str, Callable[..., None]] = {}

# Tolerances of exercise-standard.md for attention-sized float answers.
RTOL = 1e-4
ATOL = 1e-5
_MAX_MESSAGE = 300


class CheckFailed(AssertionError):
    """A learner's answer is wrong; ``str(error)`` is the diagnosis shown as feedback."""


def exercise(exercise_id: str):
    """Register the decorated function as the check for ``exercise_id``."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        if exercise_id in _REGISTRY:
            raise ValueError(f"two checks registered for {exercise_id!r}")
        _REGISTRY[exercise_id] = fn
        return fn

    return register


def _topics() -> list[str]:
    package = importlib.import_module("grader.checks")
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def _load_topic(topic: str) -> None:
    if topic not in _topics():
        raise LookupError(f"no checks for topic {topic!r}; known topics: {', '.join(_topics())}")
    importlib.import_module(f"grader.checks.{topic}")


def exercise_ids(topic: str | None = None) -> list[str]:
    """All registered exercise ids (of one topic, if given), sorted."""
    for name in [topic] if topic else _topics():
        _load_topic(name)
    return sorted(e for e in _REGISTRY if topic is None or e.split("-")[0] == topic)


def check(exercise_id: str, *answers: object) -> None:
    """Run the hidden check of ``exercise_id`` on the learner's ``answers``.

    Raises:
        CheckFailed: the answer is wrong; the message is the diagnosis.
        LookupError: no check is registered under ``exercise_id`` (a course bug).
    """
    _load_topic(exercise_id.split("-")[0])
    try:
        run = _REGISTRY[exercise_id]
    except KeyError:
        raise LookupError(f"no check registered for exercise {exercise_id!r}") from None
    run(*answers)
    print(f"{exercise_id}: all hidden checks passed")


def rng_for(exercise_id: str, case: int = 0) -> np.random.Generator:
    """A generator seeded from the exercise id, so that regrading sees the same inputs."""
    digest = hashlib.sha256(f"{exercise_id}/{case}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _short(text: object) -> str:
    text = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def call(fn: object, *args: np.ndarray, name: str) -> object:
    """Call the learner's ``fn`` on copies of ``args``.

    Inputs are numpy float64 arrays. A function written for torch tensors (it raises
    TypeError or AttributeError on numpy input) is called again with torch tensors, so
    either library is a valid answer.

    Raises:
        CheckFailed: ``fn`` is not callable or raises on both kinds of input.
    """
    if not callable(fn):
        raise CheckFailed(f"{name} should be a function, but it is a {type(fn).__name__}")
    try:
        return fn(*(np.array(a, copy=True) for a in args))
    except Exception as numpy_error:  # the learner's code may raise anything
        first = numpy_error
    if isinstance(first, (TypeError, AttributeError)):
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a course dependency
            torch = None
        if torch is not None:
            try:
                return fn(*(torch.tensor(a) for a in args))
            except Exception:
                pass
    raise CheckFailed(f"{name} raised {type(first).__name__}: {_short(first)}") from None


def to_array(value: object, what: str) -> np.ndarray:
    """Convert an answer to a fresh float64 numpy array without trusting its methods.

    Accepts numpy arrays and scalars, torch tensors, Python numbers and nested
    lists or tuples of numbers.

    Raises:
        CheckFailed: the answer is not numeric array-like data.
    """
    torch = sys.modules.get("torch")
    try:
        if torch is not None and isinstance(value, torch.Tensor):
            value = value.detach().to("cpu").resolve_conj().numpy()
        if isinstance(value, (np.ndarray, np.generic, int, float, list, tuple)) and not isinstance(value, bool):
            raw = np.array(value, copy=True)
            if raw.dtype.kind not in "biuf":
                raise TypeError(f"dtype {raw.dtype}")
            return raw.astype(np.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise CheckFailed(f"{what} should hold real numbers, but converting it failed ({_short(error)})") from None
    raise CheckFailed(f"{what} should be a numpy array or torch tensor, but it is a {type(value).__name__}")


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
