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
    import pytest

    return pytest.param(*values, marks=[pytest.mark.slow] if assignment in COSTLY else [], **kwargs)


def sampled(name: str, one_in: int = 4) -> bool:
    """Whether a run judges the case called ``name`` (a mutant, say): every case in a full run;
    in a quick run about one in ``one_in``, the same ones on every run and machine (a CRC of
    the name, not Python's salted hash)."""
    return not QUICK or zlib.crc32(name.encode()) % one_in == 0


# In a quick run, a test that looks for cases of a kind along a long list (the mutants that
# break a property) stops after this many; a full run never stops early (None).
FEW = 3 if QUICK else None


def spread(values: list, keep: int = 2) -> list:
    """``values`` as pytest params, all but ``keep`` of them, spread evenly from the first,
    marked `slow`: the edit loop runs a few of a costly family, `make test` every one."""
    import pytest

    kept = {round(i * len(values) / keep) for i in range(keep)} if values else set()
    return [pytest.param(value, marks=[] if i in kept else [pytest.mark.slow]) for i, value in enumerate(values)]


def some_params(rows: list, ids: list[str], one_in: int = 4) -> list:
    """``rows`` as pytest params named ``ids``, about ``one_in - 1`` in ``one_in`` of them marked
    `slow` (the same ones on every machine, by a CRC of the id): the edit loop judges a sample of a
    family of thousands of small cases, `make test` every one."""
    import pytest

    return [pytest.param(*row, id=name, marks=[] if zlib.crc32(name.encode()) % one_in == 0 else [pytest.mark.slow])
            for row, name in zip(rows, ids)]
