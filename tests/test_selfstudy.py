"""The self-learner's package's code (selfstudy/attention_course), in this process: check my
work (check.py), the functions a kernel defines judged with grader.checks as grading judges
them; and the command's JupyterLab line (cli.py). The installed wheel, in a clean venv, is
tested in tests/test_selfstudy_package.py."""
from __future__ import annotations

import importlib.util
import os
import types

import numpy as np
import pytest

from grader import checks, course

ASSIGNMENT = "03_masking"
NOTEBOOK = course.NOTEBOOKS / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"


def _load(name: str):
    """attention_course.<name>, loaded from selfstudy/ (this venv does not install the package)."""
    path = course.ROOT / "selfstudy" / "attention_course" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"selfstudy_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def selfcheck():
    return _load("check")


@pytest.fixture
def learner(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


@pytest.fixture(scope="module")
def solved() -> dict:
    return course.solution_namespace(ASSIGNMENT)


def test_the_solutions_get_full_marks(selfcheck, learner, solved):
    text = selfcheck.check_in_kernel(NOTEBOOK, solved)
    assert "Score: 12/12" in text and "FAIL" not in text, text
    assert text.count("  PASS  ") == 6
    assert (learner / "data" / "attention-from-scratch" / "check_secret").stat().st_mode & 0o077 == 0


def test_a_mistake_gets_the_verdict_of_the_check_of_one_exercise(selfcheck, learner, solved):
    """The same verdict and lines as check_my_work("causal_mask") (grader.kernelcheck)."""
    from grader import kernelcheck

    def causal_mask(size):  # the transpose: queries see the future, not the past
        return np.triu(np.ones((size, size), dtype=bool))

    kernel = {**solved, "causal_mask": causal_mask}
    text = selfcheck.check_in_kernel(NOTEBOOK, kernel)
    one = kernelcheck.check_in_kernel("causal_mask", kernel).text().splitlines()[1:]
    assert one[0] == "  FAIL  masking-causal_mask  0/2" and one[1].startswith("        what went wrong: ")
    assert "\n".join(line.replace("masking-causal_mask  ", "masking-causal_mask                ", 1)
                     for line in one) in text
    assert "Score: 10/12" in text and text.count("  PASS  ") == 5
    assert "What to revisit: 4. The causal (look-ahead) mask (causal_mask)" in text


def test_a_failing_upstream_function_is_blamed_first(selfcheck, learner, solved):
    def apply_mask(scores, mask, fill=-1e9):  # fills where the mask is True: the opposite convention
        return np.where(np.asarray(mask, dtype=bool), fill, scores)

    kernel = {**solved, "apply_mask": apply_mask}
    right = solved["masked_softmax"]  # the solution's, calling the apply_mask of this namespace
    kernel["masked_softmax"] = types.FunctionType(right.__code__, kernel, right.__name__, right.__defaults__)
    text = selfcheck.check_in_kernel(NOTEBOOK, kernel)
    assert "  FAIL  masking-masked_softmax             0/2" in text
    assert "apply_mask is wrong too, and masked_softmax calls it: fix apply_mask first" in text, text


def test_a_function_the_kernel_has_not_run_is_not_answered(selfcheck, learner, solved):
    text = selfcheck.check_in_kernel(NOTEBOOK, {k: v for k, v in solved.items() if k != "apply_mask"})
    assert "apply_mask: not answered yet, this kernel has not run its cell" in text
    assert "hint: run the cell of `apply_mask` in section" in text and "Run All Cells" in text


def test_a_notebook_of_no_exercise_is_one_line(selfcheck, learner, tmp_path):
    path = tmp_path / "notes.ipynb"
    path.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    said = selfcheck.check_in_kernel(path, {})
    assert said.startswith("check my work: ") and "is not one of this course's notebooks" in said
    assert "\n" not in said


def test_what_the_learner_s_code_prints_stays_out_and_the_generators_are_left_as_they_were(selfcheck, learner, solved,
                                                                                           capsys):
    import random

    import torch

    def causal_mask(size):
        print("debugging", size)
        np.random.rand(), random.random(), torch.rand(1)
        return solved["causal_mask"](size)

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = random.random(), np.random.rand(), torch.rand(1).item()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    text = selfcheck.check_in_kernel(NOTEBOOK, {**solved, "causal_mask": causal_mask})
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert "Score: 12/12" in text and "debugging" not in text + capsys.readouterr().out


@pytest.mark.parametrize("uid", [0, 1000])
def test_jupyterlab_gets_allow_root_as_root_only(monkeypatch, tmp_path, uid):
    cli = _load("cli")
    monkeypatch.setattr(cli.os, "geteuid", lambda: uid)
    command = cli.lab_command(tmp_path, ["--ServerApp.port=8890"])
    assert command[1:] == ["-m", "jupyterlab", f"--ServerApp.root_dir={tmp_path}", "--ServerApp.port=8890",
                           *(["--allow-root"] if uid == 0 else [])]
    assert cli.lab_command(tmp_path, ["--allow-root"]).count("--allow-root") == 1


def test_only_the_newest_complete_self_learner_venvs_are_kept(tmp_path):
    from hub.environments import COMPLETE, prune

    for age, name in enumerate(["selfstudy-a", "selfstudy-b", "selfstudy-c", "selfstudy-d", "student-e"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / COMPLETE).write_text("")
        os.utime(tmp_path / name / COMPLETE, (1e9 - age, 1e9 - age))
    (tmp_path / "selfstudy-building").mkdir()  # no COMPLETE yet: another process fills it
    assert prune("selfstudy", tmp_path, keep=2) == [tmp_path / "selfstudy-c", tmp_path / "selfstudy-d"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["selfstudy-a", "selfstudy-b", "selfstudy-building",
                                                          "student-e"]
