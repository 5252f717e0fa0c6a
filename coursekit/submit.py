"""``nbgrader submit`` that tells the student, in one line, how a misnamed notebook is graded.

Set in the students' nbgrader configuration (docs/deploying.md; hub/launch.py does)::

    c.ExchangeFactory.submit = "coursekit.submit.NamedSubmit"

Stock submit compares the submitted notebooks with the released ones and, when they
differ, logs a block of "FOUND / MISSING / EXTRA" lines that does not say what grading
will do. This one says it in one line, by the grader's own rule (``coursekit.naming``):
"'my masking (final).ipynb' is not named as released: it will be graded as
'03_masking.ipynb' ...", or that a copy will not be graded and which notebook will.
The submission itself is stock: nothing is refused or renamed (a student who submits
at the deadline loses nothing; ``--strict`` still refuses a missing notebook).
"""
from __future__ import annotations

from nbgrader.exchange.default.submit import ExchangeSubmit

from .naming import naming_note, notebook_files


class NamedSubmit(ExchangeSubmit):
    """Stock submit, with one line per notebook that is not named as released (see the module)."""

    def check_filename_diff(self):
        released = [name[: -len(".ipynb")] for name in notebook_files(self.release_path)]
        present = notebook_files(self.src_path)
        notes = [naming_note(name, released, present) for name in present]
        notes = [note for note in notes if note]
        if not notes or (self.strict and any(f"{n}.ipynb" not in present for n in released)):
            return super().check_filename_diff()  # stock's own words, and --strict's refusal
        for note in notes:
            self.log.warning(note)
