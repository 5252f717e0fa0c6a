"""Running units of work on Dask: local worker processes by default, a cluster when given.

One engine, two deployments. Without a scheduler address, a ``LocalCluster`` of
``jobs`` worker processes (one thread each: a unit runs one kernel, and the sandbox
and rlimits are per kernel) starts for the batch and stops after it. With one
(``tcp://host:8786``, ``tls://...``), the same units go to that scheduler's workers,
wherever they run (``dask worker``, Kubernetes, Slurm, Dask Gateway).

Results are handed back as they complete. A unit whose worker dies is run again on
another worker by Dask's scheduler; past ``distributed.scheduler.allowed-failures``
deaths, or when the unit raises, it comes back as a one-line reason instead of a
result, and the batch goes on.

Each unit (staging, execution, feedback) has one deadline, ``UnitLimits.seconds``,
counted from the moment a worker starts executing it (workers are asked which units
they execute, every ``POLL`` seconds). A unit past it is cancelled, comes back as
"grading took longer than N s ...", and its worker is restarted (its nanny starts a
fresh process; the sandbox's kernel dies with the old one): a thread cannot be
stopped from outside, so the process goes.

A grade must not depend on how busy the machine was. A unit that tripped a time limit
(its kernel's CPU or wall-clock limits, its start-up, or the unit's deadline) while
another unit ran beside it, or while the machine was busy (some process waited for a
CPU for at least ``UnitLimits.busy_pressure`` of the unit's time, by Linux's PSI), is
graded again alone: no new unit starts until the running ones are back, then it runs
with nothing else of this run beside it. Only that second result is recorded, and its
status says it was regraded alone. (The kernels' limits count their own CPU time, so
this is rare; it covers the wall-clock backstops and a machine loaded by other work.)
"""
from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import time

import dask
from distributed import Client, KilledWorker, LocalCluster, WorkerPlugin, wait
from tqdm import tqdm
from traitlets import Bool, Float, Integer
from traitlets.config import Configurable

from . import course
from .unit import Settings, grade_submission, warm_up

POLL = 2.0  # seconds between asking the workers which units they are executing
log = logging.getLogger(__name__)


class UnitLimits(Configurable):
    """The bound of one unit of work, set in nbgrader_config.py (``c.UnitLimits.seconds``)."""

    seconds = Integer(420, help="Wall seconds one submission's whole unit (staging, execution, feedback) "
                                "may take on a worker; 0: no limit.").tag(config=True)
    regrade_alone = Bool(True, help="Grade a unit again, alone, when it tripped a time limit while other "
                                    "units ran beside it or the machine was busy; record only that "
                                    "result.").tag(config=True)
    busy_pressure = Float(0.2, help="The machine counts as busy during a unit when some process waited for "
                                    "a CPU for at least this share of the unit's wall time (Linux PSI, "
                                    "/proc/pressure/cpu).").tag(config=True)


def unit_seconds() -> int:
    """The configured deadline of one unit, seconds (0: none)."""
    return UnitLimits(config=course.load_config()).seconds


def regrade_reason(outcome: dict | str, crowded: bool, limits: UnitLimits) -> str | None:
    """Why a unit's outcome must not be recorded before the unit is graded again alone, or None.

    ``crowded``: another unit ran at some moment while this one did. An outcome that tripped
    no time limit is recorded as it is, and so is one of a unit that ran alone on a quiet
    machine: the limit was the submission's own doing.
    """
    if not limits.regrade_alone:
        return None
    if isinstance(outcome, str):
        tripped = outcome.startswith("grading took longer than")
        pressure = None
    else:
        tripped = outcome.get("limits_tripped", 0) > 0
        pressure = outcome.get("ran", {}).get("cpu_pressure")
    if not tripped:
        return None
    if crowded:
        return "other units ran beside it"
    if pressure is not None and pressure >= limits.busy_pressure:
        return f"the machine was busy (processes waited for a CPU {pressure:.0%} of the time)"
    return None


def _regraded(outcome: dict | str, why: str) -> dict | str:
    """The outcome of a unit graded again alone, saying so (and why) in its status."""
    note = f"regraded alone: a time limit tripped while {why}"
    if isinstance(outcome, str):
        return f"{outcome} ({note})"
    outcome["status"] = f"{outcome['status']}; {note}" if outcome.get("status") else note
    outcome["regraded"] = why
    return outcome


class EngineUnavailable(RuntimeError):
    """The Dask scheduler could not be reached."""


@dataclass
class Unit:
    """One submission to grade. ``files``: a local path, or a function returning
    ``grader.stage.read_files`` data (called when the unit is sent)."""

    student_id: str
    assignment_id: str
    files: str | Callable[[], dict]
    settings: Settings


@contextmanager
def client(jobs: int | None = None, scheduler: str | None = None) -> Iterator[Client]:
    """A Dask client: on ``scheduler``, or on a local cluster of ``jobs`` processes.

    Raises:
        EngineUnavailable: ``scheduler`` does not answer.
        ValueError: ``jobs`` is below 1.
    """
    if scheduler:
        try:
            remote = Client(scheduler, timeout="15s")
        except OSError as error:  # also TimeoutError: nothing answered at that address
            raise EngineUnavailable(f"cannot reach the Dask scheduler at {scheduler} ({error})") from None
        with remote:
            yield remote
        return
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise ValueError(f"JOBS must be at least 1, got {jobs}")
    with LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        c.register_plugin(WarmUp(), name="grader-warm-up")
        yield c


class WarmUp(WorkerPlugin):
    """Each local worker, as it starts, warms up (``grader.unit.warm_up``: imports, the fork
    server) in a thread of its own while the collector checks the first units; the worker
    stays free to take one meanwhile (a task would hold it)."""

    def setup(self, worker) -> None:
        threading.Thread(target=_warm_up_and_stay, name="grader-warm-up", daemon=True).start()


def _warm_up_and_stay() -> None:
    warm_up()
    # bubblewrap's --die-with-parent ends the fork server with the thread that started it
    # (the parent-death signal follows a thread): so this thread stays as long as the worker
    threading.Event().wait()


def run(units: Iterable[Unit], jobs: int | None = None, scheduler: str | None = None,
        progress: bool = True, deadline: float | None = None,
        work: Callable = grade_submission) -> Iterator[tuple[Unit, dict | str]]:
    """Grade ``units``; yield (unit, result) as each completes, under a progress bar.

    The result is ``grade_submission``'s dict, or a one-line reason (str) when the
    unit raised, its worker died more often than Dask allows, or it ran past
    ``deadline`` seconds (default ``UnitLimits.seconds``; 0: none). Every unit is
    yielded exactly once. ``work`` is what a worker runs (tests pass a stand-in).

    ``units`` is read as the workers start, one unit between two looks at the workers,
    so that whatever makes a unit (the collector's checks, registering an assignment)
    overlaps the grading of the first ones. A unit is handed to Dask only when a worker
    thread is free for it, so none waits behind a long one on a busy worker; it is the
    one whose assignment took longest so far in this run (longest first, which keeps a
    long unit from starting last), or one of an assignment not timed yet, in the order
    given.

    A unit whose outcome ``regrade_reason`` holds back is graded again alone (see the
    module's doc) and yielded once, with that second outcome.
    """
    limits = UnitLimits(config=course.load_config())
    deadline = limits.seconds if deadline is None else deadline
    source, todo = iter(units), []
    first = next(source, None)
    if first is None:
        return
    todo.append(first)
    with client(jobs, scheduler) as c:
        futures, seconds = {}, {}  # future -> unit; assignment -> walls of its units so far
        pending, started, more, looked = set(), {}, True, 0.0
        crowded = set()  # futures that ran, at some moment, beside another unit
        alone, solo = [], {}  # units waiting to be graded again alone, with why; the future doing that
        regrades = 0  # futures that grade a unit again: not more submissions on the progress bar

        def submit(unit: Unit, key: str):
            files = unit.files() if callable(unit.files) else unit.files
            future = c.submit(work, files, unit.student_id, unit.assignment_id, unit.settings,
                              key=key, pure=False, priority=-len(futures))  # Dask runs them in this order
            futures[future] = unit
            pending.add(future)
            return future

        def hand_out() -> None:  # to each free thread, the unit expected to take longest
            nonlocal regrades
            if alone or solo:  # a regrade alone waits for the running units, and runs by itself
                if alone and not pending:
                    unit, why = alone.pop(0)
                    solo[submit(unit, f"regrade-{unit.assignment_id}-{unit.student_id}")] = why
                    regrades += 1
                return
            slots = _slots(c)  # one look at the scheduler per hand-out, not one per unit
            while todo and len(pending) < slots:
                unit = max(todo, key=lambda u: _expected(seconds, u.assignment_id))
                todo.remove(unit)
                submit(unit, f"grade-{unit.assignment_id}-{unit.student_id}")
            if len(pending) > 1:
                crowded.update(pending)

        def settle(future, outcome) -> dict | str | None:  # the outcome to yield, or None: held back
            if future in solo:
                return _regraded(outcome, solo.pop(future))
            why = regrade_reason(outcome, future in crowded, limits)
            if why:
                alone.append((futures[future], why))
                return None
            return outcome

        with tqdm(desc="grading", unit="submission", disable=not progress) as bar:
            while pending or todo or more or alone:
                if more:  # one unit from the source between two looks at the workers
                    unit = next(source, None)
                    more = unit is not None
                    if more:
                        todo.append(unit)
                    bar.total = len(futures) - regrades + len(todo)
                    bar.refresh()
                hand_out()
                if not pending:
                    continue
                try:
                    done, _ = wait(list(pending), timeout=0 if more else (POLL if deadline else None),
                                   return_when="FIRST_COMPLETED")
                except TimeoutError:  # none completed within POLL
                    done = {f for f in pending if f.done()}
                back = []
                for future in done:
                    pending.discard(future)
                    outcome = _outcome(future)
                    if isinstance(outcome, dict) and "total" in outcome.get("timings", {}):
                        seconds.setdefault(futures[future].assignment_id, []).append(outcome["timings"]["total"])
                    future.release()
                    outcome = settle(future, outcome)
                    if outcome is not None:
                        back.append((futures[future], outcome))
                hand_out()  # before the collector records these: a freed worker starts its next unit now
                for unit, outcome in back:
                    bar.update()
                    yield unit, outcome
                if deadline and pending and (not more or time.monotonic() - looked >= POLL):
                    looked = time.monotonic()
                    for future, worker in _overdue(c, pending, started, deadline):
                        pending.discard(future)
                        future.cancel()
                        _restart(c, worker)
                        outcome = settle(future, f"grading took longer than {deadline:g} s (staging, running "
                                                 "and feedback together), so it was stopped")
                        if outcome is not None:
                            bar.update()
                            yield futures[future], outcome


def _slots(c: Client) -> int:
    """How many units the cluster's workers run at once (at least 1, e.g. while one restarts)."""
    try:
        return max(1, sum(c.nthreads().values()))
    except Exception:  # the scheduler busy or a worker going away: one is always safe
        return 1


def _expected(seconds: dict[str, list[float]], assignment_id: str) -> float:
    """The order key of a unit: its assignment's mean wall seconds in this run, or infinity
    while none of its units has come back (max() keeps the given order among equals)."""
    walls = seconds.get(assignment_id)
    return sum(walls) / len(walls) if walls else math.inf


def _overdue(c: Client, pending: set, started: dict, deadline: float) -> list[tuple[object, str]]:
    """The pending futures that a worker has executed for longer than ``deadline``, with that worker."""
    try:
        executing = c.run(_executing)  # worker address -> keys it executes now
    except Exception as error:  # a worker going away mid-call: ask again next time
        log.debug("could not ask the workers what they execute: %s", error)
        return []
    now, late = time.monotonic(), []
    by_key = {f.key: f for f in pending}
    for worker, keys in executing.items():
        for key in keys:
            if key in by_key:
                started.setdefault(key, now)
                if now - started[key] > deadline:
                    late.append((by_key[key], worker))
    return late


def _executing(dask_worker) -> list[str]:
    return [ts.key for ts in dask_worker.state.tasks.values() if ts.state == "executing"]


def _restart(c: Client, worker: str) -> None:
    """Restart ``worker``'s process; say loudly if that is impossible (a worker without a nanny)."""
    try:
        c.restart_workers([worker], timeout=60)
    except Exception as error:
        message = (f"could not restart the Dask worker {worker} after a unit ran past its deadline "
                   f"({type(error).__name__}: {error}); it may stay busy until that unit ends")
        log.error(message)
        print(f"ERROR: {message}", file=sys.stderr)


def _outcome(future) -> dict | str:
    try:
        return future.result()
    except KilledWorker:
        allowed = dask.config.get("distributed.scheduler.allowed-failures")
        return (f"the grading worker died each time it graded this submission ({allowed + 1} times: "
                "out of memory, or killed); see the Dask worker logs")
    except Exception as error:  # a fault of the grader or the machine, not of the submission
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"the grader failed on this submission ({type(error).__name__}: {first})"
