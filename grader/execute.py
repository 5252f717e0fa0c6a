"""Notebook execution while grading: nbgrader's Execute, sandboxed and bounded.

In place of nbgrader's per-cell wall-clock time limit, ``BudgetedExecute``

- runs the kernel in ``grader.sandbox.SandboxedKernelManager``;
- counts the kernel's own CPU time, for all its processes and threads together (its
  cgroup's ``usage``, or its process tree's without one), never the wall clock: a
  kernel kept waiting for a CPU by a neighbour or by other work on the machine is
  slowed, not charged, so a correct notebook keeps its points however busy the
  machine is. A watchdog interrupts a cell that uses more than ``cell_cpu_seconds``
  (as nbclient does at its time-out: the cell's diagnosis is "stopped at the time
  limit", the kernel goes on, and one that ignores the interrupt is stopped), or once
  the notebook (from the moment its kernel is ready) used more than
  ``notebook_cpu_seconds``; then the remaining cells are not run ("not run: the
  notebook's CPU budget ... was spent"). Background processes cannot hide their CPU
  from it, and an endless loop called from several cells costs one budget;
- counts, against a notebook that sleeps or waits instead of computing, its idle time:
  the wall-clock time in which none of the kernel's threads was running or waiting for
  a CPU (the watchdog looks every ``WATCH_SECONDS``). A cell may be idle
  ``cell_idle_seconds``, the notebook ``notebook_idle_seconds``; past them, as past
  the CPU limits. A kernel that waits for a CPU is not idle, so this too is
  independent of the machine's load;
- bounds wall-clock time only as a generous backstop: ``wall_factor`` times the CPU
  limits, for a cell (nbclient's timeout: the cell is interrupted, and its kernel
  killed if it ignores that) and for the notebook (the remaining cells are not run).
  Execution therefore ends within the notebook's backstop plus a second's rounding and
  the interrupt's grace (nbclient's ``iopub_timeout``), however many cells there are.
  nbgrader's ``Execute.timeout`` is not used;
- counts, for this process, every time a limit that a busy machine could have made a
  notebook trip did trip (``limit_trips``): the CPU limits (a CPU second buys less
  work beside busy hyperthreads and caches), the wall-clock backstops and the
  kernel's start-up, not the idle limits. A unit that tripped one on a busy machine is
  graded again alone before a failure is recorded (``grader.parallel``);
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
from traitlets import Float, Integer

from .sandbox import SandboxedKernelManager

_KB = 1024
IGNORED = "the cell ignored the interrupt at the time limit, so its kernel was stopped"
WATCH_SECONDS = 0.25  # how often the watchdog reads the kernel's CPU time and its threads' states
_trips = 0  # limit_trips(): time limits that load can sway, tripped in this process


def limit_trips() -> int:
    """How many times, in this process, a kernel tripped a time limit that depends on the
    machine's load (CPU, wall clock) or did not start in time: a unit compares it before
    and after (``grader.unit``)."""
    return _trips


def _tripped() -> None:
    global _trips
    _trips += 1


def _size(msg: dict) -> int:
    content = msg.get("content", {})
    if "text" in content:
        return len(content["text"])
    data = content.get("data", {})
    return sum(len(v) if isinstance(v, str) else len(str(v)) for v in data.values()) + \
        sum(len(str(v)) for v in content.get("traceback", []))


class BudgetedExecute(Execute):
    """nbgrader's ``Execute`` in a sandbox, with CPU and idle-time limits, a wall-clock backstop and
    byte limits."""

    notebook_cpu_seconds = Integer(60, help="CPU seconds all the kernel's processes together may use for the "
                                            "whole notebook, from the moment its kernel is ready; cells left "
                                            "when they are spent are not run.").tag(config=True)
    cell_cpu_seconds = Integer(45, help="CPU seconds all the kernel's processes together may use in one "
                                        "cell; past them the cell is interrupted (and its kernel stopped if it "
                                        "ignores that).").tag(config=True)
    cell_idle_seconds = Integer(45, help="Wall-clock seconds a cell may spend with none of the kernel's "
                                         "threads running or waiting for a CPU (sleeping, waiting).").tag(config=True)
    notebook_idle_seconds = Integer(60, help="Idle seconds (as cell_idle_seconds) for the whole notebook; "
                                             "cells left when they are spent are not run.").tag(config=True)
    wall_factor = Float(3.0, help="The wall-clock backstop, as a multiple of the CPU "
                                  "limits: a cell may take wall_factor * cell_cpu_seconds of wall-clock "
                                  "time, the notebook wall_factor * notebook_cpu_seconds.").tag(config=True)
    cell_output_kb = Integer(2048, help="Output kept per cell, KiB.").tag(config=True)
    notebook_output_kb = Integer(8192, help="Output kept per notebook, KiB.").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs["kernel_manager_class"] = SandboxedKernelManager  # nbgrader passes its own
        super().__init__(*args, **kwargs)

    def cell_wall_seconds(self) -> int:
        """A cell's wall-clock backstop, whole seconds."""
        return math.ceil(self.wall_factor * self.cell_cpu_seconds)

    def notebook_wall_seconds(self) -> int:
        """The notebook's wall-clock backstop, whole seconds."""
        return math.ceil(self.wall_factor * self.notebook_cpu_seconds)

    def describe_limits(self) -> str:
        """The time limits in words, for a diagnosis: " (45 s of CPU a cell, ...)"."""
        return (f" ({self.cell_cpu_seconds} s of CPU a cell, {self.notebook_cpu_seconds} s a notebook; "
                f"{self.cell_idle_seconds} s / {self.notebook_idle_seconds} s idle; "
                f"{self.cell_wall_seconds()} s / {self.notebook_wall_seconds()} s of wall-clock time)")

    def preprocess(self, nb, resources=None, *args, **kwargs):
        self._deadline = None  # the wall-clock backstop, set once the kernel is ready: start-up has its own limit
        self._cpu_start: float | None = None  # the kernel's CPU seconds when it was ready
        self._idle = 0.0  # the notebook's idle seconds so far
        self._sample: tuple[float, bool] | None = None  # the watchdog's last look: when, and whether idle
        self._stopped: str | None = None
        self._notebook_bytes = self._cell_bytes = 0
        self._cell_over = False
        self._events = resources.setdefault("attention_course", {}).setdefault("events", {})
        return super().preprocess(nb, resources, *args, **kwargs)

    async def async_start_new_kernel_client(self):
        try:
            kc = await super().async_start_new_kernel_client()
        except Exception:  # e.g. past startup_timeout on a busy machine: a limit too
            _tripped()
            raise
        self.km.seal()  # before any cell runs
        self._deadline = time.monotonic() + self.notebook_wall_seconds()
        self._cpu_start = self.km.cpu_time()
        return kc

    # nbclient binds its sync wrappers to its own coroutines: rebind them to ours
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    def _get_timeout(self, cell):
        """A cell's wall-clock backstop (nbgrader's ``Execute.timeout`` is not used): a cell
        started with the notebook's backstop not yet spent gets at most the rest of it,
        rounded up to a second."""
        timeout = self.cell_wall_seconds()
        if cell is None or getattr(self, "_deadline", None) is None:
            return timeout
        return min(timeout, max(1, math.ceil(self._deadline - time.monotonic())))

    async def _async_handle_timeout(self, timeout, cell=None):
        _tripped()  # the wall-clock backstop: nbclient interrupts the cell
        return await super()._async_handle_timeout(timeout, cell)

    def _budget_spent(self) -> str | None:
        """Why no more cells may run (a budget is spent), or None."""
        if self._deadline is None:
            return None
        if time.monotonic() >= self._deadline:
            return f"the notebook's wall-clock backstop ({self.notebook_wall_seconds()} s) was spent"
        used = self.km.cpu_time()
        if self._cpu_start is not None and used is not None and used - self._cpu_start >= self.notebook_cpu_seconds:
            return self._cpu_spent()
        if self._idle >= self.notebook_idle_seconds:
            return self._idle_spent()
        return None

    def _cpu_spent(self) -> str:
        return f"the notebook's CPU budget ({self.notebook_cpu_seconds} s of CPU) was spent"

    def _idle_spent(self) -> str:
        return f"the notebook's idle time ({self.notebook_idle_seconds} s sleeping or waiting) was spent"

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or not cell.source.strip():  # nothing to run: skip the event loop
            self._check_assign_resources(resources)
            return cell, self.resources
        return super().preprocess_cell(cell, resources, index)

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if cell.cell_type != "code" or not cell.source.strip():
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        if not self._stopped:
            self._stopped = self._budget_spent()
            if self._stopped and self._stopped != self._idle_spent():  # load cannot make a kernel idle
                _tripped()
        if self._stopped:
            cell.outputs = [_error("NotRun", f"not run: {self._stopped}")]
            self._events[cell_index] = f"not run: {self._stopped}"
            return cell
        self._cell_bytes, self._cell_over, self._over = 0, False, None
        watch = asyncio.ensure_future(self._watch(cell_index))
        try:
            cell = await super().async_execute_cell(cell, cell_index, execution_count, store_history)
            if self._over:  # interrupted at a CPU or idle limit: the same error as at nbclient's time-out
                cell.outputs.append(_error("CellTimeoutError", f"the cell was interrupted at its limit ({self._over})"))
            return cell
        except DeadKernelError:
            self._stop(cell, cell_index, "the Python kernel stopped in this cell (os._exit, a crash, "
                                         "or a time, memory or process limit)")
        except CellTimeoutError:  # the interrupt at the time limit did not stop the cell
            self._stop(cell, cell_index, IGNORED)
            await self._async_kill()
        finally:
            watch.cancel()
            if self._sample and self._sample[1]:  # idle from the watchdog's last look to the cell's end
                self._idle += time.monotonic() - self._sample[0]
            self._sample = None
        return cell

    execute_cell = run_sync(async_execute_cell)

    async def _watch(self, cell_index: int) -> None:
        """Interrupt the cell when it uses more than ``cell_cpu_seconds`` of CPU or is idle
        more than ``cell_idle_seconds``, or the notebook more than its own (then the
        remaining cells are not run): the kernel's own CPU and idle time, whatever the wall
        clock says. As at nbclient's time-out, the kernel goes on; one that ignores the
        interrupt for ``iopub_timeout`` more seconds is stopped."""
        start, idle, last = self.km.cpu_time(), 0.0, time.monotonic()
        while start is not None:
            await asyncio.sleep(WATCH_SECONDS)
            used, busy, now = self.km.cpu_time(), self.km.busy(), time.monotonic()
            if used is None or busy is None:
                return
            if not busy:  # the whole interval, as sampled: the kernel sleeps or waits
                idle += now - last
                self._idle += now - last
            last, self._sample = now, (now, not busy)
            if used - start > self.cell_cpu_seconds:
                self._over = f"{self.cell_cpu_seconds} s of CPU a cell"
            elif self._cpu_start is not None and used - self._cpu_start > self.notebook_cpu_seconds:
                self._over = f"{self.notebook_cpu_seconds} s of CPU a notebook"
                self._stopped = self._cpu_spent()
            elif idle > self.cell_idle_seconds:
                self._over = f"{self.cell_idle_seconds} s idle a cell"
            elif self._idle > self.notebook_idle_seconds:
                self._over = f"{self.notebook_idle_seconds} s idle a notebook"
                self._stopped = self._idle_spent()
            else:
                continue
            if "CPU" in self._over:  # an idle limit does not depend on the machine's load
                _tripped()
            await self.km.interrupt_kernel()
            await asyncio.sleep(self.iopub_timeout + 1)  # cancelled when the cell ends, as it should
            self._events[cell_index] = IGNORED
            await self._async_kill()
            return

    def _stop(self, cell: NotebookNode, cell_index: int, why: str) -> None:
        self._stopped = self._stopped or "an earlier cell stopped the kernel"
        why = self._events.setdefault(cell_index, why)
        cell.outputs.append(_error("KernelStopped", why))

    async def _async_kill(self) -> None:
        try:
            await self.km.shutdown_kernel(now=True)
        except Exception as error:  # already gone
            self.log.debug("kill: %s", error)

    def output(self, outs, msg, display_id, cell_index):
        # The caps count output kept, not output dropped: a flood that runs on until the interrupt
        # lands (late on a busy machine) must not spend the notebook's cap for the cells after it.
        if self._cell_over:  # past this cell's cap: the rest of its output is dropped
            return None
        size = _size(msg)
        limit = None
        if self._cell_bytes + size > self.cell_output_kb * _KB:
            limit = f"{self.cell_output_kb} KiB a cell"
        elif self._notebook_bytes + size > self.notebook_output_kb * _KB:
            limit = f"{self.notebook_output_kb} KiB a notebook"
        if limit is None:
            self._cell_bytes += size
            self._notebook_bytes += size
            return super().output(outs, msg, display_id, cell_index)
        self._cell_over = True
        why = f"the cell printed more than the output limit ({limit}) and was interrupted"
        self._events[cell_index] = why
        outs.append(_error("OutputLimit", why))
        asyncio.ensure_future(self.km.interrupt_kernel())
        return None


def _error(name: str, text: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=name, evalue=text, traceback=[f"{name}: {text}"])
