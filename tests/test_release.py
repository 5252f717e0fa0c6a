"""The student notebooks: generated from solutions/, free of solutions and hidden tests."""
from __future__ import annotations

import ast
import re

import nbformat
import pytest

import coursekit
from grader import course
from grader.checks import exercise_ids
from grader.release import AddCheckCells
from pathlib import Path

HIDDEN_CALL = re.compile(r'^from grader\.checks import check; check\("(?P<id>[\w-]+)", \w+(, \w+)*\)$')
SECRETS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "grader")


def _cells(path):
    return nbformat.read(path, as_version=4).cells


def _comparable(path):
    nb = nbformat.read(path, as_version=4)
    return [(c.cell_type, c.get("id"), c.source, c.metadata.get("nbgrader"), c.metadata.get("course")) for c in nb.cells]


def test_notebooks_equal_a_fresh_release(released):
    """``released`` (tests/conftest.py) is grader.release.release() into a folder of its own."""
    fresh, folder = released["notebooks"], released["folder"]
    assert [p.relative_to(folder) for p in fresh] == [
        p.relative_to(course.NOTEBOOKS) for p in sorted(course.NOTEBOOKS.glob("*/*.ipynb"))]
    for path in fresh:
        assert _comparable(path) == _comparable(course.NOTEBOOKS / path.relative_to(folder)), (
            f"{path.name} is out of date: run `make release` and commit notebooks/")


def test_nbgrader_s_generate_assignment_ends_with_the_check_cells():
    """nbgrader_config.py keeps nbgrader's own preprocessors and appends AddCheckCells, so
    `nbgrader generate_assignment` (into release/) writes what `make release` writes."""
    from nbgrader.converters import GenerateAssignment
    from traitlets.utils.importstring import import_item

    configured = course.load_config().GenerateAssignment.preprocessors
    assert [import_item(p) for p in configured] == (
        GenerateAssignment.class_traits()["preprocessors"].default() + [AddCheckCells])
    assert course.load_config().CourseDirectory.release_directory == "release"


def test_check_cells_end_every_notebook_unknown_to_the_gradebook():
    """AddCheckCells' two cells have fixed ids and no nbgrader metadata (no grade, no lock)."""
    for path in sorted(course.NOTEBOOKS.glob("*/*.ipynb")):
        cells = _cells(path)[-2:]
        assert [(c.cell_type, c.id) for c in cells] == [
            ("markdown", "check-my-work-markdown"), ("code", "check-my-work-code")], path.name
        assert not any("nbgrader" in c.metadata for c in cells), path.name


def test_student_notebooks_hold_no_solution_hidden_test_or_output():
    for path in sorted(course.NOTEBOOKS.glob("*/*.ipynb")):
        for cell in _cells(path):
            for secret in SECRETS:
                assert secret not in cell.source, f"{path.name}: '{secret}' in cell {cell.get('id')}"
            assert not cell.get("outputs"), f"{path.name}: cell {cell.get('id')} has outputs"


def test_student_package_holds_no_solution_or_check():
    """coursekit defines none of the functions and classes the learner writes (their top-level
    names; methods such as forward or encode are the learner's only inside their class) and
    imports no grader code."""
    learner_functions = set()
    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        for cell in _cells(path):
            if cell.metadata.get("nbgrader", {}).get("solution"):
                learner_functions |= {n.name for n in ast.parse(cell.source).body
                                      if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert learner_functions, "no solution functions found"
    for source in Path(coursekit.__file__).parent.rglob("*.py"):
        text = source.read_text()
        tree = ast.parse(text)
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & learner_functions, f"{source.name} defines {defined & learner_functions}"
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m.split(".")[0] == "grader" for m in imported), f"{source.name} imports grader"
        for secret in SECRETS[:4]:
            assert secret not in text


def test_hidden_tests_are_one_line_calls_by_exercise_id():
    """Solution cell grade_id = exercise id; its test cell = id + '-test' and holds one check call."""
    seen = []
    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        cells = _cells(path)
        solutions = {c.metadata.nbgrader["grade_id"] for c in cells if c.metadata.get("nbgrader", {}).get("solution")}
        for cell in cells:
            meta = cell.metadata.get("nbgrader", {})
            if not (meta.get("grade") and not meta.get("solution")):
                continue
            exercise = course.exercise_id(meta["grade_id"])
            assert meta["grade_id"] == exercise + course.TEST_SUFFIX
            assert exercise in solutions, f"test cell {meta['grade_id']} has no solution cell {exercise}"
            hidden = re.search(r"### BEGIN HIDDEN TESTS\n(.*?)\n### END HIDDEN TESTS", cell.source, re.S)
            assert hidden, f"{meta['grade_id']} has no hidden tests"
            match = HIDDEN_CALL.match(hidden.group(1))
            assert match and match.group("id") == exercise, f"{meta['grade_id']}: {hidden.group(1)!r}"
            seen.append(exercise)
    assert sorted(seen) == exercise_ids(), "every check is used by exactly one test cell"


@pytest.mark.kernel
def test_validate_button_flags_the_student_version_and_passes_a_finished_one():
    """What nbgrader's Validate button runs, with the course configuration."""
    from nbgrader.validator import Validator

    validator = Validator(config=course.load_config())
    untouched = validator.validate(str(course.NOTEBOOKS / "01_similarity" / "01_similarity.ipynb"))
    assert len(untouched["failed"]) == 4
    finished = validator.validate(str(course.SAMPLE_CLASS / "ada" / "01_similarity" / "01_similarity.ipynb"))
    assert not finished.get("failed") and not finished.get("changed")


@pytest.mark.kernel
def test_new_gradebooks_get_nbgrader_s_alembic_revision(tmp_path):
    """grader.release answers nbgrader's revision question in process; it must be the
    revision nbgrader's own `alembic heads` command gives (the one upgrades start from)."""
    import os
    import subprocess
    import sys

    from nbgrader.api import Gradebook
    from nbgrader.dbutil import _temp_alembic_ini
    from sqlalchemy import create_engine, text

    import grader.release  # noqa: F401 - installs the in-process revision lookup

    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'x.db'}") as ini:
        heads = subprocess.check_output(["alembic", "-c", ini, "heads"], env=env).decode().split()[0]
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(url):
        pass
    with create_engine(url).connect() as db:
        assert db.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == heads
