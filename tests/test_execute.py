"""BudgetedExecute on small notebooks: every way a cell can misbehave ends in a recorded event."""
from __future__ import annotations

import os
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from grader.execute import BudgetedExecute

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


def test_cpu_hog_is_stopped_and_later_cells_are_not_run(tmp_path):
    nb, events = _run(tmp_path, "x = 1", "while True: pass", "print(x)", cell_cpu_seconds=1, timeout=30)
    assert "of CPU time" in events[1]
    assert events[2].startswith("not run")
    assert nb.cells[2].outputs[0].ename == "NotRun"


@pytest.mark.parametrize("flood", [
    "print('x' * 5_000_000)",                       # one huge line: a line limit would let it pass
    "for _ in range(100_000): print('y' * 100)",   # many lines
])
def test_output_over_the_byte_limit_is_cut_and_the_cell_interrupted(tmp_path, flood):
    nb, events = _run(tmp_path, flood + "\nimport time; time.sleep(30)", "print('after')",
                      cell_output_kb=64, timeout=20)
    assert "output limit" in events[0]
    kept = sum(len(o.get("text", "")) for o in nb.cells[0].outputs)
    assert kept <= 64 * 1024 + 200  # the cap, plus our one-line note
    assert nb.cells[1].outputs[0].text == "after\n"  # interrupted, not killed: the kernel goes on


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


def test_a_cell_that_ignores_the_interrupt_is_killed(tmp_path):
    nb, events = _run(tmp_path, "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
                      "print('after')", timeout=3, cell_cpu_seconds=600)
    assert "ignored the interrupt" in events[0]
    assert events[1].startswith("not run")


def test_cpu_of_the_kernels_children_counts_for_the_cell(tmp_path):
    # the kernel itself only waits; a child spins (the old watchdog read the kernel's own /proc entry)
    nb, events = _run(tmp_path, "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'while True: pass'])",
                      "print('after')", cell_cpu_seconds=1, timeout=30)
    assert "of CPU time" in events[0] and events[1].startswith("not run")


def test_the_notebook_budget_cannot_be_outrun_by_many_short_cells(tmp_path):
    nb = new_notebook(cells=[new_code_cell("import time; time.sleep(0.9)") for _ in range(20)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executor = BudgetedExecute(kernel_name="python3", notebook_timeout=3)
    resources = {"metadata": {"path": str(tmp_path)}}
    nb, resources = executor.preprocess(nb, resources)
    spent = time.monotonic() - (executor._deadline - 3)  # since the kernel was ready
    events = resources["attention_course"]["events"]
    not_run = [i for i, e in events.items() if e == "not run: the notebook's time budget (3 s) was spent"]
    assert spent < 3 + 5, spent  # the budget, a second's rounding, the interrupt's grace
    assert len(not_run) >= 14 and not_run == list(range(20 - len(not_run), 20))
    assert nb.cells[-1].outputs[0].ename == "NotRun"


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
