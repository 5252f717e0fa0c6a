"""Tests generated from the exercise specs: no catalogued diagnosis goes unasserted.

For every exercise written as a spec (``grader.checks._core.Spec``), each catalogued
mistake, each raised-error rule, each hint and each diagnosis a hook gives
(``diagnosed``) has a learner-style implementation; run as a learner's answer, it must
get its own diagnosis, on the public seed (an instructor's run) and on the seeds of
many students (grading), through the same collect/decode/verdict path as grading.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from coursekit.protocol import Raised
from grader.checks import CheckFailed, check
from grader.checks import Spec, answers_of, exercise_ids, get, verdict
from grader.checks._core import _equal
from tests.scope import some_params, student_seeds

STUDENT_SEEDS = student_seeds(6)


def _specs() -> list[Spec]:
    return [s for s in map(get, exercise_ids()) if isinstance(s, Spec)]


def _template(diagnosis: str) -> re.Pattern:
    """A rule's diagnosis as a pattern: its own words, with anything in its {error}, {what} and
    {detail} (the learner's message and the call)."""
    return re.compile(".+?".join(map(re.escape, re.split(r"\{(?:error|what|detail)\}", diagnosis))))


def _cases() -> list[tuple[str, str, object, re.Pattern]]:
    """(exercise id, name, implementation, diagnosis) of everything a spec diagnoses."""
    cases = []
    for spec in _specs():
        for m in spec.catalogue() + spec.diagnosed:
            cases.append((spec.id, m.name, m.implementation, re.compile(re.escape(m.diagnosis))))
        for i, rule in enumerate(spec.errors):
            cases.append((spec.id, f"raises-{i}", rule.example, _template(rule.diagnosis)))
        for i, hint in enumerate(spec.hints):
            cases.append((spec.id, f"hint-{i}", hint.example, re.compile(re.escape(hint.message))))
        for probe in spec.probes:
            for knob in probe.extra:
                for setting, diagnosis in knob.wrong:
                    cases.append((spec.id, f"{probe.name}-{knob.name}={setting!r}",
                                  spec.variant(**{knob.name: setting}), re.compile(re.escape(diagnosis))))
            for m in probe.examples:
                cases.append((spec.id, f"{probe.name}-{m.name}", m.implementation, re.compile(re.escape(m.diagnosis))))
    return cases


def _pairs() -> list[tuple[str, str, object, tuple[str, str]]]:
    return [(spec.id, name, implementation, both) for spec in _specs()
            for name, implementation, both in spec.pairs()]


PAIRS = _pairs()


CASES = _cases()


def test_specs_are_found_and_carry_a_catalogue():
    specs = _specs()
    assert specs, "no exercise is written as a spec"
    for spec in specs:
        assert len(spec.catalogue()) >= 3, f"{spec.id}: at least three catalogued mistakes (exercise-standard.md)"


@pytest.mark.parametrize("exercise,name,implementation,diagnosis", CASES,
                         ids=[f"{e}-{n}" for e, n, _, _ in CASES])
def test_catalogued_diagnosis_is_given(exercise, name, implementation, diagnosis):
    with pytest.raises(CheckFailed) as failure:
        check(exercise, implementation)
    assert diagnosis.search(str(failure.value)), str(failure.value)
    for seed in STUDENT_SEEDS:
        with np.errstate(all="ignore"):
            message = verdict(exercise, seed, answers_of(exercise, implementation, seed))
        assert message and diagnosis.search(message), (seed, message)


@pytest.mark.parametrize("exercise", [s.id for s in _specs()])
def test_reference_passes_for_every_student_seed(exercise):
    """The reference is judged by the same path (driver, wire) as a learner's answer."""
    spec = get(exercise)
    for seed in STUDENT_SEEDS:
        assert verdict(exercise, seed, answers_of(exercise, spec.reference, seed)) is None


@pytest.mark.parametrize("exercise,name,implementation,both",
                         some_params(PAIRS, [f"{e}-{n}" for e, n, _, _ in PAIRS]))
def test_two_mistakes_at_once_are_both_named(exercise, name, implementation, both):
    """Differential diagnosis: two knobs set wrong together, a combination no catalogue lists."""
    spec = get(exercise)
    for seed in STUDENT_SEEDS:
        with np.errstate(all="ignore"):
            answers = answers_of(exercise, implementation, seed)
            message = verdict(exercise, seed, answers)
        assert message, seed
        if all(d in message for d in both):
            continue
        # Some pairs are one function: e.g. per-sentence means, when padding is kept, are the
        # plain mean, and averaged over padding rows only, eps / V spread over the other classes
        # or over all of them is the same. Then the single mistake's diagnosis, or the other
        # pair's, is right, if it gives every graded answer.
        graded = len(spec.inputs(np.random.default_rng(seed)))
        others = [(m.implementation, (m.diagnosis,)) for m in spec.catalogue()] + [
            (other, two) for _, other, two in spec.pairs()]
        same = [said for other, said in others if all(d in message for d in said) and all(
            _equal(a, b, spec.rtol, spec.atol) or isinstance(a, Raised) and isinstance(b, Raised)
            for a, b in zip(answers_of(exercise, other, seed)[:graded], answers[:graded]))]
        assert same, (seed, message)


@pytest.mark.parametrize("exercise", [s.id for s in _specs() if s.knobs])
def test_a_variant_with_no_wrong_setting_is_right(exercise):
    spec = get(exercise)
    assert verdict(exercise, 0, answers_of(exercise, spec.variant(), 0)) is None


def _probed() -> list[tuple[str, str, object]]:
    """(exercise, name, implementation) of every answer a probe's finding names."""
    found = []
    for spec in _specs():
        for probe in spec.probes:
            found += [(spec.id, f"{probe.name}-{m.name}", m.implementation) for m in probe.examples]
            found += [(spec.id, f"{probe.name}-{k.name}={s!r}", spec.variant(**{k.name: s}))
                      for k in probe.extra for s, _ in k.wrong]
            found += [(spec.id, f"{probe.name}-{k}={s!r}", spec.variant(**{k: s}))
                      for k in probe.reads for s, _ in spec.knob(k).wrong]
    return found


PROBED = _probed()


@pytest.mark.parametrize("exercise,name,implementation", PROBED, ids=[f"{e}-{n}" for e, n, _ in PROBED])
def test_a_probe_s_inputs_never_reach_a_diagnosis(exercise, name, implementation):
    """What a probe finds says what the learner's function did, never what it was asked: no
    probe call's description, and no value of its inputs, is in the diagnosis."""
    from grader.checks import questions

    spec = get(exercise)
    seed = STUDENT_SEEDS[-1]
    asked = questions(exercise, seed)[len(spec.inputs(np.random.default_rng(seed))):]
    with np.errstate(all="ignore"):
        message = verdict(exercise, seed, answers_of(exercise, implementation, seed))
    assert message
    for call in asked:
        assert call.what not in message
        for value in (*call.args, *call.kwargs.values()):
            for x in np.ravel(value) if isinstance(value, np.ndarray) and value.dtype.kind == "f" else ():
                shown = {f"{x:.3f}", f"{x:.4g}"}
                if abs(x - round(x)) > 1e-3:  # (integers are in any text; a drawn value is not)
                    assert not any(text in message for text in shown if "." in text), (x, message)


def _seeds(exercise: str) -> list[int]:
    from grader.checks import public_seed

    return [public_seed(exercise), *STUDENT_SEEDS]


@pytest.mark.parametrize("exercise", [s.id for s in _specs()])
def test_every_rule_of_the_docstring_is_exercised_by_every_seed(exercise):
    """Inputs that separate: each rule the docstring states (``Spec.rules``) is exercised by some
    graded call of every seed, so that no student's hidden inputs let a learner ignore it."""
    spec = get(exercise)
    assert spec.rules, f"{exercise}: list the docstring's rules (Spec.rules)"
    for seed in _seeds(exercise):
        calls = spec.inputs(np.random.default_rng(seed))
        missed = [rule.name for rule in spec.rules if not any(rule.exercised(call) for call in calls)]
        assert not missed, f"seed {seed}: no graded call exercises {missed}"


@pytest.mark.parametrize("exercise", [s.id for s in _specs()])
def test_every_two_catalogued_mistakes_differ_on_some_call_of_every_seed(exercise):
    """A diagnosis is never a coincidence: for every seed, any two catalogued mistakes answer
    some graded call differently (else one learner's answer would fit both)."""
    spec = get(exercise)
    catalogue = spec.catalogue()
    for seed in _seeds(exercise):
        calls = spec.inputs(np.random.default_rng(seed))
        with np.errstate(all="ignore"):
            answers = {m.name: spec.run(m.implementation, calls) for m in catalogue}
        alike = [(a.name, b.name) for i, a in enumerate(catalogue) for b in catalogue[i + 1:]
                 if all(_same_answer(spec, x, y) for x, y in zip(answers[a.name], answers[b.name]))]
        assert not alike, f"seed {seed}: these catalogued mistakes answer every graded call alike: {alike}"


def _same_answer(spec: Spec, a: object, b: object) -> bool:
    """Two hypotheses' answers to one call cannot be told apart: the same data, or the same error."""
    from grader.checks import Raised, Unsupported

    if isinstance(a, (Raised, Unsupported)) or isinstance(b, (Raised, Unsupported)):
        return type(a) is type(b) and str(a) == str(b)
    return _equal(a, b, spec.rtol, spec.atol, nan=True)
