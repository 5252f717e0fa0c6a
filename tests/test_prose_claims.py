"""No result typed in by hand: every claim tagged in a solution notebook's prose holds in one
run of that notebook (grader/claims.py; a run is kept until something it depends on changes,
tests/runs.py), and the mechanism itself catches a false claim, a claim the prose no longer
makes and a malformed one; a kept run is given back only for the same notebook, sources and
platform."""
from __future__ import annotations

import nbformat
import pytest

from grader import claims, course
from tests import runs


def _with_claims() -> list[str]:
    """The assignments whose source notebook tags claims (read without running anything)."""
    found = []
    for assignment in course.assignments():
        path = course.SOLUTIONS / assignment / f"{assignment}.ipynb"
        if claims.claims(nbformat.read(path, as_version=4)):
            found.append(assignment)
    return found


@pytest.mark.kernel
@pytest.mark.parametrize("assignment", _with_claims())
def test_every_claim_of_the_prose_holds_in_the_solution_s_run(assignment):
    verdicts = claims.verify(course.SOLUTIONS / assignment / f"{assignment}.ipynb", run=runs.kept())
    assert verdicts
    wrong = [str(v) for v in verdicts if not v.holds]
    assert not wrong, "the prose says what the run did not show:\n" + "\n".join(wrong)


def _notebook(tmp_path, cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for i, (kind, source, tagged) in enumerate(cells):
        cell = (nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell)(source)
        cell.id = f"c{i}"
        if tagged:
            cell.metadata["course"] = {"claims": tagged}
        nb.cells.append(cell)
    path = tmp_path / "claims.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.kernel
def test_a_false_claim_a_vanished_claim_and_a_bad_expression_fail(tmp_path):
    path = _notebook(tmp_path, [
        ("code", "x = 3", None),
        ("md", "The run below gives **x = 4** and then y grows\nto 12, twice x.", [
            {"text": "y grows to 12", "value": "str(y)"},                  # evaluated after c2: holds
            {"text": "twice x", "check": "y == 2 * x"},                     # holds
            {"text": "x = 4", "value": "x"},                                # the run gave 3
            {"text": "y is odd", "check": "y % 2 == 1"},                     # words not in the prose
            {"text": "twice x", "check": "z > 0"},                          # NameError
            {"text": "twice x", "value": "x / 2"},                          # a float: must be formatted
            {"text": "twice x", "check": "y"},                              # not a bool
        ]),
        ("code", "y = 12\nx = 6", None),
        ("code", "x = 100", None),
        ("md", "At the end x is 100.", [{"text": "x is 100", "value": "f'{x}'"},
                                        {"text": "x is 100", "check": "x == 6", "after": "c2"}]),
    ])
    verdicts = {(v.claim.text, v.claim.expression): v for v in claims.verify(path)}
    assert [k for k, v in verdicts.items() if v.holds] == [
        ("y grows to 12", "str(y)"), ("twice x", "y == 2 * x"), ("x is 100", "x == 6"), ("x is 100", "f'{x}'")]
    assert verdicts[("x = 4", "x")].why == "the run gives '6'"
    assert verdicts[("y is odd", "y % 2 == 1")].why == "the prose no longer says these words"
    assert verdicts[("twice x", "z > 0")].why.startswith("the expression raised NameError")
    assert "a value must be a str or an int, got type" in verdicts[("twice x", "x / 2")].why
    assert verdicts[("twice x", "y")].why == "a check must give a bool, got str '12'"


@pytest.mark.kernel
def test_numpy_and_torch_truth_values_count_as_bools(tmp_path):
    path = _notebook(tmp_path, [
        ("code", "import numpy as np, torch\na = np.arange(3)\nt = torch.tensor([1.0, 2.0])", None),
        ("md", "a is increasing, t sums to 3", [{"text": "a is increasing", "check": "np.all(np.diff(a) > 0)"},
                                               {"text": "t sums to 3", "check": "t.sum() == 3"},
                                               {"text": "t sums to 3", "value": "int(t.sum())"}]),
    ])
    assert [v.holds for v in claims.verify(path)] == [True, True, True]


@pytest.mark.parametrize("entry, message", [
    ({"check": "True"}, "a claim is"),
    ({"text": "x", "check": "True", "value": "'x'"}, "a claim is"),
    ({"text": "x", "expect": "True"}, "a claim is"),
    ({"text": "x", "check": "True", "after": "nowhere"}, "'after' names no code cell"),
])
def test_a_malformed_claim_is_named_before_anything_runs(tmp_path, entry, message):
    path = _notebook(tmp_path, [("md", "x", [entry]), ("code", "1", None)])
    with pytest.raises(ValueError, match=message):
        claims.claims(nbformat.read(path, as_version=4))


def test_claims_on_a_code_cell_are_refused(tmp_path):
    path = _notebook(tmp_path, [("code", "1", [{"text": "1", "check": "True"}])])
    with pytest.raises(ValueError, match="markdown cells"):
        claims.claims(nbformat.read(path, as_version=4))


def test_a_run_is_kept_only_while_nothing_it_depends_on_changes(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_TEST_FRESH_RUNS", raising=False)
    package, folder = tmp_path / "src" / "coursekit", tmp_path / "solutions" / "01_x"
    package.mkdir(parents=True)
    folder.mkdir(parents=True)
    (package / "helpers.py").write_text("SEED = 0\n")
    ran = []

    def run(nb, where):
        ran.append(where)
        nb.cells[0].outputs = [nbformat.v4.new_output("stream", text=f"run {len(ran)}\n")]
        return nb

    keeping = runs.kept(run, runs=tmp_path / "runs", packages=(package,))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])

    def output(notebook):
        return keeping(notebook, folder).cells[0].outputs[0].text

    assert output(nb) == output(nb) == "run 1\n"          # the second is the kept run
    assert (tmp_path / "runs").stat().st_mode & 0o777 == 0o700  # executed solutions: no other account reads them
    (package / "helpers.py").write_text("SEED = 1\n")
    assert output(nb) == "run 2\n"                       # a package's file changed
    (folder / "data.txt").write_text("x")
    assert output(nb) == "run 3\n"                       # a file beside the notebook
    edited = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(2)")])
    assert output(edited) == "run 4\n"                   # the notebook itself
    assert output(nb) == "run 3\n"                       # the earlier key is still kept
    kept, = (tmp_path / "runs").glob(f"01_x-{runs.key(nb, folder, (package,))}.ipynb")
    kept.write_text("{not json")
    assert output(nb) == "run 5\n"                       # a torn file is run again
    monkeypatch.setenv("COURSE_TEST_FRESH_RUNS", "1")
    assert output(nb) == "run 6\n"
    assert not list((tmp_path / "runs").glob("*.part"))
    monkeypatch.delenv("COURSE_TEST_FRESH_RUNS")
    first = runs.key(nb, folder, (package,))
    for seed in range(2, 2 + runs.KEEP):                # KEEP more keys: the oldest runs go
        (package / "helpers.py").write_text(f"SEED = {seed}\n")
        output(nb)
    kept = sorted((tmp_path / "runs").glob("01_x-*.ipynb"))
    assert len(kept) == runs.KEEP and first not in "".join(p.name for p in kept)


def test_the_key_names_the_platform_and_the_installed_versions():
    described = runs._platform()
    assert f"nbformat=={nbformat.__version__}" in described.split("\n")
    import torch
    assert f"torch=={torch.__version__}" in described.split("\n")


def test_the_same_notebook_gives_the_same_probed_copy_and_key(tmp_path):
    path = _notebook(tmp_path, [("code", "x = 3", None), ("md", "x is 3", [{"text": "x is 3", "value": "x"}])])
    nb = nbformat.read(path, as_version=4)
    found = claims.order(nb, claims.claims(nb))
    first, second = claims.with_probes(nb, found), claims.with_probes(nb, found)
    assert nbformat.writes(first) == nbformat.writes(second)
    assert runs.key(first, tmp_path, ()) == runs.key(second, tmp_path, ())
