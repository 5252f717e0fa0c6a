"""Instructor-side grading for Attention from Scratch.

- ``grader.checks``: the check library behind every hidden test, keyed by exercise id.
- ``grader.course``: where the course's folders are and which assignments exist.
- ``grader.release``: solutions/ -> notebooks/ through ``nbgrader generate_assignment``.
- ``grader.grade``: a class's submissions -> gradebook, grades.csv and feedback HTML.
- ``grader.feedback``: nbgrader preprocessors that keep hidden tests out of feedback.
- ``grader.cli``: the ``course-grader`` command behind ``make release`` and ``make grade``.
"""
