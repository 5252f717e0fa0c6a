"""How much breadth a run covers. `make test` covers all of it; `make test-fast` (the edit
loop, COURSE_TEST_QUICK=1) keeps every kind of test but draws less of each: one student seed
where a test draws many, and one recorded submission per student and per assignment of the
sample class instead of all. A quick pass is not a pass of `make test`."""
from __future__ import annotations

import os
import zlib

QUICK = os.environ.get("COURSE_TEST_QUICK") == "1"


def student_seeds(n: int) -> range:
    """The student seeds a test draws: all ``n``, or the last one in a quick run."""
    return range(n - 1, n) if QUICK and n else range(n)


def some_of_each(rows: list) -> list:
    """``rows`` of ((student, assignment), expected): all of them, or in a quick run each
    student's submissions in turn (the i-th student's i-th, wrapping round) and then the first
    row of any assignment no student was given, so every student and every assignment is kept."""
    if not QUICK:
        return rows
    students = sorted({key[0] for key, _ in rows})
    kept = []
    for i, student in enumerate(students):
        theirs = [row for row in rows if row[0][0] == student]
        kept.append(theirs[i % len(theirs)])
    covered = {key[1] for key, _ in kept}
    for row in rows:
        if row[0][1] not in covered:
            kept.append(row)
            covered.add(row[0][1])
    return [row for row in rows if row in kept]


# Assignments whose notebook, run in process, trains or decodes whole models: seconds of CPU
# for each submission judged or each cell run above a visible test. Those cases are `slow`
# (left to `make test`); the edit loop keeps every other assignment's.
COSTLY = ("09_transformer", "10_seq2seq_rnn", "12_gpt", "13_rope")


def slow_if_costly(assignment: str, *values, **kwargs):
    """``pytest.param(*values)``, marked `slow` when ``assignment`` is one of COSTLY."""
    return _slow_unless(assignment not in COSTLY, *values, **kwargs)


def _slow_unless(kept: bool, *values, **kwargs):
    """``pytest.param(*values)``, marked `slow` unless ``kept``: left to `make test`."""
    import pytest

    return pytest.param(*values, marks=[] if kept else [pytest.mark.slow], **kwargs)


def _in_sample(name: str, one_in: int) -> bool:
    """About one name in ``one_in``, the same ones on every run and machine (a CRC of the name,
    not Python's salted hash)."""
    return zlib.crc32(name.encode()) % one_in == 0


def sampled(name: str, one_in: int = 4) -> bool:
    """Whether a run judges the case called ``name`` (a mutant, say): every case in a full run;
    in a quick run about one in ``one_in`` (``_in_sample``)."""
    return not QUICK or _in_sample(name, one_in)


# In a quick run, a test that looks for cases of a kind along a long list (the mutants that
# break a property) stops after this many; a full run never stops early (None).
FEW = 3 if QUICK else None


def spread(values: list, keep: int = 2) -> list:
    """``values`` as pytest params, all but ``keep`` of them, spread evenly from the first,
    marked `slow`: the edit loop runs a few of a costly family, `make test` every one."""
    kept = {round(i * len(values) / keep) for i in range(keep)} if values else set()
    return [_slow_unless(i in kept, value) for i, value in enumerate(values)]


def some_params(rows: list, ids: list[str], one_in: int = 4) -> list:
    """``rows`` as pytest params named ``ids``, about ``one_in - 1`` in ``one_in`` of them marked
    `slow` (``_in_sample`` of the id): the edit loop judges a sample of a family of thousands of
    small cases, `make test` every one."""
    return [_slow_unless(_in_sample(name, one_in), *row, id=name) for row, name in zip(rows, ids)]
