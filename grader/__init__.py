"""Instructor-side grading for Attention from Scratch.

- ``grader.checks``: the check library behind every hidden test, keyed by exercise id.
- ``grader.course``: where the course's folders are and which assignments exist.
- ``grader.release``: solutions/ -> notebooks/ through ``nbgrader generate_assignment``.
- ``grader.grade``: the collector: a class's results -> gradebook, grades.csv and feedback HTML.
- ``grader.unit``: the unit of work, one submission graded into a JSON-ready result.
- ``grader.stage``: checks a submitted folder and copies it into a workspace.
- ``grader.parallel``: runs units on Dask, locally or on a cluster.
- ``grader.execute``: nbgrader's Execute with CPU-time limits per cell and per notebook.
- ``grader.feedback``: one-line diagnoses of test cells, and the feedback preprocessor
  that shows them in place of hidden tests and tracebacks.
- ``grader.cli``: the ``course-grader`` command behind ``make release`` and ``make grade``.

The self-learner's package (selfstudy/, ``make selfstudy-wheel``) holds ``grader.checks`` and
what check my work in a kernel imports (``grader.kernelcheck`` and its modules; see
hub/environments.py, ``SELFSTUDY_GRADER``), and none of the grading stack.
"""
