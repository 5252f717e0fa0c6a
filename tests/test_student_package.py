"""The student package (coursekit/pyproject.toml): its wheel holds the notebooks' helpers
and nothing that decides a grade, and a clean venv with only that wheel runs every
student notebook's setup cell.

The wheel is built as ``make wheel`` builds it; the venv comes from hub/environments.py
(cached in out/; the first run installs torch into it, a few minutes; ``make student-env``
builds it ahead of the tests).
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from grader import course
from hub.environments import build_wheel, clean_env, student_env

pytestmark = pytest.mark.kernel

ALLOWED = re.compile(r"coursekit/[a-z_0-9]+\.py|coursekit/drivers/[a-z_0-9]+\.py"
                     r"|coursekit/assets/fonts/(NanumSquareR\.ttf|OFL\.txt)"
                     r"|attention_coursekit-0\.1\.0\.dist-info/(METADATA|WHEEL|RECORD|top_level\.txt)")
# what only the instructor's side holds: nbgrader's solution and hidden-test markers, and
# code that imports the grader package
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "grader/checks",
           ".grader_secret")
IMPORTS_GRADER = re.compile(r"^\s*(from\s+grader\b|import\s+grader\b)|import_module\([\"']grader", re.M)
# The one import of the grader the package holds: check_my_work("name") checks one exercise
# in the kernel where the grader is installed beside coursekit (a self-learner's install);
# coursekit/check.py asks importlib first, and the class's student venv, without the grader,
# gets one line instead (test_fast_check.py).
SELF_LEARNER_IMPORT = ("coursekit/check.py", "from grader.kernelcheck import CannotCheck, check_in_kernel")
DISTINCTIVE = 30  # shorter solution lines (d_k = d_model // heads) are common code, not a reference
CONSTRUCTION = re.compile(r"self\.(\w+) = (nn\.\w+\(.*\))")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheel_text(wheel) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name).decode("utf-8", "replace") for name in archive.namelist()
                if not name.endswith(".ttf")}


@pytest.fixture(scope="module")
def venv_python() -> Path:
    # the env students' servers run on the course hub (tests/test_hub.py): the wheel with its
    # hub extra; one build serves both tests
    return student_env("hub")


def _cells(folder: Path):
    for path in sorted(folder.glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            yield path, cell


def _between(source: str, begin: str, end: str) -> list[str]:
    return [m for block in re.findall(rf"{begin}\n(.*?)\n[ \t]*{end}", source, re.S) for m in block.splitlines()]


def solution_lines() -> set[str]:
    """Distinctive lines of the instructor's solutions and hidden tests: in a solution region
    or an nbgrader solution cell without one, or a hidden-test region, at least
    ``DISTINCTIVE`` characters, and not shown in any student notebook (a signature, a
    docstring, the helpers notebook 09 is given, code its text quotes). A module construction (``self.linear1 =
    nn.Linear(d_model, d_ff)``) whose name and constructor the student notebook prescribes
    in its table is part of the exercise's statement, not of its answer."""
    lines: set[str] = set()
    for _, cell in _cells(course.SOLUTIONS):
        if cell.cell_type != "code":
            continue
        if "### BEGIN SOLUTION" in cell.source:
            lines |= set(_between(cell.source, "### BEGIN SOLUTION", "### END SOLUTION"))
        elif cell.metadata.get("nbgrader", {}).get("solution"):
            lines |= set(cell.source.splitlines())
        lines |= set(_between(cell.source, "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"))
    student = "\n".join(cell.source for _, cell in _cells(course.NOTEBOOKS))
    flat = " ".join(student.split())  # markdown wraps a line of code the text quotes

    def shown(line: str) -> bool:
        return " ".join(line.split()) in flat

    def stated(line: str) -> bool:
        built = CONSTRUCTION.fullmatch(line)
        return bool(built) and f"`{built.group(1)}`" in student and built.group(2) in student

    return {line.strip() for line in lines
            if len(line.strip()) >= DISTINCTIVE and not shown(line) and not stated(line.strip())}


def check_names() -> set[str]:
    """The top-level functions and classes of grader/checks (its references too): the specs, references and judges."""
    names = set()
    for path in (course.ROOT / "grader" / "checks").rglob("*.py"):
        names |= {n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return names


def test_wheel_holds_the_helpers_the_font_and_its_licence_only(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert wheel.name == "attention_coursekit-0.1.0-py3-none-any.whl"
    assert [n for n in names if not ALLOWED.fullmatch(n)] == []
    sources = {p.relative_to(course.ROOT).as_posix() for p in (course.ROOT / "coursekit").rglob("*.py")
               if "build" not in p.parts}
    assert {n for n in names if n.endswith(".py")} == sources, "every coursekit module, check.py included"
    assert {"coursekit/assets/fonts/NanumSquareR.ttf", "coursekit/assets/fonts/OFL.txt"} <= set(names)
    assert not any(n.startswith("grader/") for n in names)


def leaks(files: dict[str, str]) -> list[str]:
    """What in ``files`` (name -> text) belongs to the instructor's side: a marker, an import
    of the grader package, a distinctive solution line, a definition named as in grader/checks."""
    found = []
    lines, names = solution_lines(), check_names()
    for name, text in files.items():
        found += [f"{name}: marker {m!r}" for m in MARKERS if m in text]
        found += [f"{name}: imports grader" for m in IMPORTS_GRADER.finditer(text)
                  if (name, text[text.rfind("\n", 0, m.end()) + 1:].split("\n", 1)[0].strip()) != SELF_LEARNER_IMPORT]
        found += [f"{name}: solution line {line!r}" for line in sorted(lines) if line in text]
        defined = set(re.findall(r"^\s*(?:def|class)\s+(\w+)", text, re.M))
        found += [f"{name}: defines {n} of grader.checks" for n in sorted(defined & names)]
    return found


def test_wheel_holds_no_solution_hidden_check_or_grader_code(wheel_text):
    assert len(solution_lines()) > 100, "the solutions' distinctive lines were not found"
    assert {"stable_softmax", "dot_product", "judge_case", "Spec"} <= check_names()
    assert leaks(wheel_text) == []


def test_the_grep_finds_what_is_planted_in_a_wheel_s_module(wheel_text):
    """The check above is able to fail: each kind of leak, planted in a module, is reported."""
    planted = sorted(solution_lines())[0]
    text = wheel_text["coursekit/data.py"] + (f"\n{planted}\nfrom grader.checks import check\n"
                                              "def stable_softmax(x, axis=-1):\n    ### BEGIN SOLUTION\n")
    found = leaks({"coursekit/data.py": text})
    assert len(found) == 4 and all(f.startswith("coursekit/data.py: ") for f in found), found
    assert any(planted in f for f in found) and any("stable_softmax" in f for f in found)


def _kernel(python: Path, tmp: Path, cwd: Path):
    spec = tmp / "kernels" / "student"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "student wheel", "language": "python"}))
    km = KernelManager(kernel_name="student", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))
    km.start_kernel(cwd=str(cwd), env=clean_env())
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def _run(kc, code: str) -> tuple[str, list[str], str]:
    """Run ``code`` in the kernel: (status, errors as 'Name: value', stdout + stderr)."""
    errors, out = [], []

    def hook(msg):
        if msg["msg_type"] == "error":
            errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
        elif msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, output_hook=hook, timeout=300)
    return reply["content"]["status"], errors, "".join(out)


PROBE = """\
import json, io, warnings, importlib.util
import coursekit, matplotlib
from matplotlib import font_manager
import coursekit.plots as plots
with warnings.catch_warnings():
    warnings.simplefilter("error")   # matplotlib warns 'Glyph ... missing from font(s)'
    ax = plots.heatmap([[0.2, 0.8], [0.6, 0.4]], ["나는", "고기를"], ["먹었다", "it"], title="나는 고기를 먹었다")
    ax.figure.savefig(io.BytesIO(), format="png")
nanum = font_manager.findfont(font_manager.FontProperties(family="NanumSquare"), fallback_to_default=False)
print(json.dumps({"coursekit": coursekit.__file__, "font": str(plots.KOREAN_FONT), "nanum": nanum,
                  "grader": importlib.util.find_spec("grader") is not None}))
"""


@pytest.mark.parametrize("assignment", course.assignments())
def test_setup_cell_runs_in_a_clean_venv_with_only_the_wheel(assignment, venv_python, tmp_path):
    """In the venv's own ipykernel, started in a copy of the assignment's student folder."""
    notebook = course.NOTEBOOKS / assignment / f"{assignment}.ipynb"
    setup = [c for c in nbformat.read(notebook, as_version=4).cells
             if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("-setup")]
    assert len(setup) == 1, f"{notebook.name} should have one setup cell (grade_id ending in -setup)"
    folder = shutil.copytree(notebook.parent, tmp_path / assignment)
    km, kc = _kernel(venv_python, tmp_path, folder)
    try:
        status, errors, out = _run(kc, setup[0].source)
        assert (status, errors) == ("ok", []), f"{assignment}'s setup cell failed: {errors}\n{out}"
        status, errors, out = _run(kc, PROBE)
        assert (status, errors) == ("ok", []), f"{errors}\n{out}"
        seen = json.loads(out.strip().splitlines()[-1])
        status, errors, _ = _run(kc, "import grader")
        assert status == "error" and errors and errors[0].startswith("ModuleNotFoundError"), errors
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    site = venv_python.parent.parent / "lib"
    assert Path(seen["coursekit"]).is_relative_to(site), f"coursekit came from {seen['coursekit']}, not the wheel"
    assert Path(seen["font"]).is_relative_to(site) and Path(seen["font"]).is_file()
    assert seen["nanum"] == seen["font"], "Hangul is drawn with the shipped font"
    assert seen["grader"] is False


def test_venv_s_files_are_world_readable(venv_python):
    venv = venv_python.parent.parent
    for path in [venv, *venv.rglob("*")]:
        if not path.is_symlink():
            assert path.stat().st_mode & 0o004, f"{path} is not readable by other accounts"
            if path.is_dir():
                assert path.stat().st_mode & 0o001, f"{path} cannot be entered by other accounts"


def test_dev_install_finds_the_font_in_the_checkout(tmp_path):
    """The instructor's editable install (and this checkout on PYTHONPATH) reads the same font,
    from coursekit/assets/fonts, in a fresh process outside the course folder."""
    done = subprocess.run([sys.executable, "-c", "import coursekit.plots as p; print(p.KOREAN_FONT, p.KOREAN_FONT.is_file())"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    font, exists = done.stdout.split()
    assert (font, exists) == (str(course.ROOT / "coursekit" / "assets" / "fonts" / "NanumSquareR.ttf"), "True")
