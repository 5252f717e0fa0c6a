"""Which submitted notebook is graded as which released one: the course's one rule.

Students rename notebooks ("my masking (final).ipynb") and keep copies beside them.
The grader (``grader.stage``), check my work (``grader.selfcheck``) and the students'
``nbgrader submit`` (``coursekit.submit``) all decide with ``graded_as`` and say it with
``naming_note``, so that what a student is told at check and at submit is what
grading does:

- a notebook saved under its released name is graded as itself, whatever else is beside it;
- in a one-notebook assignment whose notebook is missing, a lone other notebook of the
  folder is graded under the released name (its feedback keeps the student's name);
- otherwise the released notebook is missing and the submission is not graded.

Names only: no notebook is read. ``present`` lists the folder's top-level notebook files
(``.ipynb``, not hidden, not folders), as ``notebook_files`` finds them.
"""
from __future__ import annotations

import os


def notebook_files(folder: str | os.PathLike) -> list[str]:
    """The notebook files directly in ``folder`` (``.ipynb``, not hidden, not folders), sorted,
    as grading sees them; none when the folder cannot be listed."""
    try:
        with os.scandir(folder) as listing:
            return sorted(e.name for e in listing if e.name.endswith(".ipynb") and not e.name.startswith(".")
                          and not e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def graded_as(released: list[str], present: list[str]) -> dict[str, str]:
    """Released notebook name (without ``.ipynb``) -> the file name in ``present`` graded as it.

    A released notebook that nothing in ``present`` is graded as is left out.
    """
    chosen = {}
    for notebook in released:
        if f"{notebook}.ipynb" in present:
            chosen[notebook] = f"{notebook}.ipynb"
        elif len(released) == 1 and len(present) == 1:
            chosen[notebook] = present[0]
    return chosen


def _quoted(name: str) -> str:
    """A file name in a line of text: quoted, its control characters escaped."""
    return "'" + "".join(c if c.isprintable() else repr(c)[1:-1] for c in name) + "'"


def naming_note(name: str, released: list[str], present: list[str] | None = None) -> str | None:
    """One line for a student whose notebook file ``name`` is not named as released, else None.

    ``present``: the folder's notebook files (``name`` among them); by default ``name`` alone.
    The line says under which name it will be graded, or that it will not be graded
    and which file will be instead.
    """
    if name in {f"{n}.ipynb" for n in released}:
        return None
    present = sorted(set(present or []) | {name})
    expected = " or ".join(f"'{n}.ipynb'" for n in released)
    graded = graded_as(released, present)
    for notebook, file in graded.items():
        if file == name:
            return (f"{_quoted(name)} is not named as released: it will be graded as '{notebook}.ipynb' "
                    "(its feedback keeps your name)")
    if graded:
        others = " and ".join(_quoted(f) for f in graded.values())
        return f"{_quoted(name)} is not named as released ({expected}): it will not be graded, {others} will"
    alone = " (or keep it alone in its folder)" if len(released) == 1 else ""
    return f"{_quoted(name)} is not named as released ({expected}) and will not be graded: rename it {expected}{alone}"
