"""Attention from Scratch for self-learners: the course's notebooks as package data and the
``attention-course`` command (``attention_course.cli``) that writes them into a folder of
the learner's and opens JupyterLab there. The notebooks import ``coursekit``; check my
work judges them with ``grader.checks``, both installed with this package."""
