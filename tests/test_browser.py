"""JupyterLab in a real browser, as a learner uses it (tests/lab.py drives it).

One JupyterLab 4 server with nbgrader's extensions, on loopback with a token, serves a
temporary copy of the course as `make lab` does; Playwright drives Debian's chromium
(never a downloaded browser). For every assignment of grader.course.assignments() the
student notebook is opened and must render its markdown, its math (MathJax) and its
images, and the solution notebook is run from the Run menu and must show its figures as
loaded images with no error or stderr output. nbgrader's Validate button must fail the
untouched student notebook of the first assignment and pass it filled in with the
solutions. Screenshots go to out/screenshots/ (`make screenshots` writes docs/screenshots/
with the same code).

The server's kernels run with NBGRADER_EXECUTION=1, as while nbgrader grades, so that
the training notebooks train briefly (exercise-standard.md: at most 30 s each then).

Without chromium at /usr/bin/chromium these tests fail and say how to install it; they
are never skipped.
"""
from __future__ import annotations

import json

import nbformat
import pytest

from grader import course
from tests import lab as browser_lab

SHOTS = course.ROOT / "out" / "screenshots"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(the running Lab, a page with JupyterLab loaded)."""
    try:
        browser_lab.chromium()
    except browser_lab.BrowserMissing as error:  # a failure with the install command, never a skip
        pytest.fail(str(error), pytrace=False)
    workdir = tmp_path_factory.mktemp("lab")
    with browser_lab.serve(workdir) as running, browser_lab.browser(workdir) as context:
        yield running, browser_lab.open_lab(context, running)


@pytest.mark.parametrize("assignment_id", course.assignments())
def test_student_notebook_renders_and_solution_runs_with_figures(lab, assignment_id):
    running, page = lab
    found = browser_lab.visit(page, running, assignment_id, SHOTS)
    assert not found["render"], f"{assignment_id} student notebook:\n" + "\n".join(found["render"])
    assert not found["run"], f"{assignment_id} solution notebook, run all:\n" + "\n".join(found["run"])
    assert (SHOTS / f"{assignment_id}.png").stat().st_size > 10_000
    assert (SHOTS / f"{assignment_id}-figure.png").stat().st_size > 10_000


def test_validate_fails_an_untouched_notebook_and_passes_a_solved_one(lab):
    running, page = lab
    results = browser_lab.validate_both(page, running, course.assignments()[0], SHOTS)
    passed, text = results["student"]
    assert not passed and "The following cell failed" in text and "NotImplementedError" in text, text
    passed, text = results["filled"]
    assert passed and "Success! Your notebook passes all the tests." in text, text


def test_the_checks_see_what_is_broken(lab):
    """A notebook with bad math, a missing image, a warning on stderr and a failing cell:
    each is reported, so a pass above means something."""
    running, page = lab
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Broken\n\nBad math: $\\frac{1}$ and ![gone](no-such-image.png)"),
        nbformat.v4.new_code_cell("import sys; print('a warning', file=sys.stderr)"),
        nbformat.v4.new_code_cell("raise ValueError('broken on purpose')"),
        nbformat.v4.new_code_cell("print('never reached')"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (running.root / "broken.ipynb").write_text(json.dumps(nb))
    browser_lab.open_notebook(page, "broken.ipynb", len(nb.cells))
    rendered = "\n".join(browser_lab.wait_rendered(page, nb, timeout=5))
    assert "math error" in rendered and "image(s) in the source" in rendered, rendered
    ran = "\n".join(browser_lab.run_problems(nb, browser_lab.run_all(page, timeout=60)))
    assert "a warning" in ran and "ValueError: broken on purpose" in ran, ran
    assert "cell 3: not run" in ran and "no figure appeared" in ran, ran


def test_a_missing_chromium_fails_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(browser_lab, "CHROMIUM", tmp_path / "no-chromium")
    with pytest.raises(browser_lab.BrowserMissing, match="apt-get install chromium"):
        with browser_lab.browser(tmp_path):
            pass
