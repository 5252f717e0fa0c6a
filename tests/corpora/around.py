"""The attacks around the kernel (issue 21): script for the instructor's browser, links and
odd names in the submitted folder, spreadsheet formulas, terminal escapes, modules that
shadow the kernel's, writes outside the scratch, processes that outlive or starve, and
notebooks that outrun the time budget. Part of the tamper corpus (``tamper.ATTACKS``).

Every attack follows tamper.py's rules, and names the harm it is after
(``Attack.harm``, judged by tests/corpora/harms.py on any grader's outputs). An attack
whose answers are all correct (``targets=()``) expects full marks: it is after
something other than points. Cases marked "invented" were not in the security review;
they are more of the same kinds.
"""
from __future__ import annotations

import os
from pathlib import Path

from tests.corpora import harms

NOTEBOOK = "01_similarity.ipynb"
CLASSMATE = "ada"  # the classmate (in the same class folder) whose work the link attacks point at


def _code(source: str, outputs: tuple[dict, ...] = ()) -> tuple[str, str, tuple[dict, ...]]:
    return ("code", source.strip() + "\n", outputs)


def _markdown(source: str) -> tuple[str, str, tuple[dict, ...]]:
    return ("markdown", source.strip() + "\n", ())


# --- script for the instructor's browser ---------------------------------------------

# Each payload reports itself three ways, so that a browser test can see any of them run:
# a global, a dialog and a request to the Jupyter server's API with the page's session.
JS = "window.__attack=1;alert(1);fetch('/api/contents')"

SCRIPT_MARKDOWN = f"""
## My notes

<script>{JS}</script>

<img src="x" onerror="{JS}">

<svg onload="{JS}"><circle r="4"/></svg>

<div onmouseover="{JS}" style="position:fixed;inset:0">hover</div>
"""

SCRIPT_OUTPUTS = f"""
from IPython.display import HTML, Javascript, SVG, Markdown, display
display(HTML('<b>html</b><script>{JS}</script><img src=x onerror="{JS}">'))
display(Javascript("{JS}"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" onload="{JS}"><script>{JS}</script><circle r="4"/></svg>'))
display(Markdown('<img src=x onerror="{JS}"> and [a link](javascript:{JS})'))
"""

# The exception message becomes the diagnosis: HTML, markdown, and mathtext that does not parse.
SCRIPT_EXCEPTION = f'''    raise ValueError('<img src=x onerror="{JS}"> <script>{JS}</script> '
                     '[see](javascript:{JS}) $\\\\frac{{1}}{{$ ** _ ` |')'''

# invented: the same, through the notebook's metadata, widget state, an attachment, plain output
SCRIPT_METADATA_CELL = f"""
print('<script>{JS}</script>')
raise RuntimeError('<img src=x onerror="{JS}">')
"""

# invented: markup that fetches or navigates by itself
FETCHING_MARKDOWN = """
<meta http-equiv="refresh" content="0; url=http://127.0.0.1:9/refresh">
<base href="http://127.0.0.1:9/base/">
<link rel="stylesheet" href="http://127.0.0.1:9/style.css">
<style>@import url("http://127.0.0.1:9/import.css"); body { background: url("http://127.0.0.1:9/bg.png") }</style>
<iframe srcdoc="<script>parent.__attack=1</script>"></iframe>
<iframe src="javascript:parent.__attack=1"></iframe>
<object data="http://127.0.0.1:9/object"></object>
<embed src="http://127.0.0.1:9/embed">
<form action="http://127.0.0.1:9/form"><input type="submit" formaction="javascript:alert(1)"></form>
<a href="javascript:alert(1)">click</a> <a href="data:text/html,<script>alert(1)</script>">data</a>
<img src="http://127.0.0.1:9/pixel.png"> <img srcset="http://127.0.0.1:9/set.png 2x">
<p style="background-image:url(http://127.0.0.1:9/style.png)">styled</p>

![tracking pixel](http://127.0.0.1:9/markdown.png)
[markdown link](javascript:alert(1))
"""

# --- modules that shadow the kernel's --------------------------------------------------

_MARK_AND_FILL = f'''
import os, sys
def _mark(what):
    try:
        with open("/tmp/.shadow-ran", "a") as f:
            f.write(what + "\\n")
    except OSError:
        pass
    # and fill every writable folder it can reach: the connection file's, the working one
    places = {{os.getcwd()}}
    if "-f" in sys.argv[:-1]:
        places.add(os.path.dirname(os.path.abspath(sys.argv[sys.argv.index("-f") + 1])))
    for place in places:
        try:
            with open(os.path.join(place, ".shadow-fill"), "wb") as f:
                for _ in range(8):
                    f.write(b"\\0" * 2**24)  # 128 MiB in all
        except OSError:
            pass
'''

SHADOW_LAUNCHER = _MARK_AND_FILL + '''
_mark("ipykernel_launcher.py ran at start-up")
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
import runpy
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)  # the real kernel, as if nothing happened
'''


def _shadow(module: str) -> bytes:
    """A module named like one the kernel imports: it marks that it ran, then hands over."""
    return (_MARK_AND_FILL + f'''
_mark("{module}.py ran")
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
sys.modules.pop("{module}", None)
import importlib
try:
    sys.modules["{module}"] = importlib.import_module("{module}")
except ImportError:
    pass
''').encode()


SHADOW_REPORT = f"""
import os
print("{harms.SHADOW_MARK}" if os.path.exists("/tmp/.shadow-ran") else "no submitted module ran")
"""

# --- writes outside the scratch ----------------------------------------------------------

HOST_WRITES = f'''
import os
from ipykernel.connect import get_connection_file
_conn = get_connection_file()
_folder = os.path.dirname(os.path.abspath(_conn))
def _try(what, action):
    try:
        action()
        print("{harms.HOST_WRITE_MARK}:", what)
    except OSError as error:
        print("refused:", what, type(error).__name__)
def _append():
    with open(_conn, "ab") as f:
        for _ in range(4):
            f.write(b" " * 2**24)  # 64 MiB
def _fill():
    with open(os.path.join(_folder, "fill"), "wb") as f:
        for _ in range(8):
            f.write(b"\\0" * 2**24)  # 128 MiB
_try("appended 64 MiB to the connection file", _append)
_try("wrote 128 MiB beside the connection file", _fill)
_try("renamed the connection file", lambda: os.rename(_conn, _conn + ".moved"))
'''

DEEP_FOLDERS = f'''
import os, tempfile
from ipykernel.connect import get_connection_file
def _deep(place, levels=1100):
    """A folder {{levels}} deep, its bottom unreadable: what a recursive clean-up trips on."""
    fd = os.open(place, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        for i in range(50):
            os.close(os.open(f"f{{i}}", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        os.chmod(fd, 0)
    finally:
        os.close(fd)
_host = os.path.dirname(os.path.abspath(get_connection_file()))
for _place in (_host, os.getcwd(), tempfile.gettempdir(), os.path.expanduser("~")):
    try:
        _deep(_place)
        print(("{harms.HOST_WRITE_MARK}: " if _place == _host else "scratch: ") + "1100-deep folder in " + _place)
    except OSError as error:
        print("refused:", _place, type(error).__name__)
'''

# --- processes that starve a classmate, hold too much, or outlive their kernel -----------

CPU_HOG = r'''
import os, signal, time
# 200 spinning children, paused while my own cells run (a per-process CPU watchdog sees an
# idle kernel), running while the notebook waits: the CPU a classmate graded beside me needs.
_hogs = []
for _ in range(200):
    try:
        _pid = os.fork()
    except OSError:
        break
    if _pid == 0:
        try:
            _end = time.time() + 60
            while time.time() < _end:
                pass
        finally:
            os._exit(0)
    _hogs.append(_pid)
def _signal(sig):
    for _pid in _hogs:
        try:
            os.kill(_pid, sig)
        except OSError:
            pass
get_ipython().events.register("pre_run_cell", lambda *a: _signal(signal.SIGSTOP))
get_ipython().events.register("post_run_cell", lambda *a: _signal(signal.SIGCONT))
print(f"started {len(_hogs)} spinning processes")
'''

CPU_HOG_WAIT = """
import signal, time
_signal(signal.SIGCONT)  # this cell only waits: let them spin
time.sleep(25)
"""

MEMORY_CHILDREN = f'''    import os, select, time
    # five children, each holding 1.5 GiB written (7.5 GiB for one kernel); counted as
    # held only while every child that wrote its byte is still alive, at the same moment
    _r, _w = os.pipe()
    _kids = []
    for _i in range(5):
        _pid = os.fork()
        if _pid == 0:
            try:
                _block = np.ones(int(1.5 * 2**30) // 8)
                os.write(_w, bytes([_i]))
                time.sleep(60)
            finally:
                os._exit(0)
        _kids.append(_pid)
    os.close(_w)
    _wrote, _dead, _deadline = set(), set(), time.time() + 25
    while len(_wrote | _dead) < 5 and time.time() < _deadline:
        if select.select([_r], [], [], 0.5)[0]:
            _wrote.update(os.read(_r, 16))
        for _i, _pid in enumerate(_kids):
            if _i not in _dead and os.waitpid(_pid, os.WNOHANG)[0] == _pid:
                _dead.add(_i)
    print(f"{harms.HELD_MARK} {{len(_wrote - _dead) * 1.5:g}} GiB at once")
    for _pid in _kids:
        try:
            os.kill(_pid, 9)
            os.waitpid(_pid, 0)
        except OSError:
            pass'''

SURVIVOR = f'''
import os, sys
# invented: a daemon in its own session that ignores hang-ups and sleeps for ten minutes
# under a name the test looks for: it must not outlive this kernel.
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        import signal
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "{harms.SURVIVOR_MARK}"])
    os._exit(0)
print("a daemon was started")
'''

TICK = f"import time; print('{harms.BUDGET_MARK}', time.monotonic()); time.sleep(0.9)"

# --- the submitted folder: links, special files, odd names, many files --------------------


def _secret(private: Path) -> Path:
    """A root-only file outside the class folder, as /etc/shadow is on a real machine."""
    private.mkdir(parents=True, exist_ok=True)
    os.chmod(private, 0o700)
    path = private / "root-only.txt"
    path.write_text(f"{harms.SECRET}{{\"not\": json\n")
    os.chmod(path, 0o600)
    return path


def _replace_notebook(folder: Path, target: str | Path) -> None:
    (folder / NOTEBOOK).unlink()
    (folder / NOTEBOOK).symlink_to(target)


def link_classmate_notebook(folder: Path, class_dir: Path, private: Path) -> None:
    _replace_notebook(folder, Path("..", "..", CLASSMATE, "01_similarity", NOTEBOOK))


def link_classmate_folder(folder: Path, class_dir: Path, private: Path) -> None:
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    folder.symlink_to(Path("..", CLASSMATE, "01_similarity"))


def link_solution(folder: Path, class_dir: Path, private: Path) -> None:
    from grader import course

    _replace_notebook(folder, course.SOLUTIONS / "01_similarity" / NOTEBOOK)


def link_root_only(folder: Path, class_dir: Path, private: Path) -> None:
    _replace_notebook(folder, _secret(private))


def hardlink_root_only(folder: Path, class_dir: Path, private: Path) -> None:
    """A hard link, beside the notebook, to a root-only file: the student's folder is the
    student's (uid 4242), the linked file is root's."""
    os.link(_secret(private), folder / "notes.txt")
    for path in (folder.parent, folder, folder / NOTEBOOK):
        os.chown(path, 4242, 4242)


def fifo_notebook(folder: Path, class_dir: Path, private: Path) -> None:
    (folder / NOTEBOOK).unlink()
    os.mkfifo(folder / NOTEBOOK)


def fifo_extra(folder: Path, class_dir: Path, private: Path) -> None:
    os.mkfifo(folder / "data.csv")


def device_notebook(folder: Path, class_dir: Path, private: Path) -> None:
    _replace_notebook(folder, "/dev/zero")


def link_extra_files(folder: Path, class_dir: Path, private: Path) -> None:
    (folder / "shadow.txt").symlink_to("/etc/shadow")
    (folder / "secret.txt").symlink_to(_secret(private))
    (folder / "classmate.ipynb.txt").symlink_to(Path("..", "..", CLASSMATE, "01_similarity", NOTEBOOK))


def latin1_name(folder: Path, class_dir: Path, private: Path) -> None:
    os.rename(folder / NOTEBOOK, os.fsencode(folder) + b"/01_similarit\xe9.ipynb")


def escape_name(folder: Path, class_dir: Path, private: Path) -> None:
    os.rename(folder / NOTEBOOK, folder / "\x1b]0;pwned\x07\x1b[2K\x1b[1A\r=1+1\x1b[31m.ipynb")


def newline_name(folder: Path, class_dir: Path, private: Path) -> None:
    """A lone notebook whose name would add a row to a naive CSV or terminal table."""
    os.rename(folder / NOTEBOOK, folder / "x\nada,01_similarity,10,10,graded\r\n.ipynb")


def extra_folder(folder: Path, class_dir: Path, private: Path) -> None:
    """An extra folder inside the student's own folder, named like a formula: it must make
    no rows for anyone else."""
    odd = folder.parent / '=HYPERLINK("#","open")'
    odd.mkdir()
    (odd / NOTEBOOK).write_bytes((folder / NOTEBOOK).read_bytes())


def link_student_folder(folder: Path, class_dir: Path, private: Path) -> None:
    """The whole student folder is a link to a classmate's."""
    student = folder.parent
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    for path in student.iterdir():
        path.unlink()
    student.rmdir()
    student.symlink_to(CLASSMATE)


def many_files(folder: Path, class_dir: Path, private: Path) -> None:
    for i in range(6000):
        (folder / f"empty-{i:05d}.txt").touch()


def sparse_files(folder: Path, class_dir: Path, private: Path) -> None:
    for i in range(40):
        with open(folder / f"sparse-{i:02d}.bin", "wb") as f:
            f.truncate(19 * 2**20)  # 19 MiB that take no disk


def _ticks(n: int) -> tuple:
    return tuple(_code(TICK) for _ in range(n))


def _markdown_flood(n: int) -> tuple:
    return tuple(_markdown(f"note {i}") for i in range(n))


def attacks() -> list:
    """The attacks, as ``tests.corpora.tamper.Attack``s (imported here: tamper imports this module)."""
    from tests.corpora.tamper import POINTS, Attack, _body, _cheat

    DOT, COS, SCORE, SOFT = POINTS  # noqa: F841 - named for the attacks' targets
    return [
        # the instructor's browser
        Attack("t21_script_markdown", "script_markdown",
               "markdown cells with <script>, <img onerror>, <svg onload> and on* handlers",
               (), {}, harm="script", extra_cells=(_markdown(SCRIPT_MARKDOWN),)),
        Attack("t22_script_outputs", "script_outputs",
               "outputs of type text/html, application/javascript, image/svg+xml and text/markdown carrying script",
               (), {}, harm="script", extra_cells=(_code(SCRIPT_OUTPUTS),)),
        Attack("t23_script_exception", "script_exception",
               "soft_lookup raises an exception whose message (the diagnosis) holds HTML, a javascript: link "
               "and mathtext that does not parse",
               (SOFT,), _body(SOFT, "def soft_lookup(scores, values):", SCRIPT_EXCEPTION), harm="script"),
        Attack("t24_script_metadata", "script_metadata",
               "invented: script in the notebook's title and widget state, printed as text, and in an error "
               "of a plain cell",
               (), {}, harm="script", extra_cells=(_code(SCRIPT_METADATA_CELL),),
               metadata={"title": f"</title><script>{JS}</script>",
                         "widgets": {"application/vnd.jupyter.widget-state+json": {
                             "state": {}, "version_major": 2, "version_minor": 0,
                             "x": f"</script><script>{JS}</script>"}}}),
        Attack("t25_fetching_markdown", "fetching_markdown",
               "invented: markdown that navigates or fetches by itself (meta refresh, base, stylesheets, "
               "iframes, object, embed, forms, remote images, javascript: and data: links)",
               (), {}, harm="script", extra_cells=(_markdown(FETCHING_MARKDOWN),)),
        # modules that shadow the kernel's
        Attack("t26_shadow_launcher", "shadow_launcher",
               "ipykernel_launcher.py beside the notebook: runs at kernel start-up, fills the connection "
               "file's folder with 128 MiB, then starts the real kernel",
               (), {}, harm="shadow", files={"ipykernel_launcher.py": SHADOW_LAUNCHER.encode()},
               extra_cells=(_code(SHADOW_REPORT),)),
        Attack("t27_shadow_modules", "shadow_modules",
               "invented: sitecustomize.py, usercustomize.py, numpy.py, IPython.py and coursekit.py beside "
               "the notebook, each marking that it ran",
               (), {}, harm="shadow", extra_cells=(_code(SHADOW_REPORT),),
               files={f"{m}.py": _shadow(m) for m in ("sitecustomize", "usercustomize", "numpy", "IPython",
                                                      "coursekit", "matplotlib_inline")}),
        # writes outside the scratch
        Attack("t28_connection_file", "connection_file",
               "a cell appends 64 MiB to the kernel's connection file, writes 128 MiB beside it, renames it",
               (), {}, harm="host_write", extra_cells=(_code(HOST_WRITES),)),
        Attack("t29_deep_folders", "deep_folders",
               "1,100-deep folders with an unreadable bottom in the socket folder, the working folder, /tmp "
               "and home: what a recursive clean-up trips on",
               (), {}, harm="host_write", extra_cells=(_code(DEEP_FOLDERS),)),
        # processes
        Attack("t30_cpu_hog", "cpu_hog",
               "200 spinning background processes, paused while the student's cells run, spinning while "
               "the last cell waits 25 s: the CPU of a classmate graded beside it",
               (SOFT,), _cheat(SOFT, CPU_HOG), harm="points", extra_cells=(_code(CPU_HOG_WAIT),)),
        Attack("t31_memory_children", "memory_children",
               "soft_lookup forks five children that each hold 1.5 GiB written (7.5 GiB for one kernel)",
               (SOFT,), _body(SOFT, "def soft_lookup(scores, values):", MEMORY_CHILDREN), harm="memory"),
        Attack("t32_time_budget", "time_budget",
               "150 cells of time.sleep(0.9) after the last test: the notebook's 60 s of idle time must still hold",
               (), {}, harm="budget", extra_cells=_ticks(150)),
        Attack("t33_markdown_flood", "markdown_flood",
               "60,000 small markdown cells: the whole unit of work (staging, execution, feedback) must stay bounded",
               (), {}, harm="batch", extra_cells=_markdown_flood(60_000), refused=True, status="cell limit"),
        Attack("t34_survivor", "survivor",
               "invented: a daemon in its own session, ignoring SIGHUP and SIGTERM, that would sleep 10 min",
               (), {}, harm="points", extra_cells=(_code(SURVIVOR),)),
        # the submitted folder
        Attack("t35_link_classmate_notebook", "link_classmate_notebook",
               "the submitted notebook is a symlink to a classmate's notebook",
               (), {}, harm="graded_as_own", layout=link_classmate_notebook, refused=True, status="symbolic link"),
        Attack("t36_link_classmate_folder", "link_classmate_folder",
               "the assignment folder is a symlink to a classmate's assignment folder",
               (), {}, harm="graded_as_own", layout=link_classmate_folder, refused=True, status="symbolic link"),
        Attack("t37_link_solution", "link_solution",
               "the submitted notebook is a symlink to the instructor's solution notebook",
               (), {}, harm="leak", layout=link_solution, refused=True, status="symbolic link"),
        Attack("t38_link_root_only", "link_root_only",
               "the submitted notebook is a symlink to a root-only file (its bytes would show in a JSON error)",
               (), {}, harm="leak", layout=link_root_only, refused=True, status="symbolic link"),
        Attack("t39_hardlink_root_only", "hardlink_root_only",
               "a hard link beside the notebook to a root-only file, printed by a cell if it reaches the kernel",
               (), {}, harm="leak", layout=hardlink_root_only, status="hard link",
               extra_cells=(_code(f"import os\nif os.path.exists('notes.txt'):\n    print('{harms.READ_MARK}', "
                                  "open('notes.txt').read())"),)),
        Attack("t40_fifo_notebook", "fifo_notebook",
               "the submitted notebook is a FIFO (a naive read blocks the batch forever)",
               (), {}, harm="batch", layout=fifo_notebook, refused=True, status="fifo"),
        Attack("t41_fifo_extra", "fifo_extra",
               "invented: a FIFO named data.csv beside a correct notebook",
               (), {}, harm="batch", layout=fifo_extra, status="special files"),
        Attack("t42_device_notebook", "device_notebook",
               "invented: the submitted notebook is a symlink to /dev/zero (endless bytes)",
               (), {}, harm="batch", layout=device_notebook, refused=True, status="symbolic link"),
        Attack("t43_link_extra_files", "link_extra_files",
               "invented: extra files that are symlinks to /etc/shadow, a root-only file and a classmate's notebook",
               (), {}, harm="leak", layout=link_extra_files, status="symbolic links",
               extra_cells=(_code(f"import os\nfor n in os.listdir('.'):\n    try:\n        print('{harms.READ_MARK}', "
                                  "n, open(n, errors='replace').read(200))\n    except OSError:\n        pass"),)),
        Attack("t44_latin1_name", "latin1_name",
               "the notebook's file name is latin-1 bytes, not UTF-8 (stopped the whole batch before)",
               (), {}, harm="batch", layout=latin1_name, refused=True, status="not valid utf-8"),
        Attack("t45_escape_name", "escape_name",
               "the lone notebook is renamed with terminal escape sequences (window title, cursor up, erase "
               "line) and a formula",
               (), {}, harm="control", layout=escape_name, refused=True, status="control characters"),
        Attack("t51_newline_name", "newline_name",
               "invented: the lone notebook's name holds a newline and a forged grade row",
               (), {}, harm="control", layout=newline_name, refused=True, status="control characters"),
        Attack('=HYPERLINK("#","grades")', "formula_student",
               "a student folder named like a spreadsheet formula, =HYPERLINK(...)",
               (), {}, harm="formula", invalid_id=True, status="not a valid student id"),
        Attack("@SUM(1+1)*cmd|' -c calc'!A0", "formula_at_student",
               "a student folder named like a formula that starts with @",
               (), {}, harm="formula", invalid_id=True, status="not a valid student id"),
        Attack("<img src=x onerror=alert(1)>", "html_student",
               "a student folder named like an HTML element with a handler",
               (), {}, harm="script", invalid_id=True, status="not a valid student id"),
        Attack("t46_extra_folder", "extra_folder",
               "an extra folder =HYPERLINK(...) holding a notebook, inside the student's own folder",
               (), {}, harm="rows", layout=extra_folder),
        Attack("t47_bidi_name\u202egnp.sexe", "bidi_student",
               "invented: a student folder name with a right-to-left override (U+202E)",
               (), {}, harm="control", invalid_id=True, status="control characters"),
        Attack("t48_link_student_folder", "link_student_folder",
               "invented: the whole student folder is a symlink to a classmate's",
               (), {}, harm="graded_as_own", layout=link_student_folder, refused=True, status="symbolic link"),
        Attack("t49_many_files", "many_files",
               "6,000 empty files beside the notebook (staging was quadratic: 101 s)",
               (), {}, harm="batch", layout=many_files, status="extra files"),
        Attack("t50_sparse_files", "sparse_files",
               "40 sparse 19 MiB files beside the notebook (0 bytes on disk, 760 MiB apparent)",
               (), {}, harm="batch", layout=sparse_files, status="total for extra files"),
    ]
