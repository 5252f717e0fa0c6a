"""BudgetedExecute on small notebooks: every way a cell can misbehave ends in a recorded event,
and a kernel kept waiting for a CPU is slowed, never charged for the wait."""
from __future__ import annotations

import os
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from traitlets.config import Config

from grader.execute import BudgetedExecute, limit_trips

pytestmark = pytest.mark.kernel


def _run(tmp_path, *sources: str, **limits) -> tuple[nbformat.NotebookNode, dict]:
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executor = BudgetedExecute(kernel_name="python3", **limits)
    resources = {"metadata": {"path": str(tmp_path)}}
    nb, resources = executor.preprocess(nb, resources)
    return nb, resources["attention_course"]["events"]


def test_a_quiet_notebook_has_no_events(tmp_path):
    nb, events = _run(tmp_path, "x = 1", "print(x + 1)")
    assert events == {} and nb.cells[1].outputs[0].text == "2\n"


def _timed_out(cell) -> str:
    """The evalue of the time-out error the cell got, or ""."""
    return next((o.evalue for o in cell.outputs if o.output_type == "error" and o.ename == "CellTimeoutError"), "")


def test_a_cell_over_its_cpu_limit_is_interrupted_and_later_cells_run(tmp_path):
    # as at nbclient's time-out: the cell's diagnosis is "stopped at the time limit", the kernel goes on
    trips = limit_trips()
    nb, events = _run(tmp_path, "x = 1", "while True: pass", "print(x)", cell_cpu_seconds=1, wall_factor=30)
    assert _timed_out(nb.cells[1]) == "the cell was interrupted at its limit (1 s of CPU a cell)"
    assert events == {} and nb.cells[2].outputs[0].text == "1\n"
    assert limit_trips() == trips + 1


@pytest.mark.parametrize("flood", [
    "print('x' * 5_000_000)",                       # one huge line: a line limit would let it pass
    "for _ in range(100_000): print('y' * 100)",   # many lines
])
def test_output_over_the_byte_limit_is_cut_and_the_cell_interrupted(tmp_path, flood):
    nb, events = _run(tmp_path, flood + "\nimport time; time.sleep(30)", "print('after')",
                      cell_output_kb=64)
    assert "output limit" in events[0]
    kept = sum(len(o.get("text", "")) for o in nb.cells[0].outputs)
    assert kept <= 64 * 1024 + 200  # the cap, plus our one-line note
    assert nb.cells[1].outputs[0].text == "after\n"  # interrupted, not killed: the kernel goes on


def test_output_dropped_past_a_cell_s_cap_does_not_spend_the_notebook_s():
    """A flood goes on until the interrupt lands, late on a busy machine (a CI run saw the next
    cell's print('after') stopped at the notebook's cap). Worst case, played on the executor
    without a kernel: the interrupt never lands, and the cell's 300 KB past its 64 KiB cap,
    dropped, leave the notebook's 256 KiB for the next cell."""
    import asyncio

    executor = BudgetedExecute(kernel_name="python3", cell_output_kb=64, notebook_output_kb=256)
    interrupts = []

    class Kernel:
        async def interrupt_kernel(self):
            interrupts.append(1)

    executor.km = Kernel()
    executor.reset_execution_trackers()  # nbclient's per-run state, as a run sets it
    executor.clear_before_next_output = False
    executor._notebook_bytes = executor._cell_bytes = 0
    executor._cell_over, executor._events = False, {}

    def printed(text: str) -> dict:
        return {"msg_type": "stream", "header": {"msg_type": "stream"}, "parent_header": {"msg_id": "cell"},
                "content": {"name": "stdout", "text": text}}

    async def play() -> tuple[list, list]:
        first = []
        for _ in range(3000):
            executor.output(first, printed("y" * 99 + "\n"), None, 0)
        await asyncio.sleep(0)  # the interrupt's coroutine runs
        executor._cell_bytes, executor._cell_over = 0, False  # the next cell, as async_execute_cell starts it
        second = []
        executor.output(second, printed("after\n"), None, 1)
        return first, second

    first, second = asyncio.run(play())
    assert sum(len(o.get("text", "")) for o in first) <= 64 * 1024 and interrupts == [1]
    assert "64 KiB a cell" in executor._events[0] and 1 not in executor._events
    assert [o.text for o in second] == ["after\n"]


def test_kernel_exit_keeps_earlier_outputs_and_leaves_nothing(tmp_path, monkeypatch):
    import tempfile

    import grader.sandbox as sandbox

    made, mkdtemp = [], tempfile.mkdtemp
    monkeypatch.setattr(sandbox.tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    removed = []
    monkeypatch.setattr(sandbox.Cgroup, "remove", lambda self, real=sandbox.Cgroup.remove: removed.append(self) or real(self))
    nb, events = _run(tmp_path, "print('before')", "import os; os._exit(0)", "print('after')")
    assert nb.cells[0].outputs[0].text == "before\n"
    assert "kernel stopped" in events[1] and events[2].startswith("not run")
    # nbclient does not shut a dead kernel down: its run folder and cgroup go all the same
    assert len(made) == 1 and not os.path.exists(made[0])
    assert all(not d.exists() for g in removed for d in g.dirs.values()) and len(removed) == (os.geteuid() == 0)


@pytest.mark.parametrize("loop", ["time.sleep(0.05)", "pass"], ids=["sleeping", "spinning"])
def test_a_cell_that_ignores_the_interrupt_is_killed(tmp_path, loop):
    # sleeping, it uses no CPU: only the wall-clock backstop (1 x 2 CPU-s) stops it;
    # spinning, its CPU limit does (2 CPU-s, long before a backstop of 30 x 2 s)
    trips = limit_trips()
    nb, events = _run(tmp_path, f"import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: {loop}",
                      "print('after')", cell_cpu_seconds=2, wall_factor=1 if "sleep" in loop else 30)
    assert "ignored the interrupt" in events[0]
    assert events[1].startswith("not run")
    assert limit_trips() > trips


def test_cpu_of_the_kernels_children_counts_for_the_cell(tmp_path):
    # the kernel itself only waits; a child spins (the old watchdog read the kernel's own /proc entry)
    nb, events = _run(tmp_path, "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'while True: pass'])",
                      "print('after')", cell_cpu_seconds=1, wall_factor=30)
    assert "of CPU a cell" in _timed_out(nb.cells[0]) and nb.cells[1].outputs[0].text == "after\n"


@pytest.mark.parametrize("cgroups", ["auto", "off"])  # off: the kernel's process tree's threads
def test_idle_time_cannot_be_outrun_by_many_sleeping_cells(tmp_path, cgroups, monkeypatch):
    import grader.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_warned_cgroup", True)  # its warning is tested in test_sandbox_cgroup
    nb = new_notebook(cells=[new_code_cell("import time; time.sleep(0.9)") for _ in range(20)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executor = BudgetedExecute(kernel_name="python3", notebook_idle_seconds=3,
                               config=Config({"SandboxedKernelManager": {"cgroups": cgroups}}))
    resources = {"metadata": {"path": str(tmp_path)}}
    trips = limit_trips()
    nb, resources = executor.preprocess(nb, resources)
    spent = time.monotonic() - (executor._deadline - executor.notebook_wall_seconds())  # since the kernel was ready
    events = resources["attention_course"]["events"]
    not_run = [i for i, e in events.items()
               if e == "not run: the notebook's idle time (3 s sleeping or waiting) was spent"]
    # the idle time, a watchdog's look, the time between cells, the interrupt's grace
    assert spent < 3 + 5, spent
    assert len(not_run) >= 14 and not_run == list(range(20 - len(not_run), 20))
    assert nb.cells[-1].outputs[0].ename == "NotRun"
    assert limit_trips() == trips  # sleeping does not depend on the machine's load: no regrade


@pytest.mark.parametrize("cgroups", ["auto", "off"])
def test_a_computing_kernel_is_never_idle(tmp_path, cgroups, monkeypatch):
    import grader.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_warned_cgroup", True)
    # the kernel computes in a child process and waits for it: the child's thread is busy
    child = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', {!r}])\nprint('done')".format(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 2.5: pass")
    nb, events = _run(tmp_path, SPIN.format(2.5), child, cell_idle_seconds=1, notebook_idle_seconds=1,
                      config=Config({"SandboxedKernelManager": {"cgroups": cgroups}}))
    assert events == {} and [c.outputs[-1].text for c in nb.cells] == ["done\n"] * 2


def test_the_wall_clock_backstop_stops_a_notebook_the_other_limits_let_through(tmp_path):
    nb = new_notebook(cells=[new_code_cell("import time; time.sleep(0.9)") for _ in range(20)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executor = BudgetedExecute(kernel_name="python3", notebook_cpu_seconds=1, wall_factor=3)  # 3 s of wall clock
    resources = {"metadata": {"path": str(tmp_path)}}
    nb, resources = executor.preprocess(nb, resources)
    events = resources["attention_course"]["events"]
    assert "not run: the notebook's wall-clock backstop (3 s) was spent" in events.values()


SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {0}: pass\nprint('done')"


def test_the_cpu_budget_cannot_be_outrun_by_many_short_cells(tmp_path):
    # 0.9 CPU-s a cell: the third cell spends the budget of 2 CPU-s, and is interrupted
    nb, events = _run(tmp_path, *[SPIN.format(0.9) for _ in range(12)], notebook_cpu_seconds=2, wall_factor=30)
    over = [i for i, c in enumerate(nb.cells) if _timed_out(c)]
    assert len(over) == 1 and over[0] in (1, 2) and "2 s of CPU a notebook" in _timed_out(nb.cells[over[0]])
    assert events == {i: "not run: the notebook's CPU budget (2 s of CPU) was spent" for i in range(over[0] + 1, 12)}
    assert nb.cells[-1].outputs[0].ename == "NotRun"


def test_a_kernel_kept_waiting_for_a_cpu_is_not_charged_for_the_wait(tmp_path):
    """Issue 32 (failure 9): the machine's load stands in as a CPU quota of a quarter core,
    so that each cell's 0.5 CPU-s takes about 2 s of wall-clock time: more than the cell's
    1 s and the notebook's 2 s of CPU. Counted in CPU, as they are, every cell runs and none
    is stopped (the wall-clock backstop is generous: 10 times); the time it waits for the
    CPU is not idle time either (1 s allowed). Counted in wall-clock time, the third cell
    would be "not run"."""
    if os.geteuid() != 0:
        pytest.fail("run the tests as root (as CI does): the kernel's cgroup needs it")
    slow = Config({"SandboxedKernelManager": {"cpus": 0.25}})
    trips = limit_trips()
    started = time.monotonic()
    # timeout and notebook_timeout: the same limits under the names they had while they were
    # counted on the wall clock, so that this test measures them on the code before issue 32
    # too; the grader now ignores both
    nb, events = _run(tmp_path, *[SPIN.format(0.5) for _ in range(3)], config=slow, cell_cpu_seconds=1,
                      notebook_cpu_seconds=2, cell_idle_seconds=1, notebook_idle_seconds=1, wall_factor=10,
                      timeout=1, notebook_timeout=2)
    wall = time.monotonic() - started
    assert events == {}, events
    assert [c.outputs[0].text for c in nb.cells] == ["done\n"] * 3
    assert limit_trips() == trips
    assert wall > 4, f"{wall:.1f} s: the quota did not slow the kernel, so this proves nothing"


def test_many_markdown_cells_cost_little(tmp_path):
    cells = [new_markdown_cell(f"note {i}") for i in range(20_000)] + [new_code_cell("print('ran')")]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executor = BudgetedExecute(kernel_name="python3")
    started = time.monotonic()
    original = executor.preprocess_cell
    timings = []

    def timed(cell, resources, index):
        t = time.monotonic()
        out = original(cell, resources, index)
        if cell.cell_type == "markdown":
            timings.append(time.monotonic() - t)
        return out

    executor.preprocess_cell = timed
    nb, _ = executor.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert nb.cells[-1].outputs[0].text == "ran\n"
    assert sum(timings) < 2, (sum(timings), time.monotonic() - started)  # was ~0.5 ms a cell: 10 s
