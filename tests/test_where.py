"""`course-grader where ID` finds every part of every exercise, and each place it prints
holds that exercise (its id, or its function's name)."""
from __future__ import annotations

import ast
import re

import nbformat
import pytest

from grader import course
from grader.checks import exercise_ids
from grader.checks._core import get
from grader.cli import main
from grader.where import figure_exercises

LINE = re.compile(r"^(?P<kind>[a-z -]+): (?P<path>[^:]+):(?P<where>[\w-]+)(  \((?P<note>.*)\))?$")
DRAWS = re.compile(r"plt\.show\(|plt\.subplots\(|heatmap\(|show_mask\(|vectors_2d\(")
# Exercises whose function is drawn only in another exercise's figure, or in none: listed, so
# that a figure added for one of them (or one lost) shows up here.
WITHOUT_FIGURE = {"transformer-greedy_decode", "transformer-label_smoothed_loss"}


def _where(exercise: str, capsys) -> dict[str, list[re.Match]]:
    assert main(["where", exercise]) == 0
    out = capsys.readouterr().out.splitlines()
    places: dict[str, list[re.Match]] = {}
    for line in out:
        match = LINE.match(line)
        assert match, f"not <kind>: <path>:<line or cell id>: {line!r}"
        places.setdefault(match["kind"], []).append(match)
    return places


def _cell(match: re.Match):
    cells = {c.id: c for c in nbformat.read(course.ROOT / match["path"], as_version=4).cells}
    assert match["where"] in cells, f"{match['path']} has no cell {match['where']}"
    return cells[match["where"]]


def _line(match: re.Match) -> str:
    lines = (course.ROOT / match["path"]).read_text(encoding="utf-8").splitlines()
    return lines[int(match["where"]) - 1]


@pytest.mark.parametrize("exercise", exercise_ids())
def test_where_points_at_every_part_of_the_exercise(exercise, capsys):
    places = _where(exercise, capsys)
    function = exercise.split("-", 1)[1]
    topic = exercise.split("-", 1)[0]

    [solution] = places["solution"]
    cell = _cell(solution)
    assert solution["path"].startswith("solutions/") and cell.metadata.nbgrader["grade_id"] == exercise
    assert function in {n.name for n in ast.parse(cell.source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}

    [hidden] = places["hidden test"]
    assert hidden["path"] == solution["path"]
    assert f'check("{exercise}", ' in _cell(hidden).source

    [visible] = places["visible test"]
    cell = _cell(visible)
    assert visible["path"].startswith("notebooks/") and cell.metadata.nbgrader["grade_id"] == exercise + "-test"
    assert "HIDDEN" not in cell.source and function in cell.source

    figures = places.get("figure", [])
    assert bool(figures) == (exercise not in WITHOUT_FIGURE), f"{exercise}: {len(figures)} figure cell(s)"
    for figure in figures:
        cell = _cell(figure)
        tagged = figure_exercises(cell)
        assert exercise in tagged and set(cell.metadata.course) == {"exercise"}, cell.metadata.course
        assert any(re.fullmatch(rf"{re.escape(t)}-figure(-\d+)?", cell.id) for t in tagged), cell.id
        assert DRAWS.search(cell.source)

    [check] = places["check"]
    assert check["path"] == f"grader/checks/{topic}.py"
    assert exercise in _line(check) or function in _line(check), _line(check)

    for drawer in places.get("inputs", []):
        assert re.match(r"def \w+", _line(drawer)), _line(drawer)

    [cases] = places["test cases"]
    assert cases["path"] == f"tests/test_checks_{topic}.py" and exercise in _line(cases)

    driver = getattr(get(exercise), "driver", None)
    assert bool(places.get("driver")) == bool(driver)
    for found in places.get("driver", []):
        assert found["note"] == driver and found["path"].startswith("coursekit/")
        assert re.match(r"\s*def \w+", _line(found)), _line(found)

    [column] = places["grade-table column"]
    assert column["path"] == "grader/gradetable.py" and "def write_csv" in _line(column)
    assert column["note"] == f"grades.csv column {exercise}"


def test_every_figure_of_a_learner_s_function_carries_its_exercise():
    """A cell that draws and calls a function the learner wrote is some exercise's figure, by id and
    metadata; and every such tag names a real exercise."""
    known = set(exercise_ids())
    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        learner = {n.name for c in cells if c.metadata.get("nbgrader", {}).get("solution")
                   for n in ast.parse(c.source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for cell in cells:
            meta = cell.metadata.get("nbgrader", {})
            tag = figure_exercises(cell)
            if tag:
                assert set(tag) <= known and any(cell.id.startswith(f"{t}-figure") for t in tag), (path.name, cell.id)
            if cell.cell_type != "code" or meta.get("solution") or meta.get("grade") or not DRAWS.search(cell.source):
                continue
            names = {n.id for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Name)}
            if names & learner:
                assert tag, f"{path.name}: cell {cell.id} draws {sorted(names & learner)} but names no exercise"


def test_an_unknown_id_is_one_line_with_close_matches(capsys):
    assert main(["where", "masking-causal_msk"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert "no exercise 'masking-causal_msk'" in line and "masking-causal_mask" in line


def test_a_copied_solution_names_the_cell_it_is_copied_into(capsys):
    places = _where("encoder-EncoderLayer", capsys)
    [copied] = places["copied into"]
    assert copied["path"] == "solutions/09_transformer/09_transformer.ipynb"
    assert "class EncoderLayer" in _cell(copied).source


def _inputs(rng):             # a spec's input drawer, as the declarative spec will hold it
    return []


def _reference(x):
    return x


def test_a_declarative_spec_is_found_by_its_attributes(monkeypatch, capsys):
    """A spec object (inputs, reference, mistakes, driver): its parts come from its attributes,
    and a callable with no id in the topic's module is still found by inspect."""
    from types import SimpleNamespace

    import grader.checks._core as core

    mistakes = [SimpleNamespace(name="softmax over the query axis"), SimpleNamespace(name="no scaling")]
    spec = SimpleNamespace(inputs=_inputs, reference=_reference, mistakes=mistakes, driver="tensors")
    monkeypatch.setattr(core, "get", lambda exercise_id: spec)
    places = _where("softmax-stable_softmax", capsys)
    here = "tests/test_where.py"
    [check] = places["check"]          # the spec's id= line in the topic's module
    assert check["path"] == "grader/checks/softmax.py" and "softmax-stable_softmax" in _line(check)
    assert [(m["path"], _line(m).split("(")[0]) for m in places["inputs"]] == [(here, "def _inputs")]
    assert [(m["path"], _line(m).split("(")[0]) for m in places["reference"]] == [(here, "def _reference")]
    [catalogue] = places["mistakes"]
    assert catalogue["note"] == "2: softmax over the query axis, no scaling"
    [driver] = places["driver"]
    assert driver["path"] == "coursekit/probe.py" and _line(driver).startswith("def _drive_tensors")


def test_without_its_id_in_the_module_the_check_is_the_callable_s_definition(monkeypatch):
    from types import SimpleNamespace

    from grader import where

    spec = SimpleNamespace(questions=None, inputs=_inputs, reference=_reference)
    monkeypatch.setattr(where, "_first_line_with", lambda path, text: None)
    monkeypatch.setattr("grader.checks._core.get", lambda exercise_id: spec)
    [check] = [p for p in where.check_places("softmax-stable_softmax") if p.kind == "check"]
    assert check.path.name == "test_where.py" and check.where == _inputs.__code__.co_firstlineno
