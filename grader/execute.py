"""Notebook execution while grading: nbgrader's Execute, sandboxed and bounded.

On top of nbgrader's per-cell time limit, ``BudgetedExecute``

- runs the kernel in ``grader.sandbox.SandboxedKernelManager``;
- limits each cell's CPU time, counted for all the kernel's processes together (its
  cgroup's count, or its process tree's): a watchdog stops the kernel past
  ``cell_cpu_seconds``, so background processes cannot hide their CPU from it;
- gives the whole notebook a time budget, counted from the moment the kernel is
  ready: each cell's limit is cut to what is left (rounded up to a whole second), and
  once it is spent the remaining cells are not run ("not run: the notebook's time
  budget ... was spent"). Execution therefore ends within the budget plus about one
  cell's rounding and the interrupt's grace (nbclient's ``iopub_timeout``), however
  many cells there are; an endless loop called from several cells costs one budget;
- passes markdown and raw cells by without a round trip through the event loop
  (tens of thousands of them cost milliseconds, not seconds);
- caps output in bytes per cell and per notebook (nbgrader counts lines, so one huge
  line would pass): past the cap, output is dropped and the cell is interrupted;
- survives a kernel that dies or will not stop: the cell gets a plain-language
  error, the remaining cells are marked "not run", and the notebook is still saved
  and graded (answers given before that point keep their points).

What happened to a cell is recorded, for the verdicts, in
``resources["attention_course"]["events"][cell_index]``.
"""
from __future__ import annotations

import asyncio
import math
import time

from nbclient.util import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Integer

from .sandbox import SandboxedKernelManager

_KB = 1024


def _size(msg: dict) -> int:
    content = msg.get("content", {})
    if "text" in content:
        return len(content["text"])
    data = content.get("data", {})
    return sum(len(v) if isinstance(v, str) else len(str(v)) for v in data.values()) + \
        sum(len(str(v)) for v in content.get("traceback", []))


class BudgetedExecute(Execute):
    """nbgrader's ``Execute`` in a sandbox, with a notebook time budget and byte limits."""

    notebook_timeout = Integer(60, help="Seconds of execution allowed for a whole notebook, from the moment "
                                        "its kernel is ready; cells left when it is spent are not run.").tag(config=True)
    cell_output_kb = Integer(2048, help="Output kept per cell, KiB.").tag(config=True)
    notebook_output_kb = Integer(8192, help="Output kept per notebook, KiB.").tag(config=True)
    cell_cpu_seconds = Integer(90, help="CPU seconds (all threads) a cell may use; the kernel's "
                                        "SandboxedKernelManager.cpu_seconds bounds the notebook.").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs["kernel_manager_class"] = SandboxedKernelManager  # nbgrader passes its own
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, *args, **kwargs):
        self._deadline = None  # set once the kernel is ready: start-up has its own limit
        self._stopped: str | None = None
        self._notebook_bytes = self._cell_bytes = 0
        self._cell_over = False
        self._events = resources.setdefault("attention_course", {}).setdefault("events", {})
        return super().preprocess(nb, resources, *args, **kwargs)

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        self.km.seal()  # before any cell runs
        self._deadline = time.monotonic() + self.notebook_timeout
        return kc

    # nbclient binds its sync wrappers to its own coroutines: rebind them to ours
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    def _get_timeout(self, cell):
        timeout = super()._get_timeout(cell)
        if cell is None or getattr(self, "_deadline", None) is None:
            return timeout
        # a cell started with budget left gets at most the rest, rounded up to a second
        remaining = max(1, math.ceil(self._deadline - time.monotonic()))
        return remaining if timeout is None else min(timeout, remaining)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or not cell.source.strip():  # nothing to run: skip the event loop
            self._check_assign_resources(resources)
            return cell, self.resources
        return super().preprocess_cell(cell, resources, index)

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if cell.cell_type != "code" or not cell.source.strip():
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        if not self._stopped and self._deadline is not None and time.monotonic() >= self._deadline:
            self._stopped = f"the notebook's time budget ({self.notebook_timeout} s) was spent"
        if self._stopped:
            cell.outputs = [_error("NotRun", f"not run: {self._stopped}")]
            self._events[cell_index] = f"not run: {self._stopped}"
            return cell
        self._cell_bytes, self._cell_over = 0, False
        watch = asyncio.ensure_future(self._watch_cpu(cell_index))
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        except DeadKernelError:
            self._stop(cell, cell_index, "the Python kernel stopped in this cell (os._exit, a crash, "
                                         "or a time, memory or process limit)")
        except CellTimeoutError:  # the interrupt at the time limit did not stop the cell
            self._stop(cell, cell_index, "the cell ignored the interrupt at the time limit, so its "
                                         "kernel was stopped")
            await self._async_kill()
        finally:
            watch.cancel()
        return cell

    execute_cell = run_sync(async_execute_cell)

    async def _watch_cpu(self, cell_index: int) -> None:
        """Stop the kernel when the cell uses more than ``cell_cpu_seconds`` of CPU."""
        start = self.km.cpu_time()
        while start is not None:
            await asyncio.sleep(0.25)
            used = self.km.cpu_time()
            if used is None:
                return
            if used - start > self.cell_cpu_seconds:
                self._events[cell_index] = (f"the cell used more than {self.cell_cpu_seconds} s of CPU "
                                            "time, so its kernel was stopped")
                await self._async_kill()
                return

    def _stop(self, cell: NotebookNode, cell_index: int, why: str) -> None:
        self._stopped = "an earlier cell stopped the kernel"
        why = self._events.setdefault(cell_index, why)
        cell.outputs.append(_error("KernelStopped", why))

    async def _async_kill(self) -> None:
        try:
            await self.km.shutdown_kernel(now=True)
        except Exception as error:  # already gone
            self.log.debug("kill: %s", error)

    def output(self, outs, msg, display_id, cell_index):
        size = _size(msg)
        self._cell_bytes += size
        self._notebook_bytes += size
        limit = None
        if self._cell_bytes > self.cell_output_kb * _KB:
            limit = f"{self.cell_output_kb} KiB a cell"
        elif self._notebook_bytes > self.notebook_output_kb * _KB:
            limit = f"{self.notebook_output_kb} KiB a notebook"
        if limit is None:
            return super().output(outs, msg, display_id, cell_index)
        if not self._cell_over:
            self._cell_over = True
            why = f"the cell printed more than the output limit ({limit}) and was interrupted"
            self._events[cell_index] = why
            outs.append(_error("OutputLimit", why))
            asyncio.ensure_future(self.km.interrupt_kernel())
        return None


def _error(name: str, text: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=name, evalue=text, traceback=[f"{name}: {text}"])
