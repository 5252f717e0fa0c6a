"""Check my work in the self-learner's install: the hidden checks (``grader.checks``, installed
with this package) judge the functions this kernel defines, offline, with no re-execution.

``coursekit.check.check_my_work`` calls ``check_in_kernel`` when this package is installed
and the instructor's grading pipeline (``grader.selfcheck``) is not. The notebook names the
exercises (its graded test cells, ``<exercise id>-test``, and their points); each exercise's
function or class is taken by its name from the kernel's namespace, as the learner last ran
it, and judged as grading judges it: the same questions (``grader.checks.answers_of``) and
verdicts (``grader.checks.verdict``), an upstream mistake blamed first
(``grader.checks.with_upstream``). The questions are drawn from a secret of the user's own,
made on first use in their Jupyter data folder (the file ``course-grader check`` uses), as
the course's check of one exercise in a kernel draws them: the same questions every time.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import os
import random
import sys
import tempfile
import warnings
from pathlib import Path

DATA_FOLDER = "attention-from-scratch"
TEST_SUFFIX = "-test"
STUDENT = "self"
KERNEL = "kernel"  # what stands for the submission's digest in the seed of a check in the kernel
# One line under the first, as course-grader check says it: the visible tests are not the grade.
OTHER_INPUTS = ("The hidden checks try other inputs than the visible tests (they are never shown), so a "
                "notebook that passes its visible tests can still fail one here.")


def secret_file() -> Path:
    """Where this user's check secret lives (it need not exist yet)."""
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / DATA_FOLDER / "check_secret"


def user_secret() -> bytes:
    """This user's check secret, made on first use (folder 0700, file 0600; written aside and
    hard-linked into place, so that two checks at once get the same one).

    Raises:
        OSError: the user's data folder cannot be made or read.
    """
    path = secret_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.is_file():
        fd, aside = tempfile.mkstemp(dir=path.parent, prefix=".check_secret-")  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(os.urandom(32).hex())
            try:
                os.link(aside, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(aside)
    return path.read_bytes().strip()


def exercises(notebook: dict) -> tuple[dict[str, float], dict[str, str]]:
    """A notebook's graded exercises: (exercise id -> points, in notebook order; exercise id ->
    the title of the level-2 section its answer cell sits in)."""
    points, sections, heading = {}, {}, ""
    for cell in notebook.get("cells", []):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        grade_id = str(meta.get("grade_id", ""))
        if cell.get("cell_type") == "markdown":
            for line in source.splitlines():
                if line.startswith("## ") or (line.startswith("# ") and not heading):
                    heading = line.lstrip("#").strip()
        elif meta.get("solution"):
            sections[grade_id] = heading
        elif meta.get("grade") and grade_id.endswith(TEST_SUFFIX):
            points[grade_id[: -len(TEST_SUFFIX)]] = float(meta.get("points") or 0)
    return points, sections


def notebooks() -> Path:
    """The student notebooks: this package's (``<assignment>/<assignment>.ipynb``), or, for this
    module in the course's checkout (selfstudy/attention_course), the checkout's notebooks/."""
    here = Path(__file__).resolve().parent
    return here / "notebooks" if (here / "notebooks").is_dir() else here.parents[1] / "notebooks"


def assignment_of(exercise: str) -> str:
    """The assignment of an exercise ("masking-..." -> "03_masking"), from the notebooks' folders.

    Raises:
        LookupError: no notebook's folder is named for the exercise's topic.
    """
    topic = exercise.split("-", 1)[0]
    found = [f.name for f in notebooks().iterdir() if f.is_dir() and f.name.split("_", 1)[-1] == topic]
    if len(found) != 1:
        raise LookupError(f"no notebook of this course for the exercises of {topic!r}")
    return found[0]


def seed(secret: bytes, exercise: str) -> int:
    """The questions' seed: ``HMAC(secret, "self", assignment, exercise, "kernel")``, as the
    course's self-check draws them (``course-grader check``'s formula, with "kernel" for the
    saved submission's digest): the same questions on every check of an exercise by one user."""
    message = "\0".join([STUDENT, assignment_of(exercise), exercise, KERNEL]).encode()
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "little")


@contextlib.contextmanager
def _quietly():
    """While the learner's code answers: what it prints and warns kept out of the cell (the full
    check does not show it either), and afterwards the random generators of Python, numpy and
    torch as they were, so that cells run after the check draw what they would have."""
    import numpy as np

    torch = sys.modules.get("torch")
    state = random.getstate(), np.random.get_state(), torch.get_rng_state() if torch is not None else None
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        if torch is not None:
            torch.set_rng_state(state[2])


def judge(points: dict[str, float], namespace: dict, secret: bytes) -> dict[str, str | None]:
    """Exercise id -> None (the hidden checks pass) or the diagnosis, for the functions of
    ``namespace``. An exercise whose function the kernel has not defined is not answered.

    Raises:
        LookupError: an exercise of ``points`` has no registered check.
    """
    from grader import checks

    verdicts: dict[str, str | None] = {}
    for exercise in points:
        spec = checks.get(exercise)
        fn = namespace.get(spec.function)
        if fn is None:
            verdicts[exercise] = f"{spec.function}: not answered yet, this kernel has not run its cell"
            continue
        drawn = seed(secret, exercise)
        with _quietly():
            answers = checks.answers_of(exercise, fn, drawn)
        verdicts[exercise] = checks.verdict(exercise, drawn, answers)
    return checks.with_upstream(verdicts)


def _registered(exercise: str) -> bool:
    from grader import checks

    try:
        checks.get(exercise)
    except LookupError:
        return False
    return True


def _hint(function: str, section: str, diagnosis: str) -> str:
    where = f'section "{section}"' if section else "its section"
    if "not answered yet" in diagnosis:
        return f"fill in `{function}` in {where} (the cell marked YOUR CODE HERE), run it, then the test below it"
    return (f"re-read {where} and the docstring of `{function}`; the visible test under it is a small case "
            "you can work out by hand")


def _lines(exercise: str, most: float, diagnosis: str | None, section: str, width: int = 0) -> list[str]:
    """An exercise's lines: pass or fail and the points; for a failure what went wrong and the hint."""
    from grader import checks

    lines = [f"  {'PASS' if diagnosis is None else 'FAIL'}  {exercise:<{width}}  {most if diagnosis is None else 0:g}/{most:g}"]
    if diagnosis is not None:
        lines += [f"        what went wrong: {diagnosis}",
                  f"        hint: {_hint(checks.get(exercise).function, section, diagnosis)}"]
    return lines


def check_one(name: str, namespace: dict) -> str:
    """What the learner reads of one exercise, given by its function's or class's name (or its
    id), as ``namespace`` defines it now: its line, and for a failure what went wrong and the
    hint; when it fails, the upstream functions it calls are judged too, and blamed first.

    Raises:
        LookupError: no exercise of the course asks for ``name`` (the message says what to pass).
        OSError: the user's data folder, where the secret lives, cannot be written.
    """
    from grader import checks

    found = [e for e in checks.exercise_ids() if name in (e, checks.get(e).function)]
    if len(found) != 1:
        raise LookupError(f"no exercise of this course asks for {name!r}: pass the name of your function or class "
                          'as its notebook defines it, e.g. check_my_work("masked_softmax")')
    exercise = found[0]
    spec = checks.get(exercise)
    assignment = assignment_of(exercise)
    notebook = notebooks() / assignment / f"{assignment}.ipynb"
    points, sections = exercises(json.loads(notebook.read_text(encoding="utf-8")))
    secret = user_secret()
    verdicts = judge({exercise: 0.0}, namespace, secret)
    if verdicts[exercise] is not None:  # blame a failing upstream function first
        upstream = [d for d in spec.depends if checks.get(d).function in namespace]
        verdicts = checks.with_upstream({**judge(dict.fromkeys(upstream, 0.0), namespace, secret),
                                         exercise: verdicts[exercise]})
    return "\n".join([f"Checked {spec.function} as defined in this kernel now, with the hidden checks:",
                      *_lines(exercise, points.get(exercise, 0.0), verdicts[exercise], sections.get(exercise, ""))])


def check_in_kernel(path: Path, namespace: dict) -> str:
    """What the learner reads: per exercise of the notebook at ``path`` pass or fail, the
    points, the diagnosis and a hint, then the score and what to revisit.

    Raises:
        OSError: the notebook cannot be read, or the user's data folder cannot be written.
        ValueError: the notebook is not JSON.
    """
    from grader import checks

    notebook = json.loads(Path(path).read_text(encoding="utf-8"))
    points, sections = exercises(notebook)
    points = {e: p for e, p in points.items() if _registered(e)}
    if not points:
        return f"{Path(path).name}: no exercise of this course in it: pass a notebook the course gave you"
    verdicts = judge(points, namespace, user_secret())
    width = max(map(len, points))
    lines = [f"Checked the functions this kernel defines for {Path(path).name} with the hidden checks "
             "(as this kernel last ran them: run a cell you changed before checking):", OTHER_INPUTS, ""]
    revisit: dict[str, list[str]] = {}
    score = 0.0
    for exercise, most in points.items():
        diagnosis = verdicts.get(exercise)
        score += most if diagnosis is None else 0.0
        lines += _lines(exercise, most, diagnosis, sections.get(exercise, ""), width)
        if diagnosis is not None:
            revisit.setdefault(sections.get(exercise) or exercise, []).append(checks.get(exercise).function)
    lines += ["", f"Score: {score:g}/{sum(points.values()):g}",
              "What to revisit: " + ("; ".join(f"{s} ({', '.join(f)})" for s, f in revisit.items())
                                     if revisit else "nothing, every hidden check passed.")]
    return "\n".join(lines)
