"""The self-learner's package (selfstudy/pyproject.toml) against the class's student package
(coursekit/pyproject.toml): the two wheels differ by exactly the hidden checks with their
references, the notebooks and the attention-course command; and in a clean venv holding
only the self-learner's wheel, offline, the command writes the notebooks (never over a
learner's file) and opens JupyterLab, and check my work gives a notebook filled with the
solutions full marks and an untouched one no points.

Both wheels are built as ``make wheel`` and ``make selfstudy-wheel`` build them; the venv
comes from hub/environments.py (``make selfstudy-env``: cached outside the clone, keyed by
the wheel's bytes; its first build installs torch and JupyterLab, about a minute here).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import tomllib
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from coursekit.check import SELF_LEARNER_WHEEL
from grader import course
from hub.environments import build_selfstudy_wheel, build_wheel, clean_env, selfstudy_env

pytestmark = pytest.mark.kernel

DIST_INFO = re.compile(r"[^/]+\.dist-info/.*")
# the instructor's side, which the self-learner's install must not need or bring
INSTRUCTOR = {"nbgrader", "dask", "distributed", "psycopg", "jupyterhub", "playwright", "pytest", "alembic"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("wheels")
    return build_wheel(folder), build_selfstudy_wheel(folder)


def _files(wheel: Path) -> dict[str, bytes]:
    """The wheel's files but its dist-info, name -> bytes."""
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n) for n in archive.namelist() if not DIST_INFO.fullmatch(n)}


def _tree(folder: str, pattern: str) -> set[str]:
    return {p.relative_to(course.ROOT).as_posix() for p in (course.ROOT / folder).rglob(pattern)
            if "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts}


def test_the_two_wheels_differ_by_the_checks_the_notebooks_and_the_command_only(wheels):
    student, selfstudy = map(_files, wheels)
    assert wheels[1].name == "attention_from_scratch_course-0.1.0-py3-none-any.whl" == SELF_LEARNER_WHEEL, \
        "the wheel that check my work's one line tells a learner to install"
    # the hidden checks and their references, and what check my work in a kernel imports of the grader
    checks = _tree("grader/checks", "*.py") | {f"grader/{name}.py" for name in (
        "__init__", "wire", "kernelcheck", "seeds", "selfcheck", "tutortext", "course", "names")}
    notebooks = {f"attention_course/{n}" for n in _tree("notebooks", "*.ipynb")}
    lab = {"lab/jupyter_server_config.py", "lab/jupyter_server_config.json", "lab/labconfig/page_config.json"}
    command = {"attention_course/__init__.py", "attention_course/cli.py", "attention_course/check.py",
               *(f"attention_course/{name}" for name in lab)}
    assert len(notebooks) == len(course.assignments()) and "grader/checks/reference/softmax.py" in checks
    assert set(selfstudy) - set(student) == checks | notebooks | command
    assert set(student) - set(selfstudy) == set(), "the self-learner's wheel holds the whole student package"
    assert [n for n in student if student[n] != selfstudy[n]] == [], "the same coursekit, byte for byte"
    assert {n for n in student if n.startswith(("grader/", "attention_course/"))} == set()
    for name in checks | notebooks | {f"attention_course/{name}" for name in lab}:
        there = name.removeprefix("attention_course/")
        assert selfstudy[name] == (course.ROOT / there).read_bytes(), f"{name} is not the checkout's {there}"


def test_the_self_learner_s_install_is_the_learner_s(wheels):
    """Its requirements are the learner's install's (../pyproject.toml's base, ranges that
    keep a hosted notebook's torch) that the notebooks and check my work need, JupyterLab and
    ipywidgets among them, each met by the version the course is tested with; nothing of
    the instructor's grading stack; the student package's Pythons."""
    with zipfile.ZipFile(wheels[1]) as archive:
        meta = archive.read("attention_from_scratch_course-0.1.0.dist-info/METADATA").decode()
        entry = archive.read("attention_from_scratch_course-0.1.0.dist-info/entry_points.txt").decode()
    requires = [Requirement(r) for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M)]
    root = tomllib.loads((course.ROOT / "pyproject.toml").read_text())["project"]
    learner = {Requirement(r).name: Requirement(r) for r in root["dependencies"]}
    assert {r.name for r in requires} >= {"torch", "numpy", "matplotlib", "jupyterlab", "ipywidgets", "ipykernel", "tqdm"}
    for r in requires:
        assert str(r) == str(learner[r.name]), f"{r}: the learner's install says {learner.get(r.name)}"
        assert r.specifier.contains(metadata.version(r.name).split("+")[0]), f"{r} and the tested {r.name}"
    assert {r.name for r in requires} & INSTRUCTOR == set()
    student = tomllib.loads((course.ROOT / "coursekit" / "pyproject.toml").read_text())["project"]
    python = re.search(r"^Requires-Python: (.+)$", meta, re.M).group(1)
    assert SpecifierSet(python) == SpecifierSet(student["requires-python"]), "the student package's Pythons"
    assert "attention-course = attention_course.cli:main" in entry


@pytest.fixture(scope="module")
def venv_python() -> Path:
    return selfstudy_env()


def _offline(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment with no way to the network (an unreachable proxy) and its own
    HOME and Jupyter folders (the check's secret goes there)."""
    return clean_env(HOME=str(home), JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
                     JUPYTER_CONFIG_DIR=str(home / "config"), http_proxy="http://127.0.0.1:9",
                     https_proxy="http://127.0.0.1:9", PIP_NO_INDEX="1", **extra)


def _command(venv_python: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv_python.parent / "attention-course"), *args], cwd=home, env=_offline(home),
                          capture_output=True, text=True, timeout=120)


def test_the_command_writes_the_notebooks_and_never_over_the_learner_s(venv_python, tmp_path):
    done = _command(venv_python, tmp_path, "notebooks", "course")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"attention-course: wrote {len(course.assignments())} notebooks into {tmp_path / 'course'}\n"
    for assignment in course.assignments():
        name = f"{assignment}/{assignment}.ipynb"
        assert (tmp_path / "course" / name).read_bytes() == (course.NOTEBOOKS / name).read_bytes()
    mine = tmp_path / "course" / "03_masking" / "03_masking.ipynb"
    mine.write_text("my work")
    (tmp_path / "course" / "01_similarity" / "01_similarity.ipynb").unlink()
    done = _command(venv_python, tmp_path, "notebooks", "course")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.count("\n") == 1 and "wrote 1 notebook into" in done.stdout, done.stdout
    assert f"kept {len(course.assignments()) - 1} already there, not written over" in done.stdout
    assert mine.read_text() == "my work"
    done = _command(venv_python, tmp_path, "notebooks", "course")
    every = len(course.assignments())
    assert done.stdout.startswith(f"attention-course: all {every} notebooks are already in") and mine.read_text() == "my work"
    (tmp_path / "a file").write_text("")
    done = _command(venv_python, tmp_path, "notebooks", "a file")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "is a file, not a folder" in done.stderr


def test_the_command_opens_jupyterlab_on_the_folder(venv_python, tmp_path):
    """As root (this suite's CI) too: JupyterLab refuses root without --allow-root."""
    lab = subprocess.Popen([str(venv_python.parent / "attention-course"), "lab", "--ServerApp.port=0",
                            "--ServerApp.open_browser=False"], cwd=tmp_path, env=_offline(tmp_path),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not list((tmp_path / "runtime").glob("jpserver-*.json")):
            assert lab.poll() is None and time.monotonic() < deadline, lab.stdout.read() if lab.poll() else "no server"
            time.sleep(0.5)
        server = json.loads(next((tmp_path / "runtime").glob("jpserver-*.json")).read_text())
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost, not the dead proxy

        def get(path: str) -> dict:
            request = urllib.request.Request(f"{server['url'].rstrip('/')}/api/contents/{path}",
                                             headers={"Authorization": f"token {server['token']}"})
            with opener.open(request, timeout=30) as response:
                return json.load(response)

        listing, notebook = get("03_masking"), get("03_masking/03_masking.ipynb")
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=60)
    log = lab.stdout.read()
    assert "error adding extension" not in log and "Traceback" not in log, log[-3000:]
    assert server["root_dir"] == str(tmp_path / "attention-from-scratch")
    assert [item["name"] for item in listing["content"]] == ["03_masking.ipynb"]
    # the learner's configuration (lab/): the notebook comes with the kernel's own language_info,
    # so that opening it leaves it unmodified; the file keeps the released short form
    full = subprocess.run([str(venv_python), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    assert notebook["content"]["metadata"]["language_info"]["version"] == full
    released = json.loads((tmp_path / "attention-from-scratch" / "03_masking" / "03_masking.ipynb").read_text())
    assert released["metadata"]["language_info"]["version"] != full


def test_the_venv_s_torch_is_the_pinned_cpu_build(venv_python, tmp_path):
    """From the pinned file on disk (pip's find-links), as the course's own venv has it."""
    done = subprocess.run([str(venv_python), "-c", "import torch; print(torch.__version__)"], cwd=tmp_path,
                          env=_offline(tmp_path), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, metadata.version("torch")), done.stderr


def test_the_training_cells_progress_bar_has_its_widgets(venv_python, tmp_path):
    """tqdm's notebook bar needs ipywidgets: without it ``IProgress`` is None and the bar
    raises "IProgress not found" (tqdm.auto's warning, in red, in the training cells)."""
    done = subprocess.run([str(venv_python), "-W", "error", "-c", "import tqdm.notebook as t; "
                           "print(t.IProgress is not None); t.tqdm(range(2), disable=False).close()"],
                          cwd=tmp_path, env=_offline(tmp_path), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.splitlines()[:1]) == (0, ["True"]), done.stderr


def _filled(assignment: str) -> nbformat.NotebookNode:
    """The student notebook with each answer cell replaced by the solution's."""
    solved = {c.metadata.nbgrader["grade_id"]: c.source
              for c in nbformat.read(course.SOLUTIONS / assignment / f"{assignment}.ipynb", as_version=4).cells
              if c.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.read(course.NOTEBOOKS / assignment / f"{assignment}.ipynb", as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = solved[grade_id]
    return nb


def _run_notebook(venv_python: Path, home: Path, nb: nbformat.NotebookNode, name: str) -> list[str]:
    """Run the notebook top to bottom in the venv's own kernel (nbconvert, errors allowed) and
    return what each cell that calls check_my_work printed."""
    folder = home / name
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{name}.ipynb")
    done = subprocess.run([str(venv_python), "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                           "--allow-errors", "--inplace", f"{name}.ipynb"], cwd=folder, env=_offline(home),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    ran = nbformat.read(folder / f"{name}.ipynb", as_version=4).cells
    assert "check_my_work()" in ran[-1].source or "check_my_work()" in ran[-2].source
    return ["".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            for cell in ran if cell.cell_type == "code" and "check_my_work(" in cell.source]


def test_check_my_work_offline_full_marks_for_the_solutions_none_for_an_untouched_notebook_and_one_exercise(venv_python, tmp_path):
    assignment = "03_masking"
    points = sum(c.metadata.nbgrader.get("points", 0)
                 for c in nbformat.read(course.NOTEBOOKS / assignment / f"{assignment}.ipynb", as_version=4).cells
                 if c.metadata.get("nbgrader", {}).get("grade"))
    filled = _filled(assignment)
    filled.cells.append(nbformat.v4.new_code_cell('check_my_work("causal_mask")'))  # one exercise
    solved, one = _run_notebook(venv_python, tmp_path, filled, assignment)
    assert one == ("Checked causal_mask as defined in this kernel now, with the hidden checks:\n"
                   "  PASS  masking-causal_mask  2/2\n")
    assert f"Score: {points:g}/{points:g}" in solved and "FAIL" not in solved, solved
    assert "What to revisit: nothing, every hidden check passed." in solved
    [untouched] = _run_notebook(venv_python, tmp_path / "untouched",
                                nbformat.read(course.NOTEBOOKS / assignment / f"{assignment}.ipynb", as_version=4),
                                assignment)
    assert f"Score: 0/{points:g}" in untouched and "PASS" not in untouched, untouched
    assert "not answered yet, it still raises NotImplementedError" in untouched
    assert (tmp_path / "data" / "attention-from-scratch" / "check_secret").is_file(), "the user's own secret"
