"""docs/adding-an-exercise.md stays true: its worked exercise is run end to end.

The page's code blocks (solution cell, test cell, reference, spec, figure cell,
variants) are taken from the page itself, the spec is registered for the length of a
test, and the exercise is judged by the same path as grading: the solution passes, the
visible test passes on it, every catalogued diagnosis (each mistake, knob setting, pair
of settings, rule and hint) is given to its example, and the variants pass.
"""
from __future__ import annotations

import re
import types

import matplotlib
import numpy as np
import pytest
import torch

from grader import course
from grader.checks import CheckFailed, check
from grader.checks import _core
from grader.checks import Call, Hint, Knob, Mistake, Probe, Raises, Spec, answers_of, verdict
from grader.checks.reference import similarity as reference

PAGE = course.ROOT / "docs" / "adding-an-exercise.md"
EXERCISE = "similarity-distance_scores"


def blocks() -> dict[str, str]:
    """The page's python blocks, by the comment on their first line."""
    found = {}
    for body in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S):
        first, _, rest = body.partition("\n")
        found[first.lstrip("# ").strip()] = rest
    return found


@pytest.fixture(scope="module")
def page():
    code = blocks()
    assert {"solution cell", "test cell", "reference", "spec", "figure cell", "variants"} <= set(code)
    learner = {"np": np}
    exec(code["solution cell"], learner)
    ref = types.SimpleNamespace(**{n: getattr(reference, n) for n in dir(reference) if not n.startswith("_")})
    exec(code["reference"], ref_ns := {"np": np, **vars(ref)})
    ref.distance_scores = ref_ns["distance_scores"]
    spec_ns = {"np": np, "ref": ref, "Call": Call, "Spec": Spec, "Knob": Knob, "Mistake": Mistake,
               "Raises": Raises, "Hint": Hint, "Probe": Probe}
    exec(code["spec"], spec_ns)
    spec = spec_ns["DISTANCE_SCORES"]
    assert spec.id == EXERCISE
    _core.get("similarity-dot_product")  # the topic's own specs first
    _core._REGISTRY[EXERCISE] = spec
    yield {"code": code, "learner": learner, "spec": spec}
    del _core._REGISTRY[EXERCISE]
    _core._drawn.cache_clear()


def test_the_solution_passes_its_visible_test_and_the_hidden_check(page):
    cell = {"np": np, **page["learner"]}
    exec(page["code"]["test cell"], cell)
    check(EXERCISE, page["learner"]["distance_scores"])


def test_the_reference_equals_the_solution_cell(page):
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5, 3))
    np.testing.assert_allclose(page["spec"].reference(q, k), page["learner"]["distance_scores"](q, k), rtol=1e-12)


def test_every_diagnosis_on_the_page_is_given_to_its_example(page):
    spec = page["spec"]
    cases = [(m.implementation, m.diagnosis) for m in spec.catalogue()]
    cases += [(r.example, r.diagnosis.split("{error}")[-1].strip(": ")) for r in spec.errors]
    cases += [(h.example, h.message) for h in spec.hints]
    cases += [(fn, both[0]) for _, fn, both in spec.pairs()] + [(fn, both[1]) for _, fn, both in spec.pairs()]
    assert len(spec.catalogue()) == 4 and len(spec.pairs()) == 1
    for implementation, diagnosis in cases:
        with pytest.raises(CheckFailed) as failure:
            check(EXERCISE, implementation)
        assert diagnosis in str(failure.value), str(failure.value)
        for seed in range(3):
            message = verdict(EXERCISE, seed, answers_of(EXERCISE, implementation, seed))
            assert message and diagnosis in message, message


def test_the_page_s_probe_names_the_sign_beside_a_mistake_no_catalogue_lists(page):
    """The example the page gives: -|q|^2 dropped and the sign flipped at once. No mistake or
    pair explains it; the probe (queries at the origin) still names the sign."""
    def distance_scores(q, k):
        return -2 * np.einsum("...qd,...kd->...qk", q, k) + (k ** 2).sum(-1)[..., None, :]
    for seed in range(3):
        message = verdict(EXERCISE, seed, answers_of(EXERCISE, distance_scores, seed))
        assert "it returns the distances, not their negatives" in message, message
        assert "Something else differs as well" in message, message


def test_the_variants_pass(page):
    namespace = {"np": np, "torch": torch}
    exec(page["code"]["variants"], namespace)
    for fn in namespace["VARIANTS"][EXERCISE]:
        check(EXERCISE, fn)


def test_the_figure_cell_draws_from_the_learner_s_function(page):
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from coursekit.data import animal_sentence_embeddings

    namespace = {"np": np, "plt": plt, "animal_sentence_embeddings": animal_sentence_embeddings,
                 **page["learner"]}
    exec(page["code"]["figure cell"], namespace)
    image = namespace["ax"].get_images()[0].get_array()
    tokens, E = animal_sentence_embeddings()
    assert image.shape == (len(tokens), len(tokens)) and np.allclose(np.diag(image), 0)
    plt.close("all")
