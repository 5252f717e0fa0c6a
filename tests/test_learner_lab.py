"""The learner's JupyterLab, as `make lab` starts it (lab/ on JUPYTER_CONFIG_PATH), in a
real browser (tests/lab.py; one server start): a notebook opens unmodified once its kernel
has started, nbgrader's instructor screens (formgrader, the course list, the assignment
list, Create Assignment, and the Nbgrader menu that holds only them) are not there, their
server extensions answer 404, and the Validate button is on the notebook's toolbar.

The instructor's and the tests' JupyterLab keep them all (tests/test_browser.py,
tests/test_formgrader_buttons.py, tests/test_hub.py use formgrader): nothing is disabled in
the venv. The notebook's own file is unchanged afterwards.
"""
from __future__ import annotations

import urllib.error
import urllib.request

import nbformat
import pytest

from tests import lab as browser_lab

pytestmark = [pytest.mark.browser, pytest.mark.kernel]

NOTEBOOK = "01_similarity/01_similarity.ipynb"
INSTRUCTOR_COMMANDS = {"nbgrader:open-formgrader", "nbgrader:open-formgrader-local", "nbgrader:open-create-assignment",
                       "nbgrader:open-assignment-list", "nbgrader:open-course-list"}


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_learners_lab_opens_a_notebook_unmodified_without_instructor_screens(tmp_path):
    browser_lab.require_chromium()
    with browser_lab.serve(tmp_path, learner=True) as running, browser_lab.browser(tmp_path) as context:
        on_disk = (running.root / NOTEBOOK).read_bytes()
        for endpoint in ("formgrader", "assignments", "courses"):  # nbgrader's instructor server extensions
            assert _status(f"{running.url}/{endpoint}?token={running.token}") == 404, endpoint
        assert _status(f"{running.url}/lab?token={running.token}") == 200
        page = browser_lab.open_lab(context, running)
        cells = len(nbformat.read(running.root / NOTEBOOK, as_version=4).cells)
        browser_lab.open_notebook(page, NOTEBOOK, cells=cells, kernel=True)
        state = browser_lab.evaluate_async(page, """async () => {
            const panel = window.jupyterapp.shell.currentWidget;
            const info = await panel.sessionContext.session.kernel.info;  // JupyterLab writes it into the metadata
            await new Promise(resolve => setTimeout(resolve, 1000));
            return {dirty: panel.context.model.dirty, kernel: info.language_info,
                    metadata: panel.context.model.getMetadata('language_info'),
                    dirtyTab: document.querySelectorAll('.lm-TabBar-tab.jp-mod-dirty').length};
        }""")
        assert state["kernel"]["version"] and state["metadata"] == state["kernel"]
        assert state["dirty"] is False and state["dirtyTab"] == 0, state
        menus = page.evaluate("() => Array.from(document.querySelectorAll('.lm-MenuBar-itemLabel')).map(e => e.textContent)")
        assert "Kernel" in menus and "Nbgrader" not in menus, menus
        commands = set(page.evaluate("() => window.jupyterapp.commands.listCommands()"))
        assert commands & INSTRUCTOR_COMMANDS == set()
        toolbar = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar")
        assert toolbar.get_by_role("button", name="Validate").count() == 1
        page.close()
        assert (running.root / NOTEBOOK).read_bytes() == on_disk
