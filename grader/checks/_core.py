"""The exercise spec and the judging every check shares.

An exercise is data (:class:`Spec`): the calls drawn from a seed, the reference, the
catalogue of mistakes (learner-style wrong implementations with their diagnoses), knobs,
rules for raised errors, hints. Grading never trusts the kernel:

- ``questions(id, seed)``: only the calls' inputs enter the kernel, where the learner's
  function (through the spec's driver) answers them as plain data;
- ``verdict(id, seed, answers)`` runs in the trusted grader on those answers, decoded
  from the kernel's JSON by ``grader.wire`` (arrays, tuples, :class:`Raised`,
  :class:`Unsupported`): it runs the reference, and the catalogue when an answer is
  wrong, the same way, and returns None or the diagnosis.

``check(id, fn)`` runs both halves in one process (an instructor running the solution
notebook, the tests); ``grader.verify`` runs them on either side of the sandbox.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import pkgutil
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from coursekit import probe
from coursekit.protocol import Raised, Unsupported

from ..wire import decode_payload  # (the wire knows nothing of the checks: no cycle)

# Tolerances of exercise-standard.md for attention-sized float answers.
RTOL = 1e-4
ATOL = 1e-5


@contextlib.contextmanager
def _quiet():
    """No numpy or Python warnings from judging: running a mistake (0/0, overflow) or a
    hook's arithmetic must not print into the learner's test cell."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class CheckFailed(AssertionError):
    """A learner's answer is wrong; ``str(error)`` is the diagnosis shown as feedback."""


@dataclass(frozen=True)
class Call:
    """One call of the learner's function: its arguments, and its name in a diagnosis.

    Arguments are numpy arrays (passed as arrays, or as torch tensors to torch code),
    or Python numbers, booleans, strings and None (passed as they are).
    """

    args: tuple
    kwargs: dict = field(default_factory=dict)
    what: str = ""  # e.g. "dot_product(a, b) for a and b of shape (5,)"
    # The exception the docstring promises for these arguments (e.g. "ValueError"): the
    # reference's answer is then that exception, and so must the learner's be.
    raises: str = ""

    def call(self) -> tuple[list, dict]:
        return list(self.args), dict(self.kwargs)


@dataclass(frozen=True)
class Mistake:
    """A catalogued mistake: a learner-style wrong implementation and its diagnosis.

    The grader runs ``implementation`` on the drawn inputs exactly as it runs the
    learner's code (same driver, same wire); an answer equal to the mistake's answer on
    the call being judged gets ``diagnosis``. The tests run ``implementation`` as a
    learner's answer and assert that it gets its own diagnosis, for many seeds.
    """

    name: str
    diagnosis: str
    implementation: object


@dataclass(frozen=True)
class Raises:
    """A rule for a raised error: the diagnosis when the learner's function raises.

    ``diagnosis`` may use ``{error}`` (the learner's ``"TypeError: ..."``) and ``{what}``.
    The rule applies when ``match`` (a regular expression) is found in the error and
    ``when`` (of the :class:`Call`), if given, holds. ``example`` is a learner-style
    implementation that gets this diagnosis: the tests assert it.
    """

    diagnosis: str
    example: object
    match: str = ""
    when: Callable[[Call], bool] | None = None


@dataclass(frozen=True)
class Hint:
    """A diagnosis from a property of a wrong answer (``applies(answer, call)``), asked
    when no catalogued mistake matched. ``part`` names the item of a tuple answer it
    reads; ``example`` gets this diagnosis (asserted by the tests)."""

    message: str
    applies: Callable[[np.ndarray, Call], bool]
    example: object
    part: int | None = None


@dataclass(frozen=True)
class Knob:
    """One choice an implementation makes, with its wrong settings and what each means.

    An exercise with knobs has a ``Spec.variant(**settings)``: the learner-style
    implementation with those settings (``variant()`` is the reference's behaviour). Each
    wrong setting is a catalogued mistake by itself, and when no single mistake matches,
    the grader tries wrong settings of two knobs at once and names both (differential
    diagnosis: combinations nobody catalogued). The tests generate every single setting
    and every pair.
    """

    name: str
    wrong: tuple[tuple[object, str], ...]  # (setting, diagnosis)


@dataclass(frozen=True)
class Spec:
    """An exercise as data: what is asked, the reference, the catalogue of mistakes.

    ``inputs(rng)`` draws the calls (the same seed, the same calls); ``reference`` is
    the learner-style correct implementation, run like the learner's (through
    ``driver``, a ``coursekit.probe.get_driver`` name, for classes and loaders).
    ``parts`` names the items of a tuple answer (e.g. ``("output", "weights")``),
    judged in the order ``order`` (default: as returned). ``prepare(answer, call, what)``
    turns a plain answer into what is compared (e.g. a mask's values), raising
    :class:`CheckFailed` for answers of the wrong kind. ``judge(case)`` replaces the
    default judgement of one call (:func:`judge_case`): the one hook of a bespoke
    exercise. ``diagnosed`` lists learner-style implementations with the diagnosis a
    hook or ``prepare`` gives them: never matched by value, always asserted by the tests.
    """

    id: str
    function: str
    inputs: Callable[[np.random.Generator], list[Call]]
    reference: object
    mistakes: tuple[Mistake, ...] = ()
    driver: str | None = None
    figures: tuple[str, ...] = ()
    errors: tuple[Raises, ...] = ()
    hints: tuple[Hint, ...] = ()
    parts: tuple[str, ...] = ()
    order: tuple[int, ...] = ()
    prepare: Callable[[object, Call, str], object] | None = None
    judge: Callable[["Case"], None] | None = None
    diagnosed: tuple[Mistake, ...] = ()
    rtol: float = RTOL
    atol: float = ATOL
    knobs: tuple[Knob, ...] = ()
    variant: Callable[..., object] | None = None
    depends: tuple[str, ...] = ()  # exercises whose functions the learner's answer calls

    def __post_init__(self):
        if self.driver is not None:
            try:
                probe.get_driver(self.driver)
            except LookupError as error:
                raise ValueError(f"{self.id}: {error}") from None
        if self.knobs and self.variant is None:
            raise ValueError(f"{self.id}: knobs need a variant(**settings) implementation")
        names = [m.name for m in self.catalogue() + self.diagnosed]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.id}: two mistakes share a name")

    def catalogue(self) -> tuple[Mistake, ...]:
        """The catalogued mistakes: those listed, then one per wrong setting of each knob."""
        return self.mistakes + tuple(Mistake(f"{knob.name}={setting!r}", diagnosis,
                                             self.variant(**{knob.name: setting}))
                                     for knob in self.knobs for setting, diagnosis in knob.wrong)

    def pairs(self) -> list[tuple[str, object, tuple[str, str]]]:
        """Wrong settings of two knobs at once: (name, implementation, both diagnoses)."""
        found = []
        for i, first in enumerate(self.knobs):
            for second in self.knobs[i + 1:]:
                for a, da in first.wrong:
                    for b, db in second.wrong:
                        found.append((f"{first.name}={a!r}+{second.name}={b!r}",
                                      self.variant(**{first.name: a, second.name: b}), (da, db)))
        return found

    def run(self, implementation: object, calls: Sequence[Call]) -> list[object]:
        """``implementation``'s decoded answers to ``calls``, exactly as grading gets a learner's."""
        payload = probe.collect(self.id, implementation, [c.call() for c in calls], self.driver)
        return decode_payload(payload, self.id)


@dataclass
class Case:
    """One call being judged: the learner's answer beside the reference's."""

    spec: Spec
    call: Call
    answer: object
    expected: object
    _mistaken: list | None = None
    # the other calls of the exercise with the learner's answers to them: a mistake that
    # explains this call is preferred when it explains those as well
    others: tuple = ()

    @property
    def what(self) -> str:
        return self.call.what or self.spec.function

    def fail(self, message: str) -> None:
        raise CheckFailed(f"{self.what}: {message}")

    def mistaken(self) -> list[tuple[Mistake, object]]:
        """Each catalogued mistake with its answer to this call (computed once, when asked)."""
        if self._mistaken is None:
            with _quiet():  # a mistake's 0/0 is expected, not news
                self._mistaken = [(m, self.spec.run(m.implementation, [self.call])[0])
                                  for m in self.spec.catalogue()]
        return self._mistaken

    def consistent(self, implementation: object) -> bool:
        """``implementation`` answers each of the other calls as the learner did: the same
        data, or both not data (a raised error, a non-array)."""
        if not self.others:
            return True
        with _quiet():
            theirs = self.spec.run(implementation, [call for call, _ in self.others])
        for (call, given), wrong in zip(self.others, theirs):
            if isinstance(given, (Raised, Unsupported)) or isinstance(wrong, (Raised, Unsupported)):
                if not (isinstance(given, (Raised, Unsupported)) and isinstance(wrong, (Raised, Unsupported))):
                    return False
                continue
            other = Case(self.spec, call, given, None)
            try:
                mine = given if self.spec.prepare is None else self.spec.prepare(given, call, other.what)
            except CheckFailed:
                return False
            if not _same(other, mine, wrong, nan=True):
                return False
        return True


def _equal(a: object, b: object, rtol: float, atol: float, nan: bool = False) -> bool:
    """Two decoded answers are the same data, within tolerance (``nan``: NaN equals NaN,
    for comparing an answer with a mistake's, which may be NaN where the learner's is);
    text (notebook 11's tokens) only when it is the same characters."""
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(_equal(x, y, rtol, atol, nan) for x, y in zip(a, b)))
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return False
    if nan:
        return a.shape == b.shape and bool(np.allclose(a.astype(np.float64), b.astype(np.float64),
                                                       rtol=rtol, atol=atol, equal_nan=True))
    return close(a.astype(np.float64), b.astype(np.float64), rtol, atol)


def _explain_raised(case: Case) -> None:
    """A raised error in the exercise's words (the spec's rules), else in general words."""
    if isinstance(case.answer, Raised) and not case.answer.message.startswith("NotImplementedError"):
        for rule in case.spec.errors:
            if re.search(rule.match, case.answer.message) and (rule.when is None or rule.when(case.call)):
                raise CheckFailed(rule.diagnosis.format(error=case.answer.message, what=case.what))
    value(case.answer, case.spec.function)


def _same(case: Case, answer: object, wrong: object, nan: bool = False) -> bool:
    """The learner's (prepared) answer equals a wrong implementation's answer (``nan``: NaN
    where both are NaN counts as equal; never for the call being judged, where a NaN of the
    learner's says nothing about which mistake made it)."""
    if isinstance(wrong, (Raised, Unsupported)):
        return False
    if case.spec.prepare is not None:
        try:
            wrong = case.spec.prepare(wrong, case.call, case.what)
        except CheckFailed:
            return False
    return _equal(answer, wrong, case.spec.rtol, case.spec.atol, nan)


def catalogued(case: Case, answer: object) -> str | None:
    """The diagnosis of the catalogued mistake, or pair of knob settings, that explains the
    (prepared) ``answer`` to this call; None if none does.

    A mistake explains the answer when it gives the learner's answer to this call; of
    several (a scalar answer can coincide), the one that also gives the learner's other
    answers wins, and two knobs at once are tried before settling for a partial match.
    """
    matched = [m for m, wrong in case.mistaken() if _same(case, answer, wrong)]
    for mistake in matched:
        if case.consistent(mistake.implementation):
            return mistake.diagnosis
    paired = []
    for name, implementation, both in case.spec.pairs():
        with _quiet():
            wrong = case.spec.run(implementation, [case.call])[0]
        if _same(case, answer, wrong):
            if case.consistent(implementation):
                return "two mistakes at once: (1) {}; (2) {}".format(*both)
            paired.append(both)
    if matched:
        return matched[0].diagnosis
    if paired:
        return "two mistakes at once: (1) {}; (2) {}".format(*paired[0])
    return None


def judge_case(case: Case) -> None:
    """The default judgement of one call; raises :class:`CheckFailed` with the diagnosis.

    A call that ``raises`` wants that exception and nothing else (another error goes
    through the spec's error rules). Otherwise, in order: a raised error or non-data
    (the spec's error rules first); ``prepare``; right within tolerance; the catalogued
    mistake whose answer to this call is the learner's (preferring one that gives the
    learner's other answers too); two knobs set wrong at once; for a tuple answer, the first part (in ``order``) that differs; a
    wrong shape; NaN or infinity where the reference is finite; the first hint that
    applies; otherwise "wrong values".
    """
    spec = case.spec
    if case.call.raises:
        if isinstance(case.answer, Raised) and case.answer.message.startswith(case.call.raises):
            return
        _explain_raised(case)
        case.fail(f"it returned a value; it should raise {case.call.raises}, as the docstring says")
    _explain_raised(case)
    answer, expected = case.answer, case.expected
    if spec.prepare is not None:
        answer, expected = spec.prepare(answer, case.call, case.what), spec.prepare(expected, case.call, case.what)
    if _equal(answer, expected, spec.rtol, spec.atol):
        return
    found = catalogued(case, answer)
    if found:
        case.fail(found)
    if isinstance(expected, tuple):
        names = spec.parts or tuple(f"item {i}" for i in range(len(expected)))
        if not isinstance(answer, tuple) or len(answer) != len(expected):
            kind = f"a tuple of {len(answer)} items" if isinstance(answer, tuple) else "one array"
            raise CheckFailed(f"{case.what} should return a tuple ({', '.join(names)}), but it returns {kind}")
        for i in spec.order or range(len(expected)):
            got = to_array(answer[i], f"the {names[i]} of {case.what}")
            if not _equal(got, expected[i], spec.rtol, spec.atol):
                _describe(case, got, expected[i], f"the {names[i]} of {case.what}", i)
        return
    _describe(case, to_array(answer, case.what), expected, case.what, None)


def _describe(case: Case, got: np.ndarray, expected: np.ndarray, what: str, part: int | None) -> None:
    """A wrong array that no catalogued mistake explains: shape, NaN, hints, else values."""
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {got.shape}; expected {expected.shape}")
    for hint in case.spec.hints:  # (before NaN: a hint may name what a NaN comes from)
        if hint.part == part and hint.applies(got, case.call):
            raise CheckFailed(f"{what}: {hint.message}")
    if not np.all(np.isfinite(got)) and np.all(np.isfinite(expected)):
        raise CheckFailed(f"{what} contains NaN or infinity where every value should be finite")
    raise CheckFailed(f"{what} has the right shape {expected.shape} but wrong values")


_REGISTRY: dict[str, Spec] = {}


def _topics() -> list[str]:
    package = importlib.import_module("grader.checks")
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def _register_topic(topic: str) -> None:
    """Import a topic's module; register the specs it lists in ``SPECS``."""
    module = importlib.import_module(f"grader.checks.{topic}")
    for spec in getattr(module, "SPECS", ()):
        if _REGISTRY.get(spec.id, spec) is not spec:
            raise ValueError(f"two checks registered for {spec.id!r}")
        if spec.id.split("-")[0] != topic:
            raise ValueError(f"{spec.id}: a spec of topic {topic!r} must have an id {topic}-<name>")
        _REGISTRY[spec.id] = spec


def get(exercise_id: str) -> Spec:
    """The registered exercise.

    Raises:
        LookupError: no check is registered under ``exercise_id`` (a course bug).
    """
    topic = exercise_id.split("-")[0]
    if topic not in _topics():
        raise LookupError(f"no checks for topic {topic!r}; known topics: {', '.join(_topics())}")
    _register_topic(topic)
    try:
        return _REGISTRY[exercise_id]
    except KeyError:
        raise LookupError(f"no check registered for exercise {exercise_id!r}") from None


def exercise_ids(topic: str | None = None) -> list[str]:
    """All registered exercise ids (of one topic, if given), sorted."""
    for name in [topic] if topic else _topics():
        _register_topic(name)
    return sorted(e for e in _REGISTRY if topic is None or e.split("-")[0] == topic)


def public_seed(exercise_id: str) -> int:
    """The seed of in-process checks (no course secret): fixed per exercise."""
    return int.from_bytes(hashlib.sha256(exercise_id.encode()).digest()[:8], "little")


def questions(exercise_id: str, seed: int) -> list[Call]:
    """The exercise's calls drawn from ``seed`` (the same seed, the same inputs); each
    call's ``.call()`` is the ``(args, kwargs)`` that enter the kernel."""
    return list(_drawn(exercise_id, seed)[0])


@functools.lru_cache(maxsize=512)
def _drawn(exercise_id: str, seed: int) -> tuple[tuple[Call, ...], tuple[object, ...]]:
    """A spec's calls for ``seed`` and the reference's answers to them (computed once)."""
    spec = get(exercise_id)
    calls = tuple(spec.inputs(np.random.default_rng(seed)))
    with _quiet():
        expected = spec.run(spec.reference, calls)
    for call, answer in zip(calls, expected):
        promised = call.raises and isinstance(answer, Raised) and answer.message.startswith(call.raises)
        if isinstance(answer, (Raised, Unsupported)) and not promised:
            raise RuntimeError(f"{exercise_id}: the reference fails on {call.what or call.args}: {answer}")
    return calls, tuple(expected)


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
    spec = get(exercise_id)
    calls, expected = _drawn(exercise_id, seed)
    try:
        with _quiet():
            for i, (call, given, right) in enumerate(zip(calls, answers, expected)):
                others = tuple((c, a) for j, (c, a) in enumerate(zip(calls, answers)) if j != i)
                (spec.judge or judge_case)(Case(spec, call, given, right, others=others))
    except CheckFailed as error:
        return str(error)
    return None


def answers_of(exercise_id: str, fn: object, seed: int) -> list[object]:
    """``fn``'s decoded answers to the questions of ``seed``, as grading collects them
    (in this process: no kernel, no sandbox)."""
    payload = probe.collect(exercise_id, fn, [q.call() for q in questions(exercise_id, seed)],
                            get(exercise_id).driver)
    return decode_payload(payload, exercise_id)


def with_upstream(verdicts: dict[str, "str | None"]) -> dict[str, "str | None"]:
    """A notebook's verdicts, with each failed exercise whose function calls a failed
    upstream one (``Spec.depends``, the functions its solution calls) told to fix that one
    first: the downstream diagnosis may be only a consequence. The blame is appended, so a
    diagnosis still starts as it did. An exercise not answered yet is left as it is."""
    blamed = dict(verdicts)
    for exercise, diagnosis in verdicts.items():
        if not diagnosis or "not answered yet" in diagnosis:
            continue
        try:
            spec = get(exercise)
        except LookupError:
            continue
        failed = [get(d).function for d in spec.depends if verdicts.get(d)]
        if failed:
            names = " and ".join(failed)
            blamed[exercise] = (f"{diagnosis}. {names} {'is' if len(failed) == 1 else 'are'} wrong too, and "
                                f"{spec.function} calls {'it' if len(failed) == 1 else 'them'}: fix {names} "
                                f"first, then check {spec.function} again")
    return blamed


def check(exercise_id: str, fn: object) -> None:
    """Run the hidden check of ``exercise_id`` on the learner's ``fn`` in this process.

    Raises:
        CheckFailed: the answer is wrong; the message is the diagnosis.
        LookupError: no check is registered under ``exercise_id`` (a course bug).
    """
    seed = public_seed(exercise_id)
    message = verdict(exercise_id, seed, answers_of(exercise_id, fn, seed))
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
        CheckFailed: the answer is an error, a tuple or not numeric (text included).
    """
    answer = value(answer, what)
    if isinstance(answer, str):  # text is data for the exercises on text, never a number ("12.0")
        raise CheckFailed(f"{what} should be a numpy array or torch tensor, but it is a str")
    if isinstance(answer, tuple):
        raise CheckFailed(f"{what} should be one array, but it is a tuple or list of {len(answer)} "
                          "items: return one array (np.stack or np.array of them)")
    return np.asarray(answer, dtype=np.float64)


def close(a: np.ndarray, b: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> bool:
    """Shapes equal and values within tolerance (NaN never matches)."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=False))
