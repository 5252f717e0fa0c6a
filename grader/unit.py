"""The unit of work: grade one submission (one student, one assignment) into a JSON-ready dict.

``grade_submission`` is what every worker runs: in the collector's own process, in a
local Dask worker, or on a cluster. Its result depends only on its arguments and on
the course's grading package installed beside it (solutions/, grader/, coursekit/,
nbgrader_config.py). It stages the files into a private, temporary nbgrader workspace
with its own throwaway SQLite gradebook, runs nbgrader's autograde there (AskQuestions,
the sandboxed BudgetedExecute, SaveVerifiedGrades, ...) and its feedback, and returns
what the collector records. It never touches the class gradebook: only the collector
writes that (grader/grade.py), so any number of units can run at once.

Per worker process, what does not change between units is made once and kept: the
generated release and a template gradebook per (assignment, due date).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry

from . import course
from .execute import BudgetedExecute, limit_trips
from .feedback import is_test_cell, verdict_of
from .release import generate, nbgrader_api
from .names import name_problem, quoted
from .sandbox import kernels_cpu_seconds
from .stage import SUBMITTED_NAMES, BadSubmission, stage


@dataclass(frozen=True)
class Settings:
    """What a unit needs besides the files, all of it decided by the instructor.

    ``secret`` is the course secret that seeds the hidden inputs: on a cluster it
    travels over the scheduler's connection, so that connection must use TLS
    (docs/deploying.md). ``duedate`` and ``timestamp`` are as nbgrader accepts them
    ("2026-12-01 23:59:00 UTC"); the timestamp is the trusted submission time.
    ``course_version`` is ``course_version()`` on the collector's side: a worker with
    other course files refuses the unit rather than grade against other references.
    """

    secret: bytes
    duedate: str | None = None
    timestamp: str | None = None
    course_version: str = ""


class CourseMismatch(RuntimeError):
    """The worker's grading package differs from the collector's."""


@lru_cache(maxsize=1)
def course_version() -> str:
    """A digest of everything that decides a grade: configuration, solutions, checks, probe."""
    h = hashlib.sha256()
    roots = [course.CONFIG_FILE, course.SOLUTIONS, course.ROOT / "grader", course.ROOT / "coursekit"]
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()
                                                     and p.suffix in (".py", ".ipynb", ".json"))
        for path in paths:
            h.update(str(path.relative_to(course.ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


_lock = threading.Lock()
_templates: dict[tuple[str, str | None], Path] = {}
_scratch: str | None = None
_own_scratch: tempfile.TemporaryDirectory | None = None


def _scratch_dir() -> str:
    """This process's scratch folder. In a Dask worker it is the worker's own local
    directory, which Dask deletes when the worker closes (and, for a worker that was
    killed, when the next one starts); elsewhere a temporary folder removed at exit."""
    global _scratch, _own_scratch
    if _scratch is None:
        try:
            # a Dask worker has imported distributed; check my work (a learner's install has
            # no Dask: it is the instructor's extra) never imports it
            if "distributed" not in sys.modules:
                raise ValueError("not in a Dask worker")
            from distributed import get_worker

            _scratch = tempfile.mkdtemp(prefix="grader-", dir=get_worker().local_directory)
        except ValueError:  # not in a Dask worker
            _own_scratch = tempfile.TemporaryDirectory(prefix="grader-")
            _scratch = _own_scratch.name
    return _scratch


def _template(assignment_id: str, duedate: str | None) -> Path:
    """A folder holding the release and a gradebook with the assignment registered; made once."""
    with _lock:
        key = (assignment_id, duedate)
        if key not in _templates:
            folder = Path(tempfile.mkdtemp(prefix=f"{assignment_id}-", dir=_scratch_dir()))
            url = f"sqlite:///{folder / 'gradebook.db'}"
            generate(folder / "release", url, [assignment_id])
            with Gradebook(url) as gb:
                gb.update_or_create_assignment(assignment_id, duedate=duedate)
            _templates[key] = folder
        return _templates[key]


def warm_up() -> None:
    """Do ahead, once per worker process, what its first unit would otherwise wait for:
    import the grading stack (nbgrader's preprocessors) and start the fork server (as root
    with bubblewrap; ``grader.forkserver``). Nothing here depends on a submission; a
    failure is logged and left for the first unit to meet and report."""
    try:
        from . import execute, feedback, verify  # noqa: F401 - the autograde's preprocessors
        from .sandbox import SandboxedKernelManager, bwrap

        km = SandboxedKernelManager(config=course.load_config())
        if km.fork_kernels and os.geteuid() == 0 and bwrap():
            km.fork_server()
    except Exception as error:  # noqa: BLE001 - the first unit meets it again, and says so
        logging.getLogger(__name__).warning("warming up the worker failed: %s", error)


def _config(ws: Path, release: Path, secret_file: Path):
    config = course.load_config()
    config.CourseDirectory.release_directory = str(release)
    for step in ("submitted", "autograded", "feedback"):
        setattr(config.CourseDirectory, f"{step}_directory", str(ws / step))
    config.CourseDirectory.db_url = f"sqlite:///{ws / 'gradebook.db'}"
    config.CourseSecret.secret_file = str(secret_file)
    return config


def grade_submission(files: str | Path | dict[str, bytes | int], student_id: str, assignment_id: str,
                     settings: Settings) -> dict:
    """Grade one student's submission of one assignment.

    Args:
        files: the submitted folder, as a path (same machine) or as
            ``grader.stage.read_files`` data (name -> bytes, or -> size in bytes for a
            file that is not sent, or -> the kind of an entry that is refused).
        student_id, assignment_id: nbgrader ids.
        settings: the secret, due date, trusted timestamp and course version.

    Returns:
        A JSON-ready dict: ``status`` (one line; "graded..." or "not graded: ..."),
        ``graded`` (bool), ``points`` and ``max_points`` (exercise id -> points),
        ``diagnoses`` (exercise id -> one line), ``late_seconds``, ``penalty`` (points),
        ``timings`` (seconds: stage, autograde, feedback, total), ``ran`` (where and when it
        ran, for a timeline: ``worker`` "host:pid", ``start`` and ``end`` as Unix times, CPU
        seconds of the worker process, ``grader_cpu``, and of its kernel, ``kernel_cpu``,
        from the kernel's cgroup, and ``cpu_pressure``: the share of the unit's wall time
        in which some process of the machine waited for a CPU, from Linux's PSI, or None),
        ``limits_tripped`` (how many time limits its kernel tripped: CPU, wall clock or
        start-up; ``grader.parallel`` grades such a unit again alone when it ran on a busy
        machine), ``gradebook`` (what
        autograde wrote in the throwaway gradebook, for the collector to record, or
        None), ``submitted``, ``autograded`` and ``feedback`` (notebook name -> the
        staged notebook's JSON text / the autograded one's / the feedback HTML).

    Raises:
        CourseMismatch: the worker's course files are not the collector's.
        Anything else only for a fault of the grader or the machine, never for bad
        input: a submission that cannot be graded is a result with its status.
    """
    started, began, cpu, kernels_cpu = time.perf_counter(), time.time(), time.process_time(), kernels_cpu_seconds()
    trips, waited = limit_trips(), cpu_waited()
    timings: dict[str, float] = {}
    result = {"student_id": student_id, "assignment_id": assignment_id, "status": "", "graded": False,
              "points": {}, "max_points": {}, "diagnoses": {}, "late_seconds": 0.0, "penalty": 0.0,
              "timings": timings, "ran": {}, "limits_tripped": 0, "gradebook": None, "submitted": {},
              "autograded": {}, "feedback": {}, "keys": {}}

    def done(status: str) -> dict:
        result["status"] = status
        timings["total"] = time.perf_counter() - started
        now = cpu_waited()
        pressure = (now - waited) / timings["total"] if now is not None and waited is not None else None
        result["limits_tripped"] = limit_trips() - trips
        result["ran"] = {"worker": f"{socket.gethostname()}:{os.getpid()}", "start": began, "end": time.time(),
                         "grader_cpu": time.process_time() - cpu, "kernel_cpu": kernels_cpu_seconds() - kernels_cpu,
                         "cpu_pressure": None if pressure is None else round(min(1.0, max(0.0, pressure)), 3)}
        return result

    if settings.course_version and settings.course_version != course_version():
        raise CourseMismatch(f"this worker's course files (version {course_version()}) differ from the "
                             f"collector's ({settings.course_version}): install the same commit everywhere")
    if assignment_id not in course.assignments():
        return done(f"not graded: there is no assignment {quoted(assignment_id)} in this course")
    if "/" in student_id or student_id in ("", ".", "..") or name_problem(student_id):  # it names folders below
        return done(f"not graded: {quoted(student_id)} cannot be a student id")
    template = _template(assignment_id, settings.duedate)
    result["max_points"] = _max_points(template, assignment_id)
    result["points"] = dict.fromkeys(result["max_points"], 0.0)
    notebooks = course.notebook_names(assignment_id)
    with tempfile.TemporaryDirectory(prefix="unit-", dir=_scratch_dir()) as tmp:
        tmp = Path(tmp)
        ws = tmp / "course"
        try:  # a path is opened without following links; data is staged as it came
            source = Path(files) if isinstance(files, (str, Path)) else files
            submitted_as: dict[str, str] = {}
            note = stage(source, ws / "submitted" / student_id / assignment_id, notebooks, settings.timestamp,
                         submitted_as)
        except BadSubmission as error:
            return done(f"not graded: {error}")
        result["keys"] = _feedback_keys(ws / "submitted" / student_id / assignment_id, settings.timestamp)
        result["keys"][SUBMITTED_NAMES] = json.dumps(submitted_as)
        shutil.copyfile(template / "gradebook.db", ws / "gradebook.db")
        secret_file = tmp / "secret"
        secret_file.write_bytes(settings.secret)
        os.chmod(secret_file, 0o600)
        config = _config(ws, template / "release", secret_file)
        api = nbgrader_api(config)
        timings["stage"] = time.perf_counter() - started
        for notebook in notebooks:
            staged = ws / "submitted" / student_id / assignment_id / f"{notebook}.ipynb"
            result["submitted"][notebook] = staged.read_text(encoding="utf-8")
        with warnings.catch_warnings():  # nbgrader 0.9.6 warns on every autograde (SQLAlchemy, cell ids)
            warnings.simplefilter("ignore")
            outcome = api.autograde(assignment_id, student_id, force=True, create=True)
        timings["autograde"] = time.perf_counter() - started - timings["stage"]
        db_url = config.CourseDirectory.db_url
        result["gradebook"] = _snapshot(db_url, student_id, assignment_id)
        if not outcome["success"]:
            return done(f"not graded: {_autograde_failure(outcome)}")
        result["graded"] = True
        limits = BudgetedExecute(config=config).describe_limits()
        for notebook in notebooks:
            graded = ws / "autograded" / student_id / assignment_id / f"{notebook}.ipynb"
            result["diagnoses"].update(_diagnoses(graded, limits))
            result["autograded"][notebook] = graded.read_text(encoding="utf-8")
        for nb in result["gradebook"]["notebooks"].values():
            for name, (score, _) in nb["grades"].items():
                result["points"][course.exercise_id(name)] = float(score or 0.0)
        with Gradebook(db_url) as gb:
            submission = gb.find_submission(assignment_id, student_id)
            result["late_seconds"] = float(submission.total_seconds_late)
            result["penalty"] = float(submission.late_submission_penalty or 0.0)
        if result["late_seconds"] > 0:
            note = "; ".join(filter(None, [note, f"late by {_duration(result['late_seconds'])}, "
                                                 f"penalty {result['penalty']:g} points"]))
        mark = time.perf_counter()
        api.generate_feedback(assignment_id, student_id, force=True)
        timings["feedback"] = time.perf_counter() - mark
        for notebook in notebooks:
            html = ws / "feedback" / student_id / assignment_id / f"{notebook}.html"
            if html.is_file():
                result["feedback"][notebook] = html.read_text(encoding="utf-8")
        return done(_status(note, result["diagnoses"]))


_SECRET = re.compile(r"[0-9a-f]{16,256}")


def cpu_waited(pressure_file: str = "/proc/pressure/cpu") -> float | None:
    """Seconds in which some process of this machine (or container) waited for a CPU, since
    boot: Linux's pressure stall information ("some ... total=" microseconds), or None where
    the kernel does not keep it."""
    try:
        with open(pressure_file) as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return None


def _feedback_keys(staged: Path, timestamp: str | None) -> dict[str, str]:
    """timestamp.txt and submission_secret.txt for autograded/ and feedback/: nbgrader's
    release_feedback reads both, and names the released file by the secret (which
    fetch_feedback finds again from the student's own copy). The secret is kept only when
    it looks like one nbgrader's submit wrote (lowercase hex)."""
    keys = {"timestamp.txt": timestamp or ""}
    try:
        secret = (staged / "submission_secret.txt").read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return keys
    if _SECRET.fullmatch(secret):  # byte for byte: the released file's name is its hash
        keys["submission_secret.txt"] = secret
    return keys


def _max_points(template: Path, assignment_id: str) -> dict[str, float]:
    with Gradebook(f"sqlite:///{template / 'gradebook.db'}") as gb:
        return {course.exercise_id(cell.name): float(cell.max_score)
                for nb in gb.find_assignment(assignment_id).notebooks for cell in nb.grade_cells}


def _snapshot(db_url: str, student_id: str, assignment_id: str) -> dict | None:
    """What autograde wrote for this submission: timestamp, and per notebook the late
    penalty, each grade's (auto_score, needs_manual_grade) and each auto_comment."""
    with Gradebook(db_url) as gb:
        try:
            submission = gb.find_submission(assignment_id, student_id)
        except MissingEntry:
            return None
        return {"timestamp": submission.timestamp.isoformat() if submission.timestamp else None,
                "notebooks": {nb.name: {"late_submission_penalty": nb.late_submission_penalty,
                                        "grades": {g.name: (g.auto_score, g.needs_manual_grade) for g in nb.grades},
                                        "comments": {c.name: c.auto_comment for c in nb.comments}}
                              for nb in submission.notebooks}}


def _diagnoses(graded: Path, limits: str) -> dict[str, str]:
    """Exercise id -> diagnosis, for each failed test cell of an autograded notebook."""
    diagnoses = {}
    for cell in nbformat.read(graded, as_version=4).cells:
        verdict = verdict_of(cell) if is_test_cell(cell) else None
        if verdict and not verdict["passed"]:
            message = verdict["diagnosis"]
            if message.startswith("stopped at the time limit"):
                message = message.replace("stopped at the time limit", f"stopped at the time limit{limits}", 1)
            diagnoses[verdict["exercise"]] = message
    return diagnoses


def _status(note: str, diagnoses: dict[str, str]) -> str:
    parts = [note] if note else []
    timed_out = [e for e, d in diagnoses.items() if d.startswith("stopped at")]
    if timed_out:
        parts.append(f"a cell was stopped at the time limit ({', '.join(timed_out)})")
    return "graded" + (": " + "; ".join(parts) if parts else "")


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{max(int(seconds), 1)} s"
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _autograde_failure(result: dict) -> str:
    text = f"{result.get('error', '')}\n{result.get('log', '')}"
    if "DeadKernelError" in text or "Kernel died" in text:
        return "the notebook stopped the Python kernel (os._exit, a crash or running out of memory)"
    if "add_missing_grade_cells" in text:
        return ("the notebook lost the course's cell metadata (answers pasted into a new notebook?): "
                "start from the released notebook, paste the answers in, and resubmit")
    if "Duplicate grade id" in text:
        return "two cells have the same grade id (a copied test cell?): delete the copy and resubmit"
    last = [line for line in text.splitlines() if line.startswith("[ERROR]")]
    return f"nbgrader could not grade it ({last[-1][8:] if last else 'see the grader log'})"
