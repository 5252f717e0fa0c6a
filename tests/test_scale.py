"""Grading at scale: the unit of work, a real Dask cluster that loses a worker, PostgreSQL.

The cluster test starts a scheduler and two workers as separate processes on loopback
(the `dask scheduler` / `dask worker` commands), SIGKILLs one worker while it grades,
and checks that every submission still ends in the gradebook exactly once with its
recorded grades. The PostgreSQL test starts Debian's server (see tests/postgres.py)
and grades into it with two workers; the grades must equal the SQLite batch's.
"""
from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from grader import course
from grader.grade import grade_class
from grader.stage import BadSubmission, MAX_NOTEBOOK_BYTES, read_files, stage
from tests.conftest import expected_grades
from tests.postgres import free_port, postgres_server

ASSIGNMENT = "01_similarity"
STUDENTS = ["ada", "chloe", "dev", "femi"]  # quick notebooks: right, and three kinds of mistakes


def _class(folder: Path, copies: int) -> dict[str, str]:
    """``copies`` students per sample student (notebook 01 only); returns new id -> original id."""
    made = {}
    for student in STUDENTS:
        for n in range(copies):
            new = f"{student}{n}"
            shutil.copytree(course.SAMPLE_CLASS / student / ASSIGNMENT, folder / new / ASSIGNMENT)
            made[new] = student
    return made


def _grades(db_url: str, students) -> dict[str, list[tuple]]:
    with Gradebook(db_url) as gb:
        out = {}
        for sub in gb.assignment_submissions(ASSIGNMENT):
            if sub.student_id in students:
                out.setdefault(sub.student_id, []).append(sorted(
                    (g.name, g.auto_score, g.needs_manual_grade) for nb in sub.notebooks for g in nb.grades))
        return out


# --- the unit's inputs travel as data ----------------------------------------------------


def test_files_sent_as_data_stage_like_the_folder(tmp_path):
    """A worker without the submissions folder stages exactly what a local one would,
    including the "too big" statuses, without the big files' bytes."""
    big = tmp_path / "big" / ASSIGNMENT
    shutil.copytree(course.SAMPLE_CLASS / "ada" / ASSIGNMENT, big)
    with open(big / "weights.npy", "wb") as f:
        f.truncate(MAX_NOTEBOOK_BYTES + 1)
    notes = []
    for n, source in enumerate((big, read_files(big))):  # the folder, and its data as a worker gets it
        notes.append(stage(source, tmp_path / f"staged{n}" / ASSIGNMENT, [ASSIGNMENT], None))
    assert notes[0] == notes[1] and "left out files over 20 MB: weights.npy" in notes[0]
    assert read_files(big)["weights.npy"] == MAX_NOTEBOOK_BYTES + 1  # its size, not its bytes

    with open(big / f"{ASSIGNMENT}.ipynb", "wb") as f:
        f.truncate(MAX_NOTEBOOK_BYTES + 1)
    errors = []
    for n, source in enumerate((big, read_files(big))):
        with pytest.raises(BadSubmission) as error:
            stage(source, tmp_path / f"again{n}", [ASSIGNMENT], None)
        errors.append(str(error.value))
    assert errors[0] == errors[1] and "over the 20 MB limit" in errors[0]


@pytest.mark.kernel
def test_a_unit_result_is_json_and_carries_what_the_collector_needs(tmp_path):
    import json

    from grader.unit import Settings, course_version, grade_submission

    settings = Settings(b"0" * 64, course_version=course_version())
    result = grade_submission(read_files(course.SAMPLE_CLASS / "chloe" / ASSIGNMENT), "chloe", ASSIGNMENT, settings)
    decoded = json.loads(json.dumps(result))  # nothing but JSON types in it
    assert decoded["points"] == result["points"] and decoded["gradebook"]["notebooks"]
    assert result["status"] == "graded" and result["graded"]
    assert result["points"] == expected_grades()[("chloe", ASSIGNMENT)]["exercises"]
    assert set(result["max_points"]) == set(result["points"]) and sum(result["max_points"].values()) == 10
    assert any("softmax over the key axis" in d for d in result["diagnoses"].values())
    assert set(result["timings"]) == {"stage", "autograde", "feedback", "total"}
    assert "<html" in result["feedback"][ASSIGNMENT] and '"cells"' in result["autograded"][ASSIGNMENT]

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / f"{ASSIGNMENT}.ipynb").write_bytes(b"")
    bad = grade_submission(read_files(empty), "zz", ASSIGNMENT, settings)
    assert bad["status"].startswith("not graded: '01_similarity.ipynb' is an empty file")
    assert bad["gradebook"] is None and not bad["graded"] and json.dumps(bad)


@pytest.mark.kernel
def test_a_unit_that_raises_becomes_a_row_and_the_batch_goes_on(tmp_path):
    """A worker with other course files refuses the unit; the collector gets a one-line reason."""
    from grader.parallel import Unit, run
    from grader.unit import Settings

    folder = str(course.SAMPLE_CLASS / "ada" / ASSIGNMENT)
    units = [Unit("ada", ASSIGNMENT, folder, Settings(b"secret", course_version="not-this-course"))]
    [(unit, outcome)] = list(run(units, jobs=1, progress=False))
    assert unit.student_id == "ada" and isinstance(outcome, str)
    assert outcome.startswith("the grader failed on this submission (CourseMismatch: this worker's course files")


# --- a real cluster that loses a worker -----------------------------------------------------


class _Cluster:
    """`dask scheduler` and two `dask worker` processes on loopback, free ports."""

    def __init__(self, log_dir: Path):
        self.dask = str(Path(sys.executable).parent / "dask")
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []
        self._start("scheduler", "scheduler", "--host", "127.0.0.1",
                                  "--port", self.address.rsplit(":", 1)[1], "--no-dashboard")
        # no nanny: a killed worker stays dead, so its task must move to the other one
        self.workers = [self._start(f"worker{n}", "worker", self.address, "--nthreads", "1", "--no-nanny",
                                    "--no-dashboard", "--host", "127.0.0.1", "--name", f"w{n}")
                        for n in range(2)]

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "w")
        proc = subprocess.Popen([self.dask, *args], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def cluster(tmp_path):
    from distributed import Client

    running = _Cluster(tmp_path)
    try:
        with Client(running.address, timeout="60s") as c:
            c.wait_for_workers(2, timeout=120)
            running.worker_addresses = {w["name"]: addr for addr, w in c.scheduler_info()["workers"].items()}
        yield running
    finally:
        running.stop()


@pytest.mark.cluster
def test_cluster_loses_a_worker_mid_batch_and_every_submission_is_graded_once(tmp_path, cluster):
    from distributed import Client

    class_dir = tmp_path / "class"
    made = _class(class_dir, copies=2)  # 8 submissions
    out = tmp_path / "out"
    victim, killed = cluster.workers[0], {}

    def kill_when_busy():
        """SIGKILL worker w0 (and its kernel) once a result is in and w0 holds a running task."""
        with Client(cluster.address, timeout="30s") as watcher:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                busy = watcher.processing().get(cluster.worker_addresses["w0"], [])
                if busy and (out / "autograded").is_dir():
                    os.killpg(victim.pid, signal.SIGKILL)
                    killed["holding"] = list(busy)
                    return
                time.sleep(0.1)

    thread = threading.Thread(target=kill_when_busy)
    thread.start()
    rows = grade_class(out, submitted=class_dir, progress=False, scheduler=cluster.address)
    thread.join()

    assert killed.get("holding"), "the worker was not killed while it held a task"
    assert victim.wait(timeout=10) == -signal.SIGKILL
    expected = expected_grades()
    for row in rows:
        want = expected[(made[row.student_id], ASSIGNMENT)]
        assert (row.status, row.score, row.points) == (want["status"], want["score"], want["exercises"])
    with open(out / "grades.csv", newline="") as f:
        assert sorted(r["student_id"] for r in csv.DictReader(f)) == sorted(made)
    in_gradebook = _grades(f"sqlite:///{out / 'gradebook.db'}", made)
    assert sorted(in_gradebook) == sorted(made)
    assert all(len(subs) == 1 for subs in in_gradebook.values())  # exactly once each


# --- the gradebook on PostgreSQL --------------------------------------------------------------


@pytest.mark.cluster
def test_grading_into_postgresql_gives_the_grades_of_sqlite(tmp_path, graded_class):
    class_dir = tmp_path / "class"
    for student in STUDENTS:
        shutil.copytree(course.SAMPLE_CLASS / student / ASSIGNMENT, class_dir / student / ASSIGNMENT)
    (class_dir / "zz_absent").mkdir()
    with postgres_server() as db_url:
        rows = grade_class(tmp_path / "out", submitted=class_dir, progress=False, jobs=2, db_url=db_url)
        on_postgres = _grades(db_url, STUDENTS)
        # the class report reads the same gradebook through nbgrader's API
        from grader.report import write_report

        with open(write_report(tmp_path / "out", progress=False)[-2], newline="") as f:
            canvas = {r["Student"]: r[ASSIGNMENT] for r in csv.DictReader(f) if r["Student"] in STUDENTS}
        # nbgrader's own export reads it, through the course directory's configuration
        csv_path = tmp_path / "export.csv"
        subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "export", f"--CsvExportPlugin.to={csv_path}",
                        "--ExportApp.plugin_class=nbgrader.plugins.CsvExportPlugin"],
                       check=True, cwd=tmp_path / "out", stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    on_sqlite = _grades(f"sqlite:///{graded_class['out'] / 'gradebook.db'}", STUDENTS)
    assert on_postgres == on_sqlite and len(on_postgres) == len(STUDENTS)
    for row in rows:
        want = graded_class["rows"][(row.student_id, ASSIGNMENT)]
        assert (row.status, row.score, row.points, row.diagnoses) == (want.status, want.score, want.points,
                                                                       want.diagnoses)
    with open(csv_path, newline="") as f:
        exported = {r["student_id"]: float(r["score"]) for r in csv.DictReader(f) if r["assignment"] == ASSIGNMENT}
    assert exported == {r.student_id: r.score for r in rows}  # zz_absent too: 0, as nbgrader lists them
    assert canvas == {r.student_id: f"{r.score:g}" for r in rows if r.student_id in STUDENTS}


def test_a_wrong_gradebook_url_is_one_clear_line_without_the_password(tmp_path):
    from grader.coursedir import CourseDir
    from grader.grade import Grader

    port = free_port()  # nothing listens there
    with pytest.raises(RuntimeError, match=rf"^cannot open the gradebook at postgresql://grader:\*\*\*@127.0.0.1:{port}/x: "
                                           r"connection failed") as error:
        Grader(CourseDir.open(tmp_path / "a", db_url=f"postgresql://grader:hunter2@127.0.0.1:{port}/x"))
    assert "hunter2" not in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(RuntimeError, match="^the gradebook URL is not a database URL"):
        Grader(CourseDir.open(tmp_path / "b", db_url="gradebook.db"))
