"""The answer format the kernel and the grader share: one definition of the wire.

The kernel's probe (``coursekit.probe``) writes answers in this format; the grader's
reader (``grader.wire``) reads them, trusting nothing. Both take the MIME type, the
allowed dtypes and the limits from here, and the grader's decoded answers use the two
non-data kinds defined here, :class:`Raised` and :class:`Unsupported`.

An answer is an array (dtype, shape, base64 bytes), a sequence of answers, a ``text`` (one
``str``) or ``strings`` (a list of ``str``: tokens, a vocabulary); notebook 11 answers in
text. Text is valid Unicode (no lone surrogates), within ``MAX_TEXT`` characters.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np

MIME = "application/vnd.attention-course.answer+json"

# dtypes an answer may have on the wire; everything else is reported as unsupported
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64")
MAX_DEPTH = 3  # a tuple of arrays, or a tuple of tuples, is the deepest answer we take
MAX_ITEMS = 16  # items of one sequence
MAX_ANSWERS = 64  # answers in one payload
MAX_MESSAGE = 300  # characters of an error message or an unsupported kind
MAX_ELEMENTS = 4_000_000  # per array: far above any answer the course asks for
MAX_TEXT = 200_000  # characters of one text, or of all the strings of one list together
MAX_STRINGS = 20_000  # strings in one list: far above any vocabulary or token list asked for


@dataclass(frozen=True)
class Raised:
    """The learner's function raised; ``message`` is ``"TypeError: ..."``."""

    message: str


@dataclass(frozen=True)
class Unsupported:
    """The learner's function returned something that is not numeric data."""

    kind: str  # e.g. "a str", "an array of dtype object"


def encode_array(value: np.ndarray) -> dict:
    """An array as JSON-ready data: ``{"array": {"dtype", "shape", "data"}}``, little-endian."""
    array = np.asarray(value)  # (not ascontiguousarray: it turns 0-d into 1-d)
    array = array.astype(array.dtype.newbyteorder("<"), order="C", copy=True)
    return {"array": {"dtype": array.dtype.name, "shape": list(array.shape),
                      "data": base64.b64encode(array.tobytes()).decode("ascii")}}


def decode_array(wire: dict) -> np.ndarray:
    """The inverse of ``encode_array`` (without the outer key), for trusted input only:
    the grader reads the kernel's answers with ``grader.wire``, which checks everything."""
    raw = base64.b64decode(wire["data"], validate=True)
    return np.frombuffer(raw, dtype=np.dtype(wire["dtype"]).newbyteorder("<")).reshape(wire["shape"])


def is_unicode(text: str) -> bool:
    """``text`` is valid Unicode, so UTF-8 can carry it: no lone surrogate (``"\\ud800"``), which
    ``bytes.decode(..., errors="surrogateescape")`` makes and no HTML page or terminal can show."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
