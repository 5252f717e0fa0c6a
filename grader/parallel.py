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
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dask
from distributed import Client, KilledWorker, LocalCluster, as_completed
from tqdm import tqdm

from .unit import Settings, grade_submission


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
        yield c


def run(units: list[Unit], jobs: int | None = None, scheduler: str | None = None,
        progress: bool = True) -> Iterator[tuple[Unit, dict | str]]:
    """Grade ``units``; yield (unit, result) as each completes, under a progress bar.

    The result is ``grade_submission``'s dict, or a one-line reason (str) when the
    unit raised or its worker died more often than Dask allows. Every unit is
    yielded exactly once.
    """
    if not units:
        return
    with client(jobs, scheduler) as c:
        futures = {}
        for unit in units:
            files = unit.files() if callable(unit.files) else unit.files
            future = c.submit(grade_submission, files, unit.student_id, unit.assignment_id, unit.settings,
                              key=f"grade-{unit.assignment_id}-{unit.student_id}", pure=False)
            futures[future] = unit
        bar = tqdm(as_completed(futures), total=len(futures), desc="grading", unit="submission",
                   disable=not progress)
        for future in bar:
            yield futures[future], _outcome(future)
            future.release()


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
