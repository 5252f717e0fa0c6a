"""The reference implementations, written once per topic (``reference/<topic>.py``).

Each is the learner-style correct answer of an exercise, with the exercise's own
signature: the grader runs it on the drawn inputs exactly as it runs a learner's
function, and catalogued mistakes, drivers' stand-ins and later topics build on it.
Numpy where the notebook is numpy, torch where it is torch.
"""
