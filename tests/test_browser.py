"""JupyterLab in a real browser, as a learner uses it (tests/lab.py drives it).

One JupyterLab 4 server with nbgrader's extensions, on loopback with a token, serves a
temporary copy of the course as `make lab` does; Playwright drives Debian's chromium
(never a downloaded browser). For every assignment of grader.course.assignments() the
student notebook is opened and must render its markdown, its math (MathJax) and its
images; the first assignment's solution notebook is run from the Run menu and must show
its figures as loaded images with no error or stderr output (every solution's outputs
are checked where the solutions are graded, tests/test_pipeline.py). nbgrader's Validate button must fail the
untouched student notebook of the first assignment and pass it filled in with the
solutions. Screenshots go to out/screenshots/ (`make screenshots` writes docs/screenshots/
with the same code).

The server's kernels run with NBGRADER_EXECUTION=1, as while nbgrader grades, so that
the training notebooks train briefly (exercise-standard.md: at most 30 s each then).

An attacking class (tests/lab.py ``attacking_class``: an honest student and one whose
notebook carries script in markdown, in outputs of every kind and in an exception
message) is graded with the real grader; its feedback pages, formgrader's view of its
autograded notebooks (a Jupyter server on the workspace, as the grader's README says)
and the class report are opened: no student script may run (no dialog, no console
line, no global set, no call to the Jupyter API), and no page may request anything
the honest student's page does not; nothing off this machine is ever reachable.

Without chromium at /usr/bin/chromium these tests fail and say how to install it; they
are never skipped.
"""
from __future__ import annotations

import json

import nbformat
import pytest

from grader import course
from tests import lab as browser_lab

pytestmark = [pytest.mark.browser, pytest.mark.kernel]

SHOTS = course.ROOT / "out" / "screenshots"


@pytest.fixture(scope="module")
def chromium_context(tmp_path_factory):
    """One chromium (Playwright's sync API allows one at a time) for the module's tests."""
    browser_lab.require_chromium()
    with browser_lab.browser(tmp_path_factory.mktemp("chromium")) as context:
        yield context


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium_context):
    """(the running Lab, a page with JupyterLab loaded)."""
    workdir = tmp_path_factory.mktemp("lab")
    with browser_lab.serve(workdir) as running:
        page = browser_lab.open_lab(chromium_context, running)
        yield running, page
        page.close()  # before the server stops


@pytest.mark.parametrize("assignment_id", course.assignments())
def test_student_notebook_renders(lab, assignment_id):
    running, page = lab
    problems = browser_lab.render(page, running, assignment_id, SHOTS)
    assert not problems, f"{assignment_id} student notebook:\n" + "\n".join(problems)
    assert (SHOTS / f"{assignment_id}.png").stat().st_size > 10_000


def test_a_solution_runs_from_the_run_menu_and_shows_its_figures(lab):
    """JupyterLab runs a notebook in its kernel and shows its figures: once, on the first
    notebook. That every solution runs without an error or output on stderr and shows each
    of its figures is checked on the graded solutions (tests/test_pipeline.py), and `make
    screenshots` runs them all here."""
    running, page = lab
    assignment_id = course.assignments()[0]
    problems = browser_lab.run_solution(page, running, assignment_id, SHOTS)
    assert not problems, f"{assignment_id} solution notebook, run all:\n" + "\n".join(problems)
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


# ---------------------------------------------------------------------------- issue 21

@pytest.fixture(scope="module")
def attacked(tmp_path_factory, chromium_context):
    """The attacking class graded (ada honest, mallory attacking), its report written,
    and the chromium context: {"out", "rows", "context", "workdir"}."""
    from grader.grade import grade_class
    from grader.report import write_report

    workdir = tmp_path_factory.mktemp("attacked")
    submissions = browser_lab.attacking_class(workdir / "submitted")
    out = workdir / "out"
    rows = {r.student_id: r for r in grade_class(out, submitted=submissions, progress=False, jobs=1)}
    write_report(out, progress=False)
    return {"out": out, "rows": rows, "context": chromium_context, "workdir": workdir}


def _same_requests(attacker: browser_lab.Visit, honest: browser_lab.Visit, ids: dict[str, str]) -> list[str]:
    """Requests the attacker's page made that the honest page did not (ids normalised)."""
    def norm(urls):
        out = set()
        for url in urls:
            for old, new in ids.items():
                url = url.replace(old, new)
            out.add(url)
        return out
    return sorted(norm(attacker.requests) - norm(honest.requests))


def _assert_inert(attacker: browser_lab.Visit, honest: browser_lab.Visit, ids: dict[str, str]) -> None:
    assert not attacker.ran, "a student's script ran:\n" + "\n".join(attacker.ran)
    assert not honest.ran
    extra = _same_requests(attacker, honest, ids)
    assert not extra, "requests only the attacker's page made:\n" + "\n".join(extra)
    leaks = [u for u in attacker.requests + attacker.blocked if browser_lab.EVIL_HOST in u]
    assert not leaks, leaks
    assert sorted(set(attacker.blocked)) == sorted(set(honest.blocked)), "off-machine requests differ"


def test_feedback_of_an_attacking_student_runs_nothing_and_requests_nothing_new(attacked):
    assert attacked["rows"]["mallory"].status.startswith("graded"), attacked["rows"]["mallory"].status
    graded = nbformat.read(attacked["out"] / "autograded" / "mallory" / "01_similarity" /
                           "01_similarity.ipynb", as_version=4)
    shown = {mime for c in graded.cells for o in c.get("outputs", []) for mime in o.get("data", {})}
    assert {"text/html", "text/markdown", "application/javascript", "image/svg+xml"} <= shown, shown
    assert "onerror" in attacked["rows"]["mallory"].diagnoses["similarity-dot_product"]  # the attack is real
    pages = {s: attacked["out"] / "feedback" / s / "01_similarity" / "01_similarity.html"
             for s in ("ada", "mallory")}
    visits = {s: browser_lab.visit_page(attacked["context"], page.as_uri(), SHOTS / f"html-safety-feedback-{s}.png")
              for s, page in pages.items()}
    _assert_inert(visits["mallory"], visits["ada"], {"mallory": "STUDENT", "ada": "STUDENT"})
    honest = visits["ada"]
    # the honest student's page still reads as it should: prose, headings, figures
    assert honest.figures and all(honest.figures), honest.figures
    assert len(visits["mallory"].figures) >= len(honest.figures)
    for words in ("Similarity", "The dot product", "Cosine similarity", "Your feedback"):
        assert words in honest.text, words
    # the attacker's exception message is there, as characters
    assert "$\\frac{1}{$" in visits["mallory"].text and "<script>" in visits["mallory"].text


def test_formgrader_shows_an_attacking_notebook_inert(attacked):
    from nbgrader.api import Gradebook

    from grader.coursedir import CourseDir

    out = attacked["out"]
    with Gradebook(CourseDir.open(out).db_url) as gb:
        ids = {s: gb.find_submission_notebook("01_similarity", "01_similarity", s).id for s in ("ada", "mallory")}
    with browser_lab.serve_workspace(out, attacked["workdir"]) as server:
        visits = {}
        for student, submission in ids.items():
            url = f"{server.url}/formgrader/submissions/{submission}/?token={server.token}"
            visits[student] = browser_lab.visit_page(attacked["context"], url,
                                                     SHOTS / f"html-safety-formgrade-{student}.png", settle_ms=4000)
        log = server.log_tail()
    mallory, ada = visits["mallory"], visits["ada"]
    for v in (mallory, ada):  # the formgrader rendered the autograded notebook
        assert "Submission 1 / 2" in v.text or "Submission 2 / 2" in v.text, (v.url, v.text[:500], log)
        assert "The dot product" in v.text
    _assert_inert(mallory, ada, {ids["mallory"]: "ID", ids["ada"]: "ID", "mallory": "STUDENT", "ada": "STUDENT"})
    assert ada.figures and all(ada.figures), ada.figures


def test_the_class_report_of_an_attacking_class_runs_nothing(attacked):
    visit = browser_lab.visit_page(attacked["context"], (attacked["out"] / "report" / "index.html").as_uri(),
                                   SHOTS / "html-safety-report.png", settle_ms=500)
    assert not visit.ran and not visit.blocked, (visit.ran, visit.blocked)
    assert all(u.startswith("file:") for u in visit.requests), visit.requests
    assert len(visit.images) == 3 and all(visit.images), visit.images  # its figures, allowed by its policy
    assert "$\\frac{1}{$" in visit.text and "<img src=x onerror=" in visit.text
