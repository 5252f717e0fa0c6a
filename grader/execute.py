"""Notebook execution while grading: nbgrader's Execute with a whole-notebook time budget.

nbgrader limits each cell; a submission whose slow function is called from several
cells would pay the cell limit again and again. Here every cell's limit is also cut
to what is left of the notebook's budget, so one submission costs at most
``notebook_timeout`` seconds of kernel time, and every cell still gets an error
output (never a silent skip) when time runs out.
"""
from __future__ import annotations

import time

from nbgrader.preprocessors import Execute
from traitlets import Integer


class BudgetedExecute(Execute):
    """``Execute`` whose per-cell timeout never exceeds the notebook's remaining budget."""

    notebook_timeout = Integer(
        60, help="Seconds of execution allowed for a whole notebook while grading."
    ).tag(config=True)

    _deadline: float | None = None

    def preprocess(self, nb, resources=None, *args, **kwargs):
        self._deadline = time.monotonic() + self.notebook_timeout
        try:
            return super().preprocess(nb, resources, *args, **kwargs)
        finally:
            self._deadline = None

    def _get_timeout(self, cell):
        timeout = super()._get_timeout(cell)
        if cell is None or self._deadline is None:
            return timeout
        remaining = max(1, int(self._deadline - time.monotonic()))
        return remaining if timeout is None else min(timeout, remaining)
