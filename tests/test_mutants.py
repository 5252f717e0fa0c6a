"""Mutation testing of the hidden checks (grader/checks/_mutants.py), held at 100%.

Every mutant of every exercise's reference (one change a learner could make: a boundary, an
operator, an axis, an off-by-one, a constant, a dropped statement or term, swapped
arguments, another reduction) is judged as a learner's submission, through collect, the wire
and the verdict, on the public seed and on student seeds. Each must be rejected on every
seed, unless its spec declares it equivalent (``Spec.equivalent``, with the reason); a
declared one must be accepted on every seed and still exist. ``make mutants`` runs the same
on 20 student seeds and prints the scores; the quick edit loop judges a quarter of the
mutants (tests/scope.py's ``sampled``), `make test` every one.
"""
from __future__ import annotations

import ast

import numpy as np
import pytest

from grader.checks import exercise_ids, get, public_seed
from grader.checks._mutants import OPERATORS, _source_tree, judged, mutants, score
from tests.scope import sampled, student_seeds

SEEDS = student_seeds(6)


@pytest.mark.parametrize("exercise", exercise_ids())
def test_every_mutant_of_the_reference_is_rejected_on_every_seed(exercise):
    result = score(exercise, [public_seed(exercise), *SEEDS], only=sampled)   # a quarter of them in a quick run
    assert not result.survivors, "mutants the hidden checks accept (a gap in the inputs, or declare them " \
        f"equivalent with the reason): {sorted(result.survivors)}"
    assert not result.rejected_equivalent, f"declared equivalent, but rejected: {result.rejected_equivalent}"
    assert not result.unknown, f"declared equivalent, but no such mutant: {result.unknown}"


def test_every_operator_makes_mutants_somewhere():
    """No operator is dead code: each changes some reference."""
    made = {name: 0 for name, _ in OPERATORS}
    for exercise in exercise_ids():
        for node in ast.walk(_source_tree(get(exercise).reference)[0]):
            for name, operator in OPERATORS:
                made[name] += len(operator(node))
    assert all(made.values()), made


def test_a_mutant_is_the_reference_with_one_change_and_the_reference_itself_passes():
    """The engine judges what grading judges: the reference, built the way mutants are, passes;
    a known wrong change (the causal mask's triangle) is rejected with a diagnosis."""
    spec = get("masking-causal_mask")
    found = {m.name: m for m in mutants(spec)}
    triangle = next(m for name, m in found.items() if "np.tril -> np.triu" in name)
    said = judged(spec, triangle.implementation.get(), public_seed(spec.id))
    assert said and "causal_mask" in said
    assert judged(spec, spec.reference, public_seed(spec.id)) is None


def test_a_mutant_that_never_returns_is_rejected_within_the_cpu_budget(monkeypatch):
    """A loop made endless is stopped by a CPU-time budget (grading's time limit), not waited for."""
    import grader.checks._mutants as engine

    monkeypatch.setattr(engine, "CPU_BUDGET", 0.2)
    spec = get("similarity-dot_product")

    def endless(a, b):
        total = 0.0
        while True:
            total += float(np.sum(a))

    said = judged(spec, endless, public_seed(spec.id))
    assert said and "CPU seconds" in said


def test_a_mutant_that_fills_the_memory_is_rejected_within_the_memory_budget(monkeypatch):
    """A loop that appends for ever gets a MemoryError at the budget, not the machine's memory."""
    import grader.checks._mutants as engine

    monkeypatch.setattr(engine, "MEMORY_BUDGET", 256 << 20)
    spec = get("similarity-dot_product")

    def hoarding(a, b):
        kept = []
        while True:
            kept.append(np.ones(1 << 20))

    said = judged(spec, hoarding, public_seed(spec.id))
    assert said and "MemoryError" in said


def test_annotations_are_not_mutated():
    """A local variable's annotation is never evaluated: mutating it makes no learner's program."""
    from grader.checks import Spec, Call

    def annotated(a, b):
        total: list[int] = a * b
        return total.sum(-1)

    spec = Spec("similarity-annotated", "annotated", lambda rng: [Call((np.ones(2), np.ones(2)))], annotated)
    changed = [m.name.split(" ", 1)[1].split(" -> ")[0] for m in mutants(spec)]
    assert changed and not any(before.startswith(("list", "int")) for before in changed), changed
