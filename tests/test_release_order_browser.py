"""The release order on formgrader's Generate button, pressed in chromium (the API-level
case is tests/test_release.py): a course directory whose gradebook holds 11_tokenization
with no due date, so open; Generate of 12_gpt, whose helper cells hold 11's answers, shows
formgrader's error dialog with the one-line reason and writes no release/12_gpt; once 11's
due date has passed, the same button generates it."""
from __future__ import annotations

import datetime

import pytest
from nbgrader.api import Gradebook

from grader.coursedir import CourseDir
from tests import lab as browser_lab

pytestmark = [pytest.mark.browser, pytest.mark.kernel]

LATER, EARLIER = "12_gpt", "11_tokenization"


def _generate(page, server):
    """Press Generate in the row of LATER on Manage Assignments; the result dialog's (id, text)."""
    browser_lab.open_formgrader(page, server.url, "manage_assignments")
    row = page.locator(browser_lab.FORMGRADER_ROWS).filter(has=page.locator("td.name", has_text=LATER))
    row.locator("td.assign a:has(span.glyphicon-education)").click()
    modal = page.locator(browser_lab.FORMGRADER_RESULT)
    modal.wait_for(state="visible", timeout=browser_lab.FORMGRADER_BUTTON_SECONDS * 1000)
    found = modal.get_attribute("id"), modal.inner_text()
    modal.locator("button.close", has_text="OK").click()
    modal.wait_for(state="detached", timeout=10_000)
    return found


def test_formgraders_generate_button_refuses_while_the_copied_assignment_is_open(tmp_path):
    import grader.release  # noqa: F401 - answers nbgrader's alembic question in process

    browser_lab.require_chromium()
    course_dir = CourseDir.open(tmp_path / "course")
    with Gradebook(course_dir.db_url) as gb:
        gb.update_or_create_assignment(EARLIER, duedate=None)
    released = course_dir.folder("release") / LATER / f"{LATER}.ipynb"
    with browser_lab.browser(tmp_path / "chromium") as context, \
            browser_lab.serve_workspace(course_dir.root, tmp_path) as server:
        page = context.new_page()
        page.goto(f"{server.url}/api/status?token={server.token}")  # the login cookie (tests/test_formgrader_buttons.py)
        kind, text = _generate(page, server)
        assert kind == "error-modal" and f"not releasing {LATER}" in text and f"{EARLIER} has no due date" in text, text
        assert not released.exists()

        with Gradebook(course_dir.db_url) as gb:
            gb.update_or_create_assignment(EARLIER, duedate=datetime.datetime(2020, 1, 1))
        kind, text = _generate(page, server)
        assert kind == "success-modal", (text, server.log_tail(40))
        assert released.is_file()
        page.close()
