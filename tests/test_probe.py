"""The kernel-side drivers: a class or a weight loader answered as a function of plain data.

An exercise registered with ``driver=`` is called through ``coursekit.probe.DRIVERS``, in
process (``check``) and while grading (``AskQuestions`` writes the driver's name into the
rewritten hidden line). Drivers build, load and call; they judge nothing.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from nbformat import NotebookNode

from coursekit import probe
from grader.checks import Raised, Spec, Unsupported, get, public_seed, questions, verdict
from grader.verify import AskQuestions
from grader.wire import decode_payload

MODULE = "multi_head-MultiHeadAttention"
LOADER = "multi_head-load_torch_weights"


class Plain(nn.Module):
    """A minimal multi-head attention (no mask support needed for the no-mask question)."""

    def __init__(self, d_model, heads):
        super().__init__()
        if d_model % heads:
            raise ValueError("heads must divide d_model")
        self.d_model, self.heads, self.d_k = d_model, heads, d_model // heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask=None):
        b, q_len, d = query.shape
        split = [layer(t).view(b, -1, self.heads, self.d_k).transpose(1, 2)
                 for layer, t in [(self.W_q, query), (self.W_k, key), (self.W_v, value)]]
        scores = split[0] @ split[1].transpose(-2, -1) / (d // self.heads) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~(mask.unsqueeze(1) if mask.dim() == 3 else mask), float("-inf"))
        w = scores.softmax(-1)
        return self.W_o((w @ split[2]).transpose(1, 2).reshape(b, q_len, d)), w


def _answers(exercise, fn, seed=None):
    seed = public_seed(exercise) if seed is None else seed
    asked = questions(exercise, seed)
    return decode_payload(probe.collect(exercise, fn, [q.call() for q in asked], get(exercise).driver), exercise)


def _called(exercise, fn):
    """The answers to every question whose answer is what the module returns, graded or
    diagnostic: all but the last graded one, which only builds it, and the hooked ones
    (``probe.HOOKED``: what its submodules saw, grader/checks/_localise.py)."""
    answers, last = _answers(exercise, fn), len(get(exercise).inputs(np.random.default_rng(0))) - 1
    hooked = [probe.HOOKED in q.kwargs for q in questions(exercise, public_seed(exercise))]
    return [a for i, (a, h) in enumerate(zip(answers, hooked)) if i != last and not h]


def test_exercises_name_their_driver_and_plain_functions_have_none():
    assert get(MODULE).driver == "attention_module" and get(LOADER).driver == "weight_loader"
    assert get("multi_head-split_heads").driver == get("multi_head-merge_heads").driver == "tensors"
    assert get("similarity-dot_product").driver is None
    with pytest.raises(ValueError, match="unknown driver"):
        Spec(id="multi_head-nothing", function="nothing", inputs=lambda rng: [], reference=None,
             driver="no_such_driver")


def test_module_driver_loads_the_given_weights_by_name():
    """Whatever the module's own initialization, the answer depends only on the given weights."""
    first = _answers(MODULE, Plain)
    torch.manual_seed(123)  # another random initialization: the same answers
    second = _answers(MODULE, Plain)
    assert verdict(MODULE, public_seed(MODULE), first) is None
    last = len(get(MODULE).inputs(np.random.default_rng(0))) - 1  # the last graded call; the probes' follow
    assert isinstance(first[last], Raised) and first[last].message.startswith("ValueError")  # (10, 4)
    for a, b in zip(first[:last], second[:last]):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert first[0][0].dtype == np.float32  # called on float32 tensors, like torch's own module


@pytest.mark.parametrize("learner,message", [
    (lambda d, h: None, "it should be a class"),
    (type("NoModule", (), {"__init__": lambda self, d, h: None}), "is not a torch.nn.Module"),
    (type("NoWo", (nn.Module,), {"__init__": lambda self, d, h: (nn.Module.__init__(self), setattr(
        self, "W_q", nn.Linear(d, d)), setattr(self, "W_k", nn.Linear(d, d)), setattr(
        self, "W_v", nn.Linear(d, d))) and None}), "has no attribute W_o"),
    (type("Narrow", (nn.Module,), {"__init__": lambda self, d, h: (nn.Module.__init__(self), [
        setattr(self, n, nn.Linear(d, d // h)) for n in ("W_q", "W_k", "W_v", "W_o")]) and None}),
     "should be nn.Linear(d_model, d_model)"),
])
def test_module_driver_reports_what_to_fix(learner, message):
    answers = _called(MODULE, learner)
    assert all(isinstance(a, Raised) and message in a.message for a in answers), answers


def test_module_driver_hands_back_data_not_objects():
    class Liar(Plain):
        def forward(self, *args):
            class Equal:
                def __eq__(self, other):
                    return True
            return Equal()

    assert all(isinstance(a, Unsupported) for a in _called(MODULE, Liar))
    assert "Unsupported" not in str(verdict(MODULE, public_seed(MODULE), _answers(MODULE, Liar)))


def test_loader_driver_starts_from_zeros_and_reads_back_eight_tensors():
    answers = _answers(LOADER, lambda module, torch_mha: None)
    assert all(isinstance(a, tuple) and len(a) == 9 for a in answers)
    assert all(not np.any(part) for a in answers for part in a[:8])
    assert not any(bool(a[8]) for a in answers)  # None is not the module it was given
    sizes = [a[0].shape[0] for a in answers]
    assert sizes == sorted(set(sizes), reverse=True)  # pairwise-distinct d_model per question


def test_loader_driver_reports_whether_the_module_came_back():
    fresh = _answers(LOADER, lambda module, torch_mha: type(module)())
    given = _answers(LOADER, lambda module, torch_mha: module)
    assert not any(bool(a[8]) for a in fresh) and all(bool(a[8]) for a in given)


def test_loader_driver_module_has_the_sizes_the_docstring_names():
    """The stand-in module carries d_model, heads and d_k, as a MultiHeadAttention does."""
    seen = []
    _answers(LOADER, lambda module, torch_mha: seen.append((module.d_model, module.heads, module.d_k,
                                                            torch_mha.embed_dim, torch_mha.num_heads)))
    assert seen and all(d == e and h == n and k == d // h for d, h, k, e, n in seen)


def test_module_driver_only_builds_for_a_two_argument_question():
    run = probe.DRIVERS["attention_module"](Plain)
    assert run(12, 3) == 0
    with pytest.raises(ValueError, match="heads must divide"):
        run(10, 4)


@pytest.mark.parametrize("learner,message", [
    (type("NoSizes", (Plain,), {"__init__": lambda self, d, h: (Plain.__init__(self, d, h), delattr(self, "d_k"))
                                and None}), "has no attribute d_k: set self.d_model, self.heads and self.d_k"),
    (type("FloatDk", (Plain,), {"__init__": lambda self, d, h: (Plain.__init__(self, d, h), setattr(
        self, "d_k", d / h)) and None}), ".d_k should be the int 4, but it is 4.0"),
])
def test_module_driver_checks_the_size_attributes(learner, message):
    answers = _called(MODULE, learner)
    assert all(isinstance(a, Raised) and message in a.message for a in answers), answers


def test_tensors_driver_calls_with_tensors_of_the_arrays_dtype():
    seen = []

    def fn(x, heads, *, scale=None):
        seen.append((type(x), x.dtype, heads, scale))
        return x * 2

    run = probe.DRIVERS["tensors"](fn)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = run(x, 3, scale=None)
    assert seen == [(torch.Tensor, torch.float32, 3, None)]
    assert isinstance(out, torch.Tensor) and torch.equal(out, torch.tensor(x) * 2)
    x64 = np.zeros((1, 2))
    assert run(x64, 1).dtype == torch.float64
    assert not np.shares_memory(x, run(x, 1).numpy())  # the learner gets a copy


@pytest.mark.parametrize("returned", [lambda x: x.numpy(), lambda x: [x.numpy()], lambda x: np.float64(1.0)])
def test_tensors_driver_reports_a_numpy_answer(returned):
    with pytest.raises(TypeError, match="returns a numpy array for a torch tensor input"):
        probe.DRIVERS["tensors"](lambda x: returned(x))(np.ones((2, 2)))


def test_tensors_driver_does_not_retry_with_numpy():
    """A function of numpy arrays only fails, through collect, with its own error: no numpy call."""
    payload = probe.collect("multi_head-split_heads", lambda x, heads: np.split(x, heads, axis=-1)[0].base,
                            [([np.ones((1, 2, 4)), 2], {})], driver="tensors")
    (answer,) = decode_payload(payload, "multi_head-split_heads")
    assert not isinstance(answer, Unsupported)


def test_unknown_driver_is_an_answer_not_a_crash():
    payload = probe.collect(MODULE, Plain, [([1], {})], driver="from_a_newer_grader")
    (answer,) = decode_payload(payload, MODULE)
    assert isinstance(answer, Raised) and "unknown driver" in answer.message


def test_ask_questions_passes_the_driver_to_the_kernel(tmp_path, monkeypatch):
    """The rewritten hidden line names the driver; run as the kernel runs it, it answers."""
    source = ('### BEGIN HIDDEN TESTS\nfrom grader.checks import check; check("multi_head-MultiHeadAttention", '
              'Plain)\n### END HIDDEN TESTS\nprint("visible")')
    cell = NotebookNode(cell_type="code", source=source, outputs=[], metadata={"nbgrader": {
        "grade": True, "solution": False, "grade_id": f"{MODULE}-test", "points": 4}})
    nb = NotebookNode(cells=[cell], metadata={})
    preprocessor = AskQuestions(secret_file=str(tmp_path / "secret"))
    resources = {"nbgrader": {"student": "ada", "assignment": "06_multi_head"}}
    preprocessor.preprocess(nb, resources)
    rewritten = nb.cells[0].source
    assert "driver='attention_module'" in rewritten and "grader" not in rewritten

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, raw=False: shown.append(data))
    exec(rewritten, {"Plain": Plain})
    (payload,) = [d[probe.MIME] for d in shown]
    seed = resources["attention_course"]["seeds"][MODULE]
    assert verdict(MODULE, seed, decode_payload(payload, MODULE)) is None


def test_drivers_are_found_by_name_or_by_notebook_module():
    assert probe.get_driver("tensors") is probe.DRIVERS["tensors"]
    for name in ("no_such_driver", "encoder.no_such_function", "no_such_topic.run", "../x.y"):
        with pytest.raises(LookupError, match="unknown driver"):
            probe.get_driver(name)
