"""Check my work from inside Jupyter: the last cell of every student notebook.

``check_my_work()`` checks the notebook this kernel runs with the hidden checks, and prints
per exercise pass or fail, points, the diagnosis and a hint, then the score and what to
revisit. In a class or a full install it grades the notebook as last SAVED, outside this
kernel; the self-learner's own install judges what this kernel defines:

- on a hub that runs the course's check service (``COURSE_CHECK_URL`` is set), the saved
  notebook is sent there with this server's JupyterHub token; the service, which runs
  as the instructor's account, grades it (``grader.checkservice``);
- in a full install of the course (the ``grader`` package with its grading pipeline,
  ``grader.unit``, is importable), by ``course-grader check`` in a separate process;
- in the self-learner's package (``attention_course``, selfstudy/: the hidden checks
  without the instructor's grading stack), by ``attention_course.check``, which judges the
  functions this kernel defines, every exercise as the check of one exercise does;
- otherwise it says, in one line, the command that installs a checker.

Which notebook: the path given; else the one VS Code names (``__vsc_ipynb_file__``); else
the one the Jupyter server's session of this very kernel names (JupyterLab, Notebook 7,
a hub's single-user server: the current path, so a renamed notebook or a "Save As" copy
checks itself); else ``JPY_SESSION_NAME``; else (nbconvert, papermill: no server) the
one notebook in the working folder whose code holds everything this kernel ran. When
none tells, one line asks for the path.

One exercise in seconds: ``check_my_work("masked_softmax")`` (a function's or class's
name, or the object itself) judges what this kernel defines now, with the same hidden
checks and the same lines, without saving or re-running anything
(``grader.kernelcheck``). Only a self-learner's install has the checks for that; in a
class (a hub's check service, or the student package without the grader) it says so in
one line and the whole-notebook check stays the one that counts.

While nbgrader runs the notebook (autograding, the Validate button:
``NBGRADER_EXECUTION`` is set) it prints one line and does nothing else.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

ASK = ('check my work: cannot tell which notebook this is: save it (Ctrl-S) and run '
       'check_my_work("path/to/your.ipynb")')
# the self-learner's package (selfstudy/pyproject.toml; make selfstudy-wheel builds it into dist/)
SELF_LEARNER_WHEEL = "attention_from_scratch_course-0.1.0-py3-none-any.whl"
NO_CHECKER = (f"check my work: this install has no checker: run %pip install {SELF_LEARNER_WHEEL} in a cell "
              "(the self-learner's package, with the checks; make selfstudy-wheel builds it), restart the kernel "
              "and run this cell again; in a class, ask for the course's check service")
ONE_EXERCISE_IN_CLASS = ("check my work: checking one exercise in this kernel needs a self-learner's install of "
                         "the course; here, save (Ctrl-S) and run check_my_work() to check the whole notebook")
_SERVER_TIMEOUT = 3  # seconds per Jupyter server asked about its sessions: a dead one must not hang the cell
_CHECK_TIMEOUT = 600


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _from_vscode(shell) -> Path | None:
    named = shell.user_ns.get("__vsc_ipynb_file__") if shell is not None else None
    return Path(named) if isinstance(named, str) and Path(named).is_file() else None


def _kernel_id() -> str | None:
    """This kernel's id, as the Jupyter server named its connection file, or None."""
    try:
        from ipykernel.kernelapp import IPKernelApp
    except ImportError:
        return None
    if not IPKernelApp.initialized():  # not an ipykernel (asking for the instance would make one)
        return None
    found = re.fullmatch(r"kernel-(.+)\.json", Path(IPKernelApp.instance().connection_file or "").name)
    return found.group(1) if found else None


def _sessions(server: dict) -> list:
    """A running Jupyter server's sessions, asked with its own token and, on a hub's
    single-user server (whose own token may be empty or not accepted), with the hub
    token the kernel inherits.

    Raises:
        OSError: no token given is accepted, or the server does not answer.
        ValueError: the answer is not JSON.
    """
    tokens = [t for t in dict.fromkeys([server.get("token"), os.environ.get("JUPYTERHUB_API_TOKEN")]) if t]
    for i, token in enumerate(tokens or [""]):
        request = urllib.request.Request(server["url"].rstrip("/") + "/api/sessions",
                                         headers={"Authorization": f"token {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=_SERVER_TIMEOUT) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            if error.code not in (401, 403) or i == len(tokens or [""]) - 1:
                raise


def _from_server() -> Path | None:
    kernel = _kernel_id()
    if kernel is None:
        return None
    try:
        from jupyter_server.serverapp import list_running_servers

        servers = list(list_running_servers())
    except Exception:  # no jupyter_server, or a runtime folder it cannot read: no server tells
        return None
    for server in servers:
        try:
            sessions = _sessions(server)
        except (OSError, ValueError, KeyError):  # a server gone, or one that refuses us
            continue
        for session in sessions if isinstance(sessions, list) else []:
            if isinstance(session, dict) and (session.get("kernel") or {}).get("id") == kernel:
                path = Path(server.get("root_dir") or server.get("notebook_dir") or ".") / str(session.get("path", ""))
                if path.suffix == ".ipynb" and path.is_file():
                    return path
    return None


def _from_session_name() -> Path | None:
    session = os.environ.get("JPY_SESSION_NAME", "")
    return Path(session) if session.endswith(".ipynb") and Path(session).is_file() else None


def _from_history(shell) -> Path | None:
    """The one notebook in the working folder whose code cells hold every cell this
    kernel ran (nbconvert, nbclient and papermill run the cells' sources as they are)."""
    if shell is None:
        return None
    ran = {source.strip() for source in shell.history_manager.input_hist_raw if source.strip()}
    if not ran:
        return None
    found = []
    for path in sorted(Path.cwd().glob("*.ipynb")):
        try:
            cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
            code = {"".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                    for c in cells if c.get("cell_type") == "code"}
        except (OSError, UnicodeDecodeError, ValueError, AttributeError, KeyError, TypeError):
            continue  # not a notebook we can read: not this one
        if ran <= {source.strip() for source in code}:
            found.append(path)
    return found[0] if len(found) == 1 else None


def find_notebook(notebook: str | os.PathLike | None = None) -> Path | None:
    """The notebook this kernel runs (see the module's docstring for the order), or None
    when nothing tells. Never raises."""
    if notebook is not None:
        return Path(notebook)
    shell = _shell()
    for found in (lambda: _from_vscode(shell), _from_server, _from_session_name, lambda: _from_history(shell)):
        path = found()
        if path is not None:
            return path.resolve()
    return None


def _in_line(queue: dict) -> str:
    """The line for the service's ``{"position": 3, "seconds": 40}``: where this check waits."""
    position, seconds = int(queue.get("position", 0)), max(0, round(queue.get("seconds", 0)))
    suffix = "th" if position % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(position % 10, "th")
    wait = f"{seconds} s" if seconds < 120 else f"{round(seconds / 60)} min"
    return f"check my work: the checkers are busy: you are {position}{suffix} in line, about {wait} before yours starts"


def _check_on_service(url: str, path: Path) -> None:
    try:
        body = json.dumps({"name": path.name, "notebook": json.loads(path.read_text(encoding="utf-8"))})
    except (OSError, UnicodeDecodeError, ValueError) as error:
        print(f"check my work: cannot read {path.name} as a notebook ({error}): save it again (Ctrl-S)")
        return
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
    # x-ndjson: while it waits for a free checker the service sends its place in line, one JSON line at a time
    request = urllib.request.Request(url.rstrip("/") + "/check", data=body.encode("utf-8"), method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/x-ndjson",
                                              "Authorization": f"token {token}"})
    answer = None
    try:
        with urllib.request.urlopen(request, timeout=_CHECK_TIMEOUT) as response:
            for line in response:
                if not line.strip():
                    continue
                answer = json.loads(line)
                if isinstance(answer, dict) and isinstance(answer.get("queue"), dict):
                    print(_in_line(answer["queue"]), flush=True)
    except urllib.error.HTTPError as error:
        try:
            line = json.load(error).get("error") or f"HTTP {error.code}"
        except (ValueError, AttributeError, OSError):
            line = f"the check service answered HTTP {error.code}: ask your instructor"
        print(f"check my work: {line}")
        return
    except (OSError, ValueError) as error:
        print(f"check my work: the check service did not answer ({error}): try again in a minute, or ask "
              "your instructor")
        return
    if isinstance(answer, dict) and "error" in answer:
        print(f"check my work: {answer['error']}")
    elif isinstance(answer, dict) and "text" in answer:
        print(answer["text"])
    else:
        print("check my work: the check service's answer ended early: try again in a minute, or ask your instructor")


def _check_here(path: Path) -> None:
    spec = importlib.util.find_spec("grader")
    # the course's grader package, wherever it is installed: `-m` finds it from its parent folder
    where = Path(spec.submodule_search_locations[0]).parent if spec and spec.submodule_search_locations else None
    try:
        done = subprocess.run([sys.executable, "-m", "grader.cli", "check", str(path)], cwd=where,
                              capture_output=True, text=True, timeout=_CHECK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"check my work: the checker did not run ({error}); try `make check NOTEBOOK={path}`")
        return
    if done.stdout:
        print(done.stdout, end="")
    if done.returncode == 2 or not done.stdout:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        print(lines[-1] if lines else f"check my work: the checker stopped (exit code {done.returncode})")


def _importable(name: str) -> bool:
    """Whether module ``name`` can be imported (its parent packages are imported to know)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False


def _checker() -> str | None:
    """Which checker this install has: "service", "full" (the course's grading pipeline),
    "self" (the self-learner's package) or None."""
    if os.environ.get("COURSE_CHECK_URL", ""):
        return "service"
    if _importable("grader") and _importable("grader.unit"):  # the self-learner's package has no grader.unit
        return "full"
    return "self" if _importable("attention_course") else None


def _check_in_kernel(path: Path) -> None:
    shell = _shell()
    try:
        text = importlib.import_module("attention_course.check").check_in_kernel(
            path, shell.user_ns if shell is not None else {})
    except (OSError, ValueError) as error:
        print(f"check my work: cannot check {path.name} ({error}): save it again (Ctrl-S), or set "
              "JUPYTER_DATA_DIR to a folder you can write")
        return
    print(text)


def _one_exercise(what: object) -> str | None:
    """The exercise's name when ``what`` asks for one exercise (a function or class, or a
    name that is not a path to a notebook), else None."""
    if isinstance(what, str):
        return what if what.isidentifier() or re.fullmatch(r"[a-z_]+-\w+", what) else None
    if isinstance(what, os.PathLike) or what is None:
        return None
    return getattr(what, "__name__", None) if callable(what) else None


def _check_one(name: str, given: object) -> None:
    """One exercise, judged in this kernel (``grader.kernelcheck``), printed as its lines."""
    checker = _checker()
    if checker in ("service", None):
        print(ONE_EXERCISE_IN_CLASS if checker == "service" else NO_CHECKER)
        return
    # A self-learner's install: the checks run here, on what this kernel holds.
    from grader.kernelcheck import CannotCheck, check_in_kernel

    shell = _shell()
    namespace = dict(shell.user_ns if shell is not None else vars(sys.modules["__main__"]))
    if not isinstance(given, str):
        namespace[name] = given  # the object passed is the one judged
    try:
        print(check_in_kernel(name, namespace).text())
    except CannotCheck as error:
        print(f"check my work: {error}")
    except OSError as error:  # the user's data folder, where the check's secret lives
        print(f"check my work: cannot keep the check's secret ({error}): set JUPYTER_DATA_DIR to a folder "
              "of your own")


def check_my_work(notebook: str | os.PathLike | object | None = None) -> None:
    """Grade the saved notebook with the hidden checks and print the tutor's comments; or,
    given one exercise's function or class (or its name), judge that one as this kernel
    defines it, in seconds.

    Args:
        notebook: the notebook's path, for when this kernel cannot tell which notebook
            it runs (it then says so and asks for it); given, it wins. Or a function or
            class of an exercise, or its name (``"masked_softmax"``): that exercise alone.

    Returns:
        None, so that Jupyter shows nothing after the printed comments. Never raises:
        every problem is one printed line saying what to do.
    """
    if os.environ.get("NBGRADER_EXECUTION"):
        print("check my work: skipped while this notebook is graded or validated")
        return None
    one = _one_exercise(notebook)
    if one is not None:
        _check_one(one, notebook)
        return None
    if notebook is not None and not isinstance(notebook, (str, os.PathLike)):
        print("check my work: pass the notebook's path, or one exercise's function or class (or its name), "
              'e.g. check_my_work("masked_softmax")')
        return None
    path = find_notebook(notebook)
    if path is None:
        print(ASK)
        return None
    if path.suffix != ".ipynb" or not path.is_file():
        print(f"check my work: there is no notebook at {path}: save it (Ctrl-S) and pass its path, e.g. "
              'check_my_work("path/to/your.ipynb")')
        return None
    checker = _checker()
    if checker is None:
        print(NO_CHECKER)
        return None
    if checker == "self":
        _check_in_kernel(path)
        return None
    print(f"Checking the saved {path.name} (about 10 s; unsaved changes are not seen)...", flush=True)
    if checker == "service":
        _check_on_service(os.environ["COURSE_CHECK_URL"], path)
    else:
        _check_here(path)
    return None
