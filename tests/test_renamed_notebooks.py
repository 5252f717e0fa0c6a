"""Renamed notebooks, without kernels: the naming rule, what the student is told at submit,
and the feedback released under the name the student submitted.

The whole path (a real student renames, submits, is graded and fetches the feedback) is
tests/test_term.py's; formgrader's Autograde button on a renamed submission is
tests/test_formgrader_buttons.py's; check my work's line is tests/test_check_my_work.py's.
"""
from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path

import pytest
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.utils import notebook_hash
from traitlets.config import Config

from coursekit.naming import graded_as, naming_note
from grader.exchange import ReleaseFeedbackAsSubmitted, submitted_stem
from grader.stage import SUBMITTED_NAMES, BadSubmission, _Entry, _plan

A = "03_masking"
NB = f"{A}.ipynb"
RENAMED = "my masking (final).ipynb"


@pytest.mark.parametrize("present, graded", [
    ([NB], {A: NB}),
    ([RENAMED], {A: RENAMED}),  # a lone renamed notebook is graded as the released one
    ([NB, RENAMED], {A: NB}),  # the released name wins over a copy
    (["a.ipynb", "b.ipynb"], {}),  # which one? neither
    ([], {}),
])
def test_the_rule_is_the_stagings(present, graded):
    assert graded_as([A], present) == graded
    entries = [_Entry(name, "file", 10) for name in present]
    if graded:
        assert {n: e.name for n, e in _plan(entries, [A]).notebooks.items()} == graded
    else:
        with pytest.raises(BadSubmission):
            _plan(entries, [A])


def test_a_two_notebook_assignment_grades_no_renamed_notebook():
    assert graded_as(["a", "b"], ["a.ipynb", "mine.ipynb"]) == {"a": "a.ipynb"}


@pytest.mark.parametrize("name, present, said", [
    (NB, [NB, RENAMED], None),
    (RENAMED, None, f"'{RENAMED}' is not named as released: it will be graded as '{NB}'"),
    (RENAMED, [NB, RENAMED], f"'{RENAMED}' is not named as released ('{NB}'): it will not be graded, '{NB}' will"),
    ("a.ipynb", ["a.ipynb", "b.ipynb"], f"'a.ipynb' is not named as released ('{NB}') and will not be graded: "
                                        f"rename it '{NB}' (or keep it alone in its folder)"),
    ("x\x1b[2J.ipynb", None, "'x\\x1b[2J.ipynb' is not named as released"),  # a name is data in a terminal
])
def test_the_note_is_one_line_saying_how_it_is_graded(name, present, said):
    note = naming_note(name, [A], present)
    if said is None:
        assert note is None
    else:
        assert note.startswith(said) and "\n" not in note and "\x1b" not in note, note


def _feedback(tmp_path: Path, student: str, names: dict | str | None) -> tuple[Config, str]:
    """A course directory whose feedback/<student>/A/NB.html was graded from ``names``
    (what grading recorded; a str is written as it is), and a config with an exchange."""
    root = tmp_path / "course"
    folder = root / "feedback" / student / A
    folder.mkdir(parents=True)
    (folder / f"{A}.html").write_text(f"<p>feedback of {student}</p>")
    (folder / "timestamp.txt").write_text("2026-12-01 11:00:00.000000 UTC")
    secret = secrets.token_hex(64)
    (folder / "submission_secret.txt").write_text(secret)
    if names is not None:
        (folder / SUBMITTED_NAMES).write_text(names if isinstance(names, str) else json.dumps(names))
    config = Config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.course_id = "course"
    config.CourseDirectory.assignment_id = A
    config.Exchange.root = str(tmp_path / "exchange")
    return config, secret


@pytest.mark.parametrize("names, fetched_as", [
    ({A: RENAMED}, RENAMED),  # renamed: the name in the student's own copy
    ({A: NB}, NB),
    (None, NB),  # feedback graded before names were recorded: as stock
    ("{not json", NB), ({A: "../x"}, NB), ({A: 3}, NB),  # a broken record: as stock, never a crash
])
def test_feedback_is_released_under_the_name_the_student_submitted(tmp_path, names, fetched_as):
    config, secret = _feedback(tmp_path, "ren", names)
    (tmp_path / "exchange").mkdir()
    release = ReleaseFeedbackAsSubmitted(coursedir=CourseDirectory(config=config), config=config)
    release.start()
    released = sorted(p.name for p in (tmp_path / "exchange" / "course" / "feedback").iterdir())
    # what nbgrader's fetch_feedback looks for: the hash of the secret and the notebook's name in its cache
    assert released == [f"{notebook_hash(secret=secret, notebook_id=fetched_as[:-len('.ipynb')])}.html"]


def test_submitted_stem_reads_only_a_plain_file_name(tmp_path):
    (tmp_path / SUBMITTED_NAMES).write_text(json.dumps({A: RENAMED, "b": "sub/x.ipynb", "c": ".ipynb"}))
    assert submitted_stem(tmp_path, A) == RENAMED[: -len(".ipynb")]
    assert [submitted_stem(tmp_path, n) for n in ("b", "c", "d")] == ["b", "c", "d"]


def test_submit_says_in_one_line_how_a_renamed_notebook_is_graded(tmp_path, monkeypatch, caplog):
    from coursekit.submit import NamedSubmit

    exchange, work = tmp_path / "exchange", tmp_path / "work"
    (exchange / "course" / "outbound" / A).mkdir(parents=True)
    (exchange / "course" / "inbound").mkdir()
    (exchange / "course" / "outbound" / A / NB).write_text("{}")
    (work / A).mkdir(parents=True)
    (work / A / RENAMED).write_text("{}")
    config = Config()
    config.Exchange.root = str(exchange)
    config.CourseDirectory.course_id = "course"
    config.CourseDirectory.assignment_id = A
    config.CourseDirectory.root = str(work)
    config.Exchange.cache = str(tmp_path / "cache")
    monkeypatch.chdir(work)
    submit = NamedSubmit(coursedir=CourseDirectory(config=config), authenticator=Authenticator(config=config),
                         config=config)
    with caplog.at_level(logging.WARNING):
        submit.start()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [f"'{RENAMED}' is not named as released: it will be graded as '{NB}' (its feedback keeps "
                    "your name)"], said
    [inbound] = (exchange / "course" / "inbound").iterdir()
    assert (inbound / RENAMED).is_file()  # submitted as it is: nothing refused or renamed
