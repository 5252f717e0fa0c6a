"""Instructor-side grading for Attention from Scratch.

- ``grader.checks``: the check library behind every hidden test, keyed by exercise id.
- ``grader.course``: where the course's folders are and which assignments exist.
- ``grader.release``: solutions/ -> notebooks/ through ``nbgrader generate_assignment``.
- ``grader.grade``: a class's submissions -> gradebook, grades.csv and feedback HTML.
- ``grader.execute``: nbgrader's Execute with a time budget for a whole notebook.
- ``grader.feedback``: one-line diagnoses of test cells, and the feedback preprocessor
  that shows them in place of hidden tests and tracebacks.
- ``grader.cli``: the ``course-grader`` command behind ``make release`` and ``make grade``.
"""
