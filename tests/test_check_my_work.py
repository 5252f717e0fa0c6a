"""Check my work: `course-grader check PATH.ipynb` and the last cell of every student notebook.

Two notebooks are really graded here (about 25 s): a right one through the notebook
cell (which runs the command), and one with known mistakes in process.
"""
from __future__ import annotations

import json
import re

import nbformat
import pytest

from coursekit.check import check_my_work
from grader import course
from grader.cli import main
from grader.release import check_cell_source
from tests.conftest import expected_grades

FIRST = course.assignments()[0]


def _hidden_test_lines() -> set[str]:
    """Every line of every hidden test block in solutions/: none may ever be printed."""
    lines = set()
    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            hidden = re.search(r"### BEGIN HIDDEN TESTS\n(.*?)\n### END HIDDEN TESTS", cell.source, re.S)
            if hidden:
                lines |= {line.strip() for line in hidden.group(1).splitlines() if line.strip()}
    assert lines
    return lines


def _assert_reveals_nothing(text: str) -> None:
    for line in _hidden_test_lines():
        assert line not in text, line
    for secret in ("grader.checks", "coursekit.probe", "Traceback", "attention-course.answer", "HIDDEN"):
        assert secret not in text, secret


@pytest.mark.parametrize("assignment", course.assignments())
def test_every_student_notebook_ends_with_the_check_cell(assignment):
    for path in sorted((course.NOTEBOOKS / assignment).glob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        assert cells[-1].cell_type == "code" and cells[-1].source == check_cell_source(), path.name
        assert cells[-2].cell_type == "markdown" and "Ctrl-S" in cells[-2].source, path.name


def test_the_cell_is_one_line_while_nbgrader_runs_the_notebook(monkeypatch, capsys):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert check_my_work(f"{FIRST}.ipynb") is None
    assert capsys.readouterr().out.strip().splitlines() == [
        "check my work: skipped while this notebook is graded or validated"]


def test_the_cell_prints_full_marks_for_a_right_notebook(monkeypatch, capsys):
    """The notebook cell, run as JupyterLab would (the kernel knows its notebook's path)."""
    solution = course.SOLUTIONS / FIRST / f"{FIRST}.ipynb"
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", str(solution))
    assert check_my_work("elsewhere.ipynb") == 0
    out = capsys.readouterr().out
    top = sum(expected_grades()[("ada", FIRST)]["exercises"].values())
    assert f"Score: {top:g}/{top:g}" in out, out
    assert "FAIL" not in out and out.count("PASS") == len(course.sections(FIRST)), out
    assert "What to revisit: nothing" in out
    _assert_reveals_nothing(out)


def test_a_known_mistake_prints_its_diagnosis_hint_and_what_to_revisit(tmp_path, capsys):
    """chloe's notebook 01 (a renamed copy): cosine over squared lengths, keys @ queries^T,
    softmax over the query axis."""
    mine = tmp_path / "my copy.ipynb"
    mine.write_bytes((course.SAMPLE_CLASS / "chloe" / "01_similarity" / "01_similarity.ipynb").read_bytes())
    assert main(["check", str(mine)]) == 0
    out = capsys.readouterr().out
    expected = expected_grades()[("chloe", "01_similarity")]
    assert f"Score: {expected['score']:g}/10" in out, out
    for exercise, points in expected["exercises"].items():
        assert re.search(rf"{'PASS' if points else 'FAIL'}  {exercise} +{points:g}/", out), (exercise, out)
    assert "softmax over the key axis" in out and "hint: re-read section" in out
    revisit = out.split("What to revisit:")[1]
    assert "5. From scores to a soft lookup (soft_lookup)" in revisit and "dot_product" not in revisit
    _assert_reveals_nothing(out)


def test_a_broken_notebook_file_is_one_line(tmp_path, capsys):
    broken = tmp_path / f"{FIRST}.ipynb"
    broken.write_text(json.dumps({"cells": []})[:9], encoding="utf-8")  # truncated, as a crash leaves it
    assert main(["check", str(broken)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"{broken.name}: not graded: ") and "JSON" in out[0], out


@pytest.mark.parametrize("name", ["missing.ipynb", "notes.txt"])
def test_a_wrong_path_is_one_line_saying_what_to_pass(tmp_path, capsys, name):
    path = tmp_path / name
    if name.endswith(".txt"):
        path.write_text("hello")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("course-grader check: no notebook at"), err
