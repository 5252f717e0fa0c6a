"""The three installs agree: pyproject.toml names the packages (the learner's base as
ranges, the instructor's and the tests' as extras), constraints.txt pins every one of them
exactly (the grading environment: make demo, make test, .ci/run and make lab install with
it), environment.yml repeats those pins, and the student package (coursekit/pyproject.toml)
pins a subset of them."""
from __future__ import annotations

import os
import tomllib

import yaml
from packaging.requirements import Requirement

from grader import course

# what only the instructor or the tests need; the learner's base must not pull them in
INSTRUCTOR_AND_TEST_ONLY = {"jupyterhub", "jupyter-server-mathjax", "dask", "distributed", "psycopg",
                            "pytest", "pytest-xdist", "playwright", "psutil"}


def _name(requirement: Requirement) -> str:
    return requirement.name.lower().replace("_", "-")


def _pyproject(path="pyproject.toml") -> dict:
    return tomllib.loads((course.ROOT / path).read_text())["project"]


def _constraints() -> dict[str, Requirement]:
    lines = (course.ROOT / "constraints.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert all(not pin.extras and len(pin.specifier) == 1 and next(iter(pin.specifier)).operator == "=="
               for pin in pins), "constraints.txt pins each package exactly, by name only (pip takes no extras there)"
    return {_name(pin): pin for pin in pins}


def test_every_package_of_pyproject_is_pinned_by_constraints_within_its_range():
    project, pins = _pyproject(), _constraints()
    named = [Requirement(r) for r in project["dependencies"]]
    named += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    assert {_name(r) for r in named} == set(pins), "constraints.txt pins what pyproject.toml names, no more"
    for requirement in named:
        version = next(iter(pins[_name(requirement)].specifier)).version
        assert requirement.specifier.contains(version), f"{requirement}: the pin {version} is outside it"


def test_the_learners_base_is_not_the_instructors():
    project = _pyproject()
    base = {_name(Requirement(r)) for r in project["dependencies"]}
    assert base & INSTRUCTOR_AND_TEST_ONLY == set()
    assert {"torch", "numpy", "matplotlib", "jupyterlab", "ipywidgets", "ipykernel", "tqdm", "nbgrader"} <= base
    assert set(project["optional-dependencies"]) == {"instructor", "test"}
    assert project["requires-python"] == ">=3.11,<3.14"
    assert _pyproject("coursekit/pyproject.toml")["requires-python"] == ">=3.11,<3.14"


def test_environment_yml_matches_constraints():
    pins = _constraints()
    env = yaml.safe_load((course.ROOT / "environment.yml").read_text())
    assert env["channels"][0] == "conda-forge" and set(env["channels"]) <= {"conda-forge", "nodefaults"}
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e .[instructor,test]" in pip_section, "environment.yml installs the course as make demo does"
    listed = [Requirement(line) for line in pip_section if not line.startswith("-e ")]
    assert {_name(r): str(r.specifier) for r in listed} == {name: str(pin.specifier) for name, pin in pins.items()}
    assert "python=3.11" in env["dependencies"]


def test_student_package_pins_are_the_course_pins():
    pins = _constraints()
    student = _pyproject("coursekit/pyproject.toml")
    wanted = [Requirement(r) for r in student["dependencies"]]
    wanted += [Requirement(r) for extra in student["optional-dependencies"].values() for r in extra]
    assert [str(r) for r in wanted if _name(r) not in pins or r.specifier != pins[_name(r)].specifier] == [], (
        "coursekit/pyproject.toml pins what constraints.txt does not, or otherwise")


def test_the_arithmetic_notes_reference_is_the_pinned_torch():
    from coursekit import training

    assert training.REFERENCE["torch"] == next(iter(_constraints()["torch"].specifier)).version
    env = yaml.safe_load((course.ROOT / "environment.yml").read_text())
    assert f"python={training.REFERENCE['python']}" in env["dependencies"]


def test_korean_renders_offline_from_the_shipped_font(tmp_path):
    """Hangul labels draw with the font in coursekit/assets/fonts (package data, found
    through importlib.resources in this editable install; the folder is the course's
    top-level assets/, which coursekit/assets links to), with no missing-glyph warning."""
    import warnings
    from importlib import resources

    import matplotlib
    matplotlib.use("Agg")
    from coursekit import plots

    fonts = resources.files("coursekit") / "assets" / "fonts"
    assert plots.KOREAN_FONT == fonts / "NanumSquareR.ttf"
    assert plots.KOREAN_FONT.is_file() and (fonts / "OFL.txt").is_file()
    root = course.ROOT
    assert os.readlink(root / "coursekit" / "assets") == "../assets", "a relative link, valid in every clone"
    assert os.path.realpath(plots.KOREAN_FONT) == str(root / "assets" / "fonts" / "NanumSquareR.ttf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ax = plots.heatmap([[0.2, 0.8], [0.6, 0.4]], ["나는", "고기를"], ["먹었다", "it"], title="나는 고기를 먹었다")
        ax.figure.savefig(tmp_path / "korean.png")


def test_importing_nbformat_compiles_no_iri_grammar():
    """jsonschema 4.25 and later import rfc3987-syntax, whose parsers are compiled on import
    (2.6 s of CPU in every nbgrader command, Jupyter server and Dask worker); the pinned
    jsonschema does not. nbformat is imported by now in this process."""
    import sys

    import nbformat  # noqa: F401

    assert "jsonschema._format" in sys.modules
    assert "rfc3987_syntax" not in sys.modules
