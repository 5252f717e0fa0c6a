"""Check my work: one exercise in the learner's kernel against the whole saved notebook.

    .venv/bin/python bench/check.py [--assignments 03_masking ...] [--rounds N] [--no-whole]

Per assignment, side by side in one run, as a self-learner waits for them:

- the fast check, ``check_my_work("<function>")`` (grader.kernelcheck), timed from the
  client (execute request to reply) in a real Jupyter kernel of this environment that
  holds the assignment's solutions (``grader.course.solution_namespace``, as a learner's
  kernel holds their own after running the notebook). Every exercise is checked once with
  the right answer and once with a wrong one (the first catalogued mistake of its spec, put
  under the function's name; a wrong answer costs more: the catalogue is run against it).
  "first" is the first check in the fresh kernel, which pays the imports of the checks and
  the tutor once; the others are the median and the slowest of the rest. Target: at most
  2 s per exercise on a quiet 2-core machine.
- the whole-notebook check, ``course-grader check`` on the solution notebook (what the
  notebook's last cell runs in a self-learner's install): the saved notebook re-executed in
  the sandboxed kernel with NBGRADER_EXECUTION set, so a training notebook trains on its
  short grading budget (the hidden checks load known weights), then judged; median of
  ``--rounds`` runs.

The load average is printed: on a loaded machine both grow.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jupyter_client.manager import start_new_kernel  # noqa: E402

from grader import checks, course  # noqa: E402
from grader.release import use_this_environment  # noqa: E402

TARGET = 2.0  # seconds per exercise


def _run(client, code: str, timeout: float = 600) -> tuple[float, str]:
    """Run ``code`` in the kernel: (wall seconds from request to reply, what it printed)."""
    started = time.perf_counter()
    msg_id = client.execute(code)
    reply = client.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=timeout)
    took = time.perf_counter() - started
    printed = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed in the kernel: {''.join(printed)}")
    return took, "".join(printed)


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "COURSE_CHECK_URL")}
    env["JUPYTER_DATA_DIR"] = str(data)  # the learner's own secret, made on the first check
    return env


def fast_checks(assignment: str, data: Path) -> list[tuple[str, str, float, str]]:
    """(exercise, "right" or "wrong", seconds, first line of the verdict) of every check, in order."""
    topic = assignment.split("_", 1)[1]
    km, client = start_new_kernel(kernel_name="python3", env=_env(data), cwd=str(ROOT))
    try:
        _run(client, f"from grader.course import solution_namespace; "
                     f"globals().update(solution_namespace({assignment!r})); "
                     "from coursekit.check import check_my_work")
        found = []
        for exercise in checks.exercise_ids(topic):
            spec = checks.get(exercise)
            took, said = _run(client, f"check_my_work({spec.function!r})")
            found.append((exercise, "right", took, said.splitlines()[1] if "\n" in said else said.strip()))
            if spec.catalogue():
                setup = (f"from grader import checks as _c; _right = {spec.function}; "
                         f"{spec.function} = _c.get({exercise!r}).catalogue()[0].implementation")
                _run(client, setup)
                took, said = _run(client, f"check_my_work({spec.function!r})")
                _run(client, f"{spec.function} = _right")
                found.append((exercise, "wrong", took, said.splitlines()[1] if "\n" in said else said.strip()))
        return found
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)


def whole_check(assignment: str, data: Path) -> tuple[float, str]:
    """Seconds of ``course-grader check`` on the solution notebook, and its score line."""
    notebook = course.SOLUTIONS / assignment / f"{assignment}.ipynb"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "grader.cli", "check", str(notebook)], cwd=ROOT, env=_env(data),
                          capture_output=True, text=True, timeout=900)
    took = time.perf_counter() - started
    score = next((line for line in done.stdout.splitlines() if line.startswith("Score:")), done.stderr.strip()[-200:])
    return took, score


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assignments", nargs="*", default=course.assignments())
    parser.add_argument("--rounds", type=int, default=1, help="whole-notebook checks per assignment (median)")
    parser.add_argument("--no-whole", action="store_true", help="only the fast checks")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args(argv)
    use_this_environment()
    print(f"check my work, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores:")
    print(f"  {'assignment':<24} {'fast: first':>11} {'median':>7} {'slowest':>8}   {'whole notebook':>14}   ratio")
    rows, slowest = [], 0.0
    with tempfile.TemporaryDirectory(prefix="bench-check-") as scratch:
        data = Path(scratch) / "data"
        for assignment in args.assignments:
            found = fast_checks(assignment, data)
            times = [t for _, _, t, _ in found]
            rest = times[1:] or times
            wrong = [(e, kind, said) for e, kind, _, said in found if (kind == "right") != ("PASS" in said)]
            if wrong:
                raise SystemExit(f"{assignment}: a fast check gave the wrong verdict: {wrong}")
            whole = [] if args.no_whole else [whole_check(assignment, data) for _ in range(args.rounds)]
            whole_s = statistics.median(t for t, _ in whole) if whole else None
            slowest = max(slowest, max(times))
            shown = f"{whole_s:12.1f} s" if whole_s is not None else f"{'-':>14}"
            ratio = f"{whole_s / statistics.median(rest):7.0f}x" if whole_s else ""
            print(f"  {assignment:<24} {times[0]:9.2f} s {statistics.median(rest):5.2f} s {max(rest):6.2f} s"
                  f"   {shown}   {ratio}" + (f"   ({whole[0][1]})" if whole else ""), flush=True)
            rows.append({"assignment": assignment, "fast": [{"exercise": e, "answer": k, "seconds": round(t, 3)}
                                                            for e, k, t, _ in found],
                         "whole_seconds": [round(t, 2) for t, _ in whole]})
    print(f"  slowest fast check: {slowest:.2f} s (target <= {TARGET:g} s per exercise)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
