"""An instructor's whole term, as docs/deploying.md ("A term, step by step") writes it.

One scenario, run once by the module fixture ``term``, with real Linux student accounts
on nbgrader's real exchange (``tests/accounts.py``): the instructor (root, as the tests
run) in a course folder of the test's whose ``nbgrader_config.py`` loads the course's
(TrustedCollect is the course's collect), running the venv's ``nbgrader`` and
``course-grader`` by absolute path with a PATH that does not hold the venv:

1. ``generate_assignment``, ``release_assignment``;
2. three students fetch, put in their answers (a sample class notebook over the fetched
   one) and submit as themselves: ada on time, kai twice on time (chloe's 2/10 notebook,
   then kai's 10/10, renamed ``RENAMED`` first, as students do), then the instructor gives the due date (``nbgrader db assignment
   add --duedate``, "then or later" in the docs) between those and dev's, who submits late;
3. ``collect``, then ``course-grader grade --course DIR`` (what ``make grade
   COURSE=DIR`` runs);
4. a manual grade and comment in the gradebook, and the class regraded;
5. one more comment (after the last grading, as the docs' step 8 has it), then
   ``generate_feedback``, ``release_feedback``, and ada's and kai's ``fetch_feedback``;
6. nbgrader's own CSV export;
7. kai regraded alone (``--student``);
8. dev's extension (``--student dev --extensions CSV``).

Each step's outcome is kept; each test asserts one of them, so a failure names the step
that broke (a step that raised says so in every test that needs it). The accounts are
removed at the end (``userdel -r``).
"""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from nbgrader.api import Gradebook
from nbgrader.utils import parse_utc

from grader import course
from grader.exchange import TIMES_FILE, format_time, read_submission_times
from tests.accounts import COURSE_GRADER, PATH, course_dir, instructor, instructor_run

A = "01_similarity"
NB = f"{A}.ipynb"
RENAMED = "my similarity (final).ipynb"  # kai's second submission: graded as NB, fetched under this name
COURSE = "afs-term-test"
ADA, DEV, KAI = STUDENTS = ("afs_term_ada", "afs_term_dev", "afs_term_kai")
MANUAL = ("similarity-score_matrix-test", "similarity-score_matrix")  # ada's hand-graded cell, commented cell
COMMENT = "check the axis"
LATER = ("similarity-soft_lookup", "and the soft lookup is right")  # a comment given after the last grading
SLACK = timedelta(seconds=1)  # ctime is the kernel's coarse clock
GRADE_TIMEOUT = 600  # one course-grader run: about 10 s a submission, on a busy machine more


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _sample(persona: str) -> bytes:
    return (course.SAMPLE_CLASS / persona / A / NB).read_bytes()


def _rows(text: str) -> dict[str, dict]:
    """grades.csv's rows of assignment 01 by student."""
    return {r["student_id"]: r for r in csv.DictReader(io.StringIO(text)) if r["assignment_id"] == A}


def _lines(text: str) -> dict[str, str]:
    """grades.csv's lines (bytes as written) by student."""
    return {line.split(",", 1)[0]: line for line in text.splitlines()[1:]}


def _grade(folder: Path, *options: str) -> subprocess.CompletedProcess:
    """``course-grader grade --course DIR OPTIONS`` as the instructor."""
    return instructor_run(folder, COURSE_GRADER, "grade", "--course", folder, *options, timeout=GRADE_TIMEOUT)


class Term(dict):
    """What each step left, and each step's failure (its traceback), by step name."""

    def __init__(self):
        super().__init__()
        self.failed: dict[str, str] = {}
        self.seconds: dict[str, float] = {}

    def step(self, name: str, action) -> None:
        started = time.monotonic()
        try:
            action()
        except Exception:  # noqa: BLE001 - kept, and raised by every test that needs the step
            self.failed[name] = traceback.format_exc()
        finally:
            self.seconds[name] = time.monotonic() - started

    def need(self, *names: str) -> None:
        """Fail the calling test when one of the steps it checks failed, with that step's error."""
        for name in names:
            if name in self.failed:
                pytest.fail(f"step {name!r} failed:\n{self.failed[name]}", pytrace=False)


@pytest.fixture(scope="module")
def term(accounts, tmp_path_factory):
    accounts.add(*STUDENTS)
    try:
        yield _run_term(accounts, tmp_path_factory)
    finally:
        accounts.remove(*STUDENTS)


def _run_term(accounts, tmp_path_factory) -> Term:
    """The term, step by step; what each step left (``Term``)."""
    exchange = accounts.base / "term-exchange"
    exchange.mkdir()
    os.chmod(exchange, 0o1777)  # nbgrader's docs: writable by everyone, sticky
    root = tmp_path_factory.mktemp("term")
    folder = course_dir(root / "course", exchange, root / "course" / "gradebook.db", COURSE, trusted_collect=False,
                        extra=f"c.CourseSecret.secret_file = {str(root / 'course' / 'home' / 'secret')!r}\n")
    url = f"sqlite:///{root / 'course' / 'gradebook.db'}"
    t = Term()
    t.update(folder=folder, root=root, exchange=exchange, url=url, times={}, accounts=accounts)
    started = time.monotonic()

    def release():  # 1. (the due date comes in step 2, between the submissions)
        instructor(folder, "generate_assignment", A)
        instructor(folder, "release_assignment", A)

    def students():  # 2.
        times = t["times"]
        works = {}

        def fetch(user):
            works[user] = accounts.enroll(user, exchange, COURSE)
            accounts.nbgrader(user, "fetch_assignment", A)

        with ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(fetch, u) for u in STUDENTS]:
                future.result()

        def answer(user, persona):  # written in place: the student still owns it
            (works[user] / A / NB).write_bytes(_sample(persona))

        def ada():
            answer(ADA, "ada")
            accounts.nbgrader(ADA, "submit", A)

        def kai():
            answer(KAI, "chloe")
            accounts.nbgrader(KAI, "submit", A)
            answer(KAI, "kai")
            accounts.run(KAI, "mv", works[KAI] / A / NB, works[KAI] / A / RENAMED)
            t["kai submit log"] = accounts.nbgrader(KAI, "submit", A)

        with ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(f) for f in (ada, kai)]:
                future.result()
        # the due date: after the on-time submissions, before dev's
        due = (_now() + SLACK).replace(microsecond=0) + timedelta(seconds=1)
        times["due"] = due
        t["db log"] = instructor(folder, "db", "assignment", "add", A, f"--duedate={due:%Y-%m-%d %H:%M:%S} UTC")
        while _now() < due + SLACK:
            time.sleep(0.1)
        times["dev from"] = _now()
        answer(DEV, "dev")
        accounts.nbgrader(DEV, "submit", A)

    def collect():  # 3.
        t["collect log"] = instructor(folder, "collect", A)

    def grade():  # 3.
        make = ["make", "-C", str(course.ROOT), "grade", f"COURSE={folder}"]
        t["make -n"] = subprocess.run([*make, "-n"], capture_output=True, text=True, env={"PATH": PATH}).stdout
        # make grade first brings the venv up to date (.venv/.installed): only run it when that is a no-op
        if subprocess.run(["make", "-q", "-C", str(course.ROOT), ".venv/.installed"], capture_output=True,
                          env={"PATH": PATH}).returncode == 0:
            t["ran"] = "make"
            t["first"] = instructor_run(folder, *make, timeout=GRADE_TIMEOUT)
        else:
            t["ran"] = "course-grader"
            t["first"] = _grade(folder)
        t["csv first"] = (folder / "grades.csv").read_text(encoding="utf-8")

    def manual():  # 4.
        with Gradebook(url, COURSE) as gb:  # what formgrader writes: 1 of 3 points, a comment
            grade = gb.find_grade(MANUAL[0], A, A, ADA)
            grade.manual_score = 1.0
            grade.needs_manual_grade = False
            gb.find_comment(MANUAL[1], A, A, ADA).manual_comment = COMMENT
            gb.db.commit()
        t["regrade"] = _grade(folder)
        t["csv regraded"] = (folder / "grades.csv").read_text(encoding="utf-8")
        with Gradebook(url, COURSE) as gb:
            grade = gb.find_grade(MANUAL[0], A, A, ADA)
            t["manual grade"] = (grade.manual_score, grade.auto_score, grade.needs_manual_grade, grade.score)
            t["manual comment"] = gb.find_comment(MANUAL[1], A, A, ADA).manual_comment

    def feedback():  # 5.
        with Gradebook(url, COURSE) as gb:  # in formgrader, after the last grading run
            gb.find_comment(LATER[0], A, A, ADA).manual_comment = LATER[1]
            gb.db.commit()
        t["feedback log"] = instructor(folder, "generate_feedback", A)
        t["release log"] = instructor(folder, "release_feedback", A)
        t["fetch log"] = accounts.nbgrader(ADA, "fetch_feedback", A)
        t["fetched"] = sorted((accounts.home(ADA) / "work" / A / "feedback").glob(f"*/{A}.html"))
        t["kai fetch log"] = accounts.nbgrader(KAI, "fetch_feedback", A)
        t["kai fetched"] = sorted((accounts.home(KAI) / "work" / A / "feedback").glob("*/*.html"))

    def export():  # 6.
        before = (folder / "grades.csv").read_text(encoding="utf-8")
        instructor(folder, "export", "--ExportApp.plugin_class=nbgrader.plugins.CsvExportPlugin", "--to", "stock.csv")
        t["stock"] = (folder / "stock.csv").read_text(encoding="utf-8")
        t["csv at export"] = before
        t["csv after export"] = (folder / "grades.csv").read_text(encoding="utf-8")

    def one_student():  # 7.
        t["csv before kai"] = (folder / "grades.csv").read_text(encoding="utf-8")
        t["kai alone"] = _grade(folder, "--student", KAI)
        t["csv after kai"] = (folder / "grades.csv").read_text(encoding="utf-8")

    def extension():  # 8.
        submitted = read_submission_times(folder)[(DEV, A)]
        extended = parse_utc(submitted) + timedelta(hours=1)
        t["extended"] = extended
        extensions = root / "ext.csv"
        extensions.write_text(f"student_id,assignment_id,duedate\n{DEV},{A},{format_time(extended)}\n")
        t["csv before dev"] = (folder / "grades.csv").read_text(encoding="utf-8")
        t["dev extended"] = _grade(folder, "--student", DEV, "--extensions", extensions)
        t["csv after dev"] = (folder / "grades.csv").read_text(encoding="utf-8")
        with Gradebook(url, COURSE) as gb:
            t["due after extension"] = (gb.find_assignment(A).duedate, gb.find_submission(A, DEV).duedate,
                                        gb.find_submission(A, ADA).duedate)

    for name, action in [("release", release), ("students", students), ("collect", collect), ("grade", grade),
                         ("manual", manual), ("feedback", feedback), ("export", export),
                         ("one student", one_student), ("extension", extension)]:
        t.step(name, action)
    t.seconds["term"] = time.monotonic() - started
    print("\nterm steps (s): " + ", ".join(f"{k} {v:.0f}" for k, v in t.seconds.items()), file=sys.stderr)
    return t


# --- the cases ----------------------------------------------------------------------------------


def test_release_puts_the_student_version_in_the_exchange(term):
    term.need("release")
    released = term["exchange"] / COURSE / "outbound" / A / NB
    assert released.read_bytes() == (term["folder"] / "release" / A / NB).read_bytes()
    assert json.loads(released.read_text())["cells"]  # a notebook


def test_students_fetch_and_submit_as_themselves(term):
    term.need("students")
    import pwd

    inbound = term["exchange"] / COURSE / "inbound"
    owners = {}
    for folder in inbound.iterdir():
        owners.setdefault(folder.name.split("+")[0], []).append(pwd.getpwuid(folder.stat().st_uid).pw_name)
    assert owners == {ADA: [ADA], DEV: [DEV], KAI: [KAI, KAI]}


def test_due_date_is_set_with_nbgrader_db(term):
    term.need("students")
    with Gradebook(term["url"], COURSE) as gb:
        assert gb.find_assignment(A).duedate == term["times"]["due"]


def test_collect_takes_trusted_times_and_each_students_latest_submission(term):
    term.need("students", "collect")
    folder, due = term["folder"], term["times"]["due"]
    times = {s: parse_utc(t) for (s, a), t in read_submission_times(folder).items() if a == A}
    assert sorted(times) == sorted(STUDENTS)
    assert times[ADA] <= due and times[KAI] <= due  # on time
    assert times[DEV] >= term["times"]["dev from"] - SLACK and times[DEV] > due  # late
    for student in STUDENTS:  # timestamp.txt (nbgrader's) says what submission_times.csv (ours) says
        stamp = (folder / "submitted" / student / A / "timestamp.txt").read_text()
        assert stamp == read_submission_times(folder)[(student, A)]
    assert (folder / "submitted" / KAI / A / RENAMED).read_bytes() == _sample("kai")  # the second submission
    assert (folder / "submitted" / ADA / A / NB).read_bytes() == _sample("ada")
    assert (folder / TIMES_FILE).is_file() and f"Collecting submission: {KAI} {A}" in term["collect log"]


def test_make_grade_runs_course_grader_on_the_course_directory(term):
    term.need("grade")
    command = f".venv/bin/course-grader grade --course '{term['folder']}'"
    assert command in [line.strip() for line in term["make -n"].splitlines()], term["make -n"]


def test_first_grading_gives_the_on_time_scores_and_zero_for_late(term):
    term.need("collect", "grade")
    rows = _rows(term["csv first"])
    table = term["csv first"]
    assert sorted(rows) == sorted(STUDENTS), table
    assert float(rows[ADA]["score"]) == 10 and float(rows[KAI]["score"]) == 10, table
    assert float(rows[DEV]["score"]) == 0, table  # the "zero" policy
    assert "late by" in rows[DEV]["status"], table
    assert "late" not in rows[ADA]["status"] and "late" not in rows[KAI]["status"], table


def test_a_manual_grade_survives_regrading(term):
    term.need("manual")
    manual, auto, needs, score = term["manual grade"]
    assert (manual, needs, score) == (1.0, False, 1.0)
    assert auto == 3.0  # the autograder's, kept beside it
    assert term["manual comment"] == COMMENT
    rows = _rows(term["csv regraded"])
    assert float(rows[ADA]["score"]) == 8, term["csv regraded"]  # 10 - 3 + 1
    assert (float(rows[KAI]["score"]), float(rows[DEV]["score"])) == (10, 0), term["csv regraded"]


def test_ada_fetches_feedback_with_her_manual_grade_and_comment(term):
    term.need("manual", "feedback")
    assert len(term["fetched"]) == 1, term["fetch log"]
    [html] = term["fetched"]  # under her HOME: ~/work/01_similarity/feedback/<timestamp>/
    assert html.is_relative_to(term["accounts"].home(ADA))
    text = html.read_text(encoding="utf-8")
    for wanted in ("Your feedback: 8 / 10 points", COMMENT):
        if wanted not in text:
            pytest.fail(f"{wanted!r} is not in the feedback ada fetched ({html})", pytrace=False)


def test_a_renamed_notebook_is_told_at_submit_graded_and_its_feedback_fetched_under_its_name(term):
    """kai renamed the notebook before submitting: ``nbgrader submit`` says in one line that
    it will be graded as the released notebook; it is graded (10/10); the feedback that
    release_feedback releases is the one kai's fetch_feedback finds, under kai's name."""
    term.need("students", "grade", "feedback")
    told = [line for line in term["kai submit log"].splitlines() if RENAMED in line]
    assert told and f"it will be graded as '{NB}'" in told[0], term["kai submit log"]
    assert "MISSING" not in term["kai submit log"], term["kai submit log"]  # the one line, not stock's block
    rows = _rows(term["csv first"])
    assert float(rows[KAI]["score"]) == 10 and "renamed" in rows[KAI]["status"], term["csv first"]
    fetched = term["kai fetched"]
    assert [p.name for p in fetched] == [RENAMED.replace(".ipynb", ".html")], (fetched, term["kai fetch log"])
    assert "Your feedback: 10 / 10 points" in fetched[0].read_text(encoding="utf-8")


def test_generate_feedback_after_manual_grading_shows_a_later_comment(term):
    """docs/deploying.md, step 8: after manual grading, ``nbgrader generate_feedback
    01_similarity`` makes the feedback show the manual grades and comments."""
    term.need("feedback")
    [html] = term["fetched"]
    if LATER[1] not in html.read_text(encoding="utf-8"):
        pytest.fail(f"the comment {LATER[1]!r}, given after the last grading run, is not in the feedback ada "
                    f"fetched; nbgrader generate_feedback {A} said:\n{term['feedback log']}", pytrace=False)


def test_nbgraders_own_export_agrees_with_grades_csv(term):
    term.need("export")
    with io.StringIO(term["stock"]) as f:
        stock = {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(f)}
    ours = {(r["student_id"], r["assignment_id"]): float(r["score"])
            for r in csv.DictReader(io.StringIO(term["csv at export"]))}
    assert stock == ours, (term["stock"], term["csv at export"])
    assert stock[(ADA, A)] == 8
    assert term["csv after export"] == term["csv at export"]  # another plugin: grades.csv stays


def test_regrading_one_student_leaves_every_other_row_byte_identical(term):
    term.need("one student")
    before, after = _lines(term["csv before kai"]), _lines(term["csv after kai"])
    assert sorted(before) == sorted(after) == sorted(STUDENTS)
    for student in (ADA, DEV):
        assert after[student] == before[student], (before, after)
    assert float(_rows(term["csv after kai"])[KAI]["score"]) == 10, term["csv after kai"]
    assert KAI in term["kai alone"].stdout and ADA not in term["kai alone"].stdout


def test_an_extension_lifts_devs_late_penalty(term):
    term.need("extension")
    dev = _rows(term["csv after dev"])[DEV]
    assert float(dev["score"]) == 4, term["csv after dev"]  # sample_class/dev/expected.json
    assert "late" not in dev["status"], term["csv after dev"]
    assert "late" in _rows(term["csv before dev"])[DEV]["status"]  # it was late before


def test_an_extension_is_devs_alone(term):
    term.need("extension")
    assignment_due, dev_due, ada_due = term["due after extension"]
    assert assignment_due == term["times"]["due"] and ada_due == term["times"]["due"]
    assert abs((dev_due - term["extended"]).total_seconds()) < 1e-3
    before, after = _lines(term["csv before dev"]), _lines(term["csv after dev"])
    assert after[ADA] == before[ADA] and after[KAI] == before[KAI], (before, after)

