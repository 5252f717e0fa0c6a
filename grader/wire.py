"""Reading the kernel's answers, trusting nothing about them.

The payload comes from a process that runs student code, so it is treated as
hostile input: JSON only (never pickle), a closed set of dtypes, shapes that must
match the bytes, caps on sizes and nesting, text that is valid Unicode within its caps.
Anything else makes the exercise's answers unreadable, which earns nothing; it never
raises into the grader.
"""
from __future__ import annotations

import base64
import binascii
import math

import numpy as np

from coursekit.protocol import (DTYPES, MAX_ANSWERS, MAX_DEPTH, MAX_ELEMENTS, MAX_ITEMS, MAX_MESSAGE, MAX_STRINGS,
                                MAX_TEXT, Raised, Unsupported, is_unicode)


class Unreadable(ValueError):
    """The payload does not follow the answer format."""


def _array(wire: object) -> np.ndarray:
    if not isinstance(wire, dict) or set(wire) != {"dtype", "shape", "data"}:
        raise Unreadable("an array must have exactly dtype, shape and data")
    dtype, shape, data = wire["dtype"], wire["shape"], wire["data"]
    if dtype not in DTYPES:
        raise Unreadable(f"dtype {str(dtype)[:20]!r} is not allowed")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(type(n) is int and 0 <= n <= MAX_ELEMENTS for n in shape)):
        raise Unreadable("shape must be a list of at most 8 non-negative integers")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise Unreadable(f"an array of {count} elements is over the limit")
    if not isinstance(data, str):
        raise Unreadable("data must be base64 text")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise Unreadable("data is not valid base64") from None
    kind = np.dtype(dtype).newbyteorder("<")
    if len(raw) != count * kind.itemsize:
        raise Unreadable("data length does not match dtype and shape")
    # a fresh, writable, native-endian copy: nothing of the wire buffer is kept
    return np.frombuffer(raw, dtype=kind).reshape(shape).astype(np.dtype(dtype), copy=True)


def _text(body: object) -> str:
    if type(body) is not str or len(body) > MAX_TEXT or not is_unicode(body):
        raise Unreadable(f"text must be a string of at most {MAX_TEXT} characters, valid Unicode")
    return body


def _strings(body: object) -> tuple[str, ...]:
    if not isinstance(body, list) or len(body) > MAX_STRINGS:
        raise Unreadable(f"strings must be a list of at most {MAX_STRINGS} items")
    texts = tuple(map(_text, body))
    if sum(map(len, texts)) > MAX_TEXT:
        raise Unreadable(f"strings hold more than {MAX_TEXT} characters in all")
    return texts


def _value(wire: object, depth: int = 0) -> object:
    if not isinstance(wire, dict) or len(wire) != 1:
        raise Unreadable("a value must be one of array, sequence, text, strings or unsupported")
    (kind, body), = wire.items()
    if kind == "array":
        return _array(body)
    if kind == "text":
        return _text(body)
    if kind == "strings":
        return _strings(body)
    if kind == "sequence":
        if depth >= MAX_DEPTH or not isinstance(body, list) or len(body) > MAX_ITEMS:
            raise Unreadable("sequence too deep or too long")
        return tuple(_value(item, depth + 1) for item in body)
    if kind == "unsupported":
        return Unsupported(str(body)[:MAX_MESSAGE])
    raise Unreadable(f"unknown value kind {str(kind)[:20]!r}")


def decode_payload(payload: object, exercise_id: str) -> list[object]:
    """The answers in one payload, as arrays, tuples, text (``str``; ``strings`` as a tuple of
    ``str``), :class:`Raised` or :class:`Unsupported`.

    Raises:
        Unreadable: the payload is not an answer to ``exercise_id`` in the wire format.
    """
    if not isinstance(payload, dict) or set(payload) != {"exercise", "answers"}:
        raise Unreadable("a payload must have exactly exercise and answers")
    if payload["exercise"] != exercise_id:
        raise Unreadable(f"the payload answers {str(payload['exercise'])[:40]!r}, not {exercise_id!r}")
    answers = payload["answers"]
    if not isinstance(answers, list) or len(answers) > MAX_ANSWERS:
        raise Unreadable(f"answers must be a list of at most {MAX_ANSWERS} items")
    decoded = []
    for item in answers:
        if isinstance(item, dict) and set(item) == {"raised"} and isinstance(item["raised"], str):
            decoded.append(Raised(item["raised"][:MAX_MESSAGE]))
        elif isinstance(item, dict) and set(item) == {"value"}:
            decoded.append(_value(item["value"]))
        else:
            raise Unreadable("each answer must be {'value': ...} or {'raised': '...'}")
    return decoded
