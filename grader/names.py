"""Student-controlled names and text made safe for terminals and CSV files; ids validated.

Everything a student names (their folder, an assignment folder, a file) and every
status built from those names passes through here before it is printed or written:

- ``shown(text)``: the one escaping function. No control character (C0, DEL, C1), no
  bidi override or isolate (U+202A-U+202E, U+2066-U+2069), no bidi mark or line
  separator and no surrogate reaches a terminal or a file: each is shown as ``\\xNN``
  or ``\\uNNNN``. A byte that was not UTF-8 (``os.fsdecode`` gives it as a surrogate,
  U+DC80-U+DCFF) is shown as the byte, ``\\xNN``.
- ``csv_cell(value)``: one CSV cell. Numbers stay numbers; text is ``shown`` and, when
  it begins (also after leading spaces) with ``=``, ``+``, ``-``, ``@``, a tab or a
  carriage return, gets a leading single quote, as OWASP's CSV injection guidance
  says, so that no spreadsheet reads it as a formula.
- ``student_id_problem`` / ``name_problem``: why a name cannot be used, or None.

The id rule (used when no roster is given): 1 to 100 characters, letters (any script,
with their combining marks) and digits, and ``.``, ``_``, ``-``, ``@`` after the first,
which is a letter or a digit. nbgrader 0.9.6 itself refuses ``+`` and ``*`` in a
student id (the exchange's ``submit`` and ``fetch_feedback``: it names files
``student+assignment+time``), ``+`` in an assignment id (``CourseDirectory``), and
strips surrounding whitespace; and it uses ``CourseDirectory.student_id`` as a file
glob, so ``*``, ``?`` and ``[`` would match other students' folders. The rule keeps
all of those out, with ``/`` and ``..``, and it cannot begin a CSV formula. Email-style
ids (``jane.doe@uni.example``) and JupyterHub user names pass.
"""
from __future__ import annotations

import unicodedata
from numbers import Real

MAX_ID_LENGTH = 100

# bidi embeddings, overrides and isolates, the bidi marks, line/paragraph separators
_INVISIBLE = {0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
_FORMULA = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")  # and fullwidth forms
_ID_PUNCTUATION = "._-@"


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte os.fsdecode could not decode (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F or code in _INVISIBLE or 0xD800 <= code <= 0xDFFF


def shown(text: object) -> str:
    """``text`` (a str, or anything ``str()`` takes) as it may be printed or written.

    Returns it unchanged when it holds nothing unsafe; otherwise every control
    character, bidi control, line separator and surrogate is replaced by a ``\\xNN`` /
    ``\\uNNNN`` escape (a surrogate-escaped byte as ``\\xNN``). Idempotent. Never raises.
    """
    text = text if isinstance(text, str) else str(text)
    if not any(map(_unsafe, text)):
        return text
    return "".join(_escape(c) if _unsafe(c) else c for c in text)


def quoted(name: str) -> str:
    """A name for a status or message: escaped, between single quotes."""
    return f"'{shown(name)}'"


def name_problem(name: str) -> str | None:
    """Why a file or folder name cannot be used as it is, or None.

    Args:
        name: as ``os.fsdecode`` / ``os.scandir`` gives it (bytes that are not UTF-8
            are surrogates).
    Returns:
        "is not valid UTF-8", "holds control characters", or None.
    """
    if any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        return "is not valid UTF-8"
    if shown(name) != name:
        return "holds control characters"
    return None


def student_id_problem(student_id: str, roster: set[str] | dict | None = None) -> str | None:
    """Why a student folder's name is not a student id, or None when it is one.

    With a roster (its student ids), an id is valid when it is on it; otherwise it
    must follow the rule in this module's docs. The reason is a phrase to follow the
    quoted, escaped name: "is not on the roster", "is not a valid student id (...)".
    """
    if roster is not None:
        return None if student_id in roster else "is not on the roster"
    why = name_problem(student_id)
    if why:
        return why
    if not 1 <= len(student_id) <= MAX_ID_LENGTH:
        return f"is not a valid student id (1 to {MAX_ID_LENGTH} characters)"
    first = unicodedata.category(student_id[0])
    rest_ok = all(c in _ID_PUNCTUATION or unicodedata.category(c)[0] in "LNM" for c in student_id[1:])
    if first[0] not in "LN" or not rest_ok:
        return ("is not a valid student id (letters and digits, and . _ - @ after the first "
                "character)")
    return None


def csv_cell(value: object) -> object:
    """One cell for ``csv.writer``: a number stays a number, None is empty, text is made safe.

    ``int`` and ``float`` (not bool) are written as ``f"{value:g}"``, so a score of -1
    stays -1. Text is ``shown``; if it then begins with a formula character (``=``,
    ``+``, ``-``, ``@``, tab, carriage return, or their fullwidth forms), also after
    leading whitespace, it gets a leading ``'`` (OWASP's CSV injection guidance).
    """
    if value is None:
        return ""
    if isinstance(value, Real) and not isinstance(value, bool):
        return f"{value:g}"
    text = shown(value)
    if text.startswith(_FORMULA) or text.lstrip(" \t\r\n\u00a0\u3000").startswith(_FORMULA):
        return "'" + text
    return text


def csv_row(values) -> list:
    """``csv_cell`` applied to every value of a row."""
    return [csv_cell(v) for v in values]
