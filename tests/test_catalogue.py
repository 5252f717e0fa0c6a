"""Tests generated from the exercise specs: no catalogued diagnosis goes unasserted.

For every exercise written as a spec (``grader.checks._core.Spec``), each catalogued
mistake, each raised-error rule, each hint and each diagnosis a hook gives
(``diagnosed``) has a learner-style implementation; run as a learner's answer, it must
get its own diagnosis, on the public seed (an instructor's run) and on the seeds of
many students (grading), through the same collect/decode/verdict path as grading.
"""
from __future__ import annotations

import numpy as np
import pytest

from grader.checks import CheckFailed, check
from grader.checks import Spec, answers_of, exercise_ids, get, verdict
from grader.checks._core import _equal

STUDENT_SEEDS = range(6)


def _specs() -> list[Spec]:
    return [s for s in map(get, exercise_ids()) if isinstance(s, Spec)]


def _cases() -> list[tuple[str, str, object, str]]:
    """(exercise id, name, implementation, diagnosis) of everything a spec diagnoses."""
    cases = []
    for spec in _specs():
        for m in spec.catalogue() + spec.diagnosed:
            cases.append((spec.id, m.name, m.implementation, m.diagnosis))
        for i, rule in enumerate(spec.errors):
            cases.append((spec.id, f"raises-{i}", rule.example, rule.diagnosis.split("{error}")[-1].strip(". ")))
        for i, hint in enumerate(spec.hints):
            cases.append((spec.id, f"hint-{i}", hint.example, hint.message))
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
    assert diagnosis in str(failure.value), str(failure.value)
    for seed in STUDENT_SEEDS:
        with np.errstate(all="ignore"):
            message = verdict(exercise, seed, answers_of(exercise, implementation, seed))
        assert message and diagnosis in message, (seed, message)


@pytest.mark.parametrize("exercise", [s.id for s in _specs()])
def test_reference_passes_for_every_student_seed(exercise):
    """The reference is judged by the same path (driver, wire) as a learner's answer."""
    spec = get(exercise)
    for seed in STUDENT_SEEDS:
        assert verdict(exercise, seed, answers_of(exercise, spec.reference, seed)) is None


@pytest.mark.parametrize("exercise,name,implementation,both", PAIRS, ids=[f"{e}-{n}" for e, n, _, _ in PAIRS])
def test_two_mistakes_at_once_are_both_named(exercise, name, implementation, both):
    """Differential diagnosis: two knobs set wrong together, a combination no catalogue lists."""
    spec = get(exercise)
    for seed in STUDENT_SEEDS:
        with np.errstate(all="ignore"):
            answers = answers_of(exercise, implementation, seed)
            message = verdict(exercise, seed, answers)
        assert message, seed
        if "two mistakes at once" in message:
            assert all(d in message for d in both), (seed, message)
            continue
        # Some pairs are one function: e.g. per-sentence means, when padding is kept, are the
        # plain mean. Then the single mistake's diagnosis is right, if it gives every answer.
        same = [m for m in spec.catalogue() if m.diagnosis in message and
                all(_equal(a, b, spec.rtol, spec.atol) for a, b in zip(answers_of(exercise, m.implementation, seed), answers))]
        assert same, (seed, message)


@pytest.mark.parametrize("exercise", [s.id for s in _specs() if s.knobs])
def test_a_variant_with_no_wrong_setting_is_right(exercise):
    spec = get(exercise)
    assert verdict(exercise, 0, answers_of(exercise, spec.variant(), 0)) is None
