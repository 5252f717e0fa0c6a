"""The tests every check module shares, built from its MISTAKES and VARIANTS.

Each ``tests/test_checks_<topic>.py`` lists, per exercise id, wrong implementations
with the diagnosis each must get (MISTAKES) and valid alternatives that must pass
(VARIANTS), and binds the tests here with::

    globals().update(shared_tests("masking", MISTAKES, VARIANTS, solutions="masking"))

where ``solutions`` names the module's fixture holding the reference functions.
"""
from __future__ import annotations

import pytest

from grader.checks import CheckFailed, check, exercise_ids


def _ids(x: object) -> str:
    return x if isinstance(x, str) else ""


def shared_tests(topic: str, mistakes: dict, variants: dict, solutions: str) -> dict:
    """The four shared test functions, by name, for one topic."""

    def test_every_exercise_has_cases():
        assert set(mistakes) == set(variants) == set(exercise_ids(topic))
        for exercise in mistakes:
            assert len(mistakes[exercise]) >= 3 and len(variants[exercise]) >= 2

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

    return {f.__name__: f for f in (test_every_exercise_has_cases, test_mistake_is_rejected_with_its_diagnosis,
                                    test_valid_variant_passes, test_reference_solutions_pass)}
