"""``course-grader where ID``: every part of one exercise, found by its id.

One line per part, ``<kind>: <path>:<line or cell id>``: the solution cell, the test cell
(its visible part in the student version, its hidden part in the source), the figure cells
(cell metadata ``{"course": {"exercise": ID}}``, or a list of ids for a figure that draws
several exercises' functions), the cells the solution is copied into at
release (``grader/assembled.py``), the check, its reference, mistake
catalogue and driver when the exercise's object has them, the test cases and the
grade-table column. Paths are relative to the repository root.

The check is the line of ``grader/checks/<topic>.py`` that names the id (an ``@exercise``
line, a spec's ``id=``), else the definition of the callable the exercise object holds
(``questions``, ``inputs``, ``reference``, tried in that order). The rest is read from
whatever ``grader.checks._core.get(ID)`` returns, by attribute (``questions`` / ``inputs``,
``reference``, ``mistakes``, ``driver``), so that the lookup works for the closures of
today and for a declarative spec object alike.
"""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from . import course

CHECK_ATTRIBUTES = ("questions", "inputs", "reference")


@dataclass(frozen=True)
class Place:
    """One part of an exercise: what it is, the file, and a line number or a cell id."""
    kind: str
    path: Path
    where: str | int
    note: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {_relative(self.path)}:{self.where}" + (f"  ({self.note})" if self.note else "")


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(course.ROOT))
    except ValueError:
        return str(path)


def _unwrapped_source(obj: Any) -> tuple[Path, int] | None:
    """The file and first line of ``obj``'s definition, or None when it has no Python source
    (a builtin, a plain value). Decorated functions are followed to what they wrap."""
    try:
        target = inspect.unwrap(obj) if callable(obj) else obj
        _, start = inspect.getsourcelines(target)
        return Path(inspect.getsourcefile(target)).resolve(), max(start, 1)
    except (TypeError, OSError):
        return None


def spec_location(spec: Any, attributes: tuple[str, ...] = CHECK_ATTRIBUTES) -> tuple[Path, int] | None:
    """Where an exercise's check is defined: the source of the first of ``attributes`` that
    ``spec`` holds as a callable with Python source; None when none has (a spec of plain
    data: then ``_first_line_with`` finds its id in the topic's module)."""
    for name in attributes:
        value = getattr(spec, name, None)
        found = _unwrapped_source(value) if callable(value) else None
        if found:
            return found
    return None


def _names(catalogue: Any) -> list[str]:
    """The names of a mistake catalogue's entries: dict keys, or each entry's ``name`` /
    ``how`` / ``__name__``, or its text."""
    if isinstance(catalogue, dict):
        return [str(k) for k in catalogue]
    names = []
    for entry in catalogue:
        name = next((getattr(entry, a) for a in ("name", "how", "__name__") if isinstance(getattr(entry, a, None), str)),
                    None)
        names.append(name or str(entry))
    return names


def _cells(assignment: str, root: Path):
    path = root / assignment / f"{assignment}.ipynb"
    return path, nbformat.read(path, as_version=4).cells


def _assignment_of(exercise_id: str) -> str:
    """The assignment whose source notebook holds the exercise's solution cell.

    Raises:
        LookupError: no source notebook has a cell with that grade_id.
    """
    for assignment in course.assignments():
        _, cells = _cells(assignment, course.SOLUTIONS)
        if any(c.metadata.get("nbgrader", {}).get("grade_id") == exercise_id for c in cells):
            return assignment
    raise LookupError(f"no solution cell has grade_id {exercise_id!r}")


def _first_line_with(path: Path, text: str) -> int | None:
    if not path.is_file():
        return None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if text in line:
            return number
    return None


def figure_exercises(cell) -> list[str]:
    """The exercises a figure cell draws: its metadata ``course.exercise``, one id or a list."""
    tag = cell.metadata.get("course", {}).get("exercise")
    return [tag] if isinstance(tag, str) else list(tag or [])


def notebook_places(exercise_id: str) -> list[Place]:
    """The cells of an exercise: solution, test (visible and hidden) and figures.

    Raises:
        LookupError: no source notebook has a cell with that grade_id.
    """
    assignment = _assignment_of(exercise_id)
    places = []
    source, cells = _cells(assignment, course.SOLUTIONS)
    test_id = exercise_id + course.TEST_SUFFIX
    for cell in cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id == exercise_id:
            places.append(Place("solution", source, cell.id))
        elif grade_id and grade_id.startswith(test_id):
            if "### BEGIN HIDDEN TESTS" in cell.source:
                places.append(Place("hidden test", source, cell.id))
    released = course.NOTEBOOKS / assignment / f"{assignment}.ipynb"
    if released.is_file():
        for cell in nbformat.read(released, as_version=4).cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id and grade_id.startswith(test_id):
                places.append(Place("visible test", released, cell.id))
    places += [Place("figure", source, cell.id) for cell in cells if exercise_id in figure_exercises(cell)]
    from .assembled import ASSEMBLIES, notebook_path

    places += [Place("copied into", notebook_path(a.assignment), a.cell, "by make release")
               for a in ASSEMBLIES for p in a.pieces if p.cell == exercise_id]
    return places


def _driver_place(name: str) -> Place | None:
    from coursekit import probe

    try:
        found = _unwrapped_source(probe.get_driver(name))
    except LookupError:
        return None
    if found is None:
        return None
    return Place("driver", found[0], found[1], name)


def check_places(exercise_id: str) -> list[Place]:
    """The grading side of an exercise: check, reference, mistakes, driver, test cases and
    the grade-table column.

    Raises:
        LookupError: no check is registered under ``exercise_id``.
    """
    from grader.checks import _core

    from . import gradetable

    spec = _core.get(exercise_id)
    topic = exercise_id.split("-", 1)[0]
    module = course.ROOT / "grader" / "checks" / f"{topic}.py"
    by_id = (module, line) if (line := _first_line_with(module, f'"{exercise_id}"')) else None
    places = []
    # The line that names the id is the definition (the @exercise line of a closure, the
    # id= line of a spec); a shared input drawer's own line would name another exercise.
    found = by_id or spec_location(spec)
    if found:
        places.append(Place("check", *found))
    drawer = spec_location(spec, ("questions", "inputs"))
    if drawer and drawer != found:
        places.append(Place("inputs", *drawer))
    if getattr(spec, "reference", None) is not None:
        found = _unwrapped_source(spec.reference)
        if found:
            places.append(Place("reference", *found))
    # a spec's catalogue holds its mistakes and one per wrong setting of its knobs
    mistakes = spec.catalogue() if callable(getattr(spec, "catalogue", None)) else getattr(spec, "mistakes", None)
    if mistakes is not None:
        names = _names(mistakes)
        found = spec_location(spec, ("mistakes",)) or by_id or (module, 1)
        places.append(Place("mistakes", *found, f"{len(names)}: {', '.join(names)}" if names else "none"))
    if getattr(spec, "driver", None):
        place = _driver_place(spec.driver)
        if place:
            places.append(place)
    cases = course.ROOT / "tests" / f"test_checks_{topic}.py"
    line = _first_line_with(cases, f'"{exercise_id}"') or _first_line_with(cases, exercise_id)
    if line:
        places.append(Place("test cases", cases, line))
    writer = _unwrapped_source(gradetable.write_csv)
    if writer:
        places.append(Place("grade-table column", writer[0], writer[1], f"grades.csv column {exercise_id}"))
    return places


def where(exercise_id: str) -> list[Place]:
    """Every part of the exercise ``exercise_id`` (see the module docstring), in that order.

    Raises:
        LookupError: ``exercise_id`` is no exercise; the message names the closest ids.
    """
    from grader.checks import exercise_ids

    known = exercise_ids()
    if exercise_id not in known:
        close = difflib.get_close_matches(exercise_id, known, n=3, cutoff=0.5)
        raise LookupError(f"no exercise {exercise_id!r}" +
                          (f"; did you mean {', '.join(close)}?" if close else
                           f"; an id is <topic>-<function>, e.g. {known[0]}"))
    places = notebook_places(exercise_id)
    order = ["solution", "visible test", "hidden test", "figure", "copied into"]
    places.sort(key=lambda p: order.index(p.kind))
    return places + check_places(exercise_id)
