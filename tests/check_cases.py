"""The tests every check module shares, built from its MISTAKES and VARIANTS.

Each ``tests/test_checks_<topic>.py`` lists, per exercise id, wrong implementations
with the diagnosis each must get (MISTAKES) and valid alternatives that must pass
(VARIANTS), and binds the tests here with::

    globals().update(shared_tests("masking", MISTAKES, VARIANTS, solutions="masking"))

where ``solutions`` names the module's fixture holding the reference functions, and
``seeds=N`` adds a test that every verdict holds for N student seeds (the inputs each
student gets while graded), not only for the public one.
"""
from __future__ import annotations

import pytest

from coursekit.probe import collect
from grader.checks import CheckFailed, check, exercise_ids
from grader.checks import get, questions, verdict
from grader.wire import decode_payload
from tests.scope import student_seeds


def _ids(x: object) -> str:
    return x if isinstance(x, str) else ""


def _verdict_for_seed(exercise: str, fn: object, seed: int) -> str | None:
    """What grading says of ``fn`` when the student's seed is ``seed`` (in process, no kernel)."""
    asked = questions(exercise, seed)
    payload = collect(exercise, fn, [q.call() for q in asked], get(exercise).driver)
    return verdict(exercise, seed, decode_payload(payload, exercise))


def shared_tests(topic: str, mistakes: dict, variants: dict, solutions: str, seeds: int = 0) -> dict:
    """The shared test functions, by name, for one topic."""

    def test_every_exercise_has_cases():
        """At least three mistakes (here, or in the spec's catalogue, whose tests
        tests/test_catalogue.py generates) and two valid variants per exercise."""
        assert set(mistakes) == set(variants) == set(exercise_ids(topic))
        for exercise in mistakes:
            catalogued = get(exercise).catalogue()
            assert len(mistakes[exercise]) + len(catalogued) >= 3 and len(variants[exercise]) >= 2

    @pytest.mark.parametrize("exercise,fn,diagnosis",
                             [(e, fn, d) for e, cases in mistakes.items() for fn, d in cases], ids=_ids)
    def test_mistake_is_rejected_with_its_diagnosis(exercise, fn, diagnosis):
        with pytest.raises(CheckFailed) as failure:
            check(exercise, fn)
        assert diagnosis in str(failure.value), str(failure.value)

    @pytest.mark.parametrize("exercise,fn", [(e, fn) for e, cases in variants.items() for fn in cases],
                             ids=_ids)
    def test_valid_variant_passes(exercise, fn):
        check(exercise, fn)

    def test_reference_solutions_pass(request):
        namespace = request.getfixturevalue(solutions)
        for exercise in exercise_ids(topic):
            check(exercise, namespace[exercise.split("-", 1)[1]])

    @pytest.mark.parametrize("seed", student_seeds(seeds))
    def test_variants_pass_and_mistakes_fail_for_many_student_seeds(seed):
        """While grading, each student gets other inputs: the verdicts must not depend on them."""
        for exercise, cases in variants.items():
            for fn in cases:
                message = _verdict_for_seed(exercise, fn, seed)
                assert message is None, (exercise, fn, message)
        for exercise, cases in mistakes.items():
            for fn, diagnosis in cases:
                message = _verdict_for_seed(exercise, fn, seed)
                assert message and diagnosis in message, (exercise, diagnosis, message)

    tests = [test_every_exercise_has_cases, test_mistake_is_rejected_with_its_diagnosis,
             test_valid_variant_passes, test_reference_solutions_pass]
    if seeds:
        tests.append(test_variants_pass_and_mistakes_fail_for_many_student_seeds)
    return {f.__name__: f for f in tests}
