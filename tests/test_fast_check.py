"""Check one exercise in seconds (``check_my_work("masked_softmax")``, grader.kernelcheck):
the same verdicts and diagnoses as the full check, for every sample-class persona.

The full check is grading (``grader.unit.grade_submission`` on the saved notebook); the
suite's stand-in for it on the sample class is the in-process judge (tests/inprocess.py,
held to the recorded grades by tests/test_pipeline.py and, for notebook 01, to the real
pipeline). The judge runs each persona's notebook once and then, on the namespace it left,
the fast check of every exercise with the same seeds (``Judged.fast``): no notebook is run
twice, and a session that already judged the class pays only for the fast checks.
"""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from coursekit import check as client
from coursekit.check import check_my_work
from grader import checks, course, kernelcheck
from grader.selfcheck import CannotCheck
from tests.scope import slow_if_costly, some_of_each
from tests.test_pipeline import IN_PROCESS, _key_id

# Graded submissions only: a notebook that cannot be staged has no kernel to check in.
GRADED = some_of_each([(k, e) for k, e in IN_PROCESS if e["status"].startswith("graded")])


@pytest.mark.parametrize("key", [slow_if_costly(k[1], k, id=_key_id(k)) for k, _ in GRADED])
def test_the_fast_check_gives_the_full_check_s_verdicts_and_diagnoses(judged, key):
    row = judged(*key)
    full = {exercise: row.diagnoses.get(exercise) for exercise in row.max_points}
    assert set(row.fast) | set(row.undefined) == set(full)
    for exercise, said in row.undefined.items():  # no function to judge: the full check fails it too
        assert full[exercise] is not None and said.endswith("run the cell that defines it, then check again"), \
            (exercise, full[exercise])
    assert row.fast == {e: d for e, d in full.items() if e in row.fast}


# ---------------------------------------------------------------- check_my_work("name")

@pytest.fixture
def kernel(monkeypatch, tmp_path):
    """A self-learner's kernel: notebook 03's solutions defined, a data folder of their own,
    no hub's check service; ``kernel`` is its namespace."""
    for name in ("NBGRADER_EXECUTION", "COURSE_CHECK_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    namespace = course.solution_namespace("03_masking")
    monkeypatch.setattr(client, "_shell", lambda: type("Shell", (), {"user_ns": namespace})())
    return namespace


def masked_softmax(scores, mask):  # masked scores set to 0: a catalogued mistake
    scores = np.where(mask, scores, 0.0)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


_wrong_fill = masked_softmax


def test_a_right_function_passes_with_its_points_in_two_lines(kernel, capsys):
    assert check_my_work("masked_softmax") is None
    assert capsys.readouterr().out.splitlines() == [
        "Checked masked_softmax as defined in this kernel now, with the hidden checks:",
        "  PASS  masking-masked_softmax  2/2"]


def test_a_mistake_gets_the_full_check_s_lines_on_this_learner_s_seed(kernel, capsys):
    """The object passed is the one judged (the kernel's right one is left alone); its lines
    are the full check's for that exercise: the diagnosis of the same verdict, the hint."""
    check_my_work(_wrong_fill)
    out = capsys.readouterr().out.splitlines()
    diagnosis = checks.verdict("masking-masked_softmax", kernelcheck.own_seed("masking-masked_softmax"),
                               checks.answers_of("masking-masked_softmax", _wrong_fill,
                                                 kernelcheck.own_seed("masking-masked_softmax")))
    assert "sets the masked scores to 0" in diagnosis
    assert out[1:] == ["  FAIL  masking-masked_softmax  0/2", f"        what went wrong: {diagnosis}",
                       '        hint: re-read section "6. Applying the mask: before the softmax, with a large '
                       'negative number" and the docstring of `masked_softmax`; the visible test under it is a '
                       "small case you can work out by hand"], out


def test_a_failing_upstream_function_is_blamed_as_in_the_full_check(kernel, capsys):
    kernel["apply_mask"] = lambda scores, mask, fill=-1e9: scores  # masks nothing
    kernel["masked_softmax"] = _wrong_fill
    check_my_work("masked_softmax")
    assert ("apply_mask is wrong too, and masked_softmax calls it: fix apply_mask first, then check "
            "masked_softmax again") in capsys.readouterr().out


def test_the_learner_s_kernel_is_left_as_it_was(kernel, capsys):
    """Nothing the learner's code prints reaches the cell; the random generators draw next
    what they would have drawn without the check; torch keeps its thread count."""
    right = kernel["masked_softmax"]

    def masked_softmax(scores, mask):
        print("debugging output")
        torch.rand(3), np.random.rand(3), random.random()
        return right(scores, mask)

    threads = torch.get_num_threads()
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    without = torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    check_my_work(masked_softmax)
    assert (torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()) == without
    assert torch.get_num_threads() == threads
    out = capsys.readouterr().out
    assert "debugging output" not in out and "PASS" in out, out


def test_an_endless_loop_is_stopped_at_the_time_limit(kernel):
    def endless(scores, mask):
        while True:
            pass

    kernel["masked_softmax"] = endless
    said = kernelcheck.verdicts(kernel, "masking-masked_softmax", seconds=0.2)["masking-masked_softmax"]
    assert said == "stopped at the time limit (0.2 s for one exercise)"


@pytest.mark.parametrize("asked,said", [
    ("nothing_of_ours", "check my work: no exercise of this course asks for nothing_of_ours: pass the name of your "
                        'function or class as its notebook defines it, e.g. check_my_work("masked_softmax")'),
    ("MultiHeadAttention", "check my work: MultiHeadAttention is not defined in this kernel: run the cell that "
                           "defines it, then check again"),
    (3, "check my work: pass the notebook's path, or one exercise's function or class (or its name), e.g. "
        'check_my_work("masked_softmax")')])
def test_what_cannot_be_checked_is_one_line_saying_what_to_do(kernel, capsys, asked, said):
    check_my_work(asked)
    assert capsys.readouterr().out.splitlines() == [said]


def test_an_exercise_id_names_the_exercise_too(kernel):
    assert kernelcheck.exercise_of("masking-causal_mask") == kernelcheck.exercise_of("causal_mask")
    with pytest.raises(CannotCheck):
        kernelcheck.exercise_of("masking-nothing")


def test_in_a_class_it_says_so_in_one_line(kernel, monkeypatch, capsys):
    """On a hub the check service stays the trusted path, even where the grader is importable;
    the student package without the grader has no checks to run here."""
    monkeypatch.setenv("COURSE_CHECK_URL", "http://127.0.0.1:9/services/course-check")
    check_my_work("masked_softmax")
    assert capsys.readouterr().out.splitlines() == [client.ONE_EXERCISE_IN_CLASS]
    monkeypatch.delenv("COURSE_CHECK_URL")
    real = client.importlib.util.find_spec
    monkeypatch.setattr(client.importlib.util, "find_spec", lambda name: None if name == "grader" else real(name))
    check_my_work("masked_softmax")
    assert capsys.readouterr().out.splitlines() == [client.NO_CHECKER]


def test_while_nbgrader_runs_the_notebook_it_is_one_line(kernel, monkeypatch, capsys):
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    check_my_work("masked_softmax")
    assert capsys.readouterr().out.splitlines() == ["check my work: skipped while this notebook is graded or validated"]


def test_the_fast_check_s_time_limit_is_the_course_s_cell_limit():
    assert kernelcheck.SECONDS == course.load_config().BudgetedExecute.cell_cpu_seconds


def test_the_whole_notebook_check_runs_the_short_training_budget(monkeypatch):
    """``course-grader check`` (and the check service) grade through nbgrader's autograde,
    which sets NBGRADER_EXECUTION, and the sandbox hands it to the kernel even when the
    grader's own environment lacks it: the training notebooks' ``grading()`` is then True,
    and they train on their short budget while the checks load known weights (notebook 14
    also measures fewer lengths)."""
    from coursekit.training import grading
    from grader.sandbox import _kernel_env

    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    env = _kernel_env()
    assert env["NBGRADER_EXECUTION"]
    monkeypatch.setenv("NBGRADER_EXECUTION", env["NBGRADER_EXECUTION"])
    assert grading()
    budgets = [path.name for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")) if "grading()" in path.read_text()]
    assert {"09_transformer.ipynb", "10_seq2seq_rnn.ipynb", "12_gpt.ipynb", "13_rope.ipynb"} <= set(budgets)


@pytest.mark.parametrize("assignment", course.assignments())
def test_each_notebook_offers_the_check_of_its_first_exercise(assignment):
    """The paragraph above the check cell names a call that works: its notebook's first exercise."""
    import re

    import nbformat

    [path] = (course.NOTEBOOKS / assignment).glob("*.ipynb")
    text = nbformat.read(path, as_version=4).cells[-2].source
    if not course.sections(assignment):          # a notebook whose exercises are still to come: no call to offer
        assert "check_my_work(\"" not in text, text
        return
    [name] = re.findall(r'check_my_work\("(\w+)"\)', text)
    assert kernelcheck.exercise_of(name) == next(iter(course.sections(assignment)))


@pytest.mark.kernel
def test_in_a_real_kernel_the_learner_s_own_cells_are_judged(tmp_path):
    """A Jupyter kernel of this environment: the cells a learner ran define dot_product and
    cosine_similarity (the latter calling the former); check_my_work("cosine_similarity")
    judges what IPython's namespace holds now, and a redefinition is judged at once."""
    from jupyter_client.manager import start_new_kernel

    from grader.release import use_this_environment

    use_this_environment()
    env = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "COURSE_CHECK_URL")}
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "data")
    km, client = start_new_kernel(kernel_name="python3", env=env, cwd=str(course.ROOT))
    try:
        def run(code: str) -> str:
            reply = client.execute_interactive(code, timeout=120, output_hook=lambda m: said.append(m))
            assert reply["content"]["status"] == "ok", said
            return "".join(m["content"].get("text", "") for m in said if m["msg_type"] == "stream")

        said = []
        run("import numpy as np\n"
            "def dot_product(a, b):\n    return np.sum(np.asarray(a) * np.asarray(b), axis=-1)\n"
            "def cosine_similarity(a, b, eps=1e-8):\n"
            "    return dot_product(a, b) / np.maximum(np.sqrt(dot_product(a, a) * dot_product(b, b)), eps)")
        said = []
        out = run('from coursekit.check import check_my_work\ncheck_my_work("cosine_similarity")')
        assert out.splitlines()[1] == "  PASS  similarity-cosine_similarity  2/2", out
        said = []
        run("def cosine_similarity(a, b, eps=1e-8):\n    return dot_product(a, b)")  # forgot to divide by the lengths
        said = []
        out = run('check_my_work("cosine_similarity")')
        assert out.splitlines()[1] == "  FAIL  similarity-cosine_similarity  0/2", out
        assert "what went wrong: " in out and "hint: " in out
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)
