"""The kernel's answers are hostile input: the decoder and the verdict hold against forgeries."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from nbformat import NotebookNode

from coursekit.probe import MIME, collect, encode_array
from coursekit.protocol import MAX_STRINGS, MAX_TEXT
from grader.checks import Raised, Unsupported, public_seed, questions, verdict
from grader.verify import _hidden_calls, judge_cell, seed_for
from grader.wire import Unreadable, decode_payload

EXERCISE = "similarity-dot_product"


def _array(dtype="float64", shape=(2,), data=None):
    data = base64.b64encode(np.zeros(shape, dtype=dtype).tobytes()).decode() if data is None else data
    return {"value": {"array": {"dtype": dtype, "shape": list(shape), "data": data}}}


def test_round_trip_keeps_values_dtype_and_structure():
    value = (np.arange(6, dtype=np.float32).reshape(2, 3), np.float64(2.5), [1, 2])
    payload = collect(EXERCISE, lambda: value, [([], {})])
    (got,) = decode_payload(payload, EXERCISE)
    assert isinstance(got, tuple) and got[0].dtype == np.float32 and got[0].shape == (2, 3)
    assert got[1].shape == () and float(got[1]) == 2.5 and got[2].tolist() == [1.0, 2.0]


def test_lists_of_number_rows_are_arrays_and_lists_of_arrays_are_sequences():
    """A table built row by row in plain Python is one array; [output, weights] stays two answers."""
    rows = [[float(i + j) for j in range(3)] for i in range(4)]
    ragged = [[1.0, 2.0], [3.0]]
    pair = [np.zeros((2, 3)), np.ones((2, 2))]
    payload = collect(EXERCISE, lambda x: x, [([rows], {}), ([ragged], {}), ([pair], {})])
    table, uneven, two = decode_payload(payload, EXERCISE)
    assert isinstance(table, np.ndarray) and table.shape == (4, 3) and table[3, 2] == 5.0
    assert isinstance(uneven, tuple) and len(uneven) == 2
    assert isinstance(two, tuple) and two[1].shape == (2, 2)


def test_text_and_lists_of_strings_travel_as_text():
    """Notebook 11's answers: a str, a list of tokens; a tuple of token lists (merges)."""
    class Shouty(str):
        def __eq__(self, other):
            return True

    value = ["▁고기", "를", "<0xEA>"]
    payload = collect(EXERCISE, lambda x: x, [(["나는 고기를\n먹었다"], {}), ([value], {}), ([(value, ("a",))], {}),
                                              ([Shouty("dog")], {}), ([[Shouty("a"), "b"]], {})])
    text, tokens, merges, plain, listed = decode_payload(payload, EXERCISE)
    assert text == "나는 고기를\n먹었다" and tokens == tuple(value) and merges == (tuple(value), ("a",))
    assert type(plain) is str and plain == "dog" and plain != "cat"  # the characters, not the subclass
    assert listed == ("a", "b") and all(type(t) is str for t in listed)


@pytest.mark.parametrize("returned,kind", [
    ("\ud800", "not valid Unicode"),                         # bytes.decode(errors="surrogateescape")
    (["a", "\udcff"], "not valid Unicode"),
    ("x" * (MAX_TEXT + 1), "characters"),
    (["ab"] * (MAX_STRINGS + 1), "strings"),
    (["x" * 1000] * (MAX_TEXT // 1000 + 1), "characters in all"),
])
def test_text_that_cannot_travel_is_unsupported_not_an_error(returned, kind):
    (got,) = decode_payload(collect(EXERCISE, lambda: returned, [([], {})]), EXERCISE)
    assert isinstance(got, Unsupported) and kind in got.kind


def test_text_is_never_taken_for_a_number():
    """A forged (or honest) "12.0" for a numeric exercise is not the array 12.0."""
    seed = public_seed(EXERCISE)
    right = _right_payload(seed)
    forged = {"exercise": EXERCISE, "answers": [{"value": {"text": "12.0"}}] * len(right["answers"])}
    message = verdict(EXERCISE, seed, decode_payload(forged, EXERCISE))
    assert message and "should be a numpy array or torch tensor, but it is a str" in message


def test_errors_and_non_data_are_reported_not_trusted():
    class EqualsAnything:
        def __eq__(self, other):
            return True

    payload = collect(EXERCISE, lambda: EqualsAnything(), [([], {})])
    payload["answers"] += collect(EXERCISE, lambda: 1 / 0, [([], {})])["answers"]
    got = decode_payload(payload, EXERCISE)
    assert got[0] == Unsupported("a EqualsAnything")
    assert isinstance(got[1], Raised) and got[1].message.startswith("ZeroDivisionError")


@pytest.mark.parametrize("answer", [
    _array(dtype="object"),                                   # pickled objects hide in object arrays
    _array(dtype="complex128"),
    _array(shape=(3,), data=base64.b64encode(b"\0" * 8).decode()),  # shape does not match bytes
    {"value": {"array": {"dtype": "float64", "shape": [10**7, 10**7], "data": ""}}},
    {"value": {"array": {"dtype": "float64", "shape": [-1], "data": ""}}},
    {"value": {"array": {"dtype": "float64", "shape": [True], "data": base64.b64encode(b"\0" * 8).decode()}}},
    {"value": {"array": {"dtype": "float64", "shape": [1], "data": "not base64!"}}},
    {"value": {"array": {"dtype": "float64", "shape": [0], "data": "", "passed": True}}},
    {"value": {"pickle": "gASV"}},
    {"value": {"sequence": [{"sequence": [{"sequence": [{"sequence": []}]}]}]}},
    {"verdict": "passed"},
    "passed",
    {"value": {"text": 12}},                                  # text is a JSON string, nothing else
    {"value": {"text": ["a"]}},
    {"value": {"text": "\ud800"}},                            # a lone surrogate: no page can show it
    {"value": {"text": "x" * (MAX_TEXT + 1)}},
    {"value": {"strings": "abc"}},
    {"value": {"strings": ["a", 1]}},
    {"value": {"strings": [["a"]]}},
    {"value": {"strings": ["a", "\udfff"]}},
    {"value": {"strings": ["a"] * (MAX_STRINGS + 1)}},
    {"value": {"strings": ["x" * 1000] * (MAX_TEXT // 1000 + 1)}},
    {"value": {"text": "a", "strings": ["a"]}},
])
def test_malformed_answers_are_unreadable(answer):
    with pytest.raises(Unreadable):
        decode_payload({"exercise": EXERCISE, "answers": [answer]}, EXERCISE)


@pytest.mark.parametrize("payload", [
    {"exercise": "similarity-cosine_similarity", "answers": []},  # an answer to another exercise
    {"exercise": EXERCISE, "answers": [], "verdict": "passed"},
    {"exercise": EXERCISE, "answers": [_array()] * 65},
    ["not", "a", "payload"],
])
def test_malformed_payloads_are_unreadable(payload):
    with pytest.raises(Unreadable):
        decode_payload(payload, EXERCISE)


def _test_cell(*payloads) -> NotebookNode:
    outputs = [NotebookNode(output_type="display_data", data={MIME: p}, metadata={}) for p in payloads]
    return NotebookNode(cell_type="code", source="", outputs=outputs,
                        metadata={"nbgrader": {"grade": True, "solution": False, "grade_id": f"{EXERCISE}-test"}})


def _right_payload(seed: int) -> dict:
    asked = questions(EXERCISE, seed)
    return collect(EXERCISE, lambda a, b: np.sum(a * b, axis=-1), [q.call() for q in asked])


def test_verdict_needs_exactly_one_readable_right_answer():
    seed = public_seed(EXERCISE)
    right = _right_payload(seed)
    assert judge_cell(_test_cell(right), EXERCISE, seed, None) is None
    assert "2 answers where one was expected" in judge_cell(_test_cell(right, right), EXERCISE, seed, None)
    assert "no answer reached the grader" in judge_cell(_test_cell(), EXERCISE, seed, None)
    assert "could not be read" in judge_cell(_test_cell({"exercise": EXERCISE, "verdict": "passed"}),
                                             EXERCISE, seed, None)
    # right answers to other inputs (a leaked or replayed payload) are wrong here
    assert judge_cell(_test_cell(right), EXERCISE, seed + 1, None) is not None


def test_seeds_depend_on_secret_student_and_submission():
    base = seed_for(b"secret", "ada", "01_similarity", EXERCISE, "digest")
    assert base == seed_for(b"secret", "ada", "01_similarity", EXERCISE, "digest")  # regrading
    for changed in [seed_for(b"other", "ada", "01_similarity", EXERCISE, "digest"),
                    seed_for(b"secret", "ben", "01_similarity", EXERCISE, "digest"),
                    seed_for(b"secret", "ada", "01_similarity", EXERCISE, "changed")]:
        assert changed != base
    a = questions(EXERCISE, base)[1].args[0]
    assert not np.array_equal(a, questions(EXERCISE, base + 1)[1].args[0])


def test_questions_carry_arrays_numbers_and_keywords():
    from coursekit.probe import decode_questions, encode_questions

    mask = np.array([[True, False]])
    (args, kwargs), = decode_questions(encode_questions([([np.arange(3.0), 4], {"mask": mask, "axis": -1,
                                                                                "scale": None})]))
    assert args[0].tolist() == [0.0, 1.0, 2.0] and args[1] == 4
    assert kwargs["mask"].dtype == bool and kwargs["axis"] == -1 and kwargs["scale"] is None
    got = collect(EXERCISE, lambda x, n, mask, axis, scale: x.sum() * n + mask.sum() + axis,
                  [(args, kwargs)])
    assert decode_payload(got, EXERCISE)[0] == 12.0


def test_questions_carry_text_and_lists_of_strings():
    from coursekit.probe import decode_questions, encode_questions

    (args, kwargs), = decode_questions(encode_questions([(["고기를 먹었다", ("▁고", "기")], {"tokens": ["a", "b"],
                                                                                       "empty": ()})]))
    assert args == ["고기를 먹었다", ["▁고", "기"]] and kwargs == {"tokens": ["a", "b"], "empty": []}
    with pytest.raises(TypeError, match="cannot carry a list"):
        encode_questions([([["a", 1]], {})])


def test_only_the_exact_hidden_call_is_rewritten():
    source = 'from grader.checks import check\ncheck("x-y", f)\nassert f(1) == 2\ncheck("x-z",\n g)\n'
    assert _hidden_calls(source) == [(2, "x-y", "f")]
    assert encode_array(np.float64(1.0))["array"]["shape"] == []
