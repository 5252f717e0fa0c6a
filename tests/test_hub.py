"""The course on a real JupyterHub: an instructor and two students, in chromium.

One scenario, run once by the module fixture ``term``: ``hub/launch.py`` starts JupyterHub
6 (from the dev venv, as root, on loopback) with PAM logins of real local accounts
(instructor, ada, chloe), the proxy from the npm registry (``make hub-deps``), each
student's server from the student environment and the instructor's from the instructor
environment. In Playwright on Debian's chromium (headless), each person logs in through
the hub's login form in a browser context of their own, and:

1. the instructor opens formgrader (it shows the course's assignments) and presses its
   Generate and Release buttons for 01_similarity;
2. each student opens Nbgrader > Assignment List and presses Fetch; "works": the answers
   of a sample_class notebook (ada's: 10/10, chloe's: 2/10) are saved over the fetched
   notebook through the student's own Jupyter contents API, from their browser session
   (not typed key by key); opens it, runs the check-my-work cell in the page and the
   output is read from the page; presses Submit;
3. the instructor presses formgrader's Collect button, grades with ``course-grader grade``
   run as the instructor's account, and presses Release Feedback;
4. each student presses Fetch Feedback, follows "(view feedback)" and opens the feedback
   page, which shows their own score.

Each step's outcome is kept; each test asserts one of them (tests/test_term.py's Term).
Screenshots go to out/screenshots/hub-*.png. Missing chromium, proxy, bubblewrap or
/usr/bin/python3.11 fails every test with the install command.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from grader import course
from hub import launch
from tests import lab as browser_lab
from tests.test_term import Term

pytestmark = [pytest.mark.hub, pytest.mark.browser]

A = "01_similarity"
NB = f"{A}.ipynb"
INSTRUCTOR = "afs_hub_teacher"
PERSONAS = {"afs_hub_ada": "ada", "afs_hub_chloe": "chloe"}  # account -> sample_class student
EXPECTED = {s: json.loads((course.SAMPLE_CLASS / p / "expected.json").read_text())[A] for s, p in PERSONAS.items()}
SHOTS = course.ROOT / "out" / "screenshots"
LOGIN_SECONDS = 180  # login, then the single-user server's start (a first JupyterLab start is slow)
CHECK_SECONDS = 240
GRADE_TIMEOUT = 600


def _login(context, hub, user: str):
    """A page of ``user``'s JupyterLab, reached through the hub's login form."""
    page = browser_lab.record_dialogs(context.new_page())
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub.passwords[user])
    page.click("#login_submit")
    page.wait_for_url(re.compile(rf".*/user/{user}/lab.*"), timeout=LOGIN_SECONDS * 1000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=LOGIN_SECONDS * 1000)
    browser_lab.evaluate_async(page, "() => window.jupyterapp.restored")
    return page


def _assignment_list(page):
    """Nbgrader > Assignment List, as a student opens it from the menu bar."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
    page.wait_for_selector("#nbgrader-assignment-list", timeout=30_000)


def _row(page, section: str):
    """01_similarity's row in one section of the Assignment List (released, fetched, submitted)."""
    return page.locator(f"#{section}_assignments_list .list_item", has_text=A).first  # then its notebooks' rows


def _press_in_list(page, section: str, label: str, then: str) -> None:
    """Press ``label`` in 01_similarity's row of ``section``; wait for it to show in ``then``."""
    _row(page, section).locator("button", has_text=label).click()
    _row(page, then).wait_for(timeout=120_000)


def _kernel_says(page, code: str) -> str:
    """What ``code`` prints, run in the kernel of the notebook open in the page (the student's own)."""
    return browser_lab.evaluate_async(page, """async (code) => {
        const panel = Array.from(window.jupyterapp.shell.widgets('main'))
            .find(w => w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel);
        const kernel = panel.sessionContext.session.kernel;
        let out = '';
        const future = kernel.requestExecute({code});
        future.onIOPub = (msg) => {
            if (msg.header.msg_type === 'stream') { out += msg.content.text; }
            if (msg.header.msg_type === 'error') { out += msg.content.ename + ': ' + msg.content.evalue; }
        };
        await future.done;
        return out;
    }""", code)


def _answer_bearing(hub) -> list[str]:
    """Every path under what the launcher says no student may read (``Hub.private``): each
    file and folder, except inside a venv, node_modules/ or .git/, of which the folder
    itself is listed and, for a venv, an editable install's files (its pointers into the
    checkout)."""
    def opaque(folder: Path) -> list[Path] | None:
        if (folder / "pyvenv.cfg").exists():
            return [folder, *folder.glob("lib/python*/site-packages/__editable__*")]
        return [folder] if folder.name in ("node_modules", ".git") else None

    paths = []
    for root in hub.private.values():
        if opaque(root) is not None:
            paths += opaque(root)
            continue
        paths.append(root)
        for folder, dirs, files in os.walk(root):
            for name in list(dirs):
                inside = opaque(Path(folder) / name)
                paths += inside or [Path(folder) / name]
                if inside is not None:
                    dirs.remove(name)
            paths += [Path(folder) / name for name in files]
    return sorted({str(p) for p in paths})


# Run in a student's kernel after PATHS, CHECKOUT and INSTRUCTOR_PYTHON are set: how many of
# PATHS it can open (a folder: list) and the first of them (a few lines: the server limits a
# kernel's output rate), and whether the grader and its references import: from the
# student's environment, with the checkout put on sys.path, and with the instructor
# environment's own interpreter.
PROBE = """
import json, os, subprocess, sys
readable = []
for path in PATHS:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, 'rb').close()
        readable.append(path)
    except OSError:
        pass
imports = {}
for python, code in [(sys.executable, 'import grader'), (sys.executable, 'import grader.checks.reference'),
                     (sys.executable, f'import sys; sys.path.insert(0, {CHECKOUT!r}); import grader.checks.reference'),
                     (INSTRUCTOR_PYTHON, 'import grader.checks.reference')]:
    try:
        done = subprocess.run([python, '-c', code], capture_output=True, text=True, timeout=60)
        imports[f'{python}: {code}'] = 'imported' if done.returncode == 0 else done.stderr.strip().splitlines()[-1]
    except OSError as error:
        imports[f'{python}: {code}'] = repr(error)
print(json.dumps({'readable': len(readable), 'first readable': readable[:20], 'imports': imports}))
"""


def _processes_of_hub(hub) -> dict[int, psutil.Process]:
    """The hub's processes while it runs, found by the test itself: its descendants (the proxy,
    the check service, the single-user servers, their kernels) and every process of a course
    account."""
    found = psutil.Process(hub.process.pid).children(recursive=True)
    found += launch.processes_of({hub.home(u).stat().st_uid for u in [hub.instructor, *hub.students]})
    return {p.pid: p for p in found}


def _answered(persona: str, fetched: dict) -> dict:
    """The fetched notebook with the answer cells of sample_class/<persona> (by grade_id)."""
    sample = nbformat.read(course.SAMPLE_CLASS / persona / A / NB, as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in sample.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.from_dict(fetched)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution") and grade_id in answers:
            cell.source = answers[grade_id]
    return json.loads(nbformat.writes(nb))


@pytest.fixture(scope="module")
def term():
    """The scenario, step by step (see the module's docs); what each step left."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    t = Term()
    started = time.monotonic()
    try:
        browser_lab.chromium()
        launch.require()
    except (browser_lab.BrowserMissing, launch.EnvironmentMissing) as error:
        pytest.fail(str(error), pytrace=False)
    processes = {}
    with launch.start(instructor=INSTRUCTOR, students=tuple(PERSONAS),
                      spawner_args=("--LabApp.expose_app_in_browser=True",)) as hub, \
            browser_lab.chromium_browser() as chromium:
        t.seconds["hub up"] = time.monotonic() - started
        t["hub"] = hub
        contexts = {u: chromium.new_context(viewport=browser_lab.VIEWPORT) for u in [INSTRUCTOR, *PERSONAS]}
        pages = {}
        _run(t, hub, contexts, pages)
        for context in contexts.values():
            context.close()
        processes = _processes_of_hub(hub)
        t["hub processes"] = {pid: " ".join(p.cmdline()) for pid, p in processes.items()}
        # the hub dies as the OOM killer would kill it: the launcher stops what it started, not the hub
        hub.process.kill()
    # a process being killed gets a moment to die; one nobody stopped does not
    alive = psutil.wait_procs(list(processes.values()), timeout=10)[1]
    t["survivors"] = {p.pid: t["hub processes"][p.pid] for p in alive}
    t.seconds["total"] = time.monotonic() - started
    print("\nhub steps (s): " + ", ".join(f"{k} {v:.0f}" for k, v in t.seconds.items()), file=sys.stderr)
    return t


def _run(t: Term, hub, contexts, pages) -> None:
    user_url = hub.user_url(INSTRUCTOR)

    def instructor_release():
        page = pages[INSTRUCTOR] = _login(contexts[INSTRUCTOR], hub, INSTRUCTOR)
        browser_lab.open_formgrader(page, user_url, "manage_assignments")
        t["formgrader assignments"] = page.inner_text("#main-table")
        page.screenshot(path=str(SHOTS / "hub-formgrader.png"), full_page=True)
        row = page.locator(browser_lab.FORMGRADER_ROWS).filter(has=page.locator("td.name", has_text=A))
        t["generate"] = browser_lab.press_formgrader(
            page, row.locator("td.assign a:has(span.glyphicon-education)"), f"Generate of {A}", hub.log_tail)
        t["release"] = browser_lab.press_formgrader(
            page, row.locator("td.release a:has(span.glyphicon-cloud-upload)"), f"Release of {A}", hub.log_tail)
        t["released"] = (hub.exchange / launch.COURSE_ID / "outbound" / A / NB).read_text(encoding="utf-8")

    def students_work():
        for user, persona in PERSONAS.items():
            page = pages[user] = _login(contexts[user], hub, user)
            _assignment_list(page)
            _row(page, "released").wait_for(timeout=60_000)
            _press_in_list(page, "released", "Fetch", then="fetched")
            path = f"{A}/{NB}"
            fetched = browser_lab.evaluate_async(page, "async (p) => (await window.jupyterapp.serviceManager.contents.get(p)).content",
                                    path)
            browser_lab.evaluate_async(page, "async ([p, nb]) => window.jupyterapp.serviceManager.contents.save(p, "
                          "{type: 'notebook', format: 'json', content: nb})", [path, _answered(persona, fetched)])
            cells = len(fetched["cells"])
            browser_lab.open_notebook(page, path, cells, kernel=True, timeout=120)
            # the check-my-work cell, the last one, run as a learner runs it (Shift-Enter's command)
            browser_lab.evaluate_async(page, """(n) => { const nb = window.jupyterapp.shell.currentWidget.content;
                                      nb.activeCellIndex = n - 1;
                                      return window.jupyterapp.commands.execute('notebook:run-cell'); }""", cells)
            last = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(cells - 1)
            last.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for(timeout=CHECK_SECONDS * 1000)
            last.scroll_into_view_if_needed()
            t[f"check {user}"] = last.locator(".jp-OutputArea").inner_text()
            t[f"check log {user}"] = hub.log_tail(60)  # the service logs why a check failed
            page.screenshot(path=str(SHOTS / ("hub-check-my-work.png" if persona == "ada" else
                                              f"hub-check-my-work-{persona}.png")))
            t[f"import grader {user}"] = _kernel_says(page, "try:\n import grader\n print('imported')\n"
                                                            "except ImportError as e:\n print(repr(e))")
            t[f"read course {user}"] = _kernel_says(
                page, f"import os\ntry:\n print(os.listdir({str(hub.course)!r}))\nexcept OSError as e:\n"
                      " print(type(e).__name__)")
            t[f"formgrader status {user}"] = page.request.get(f"{hub.user_url(user)}/formgrader").status
            t[f"formgrader command {user}"] = page.evaluate(
                "() => window.jupyterapp.commands.hasCommand('nbgrader:open-formgrader')")
            _assignment_list(page)
            _press_in_list(page, "fetched", "Submit", then="submitted")

    def collect_grade_release():
        page = pages[INSTRUCTOR]
        browser_lab.open_formgrader(page, user_url, "manage_assignments")
        row = page.locator(browser_lab.FORMGRADER_ROWS).filter(has=page.locator("td.name", has_text=A))
        t["collect"] = browser_lab.press_formgrader(
            page, row.locator("td.collect a:has(span.glyphicon-cloud-download)"), f"Collect of {A}", hub.log_tail)
        grader = hub.instructor_python.parent / "course-grader"
        t["grade"] = hub.run_as(INSTRUCTOR, grader, "grade", "--course", hub.course, timeout=GRADE_TIMEOUT)
        t["grades.csv"] = (hub.course / "grades.csv").read_text(encoding="utf-8")
        t["submission owners"] = {u: (hub.course / "submitted" / u / A / NB).stat().st_uid for u in PERSONAS}
        t["instructor uid"] = hub.home(INSTRUCTOR).stat().st_uid
        browser_lab.open_formgrader(page, user_url, "manage_assignments")
        row = page.locator(browser_lab.FORMGRADER_ROWS).filter(has=page.locator("td.name", has_text=A))
        t["release feedback"] = browser_lab.press_formgrader(
            page, row.locator("td.release-feedback a:has(span.glyphicon-envelope)"), f"Release Feedback of {A}",
            hub.log_tail)

    def students_feedback():
        private = t["answer-bearing paths"] = _answer_bearing(hub)  # after grading: the gradebook is there
        t["course secret"] = str(hub.secret)  # (the account is gone when the tests read it)
        for user, persona in PERSONAS.items():
            page = pages[user]
            _assignment_list(page)
            _row(page, "submitted").locator("button", has_text="Fetch Feedback").click()
            link = _row(page, "submitted").locator("a", has_text="view feedback")
            link.wait_for(timeout=120_000)
            link.click()  # the file browser goes to the feedback folder
            listing = browser_lab.evaluate_async(page, """async (p) => (await window.jupyterapp.serviceManager.contents.get(p)).content
                                       .map(e => e.path)""", f"{A}/feedback")
            [stamp] = listing
            html_path = f"{stamp}/{NB.replace('.ipynb', '.html')}"
            t[f"feedback path {user}"] = html_path
            feedback = contexts[user].new_page()
            feedback.goto(f"{hub.user_url(user)}/files/{html_path}")
            t[f"feedback {user}"] = feedback.inner_text("body")
            feedback.screenshot(path=str(SHOTS / ("hub-feedback.png" if persona == "ada" else
                                                  f"hub-feedback-{persona}.png")))
            feedback.close()
            said = _kernel_says(page, f"PATHS = {private!r}\nCHECKOUT = {str(launch.ROOT)!r}\n"
                                      f"INSTRUCTOR_PYTHON = {str(hub.instructor_python)!r}\n{PROBE}")
            t[f"probe {user}"] = json.loads(said) if said.startswith("{") else {"error": said}
            t[f"other feedback {user}"] = feedback_of_others = []
            for other in PERSONAS:
                if other != user:
                    done = hub.run_as(user, "ls", hub.home(other), check=False)
                    feedback_of_others.append(done.returncode)

    for name, action in [("instructor release", instructor_release), ("students work", students_work),
                         ("collect grade release", collect_grade_release), ("students feedback", students_feedback)]:
        if t.failed:  # a later step needs the earlier ones
            t.failed.setdefault(name, "an earlier step failed")
            continue
        t.step(name, action)
        if name in t.failed:
            t.failed[name] += f"\n--- hub log ---\n{hub.log_tail(60)}"


# --- the cases ----------------------------------------------------------------------------------


def test_formgrader_on_the_instructors_server_shows_the_course_and_releases(term):
    term.need("instructor release")
    assert A in term["formgrader assignments"], term["formgrader assignments"]
    assert f"Successfully released '{A}'" in term["release"] or "released" in term["release"].lower(), term["release"]
    assert json.loads(term["released"])["cells"]  # the student version, in the exchange
    assert "BEGIN SOLUTION" not in term["released"]


def test_students_check_their_work_in_the_browser(term):
    term.need("students work")
    for user in PERSONAS:
        out = term[f"check {user}"]
        assert out.strip(), f"the check cell of {user} printed nothing"
        expected = EXPECTED[user]
        assert f"Score: {expected['score']:g}/10" in out, out + "\n--- hub log ---\n" + term[f"check log {user}"]
        for exercise, points in expected["exercises"].items():
            assert re.search(rf"(PASS|FAIL)\s+{re.escape(exercise)}\s+{points:g}/", out), (exercise, out)


def test_students_have_no_grader_no_formgrader_and_cannot_read_the_course(term):
    term.need("students work")
    for user in PERSONAS:
        assert "ModuleNotFoundError" in term[f"import grader {user}"], term[f"import grader {user}"]
        assert term[f"read course {user}"].strip() == "PermissionError", term[f"read course {user}"]
        assert term[f"formgrader status {user}"] == 404
        assert term[f"formgrader command {user}"] is False


def test_submissions_are_collected_and_graded_as_the_instructor(term):
    term.need("collect grade release")
    import csv
    import io

    rows = {r["student_id"]: r for r in csv.DictReader(io.StringIO(term["grades.csv"])) if r["assignment_id"] == A}
    assert {s: float(r["score"]) for s, r in rows.items()} == {s: e["score"] for s, e in EXPECTED.items()}, (
        term["grades.csv"])
    assert set(term["submission owners"].values()) == {term["instructor uid"]}  # collected by the instructor


def test_each_student_sees_their_own_grade_in_their_feedback(term):
    term.need("students feedback")
    for user in PERSONAS:
        text = term[f"feedback {user}"]
        assert f"Your feedback: {EXPECTED[user]['score']:g} / 10 points" in text, text[:2000]
        for other in PERSONAS:
            if other != user and EXPECTED[other]["score"] != EXPECTED[user]["score"]:
                assert f"Your feedback: {EXPECTED[other]['score']:g} / 10" not in text
        assert all(code != 0 for code in term[f"other feedback {user}"]), "a student can list another's home"


def test_no_student_reads_an_answer_bearing_path_of_the_hub_or_imports_the_grader(term):
    """From each student's own kernel on the hub: open() on every path of what the launcher
    put where students must not read it (the checkout, the instructor environment, the course
    directory and gradebook, the secrets, the hub's state and log) fails, and the grader with
    its references imports neither from the student's environment, nor with the checkout on
    sys.path, nor through the instructor environment's interpreter."""
    term.need("students feedback")
    paths = term["answer-bearing paths"]
    # (the course directory's source/ is the checkout's solutions/: grader/coursedir.py)
    must = {"a solution notebook": f"/solutions/{A}/{NB}", "a reference": "/grader/checks/reference/",
            "the gradebook": "/course/gradebook.db", "a submission": f"/course/submitted/afs_hub_ada/{A}/{NB}",
            "the course secret": term["course secret"], "the editable install": "__editable__"}
    assert not [what for what, part in must.items() if not any(part in p for p in paths)], must
    for user in PERSONAS:
        probe = term[f"probe {user}"]
        assert "error" not in probe, probe
        assert probe["readable"] == 0, f"{user} reads {probe['readable']} of {len(paths)}: {probe['first readable']}"
        assert not [code for code, said in probe["imports"].items() if said == "imported"], probe["imports"]


def test_stopping_the_hub_stops_every_process_it_started(term):
    """The hub's proxy (root's, a session of its own), the check service, the single-user
    servers and their kernels, recorded while the hub ran, are all gone once the launcher's
    context has ended, even though the hub itself was killed before it could stop them."""
    assert term.get("hub processes"), "no process of the hub was recorded"
    commands = " ".join(term["hub processes"].values())
    assert "configurable-http-proxy" in commands and "serve-checks" in commands, commands
    assert "ipykernel" in commands and "jupyterhub-singleuser" in commands, commands
    assert term["survivors"] == {}, term["survivors"]
