"""The kernel's half of a hidden check: call the learner's function, hand back plain data.

While a notebook is graded, each hidden test cell calls ``answer(exercise_id, fn,
questions)`` with inputs the grader chose for this student. The answers leave the
kernel as one ``display_data`` output of mime type ``MIME``: JSON holding arrays as
dtype, shape and base64 bytes, never pickles, never a verdict. A trusted process
outside the kernel decodes them and compares them with the reference
(``grader/verify.py``), so nothing in this module, or anything a notebook does to
it, can make a wrong answer pass. It holds no reference code and no secrets.

The same encoding is used in process by ``grader.checks.check`` when an instructor
runs the solution notebook.
"""
from __future__ import annotations

import base64
import json
import sys
from typing import Any

import numpy as np

MIME = "application/vnd.attention-course.answer+json"

# dtypes an answer may have on the wire; everything else is reported as unsupported
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64")
MAX_DEPTH = 3  # a tuple of arrays, or a tuple of tuples, is the deepest answer we take
MAX_ITEMS = 16
MAX_MESSAGE = 300


def encode_array(value: np.ndarray) -> dict:
    """An array as JSON-ready data: ``{"array": {"dtype", "shape", "data"}}``, little-endian."""
    array = np.asarray(value)  # (not ascontiguousarray: it turns 0-d into 1-d)
    array = array.astype(array.dtype.newbyteorder("<"), order="C", copy=True)
    return {"array": {"dtype": array.dtype.name, "shape": list(array.shape),
                      "data": base64.b64encode(array.tobytes()).decode("ascii")}}


def decode_array(wire: dict) -> np.ndarray:
    """The inverse of ``encode_array`` (without the outer key); used by tests and helpers."""
    raw = base64.b64decode(wire["data"], validate=True)
    return np.frombuffer(raw, dtype=np.dtype(wire["dtype"]).newbyteorder("<")).reshape(wire["shape"])


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def encode_value(value: Any, depth: int = 0) -> dict:
    """A returned value as plain data: an array, a sequence of values, or ``unsupported``.

    Torch tensors and numpy arrays become arrays; Python numbers and nested lists of
    numbers become arrays; a tuple or list of arrays or tensors becomes a sequence.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().to("cpu").resolve_conj().resolve_neg().numpy()
    if isinstance(value, (np.ndarray, np.generic, bool, int, float)):
        array = np.asarray(value)
        if array.dtype.name not in DTYPES:
            return {"unsupported": f"an array of dtype {array.dtype}"}
        return encode_array(array)
    if isinstance(value, (tuple, list)) and depth < MAX_DEPTH:
        items = list(value)
        nested = [i for i in items if isinstance(i, (tuple, list, np.ndarray))
                  or torch is not None and isinstance(i, torch.Tensor)]
        if isinstance(value, list) and not nested:
            try:  # a plain list of numbers is an array
                return encode_value(np.asarray(items, dtype=np.float64), depth)
            except (TypeError, ValueError):
                pass
        if len(items) > MAX_ITEMS:
            return {"unsupported": f"a {type(value).__name__} of {len(items)} items"}
        return {"sequence": [encode_value(item, depth + 1) for item in items]}
    return {"unsupported": f"a {type(value).__name__}"}


Question = "tuple[list[Any], dict[str, Any]]"  # positional and keyword arguments


def call(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Call ``fn`` on fresh copies of the arguments; retry with torch tensors on a type error.

    Arrays are passed as numpy arrays first. A function written for torch tensors
    usually raises on numpy input (TypeError, AttributeError, or ValueError from
    ``x.transpose(-2, -1)``), so when any exception escapes it is called again with
    every array turned into a tensor: either library is a valid answer. Numbers,
    booleans and None are passed as they are. If both calls raise, the numpy call's
    exception propagates.
    """
    if not callable(fn):
        raise TypeError(f"it should be a function, but it is a {type(fn).__name__}")

    def fresh(convert):
        return ([convert(a) if isinstance(a, np.ndarray) else a for a in args],
                {k: convert(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()})

    a, k = fresh(lambda x: np.array(x, copy=True))
    try:
        return fn(*a, **k)
    except Exception as numpy_error:  # the learner's code may raise anything
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a course dependency
            raise numpy_error from None
        a, k = fresh(torch.tensor)
        try:
            return fn(*a, **k)
        except Exception:
            raise numpy_error from None


def collect(exercise_id: str, fn: Any, questions: list) -> dict:
    """Call ``fn`` on each question's ``(args, kwargs)``; the payload handed to the grader."""
    answers = []
    for args, kwargs in questions:
        try:
            answers.append({"value": encode_value(call(fn, args, kwargs))})
        except Exception as error:  # the learner's code may raise anything
            answers.append({"raised": _short(error)})
    return {"exercise": exercise_id, "answers": answers}


def _encode_input(value: Any) -> dict:
    if isinstance(value, np.ndarray):
        return encode_array(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"scalar": value}
    raise TypeError(f"a question cannot carry a {type(value).__name__}")


def _decode_input(wire: dict) -> Any:
    return decode_array(wire["array"]) if "array" in wire else wire["scalar"]


def encode_questions(questions: list) -> str:
    """The grader's questions as JSON text: ``[{"args": [...], "kwargs": {...}}, ...]``."""
    return json.dumps([{"args": [_encode_input(a) for a in args],
                        "kwargs": {k: _encode_input(v) for k, v in kwargs.items()}}
                       for args, kwargs in questions], separators=(",", ":"))


def decode_questions(text: str) -> list:
    """The grader's questions, as written into the hidden test cell."""
    return [([_decode_input(a) for a in q["args"]], {k: _decode_input(v) for k, v in q["kwargs"].items()})
            for q in json.loads(text)]


def answer(exercise_id: str, fn: Any, questions: str) -> None:
    """Hidden test cell entry point: answer the grader's questions with ``fn``."""
    from IPython.display import display

    display({MIME: collect(exercise_id, fn, decode_questions(questions))}, raw=True)
