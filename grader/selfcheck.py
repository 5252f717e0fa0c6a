"""Check my work: grade a learner's own saved notebook with the hidden checks, offline.

``course-grader check PATH.ipynb`` (``make check NOTEBOOK=PATH``, and the last cell of
every student notebook through ``coursekit.check``) runs the one grading pipeline,
``grader.unit.grade_submission``, on that single notebook: the same sandboxed kernel,
the same questions and verdicts. The questions are drawn from a secret of the user
who runs the check, made on first use in their own Jupyter data folder
(``jupyter_data_dir()/attention-from-scratch/check_secret``, which ``JUPYTER_DATA_DIR``
moves; folder 0700, file 0600), not from an instructor's course secret, so a self-check
never reveals anything about a graded run. Nothing is written into the install or the
course folder (it may be read-only and shared by a whole class): the grading itself
runs in a temporary folder. What is printed is the tutor's text (``grader.tutor``): per exercise pass or
fail, the points, the diagnosis and a hint, then the score and what to revisit;
never hidden inputs or hidden test code.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from coursekit.naming import naming_note, notebook_files

from . import course, tutortext

DATA_FOLDER = "attention-from-scratch"
STUDENT = "self"


def secret_file() -> Path:
    """Where this user's self-check secret lives (it need not exist yet)."""
    return Path(jupyter_data_dir()) / DATA_FOLDER / "check_secret"


def user_secret() -> bytes:
    """This user's self-check secret, made on first use (folder 0700, file 0600).

    Two checks starting at once (the check service) both get the same secret: the file
    appears complete or not at all, because it is written aside and then hard-linked
    into place, which fails if another process got there first.

    Raises:
        OSError: the user's data folder cannot be made or read.
    """
    path = secret_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # mkdir's mode is masked by the umask, and an older folder may be open
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


# One line under the first: the visible tests (and Validate, which runs them) are not the grade.
OTHER_INPUTS = ("The hidden checks try other inputs than the visible tests (they are never shown), so a "
                "notebook that passes its visible tests and Validate can still fail one here.")


class CannotCheck(ValueError):
    """The path is not a notebook of this course; the message says what to do."""


@dataclass
class Checked:
    """The outcome of one self-check."""

    assignment_id: str
    status: str  # grade_submission's status: "graded..." or "not graded: ..."
    score: float
    max_score: float
    comments: list[tutortext.Comment]
    naming: str | None = None  # coursekit.naming.naming_note: the file is not named as released

    @property
    def graded(self) -> bool:
        return self.status.startswith("graded")

    def text(self, path: Path) -> str:
        """What the learner reads; the naming note, when there is one, right under the first line."""
        naming = f"Note: {self.naming}\n" if self.naming else ""
        if not self.graded:
            return f"{path.name}: {self.status}\n{naming}".rstrip("\n")
        head = f"Checked {path.name} ({self.assignment_id}) with the hidden checks:\n{naming}{OTHER_INPUTS}\n"
        note = "" if self.status == "graded" else f"({self.status.removeprefix('graded: ')})\n"
        return head + note + "\n" + tutortext.as_text(self.comments, self.score, self.max_score)


def assignment_of(path: Path) -> str:
    """The assignment a notebook belongs to: from its cells' grade ids, else its file name.

    Raises:
        CannotCheck: neither names an assignment of this course.
    """
    by_topic = {a.split("_", 1)[-1]: a for a in course.assignments()}
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        ids = [c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "") for c in cells if isinstance(c, dict)]
        topics = {i.split("-", 1)[0] for i in ids if "-" in i} & set(by_topic)
        if len(topics) == 1:
            return by_topic[topics.pop()]
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        pass  # a broken file: its name may still tell, and grading then says what is wrong with it
    named = [a for a in course.assignments() if path.stem.startswith(a)]
    if named:
        return max(named, key=len)
    raise CannotCheck(f"{path} is not one of this course's notebooks ({', '.join(course.assignments())}): "
                      "pass a notebook from notebooks/<assignment>/")


def check_notebook(path: Path, student: str = STUDENT) -> Checked:
    """Grade ``path`` as the hidden checks would; nothing is written beside it.

    Args:
        path: the saved notebook.
        student: whose questions are drawn (with this user's secret): "self" for a
            learner's own check, the hub user's name in the check service.

    Raises:
        CannotCheck: ``path`` is missing, not a .ipynb file, or not of this course.
        OSError: the user's data folder, where the secret lives, cannot be written.
    """
    from . import sandbox  # (the grading stack, nbgrader's, imported only by a whole-notebook check)
    from .unit import Settings, course_version, grade_submission

    path = Path(path)
    if path.suffix != ".ipynb" or not path.is_file():
        raise CannotCheck(f"no notebook at {path}: pass the .ipynb file you saved (File > Save, Ctrl-S)")
    assignment_id = assignment_of(path)
    # The learner grades their own code on their own machine: without bubblewrap the
    # kernel still gets its rlimits, and the instructor's warning would only alarm.
    sandbox._warned = True
    secret = user_secret()
    with tempfile.TemporaryDirectory(prefix="check-") as tmp:
        folder = Path(tmp) / assignment_id
        folder.mkdir()
        names = course.notebook_names(assignment_id)  # a renamed copy is checked under its own name
        shutil.copyfile(path, folder / (f"{names[0]}.ipynb" if len(names) == 1 else path.name))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = grade_submission(folder, student, assignment_id, Settings(secret, course_version=course_version()))
    found = tutortext.comments(assignment_id, result["points"], result["max_points"], result["diagnoses"])
    return Checked(assignment_id, result["status"], sum(result["points"].values()),
                   sum(result["max_points"].values()), found,
                   naming_note(path.name, names, notebook_files(path.parent)))
