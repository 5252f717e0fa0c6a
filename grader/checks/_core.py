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

A spec's probes (:class:`Probe`) are diagnostic questions: calls on inputs chosen to tell
hypotheses apart, asked with the graded calls (``questions`` returns both) and answered in
the same kernel run. They never count for points; ``verdict`` reads them only to locate a
mistake that no catalogued one explains.

``check(id, fn)`` runs both halves in one process (an instructor running the solution
notebook, the tests); ``grader.verify`` runs them on either side of the sandbox.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import itertools
import pkgutil
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from coursekit.probe import collect, get_driver
from coursekit.protocol import Raised, Unsupported

from ..wire import decode_payload  # (the wire knows nothing of the checks: no cycle)
from . import _localise  # (it imports _core inside its functions only)
from . import _relations as relations

# Tolerances of exercise-standard.md for attention-sized float answers.
RTOL = 1e-4
ATOL = 1e-5


@contextlib.contextmanager
def _one_thread():
    """torch on one thread while the grader runs a reference or a hypothesis: its tensors are
    tiny, and on a loaded machine every op of a thread pool waits for its busiest thread
    (measured: a decoder layer's call took 27 times as long with the default pool)."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else 1
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


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

    ``diagnosis`` may use ``{error}`` (the learner's ``"TypeError: ..."``, without a final
    period), ``{detail}`` (the same without the exception's type) and ``{what}`` (the call).
    The rule applies when ``match`` (a regular expression) is found in the error and
    ``when`` (of the :class:`Call`), if given, holds; it applies on every call, the first
    rule that does wins. ``example`` is a learner-style implementation that gets this
    diagnosis: the tests assert it.
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
class Probe:
    """A diagnostic question: extra calls of the learner's function on inputs chosen to tell
    hypotheses apart, where a part of the exercise is made irrelevant or transparent (zero
    biases, identity weights, a sublayer that outputs a constant, one key, a known
    activation region, batch and padding counts that tell reductions apart).

    ``calls(rng)`` draws them after the graded calls, from the same seed (so the graded
    questions do not change), and they are answered in the same kernel run: the verdict is
    reached after execution, so every question is asked in advance. They never count for
    points. They are read only when a graded answer is wrong and no catalogued mistake
    explains it, so a valid implementation loses nothing whatever it answers here, and a
    right one costs only the kernel's time to answer them. Their inputs are never shown.

    Reading, in order:

    - ``reads`` names knobs of the spec: every combination of their settings (the
      reference's, each wrong one, and the ``extra`` wrong settings tried on this probe
      only, e.g. activations no knob lists), with at most ``most`` wrong at once and the
      fewest first, runs on these calls; the first whose answers are the learner's names
      its wrong settings, all of them. The knobs not read keep the reference's setting,
      so the inputs must make them irrelevant. With ``reads`` empty only the reference
      is tried.
    - ``describe(answers, calls)``: what the learner's answers show when no combination
      gives them (e.g. which axes sum to one), or None.

    ``right`` is said when the learner answers as the reference does: the part this probe
    isolates is right, look elsewhere. ``examples`` are learner-style implementations with
    the finding each must get (asserted by the tests, like ``Spec.diagnosed``).
    """

    name: str
    calls: Callable[[np.random.Generator], list[Call]]
    reads: tuple[str, ...] = ()
    extra: tuple[Knob, ...] = ()
    describe: Callable[[list, list[Call]], str | None] | None = None
    right: str = ""
    most: int = 2
    examples: tuple[Mistake, ...] = ()


@dataclass(frozen=True)
class Rule:
    """A rule the exercise's docstring states, and which graded calls exercise it.

    ``exercised(call)`` is True when ``call`` is one whose right answer depends on the rule
    (e.g. "two words become equal after a merge", "a row fully masked", "q_len != k_len").
    The tests assert that the graded calls of every seed exercise every rule: an input set
    that never tests a rule cannot reject a learner who ignores it.
    """

    name: str
    exercised: Callable[[Call], bool]


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
    ``probes`` are the diagnostic questions (:class:`Probe`). ``by_call``: a raised error
    or non-data answer that no rule explains is named by its call (``Call.what``: which
    call tells a learner more, a batch, a keyword, a mask without heads) rather than by
    the function, and before the ``judge`` hook sees it. ``output`` names an answer in
    value diagnoses when the call is not the answer itself (``"the output of {}"``).
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
    probes: tuple[Probe, ...] = ()
    by_call: bool = False
    output: str = ""
    # The docstring's rules (:class:`Rule`), each exercised by the graded calls of every seed.
    rules: tuple[Rule, ...] = ()
    # Mutants of the reference (grader.checks._mutants) that compute the same function, by
    # mutant name, with the reason why: (name, reason) pairs. Every other mutant must be
    # rejected on every seed.
    equivalent: tuple[tuple[str, str], ...] = ()
    # A module exercise: the submodules its docstring names ("layers.*.norm1": * is an index),
    # hooked on diagnostic questions to localise a mistake no catalogued one explains
    # (grader.checks._localise, read by _describe).
    submodules: tuple[str, ...] = ()

    def __post_init__(self):
        if self.submodules and not any(p.name == _localise.NAME for p in self.probes):
            object.__setattr__(self, "probes", self.probes + (_localise.probe(self),))
        if self.driver is not None:
            try:
                get_driver(self.driver)
            except LookupError as error:
                raise ValueError(f"{self.id}: {error}") from None
        if self.knobs and self.variant is None:
            raise ValueError(f"{self.id}: knobs need a variant(**settings) implementation")
        names = [m.name for m in self.catalogue() + self.diagnosed]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.id}: two mistakes share a name")
        knobs = {k.name for k in self.knobs}
        for p in self.probes:
            unknown = (set(p.reads) | {k.name for k in p.extra}) - knobs
            if unknown or not set(k.name for k in p.extra) <= set(p.reads):
                raise ValueError(f"{self.id}: probe {p.name!r} reads knobs the spec does not have, or has extra "
                                 f"settings of knobs it does not read: {sorted(unknown) or [k.name for k in p.extra]}")
        if len({p.name for p in self.probes}) != len(self.probes):
            raise ValueError(f"{self.id}: two probes share a name")

    def knob(self, name: str) -> Knob:
        return next(k for k in self.knobs if k.name == name)

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

    def combinations(self, probe: Probe) -> list[tuple[str, dict, tuple[str, ...]]]:
        """The settings a probe tells apart, fewest wrong first: (name, settings, diagnoses);
        the first is the reference's (no wrong setting)."""
        options = [[(knob, s, d) for s, d in self.knob(knob).wrong
                    + tuple(w for k in probe.extra if k.name == knob for w in k.wrong)] for knob in probe.reads]
        found = [("reference", {}, ())]
        for n in range(1, min(probe.most, len(options)) + 1):
            for chosen in itertools.combinations(options, n):
                for picks in itertools.product(*chosen):
                    found.append(("+".join(f"{k}={s!r}" for k, s, _ in picks), {k: s for k, s, _ in picks},
                                  tuple(d for _, _, d in picks)))
        return found

    def implementation(self, settings: dict) -> object:
        """The reference, or the variant with these knob settings."""
        return self.variant(**settings) if settings else self.reference

    def run(self, implementation: object, calls: Sequence[Call]) -> list[object]:
        """``implementation``'s decoded answers to ``calls``, exactly as grading gets a learner's."""
        with _one_thread():
            payload = collect(self.id, implementation, [c.call() for c in calls], self.driver)
        return decode_payload(payload, self.id)


# Hypotheses' answers (a catalogued mistake, a pair of knobs, a probe's combination) to one
# question of one seed, computed once: the same seed asks them again for every answer judged
# in the tests, and a probe's reading reuses the catalogue's. Keyed by (exercise, seed,
# question, hypothesis name); cleared when it grows past the limit.
_ANSWERS: dict[tuple, object] = {}
_ANSWERS_LIMIT = 20_000


def _answer_of(spec: Spec, seed: int | None, question: object, name: str, implementation: object,
               call: Call) -> object:
    """``implementation``'s decoded answer to ``call`` (the hypothesis ``name``), quietly."""
    key = (spec.id, seed, question, name)
    if seed is not None and key in _ANSWERS:
        return _ANSWERS[key]
    with _quiet():  # a mistake's 0/0 is expected, not news
        found = spec.run(implementation, [call])[0]
    if seed is not None:
        if len(_ANSWERS) >= _ANSWERS_LIMIT:
            _ANSWERS.clear()
        _ANSWERS[key] = found
    return found


@dataclass
class Case:
    """One call being judged: the learner's answer beside the reference's.

    ``seed`` and ``index`` (the call's place among the graded calls) key the hypotheses'
    answers computed once (:func:`_answer_of`); ``others`` holds (index, call, answer) of the
    exercise's other graded calls, ``probed`` (probe, calls, answers) of its probes.
    """

    spec: Spec
    call: Call
    answer: object
    expected: object
    _mistaken: list | None = None
    # the other calls of the exercise with the learner's answers to them: a mistake that
    # explains this call is preferred when it explains those as well
    others: tuple = ()
    seed: int | None = None
    index: int | None = None
    probed: tuple = ()
    _found: "Findings | None" = None
    # set by ``catalogued`` when what it says is only "partly like" a mistake
    partly: bool = False

    @property
    def called(self) -> str:
        """The call, as a diagnosis names it (``Call.what``, else the function)."""
        return self.call.what or self.spec.function

    @property
    def what(self) -> str:
        """The answer, as a value diagnosis names it (``Spec.output`` of the call)."""
        return self.spec.output.format(self.called) if self.spec.output else self.called

    def fail(self, message: str) -> None:
        raise CheckFailed(f"{self.what}: {message}")

    def answer_of(self, name: str, implementation: object, call: Call | None = None, question: object = None
                  ) -> object:
        """The hypothesis ``name``'s answer to this call (or to ``call``, the ``question``-th)."""
        if call is None:
            call, question = self.call, self.index
        seed = self.seed if question is not None else None
        return _answer_of(self.spec, seed, question, name, implementation, call)

    def mistaken(self) -> list[tuple[Mistake, object]]:
        """Each catalogued mistake with its answer to this call (computed once, when asked)."""
        if self._mistaken is None:
            self._mistaken = [(m, self.answer_of(m.name, m.implementation)) for m in self.spec.catalogue()]
        return self._mistaken

    def consistent(self, implementation: object, name: str | None = None) -> bool:
        """``implementation`` answers each of the other calls as the learner did: the same
        data, or both not data (a raised error, a non-array)."""
        return not self.unexplained(implementation, name)

    def unexplained(self, implementation: object, name: str | None = None) -> list[Call]:
        """The other graded calls that ``implementation`` does not answer as the learner did,
        leaving out those where the docstring promises an exception (``Call.raises``): whether
        the learner raises it is judged on that call, and tells nothing of how it computes."""
        missed = []
        for index, call, given in self.others:
            if call.raises:
                continue
            if name is None:
                with _quiet():
                    wrong = self.spec.run(implementation, [call])[0]
            else:
                wrong = self.answer_of(name, implementation, call, index)
            if not _agrees(self.spec, call, given, wrong):
                missed.append(call)
        return missed

    def findings(self) -> "Findings":
        """What the probes found (read once, when asked), and where the module's hooks localise
        the mistake (``Spec.submodules``)."""
        if self._found is None:
            found = _read_probes(self)
            self._found = Findings(found.wrong, found.complete, found.right,
                                   functools.cache(lambda: _localise.localise(self)))
        return self._found


@dataclass(frozen=True)
class Findings:
    """What a case's probes found: the diagnosis of what is wrong (None if nothing), whether
    it explains every graded answer, and the notes of the parts found right."""

    wrong: str | None = None
    complete: bool = False
    right: tuple[str, ...] = ()
    # where a module's hooks find the first submodule, residual or norm that differs (computed
    # when asked: grader.checks._localise)
    where: Callable[[], str | None] = lambda: None


def _agrees(spec: Spec, call: Call, given: object, wrong: object) -> bool:
    """A hypothesis's answer to another call is the learner's: the same (prepared) data, or
    both not data."""
    if isinstance(given, (Raised, Unsupported)) or isinstance(wrong, (Raised, Unsupported)):
        return isinstance(given, (Raised, Unsupported)) and isinstance(wrong, (Raised, Unsupported))
    other = Case(spec, call, given, None)
    try:
        mine = given if spec.prepare is None else spec.prepare(given, call, other.what)
    except CheckFailed:
        return False
    return _same(other, mine, wrong, nan=True)


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


NOT_ANSWERED = "NotImplementedError"


def not_answered(answer: object) -> bool:
    """The stub's own ``raise NotImplementedError()``, untouched: the bare exception, with no
    message (a NotImplementedError that torch or numpy raise, for an operation they lack,
    carries one, and is the learner's error to be explained)."""
    return isinstance(answer, Raised) and answer.message == NOT_ANSWERED


def _explain_raised(case: Case) -> None:
    """A raised error or non-data answer, named once for every exercise: the first of the
    spec's rules that applies to the error (on any call), else ``<name> raised <error>``,
    where the name is the call (``Spec.by_call``) or the function. Returns for data."""
    answer, spec = case.answer, case.spec
    name = case.called if spec.by_call else spec.function
    if isinstance(answer, Raised) and not not_answered(answer):
        message = answer.message.rstrip(".")
        for rule in spec.errors:
            if re.search(rule.match, message) and (rule.when is None or rule.when(case.call)):
                said = rule.diagnosis.format(error=message, what=case.called, detail=message.split(": ", 1)[-1])
                # (a rule that only names the call: say what the docstring asks, as below)
                raise CheckFailed(said + _asked(case, message) if said.endswith(message) else said)
        raise CheckFailed(f"{case.called} raised {message}{_asked(case, message)}")
    value(answer, name)


UNDEFINED = ("; a name it uses is not defined when it runs: misspelt, or defined in a later cell, or in a cell "
             "since deleted, renamed or not run (a run from top to bottom does not have it). Restart the kernel "
             "and run all cells from the top to see it")


def _asked(case: Case, message: str) -> str:
    """What the docstring asks of a call that raised an error no rule explains: the answer
    it should return (its kind and shape), or, for a NameError, how to see it."""
    if message.startswith("NameError"):
        return UNDEFINED
    kind = _answer_kind(case.expected, case.spec.parts)
    return f"; it should return {kind}" if kind else ""


def _answer_kind(expected: object, parts: tuple[str, ...] = ()) -> str | None:
    """A right answer as a docstring names it: "an array of shape (2, 3)", "a tuple (output,
    weights) of shapes (2, 3) and (2, 3, 3)", "a str"."""
    if isinstance(expected, np.ndarray):
        return "a number (an array of shape ())" if expected.shape == () else f"an array of shape {expected.shape}"
    if isinstance(expected, str):
        return "a str"
    if isinstance(expected, tuple) and all(isinstance(e, np.ndarray) for e in expected):
        names = f" ({', '.join(parts)})" if len(parts) == len(expected) else ""
        shapes = " and ".join(str(e.shape) for e in expected)
        return f"a tuple{names} of {len(expected)} arrays, of shapes {shapes}"
    return None


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


_COUNTS = {2: "two", 3: "three", 4: "four", 5: "five"}


def at_once(diagnoses: Sequence[str]) -> str:
    """One diagnosis, or several named together: "two mistakes at once: (1) ...; (2) ..."."""
    if len(diagnoses) == 1:
        return diagnoses[0]
    listed = "; ".join(f"({i}) {d}" for i, d in enumerate(diagnoses, 1))
    return f"{_COUNTS.get(len(diagnoses), len(diagnoses))} mistakes at once: {listed}"


def catalogued(case: Case, answer: object) -> str | None:
    """The diagnosis of the catalogued mistake, or pair of knob settings, that explains the
    (prepared) ``answer`` to this call and the learner's answers to every other graded call,
    or what the probes find; None if nothing does.

    A mistake explains the answers when it gives the learner's answer to every graded call
    (a scalar answer can coincide with several on one call). Then the probes are read: knob
    settings they find that explain every graded answer (with one more knob, if need be) are
    named. Then two knobs at once, only where no single mistake explains the answers and
    the pair gives them on every call, with calls that tell it from each knob alone
    (:func:`_separated`). Then what the probes found even if it explains only part. Last, a
    mistake (or pair) that gives the answer to this call but not to others is no diagnosis:
    it is said as "partly like" that mistake, naming the calls it does not explain.
    """
    matched = [m for m, wrong in case.mistaken() if _same(case, answer, wrong)]
    for mistake in matched:
        if case.consistent(mistake.implementation, mistake.name):
            return mistake.diagnosis
    found = case.findings()
    if found.wrong and found.complete:
        return found.wrong
    paired = []
    for name, implementation, both in case.spec.pairs():
        if _same(case, answer, case.answer_of(name, implementation)):
            if not case.consistent(implementation, name):
                paired.append((name, implementation, at_once(both), True))
            elif _separated(case, name, implementation):
                return at_once(both)
    if found.wrong:
        return found.wrong
    partial = [(m.name, m.implementation, m.diagnosis, False) for m in matched] + paired
    if partial:
        case.partly = True
        return _partly(case, *partial[0])
    return None


def _graded_calls(case: Case) -> list[tuple[int | None, Call]]:
    """The call judged and the other graded calls, as (question index, call)."""
    return [(case.index, case.call)] + [(j, c) for j, c, _ in case.others]


def _separated(case: Case, name: str, implementation: object) -> bool:
    """Two knobs set wrong at once (the pair ``name``) are told from each knob alone by the
    graded calls: some call where the pair's answer differs from each knob's alone, two calls
    at least in all (else one knob's evidence is one coincidence of the other's)."""
    single = {m.name: m.implementation for m in case.spec.catalogue()}
    parts = next(([(a, single[a]), (b, single[b])] for a, b in itertools.permutations(single, 2)
                  if f"{a}+{b}" == name), None)
    if parts is None:
        return True  # (not a pair of catalogued settings: nothing to tell it from)
    telling = [set(), set()]
    for j, call in _graded_calls(case):
        both = case.answer_of(name, implementation, call, j)
        for told, (part, fn) in zip(telling, parts):
            if not _equal(both, case.answer_of(part, fn, call, j), case.spec.rtol, case.spec.atol, nan=True):
                told.add(j)
    return all(telling) and len(telling[0] | telling[1]) >= 2


def _partly(case: Case, name: str, implementation: object, diagnosis: str, several: bool) -> str:
    """A mistake (``several``: two at once) that gives the learner's answer to this call, said
    with the graded calls whose answers it does not give."""
    missed = [call.what or case.spec.function for call in case.unexplained(implementation, name)]
    listed = "; ".join(missed[:2]) + (f" and {len(missed) - 2} more" if len(missed) > 2 else "")
    like, they = ("these", "they do") if several else ("this mistake", "that mistake does")
    return (f"partly like {like}: {diagnosis}. But {they} not give your answers to {listed}: something else "
            "differs as well")


def _read(case: Case, probe: Probe, calls: tuple, answers: tuple) -> tuple[dict | None, tuple[str, ...]]:
    """One probe's reading: (the knob settings whose answers are the learner's, their wrong
    settings' diagnoses), or (None, what ``describe`` says, if anything)."""
    spec = case.spec
    if not any(isinstance(a, (Raised, Unsupported)) for a in answers):
        for name, settings, diagnoses in spec.combinations(probe):
            implementation = spec.implementation(settings)
            if all(_agrees(spec, call, given, _answer_of(spec, case.seed, (probe.name, i), name, implementation,
                                                           call))
                   for i, (call, given) in enumerate(zip(calls, answers))):
                return settings, diagnoses
    if probe.describe is not None:
        with _quiet():
            said = probe.describe(list(answers), list(calls))
        if said:
            return None, (said,)
    return None, ()


def _read_probes(case: Case) -> Findings:
    """Every probe's reading, combined: the wrong settings found (confirmed, or completed by
    one more wrong setting, on every graded answer) and what the describers say; else the
    notes of the probes that found their part right."""
    spec, settings, wrong, right, described = case.spec, {}, [], [], False
    for probe in spec.probes:
        calls = tuple(c for p, c, _ in case.probed if p is probe)
        answers = tuple(a for p, _, a in case.probed if p is probe)
        if not calls:
            continue
        found, said = _read(case, probe, calls, answers)
        if found == {}:
            if probe.right:
                right.append(probe.right)
        elif found:
            settings.update(found)
        else:
            described = described or bool(said)
        wrong.extend(d for d in said if d not in wrong)
    if not wrong:
        return Findings(right=tuple(right))
    if settings and not described:  # (knob settings only: confirm them on the graded answers)
        extra = _complete(case, settings)
        if extra is None:
            return Findings(f"{at_once(wrong)}. Something else differs as well: fix this first, then check again")
        return Findings(at_once(wrong + extra), complete=True)
    return Findings(at_once(wrong))


def _complete(case: Case, settings: dict) -> list[str] | None:
    """The learner's graded answers given by ``settings`` alone ([]), or with one more wrong
    setting of a knob the probes did not read ([its diagnosis]); None if neither gives them."""
    answer = case.answer
    if case.spec.prepare is not None:
        try:
            answer = case.spec.prepare(answer, case.call, case.what)
        except CheckFailed:
            return None

    def gives(more: dict) -> bool:
        name = "+".join(f"{k}={v!r}" for k, v in sorted(more.items(), key=str))
        implementation = case.spec.variant(**more)
        return _same(case, answer, case.answer_of(name, implementation)) and case.consistent(implementation, name)

    if gives(settings):
        return []
    for knob in case.spec.knobs:
        if knob.name not in settings:
            for setting, diagnosis in knob.wrong:
                if gives({**settings, knob.name: setting}):
                    return [diagnosis]
    return None


def judge_case(case: Case) -> None:
    """The default judgement of one call; raises :class:`CheckFailed` with the diagnosis.

    A call that ``raises`` wants that exception and nothing else (another error goes
    through the spec's error rules). Otherwise, in order: a raised error or non-data
    (the spec's error rules first); ``prepare``; right within tolerance; what
    :func:`catalogued` says (a mistake only if it gives every graded answer; one that gives
    some only yields to a relation seen on every call); for a tuple answer, the first part
    (in ``order``) that differs; then :func:`_describe`.
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
    if found and case.partly and not isinstance(expected, (tuple, str)):
        found = _related(case, answer, expected) or found  # (a relation on every call, not a mistake on some)
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
    """A wrong array that no catalogued mistake explains: a wrong shape (and how it relates
    to the right one); a hint; NaN or infinity (where); a relation that holds on every graded
    call where the answer is finite (:mod:`._relations`), or the axis it sums to 1 along; a
    pattern of positions, the same on every call, where it is wrong; else which positions are;
    with what the probes found right."""
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        related = relations.shape_relation(got, expected)
        raise CheckFailed(f"{what} has shape {got.shape}; expected {expected.shape}" + (f": {related}" if related else ""))
    for hint in case.spec.hints:  # (before NaN: a hint may name what a NaN comes from)
        if hint.part == part and hint.applies(got, case.call):
            raise CheckFailed(f"{what}: {hint.message}")
    where = case.findings().where()  # (a module: the first submodule, residual or norm that differs)
    if where:
        raise CheckFailed(f"{what}: {where}")
    right = "".join(f"; {note}" for note in case.findings().right)
    pairs, index, names = _graded_pairs(case, got, expected, part)
    said = (relations.nonfinite(pairs, index, names) or _whole(pairs, index, names, strict=False)
            or relations.normalised_here(pairs[index]) or relations.describe(pairs, index, names, relations.PATTERNS))
    if said:
        raise CheckFailed(f"{what}: {said}{right}")
    where = relations.unnormalised(pairs[index]) or relations.where_wrong(pairs[index])
    calls = relations.right_on(pairs, names) or ""
    if where:
        shape = "" if expected.ndim == 0 else f" has the right shape {expected.shape}, but"
        raise CheckFailed(f"{what}{shape or ':'} {where}{calls}{right}")
    raise CheckFailed(f"{what} has the right shape {expected.shape} but wrong values{calls}{right}")


def _related(case: Case, got: object, expected: object) -> str | None:
    """The relation between the learner's answers and the right ones that says how the whole
    answer is computed and holds on every graded call, each answer of the right shape and
    finite; or None."""
    try:
        got, expected = to_array(got, case.what), np.asarray(expected, dtype=np.float64)
    except (CheckFailed, TypeError, ValueError):
        return None
    if got.shape != expected.shape:
        return None
    return _whole(*_graded_pairs(case, got, expected, None), strict=True)


def _whole(pairs: list, index: int, names: list[str], strict: bool) -> str | None:
    """``relations.WHOLE`` on the graded calls: with ``strict``, only if every answer is of the
    right shape and finite; else if the answer judged is, naming a call where another is not."""
    unseen = [p for p in pairs if not p.comparable]
    if pairs[index] in unseen or (strict and unseen):  # (a relation must be seen on every call)
        return None
    said = relations.describe(pairs, index, names, relations.WHOLE)
    broken = [p.what for p in unseen if p.got is not None and p.got.shape == p.want.shape]
    if said and broken:
        said += f" where it is finite (on {broken[0]}{' and others' if len(broken) > 1 else ''} it is not)"
    return said


def _graded_pairs(case: Case, got: np.ndarray, expected: np.ndarray, part: int | None
                  ) -> tuple[list[relations.Pair], int, list[str]]:
    """The learner's and the reference's answers (the item ``part`` of a tuple) on every graded
    call, the index of the call judged among them, the function's argument names. Only the
    call judged when the others are not known (a hook's own case, no seed) or do not line up
    with it."""
    spec, call = case.spec, case.call
    names = (relations.argument_names(spec.reference, len(call.args)) if inspect.isfunction(spec.reference)
             else [f"argument {i + 1}" for i in range(len(call.args))])  # (a class's driver passes others)
    mine = relations.Pair(got, expected, call.args, tuple(call.kwargs.items()), case.called)
    if case.seed is None or case.index is None or not case.others:
        return [mine], 0, names
    calls, right, _ = _drawn(spec.id, case.seed)

    def data(answer: object, asked: Call) -> np.ndarray | None:
        try:
            if spec.prepare is not None:
                answer = spec.prepare(answer, asked, case.what)
            return to_array(answer[part] if part is not None else answer, case.what)
        except (CheckFailed, TypeError, ValueError, IndexError, KeyError):
            return None

    if case.index >= len(calls):
        return [mine], 0, names
    own = data(right[case.index], calls[case.index])
    if own is None or own.shape != expected.shape or not np.allclose(own, expected, equal_nan=True):
        return [mine], 0, names
    pairs = [mine]
    for j, asked, given in case.others:
        want = data(right[j], asked) if j < len(right) else None
        if want is not None:
            pairs.append(relations.Pair(data(given, asked), want, asked.args, tuple(asked.kwargs.items()),
                                        asked.what or spec.function))
    return pairs, 0, names


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
    """The exercise's calls drawn from ``seed`` (the same seed, the same inputs): the graded
    calls, then the probes' (diagnostic, never scored). Each call's ``.call()`` is the
    ``(args, kwargs)`` that enter the kernel."""
    calls, _, probing = _drawn(exercise_id, seed)
    return list(calls) + [call for _, call in probing]


@functools.lru_cache(maxsize=512)
def _drawn(exercise_id: str, seed: int) -> tuple[tuple[Call, ...], tuple[object, ...], tuple[tuple[int, Call], ...]]:
    """A spec's graded calls for ``seed``, the reference's answers to them (computed once),
    and the probes' calls (probe index, call), drawn after the graded ones."""
    spec = get(exercise_id)
    rng = np.random.default_rng(seed)
    calls = tuple(spec.inputs(rng))
    probing = tuple((i, call) for i, p in enumerate(spec.probes) for call in p.calls(rng))
    with _quiet():
        expected = spec.run(spec.reference, calls)
    for call, answer in zip(calls, expected):
        promised = call.raises and isinstance(answer, Raised) and answer.message.startswith(call.raises)
        if isinstance(answer, (Raised, Unsupported)) and not promised:
            raise RuntimeError(f"{exercise_id}: the reference fails on {call.what or call.args}: {answer}")
    return calls, tuple(expected), probing


def verdict(exercise_id: str, seed: int, answers: Sequence[object] | None) -> str | None:
    """Judge decoded ``answers`` to the questions of ``seed``: None if right, else the diagnosis.

    ``answers`` is None when the kernel handed back nothing for this exercise. Only the
    graded calls' answers decide; the probes' answers are read to locate a mistake.
    """
    spec = get(exercise_id)
    calls, expected, probing = _drawn(exercise_id, seed)
    if answers is None:
        return "no answer reached the grader: the test cell did not finish"
    graded = answers[:len(calls)]
    if graded and all(not_answered(a) for a in graded):
        return f"{spec.function}: not answered yet, it still raises NotImplementedError"
    if len(answers) != len(calls) + len(probing):
        return f"the grader asked {len(calls) + len(probing)} questions and received {len(answers)} answers"
    probed = tuple((spec.probes[i], call, a) for (i, call), a in zip(probing, answers[len(calls):]))
    try:
        with _quiet():
            for i, (call, given, right) in enumerate(zip(calls, graded, expected)):
                others = tuple((j, c, a) for j, (c, a) in enumerate(zip(calls, graded)) if j != i)
                case = Case(spec, call, given, right, others=others, seed=seed, index=i, probed=probed)
                if spec.by_call and not call.raises:
                    _explain_raised(case)
                (spec.judge or judge_case)(case)
    except CheckFailed as error:
        return str(error)
    return None


def answers_of(exercise_id: str, fn: object, seed: int) -> list[object]:
    """``fn``'s decoded answers to the questions of ``seed`` (graded and diagnostic), as grading
    collects them (in this process: no kernel, no sandbox)."""
    with _one_thread():
        payload = collect(exercise_id, fn, [q.call() for q in questions(exercise_id, seed)], get(exercise_id).driver)
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
        if not_answered(answer):
            raise CheckFailed(f"{name}: not answered yet, it still raises NotImplementedError")
        raise CheckFailed(f"{name} raised {answer.message.rstrip('.')}")
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
