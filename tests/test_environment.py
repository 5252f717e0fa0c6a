"""environment.yml and pyproject.toml pin the same packages to the same versions, and the
student package (coursekit/pyproject.toml) pins a subset of them."""
from __future__ import annotations

import os
import tomllib

import yaml

from grader import course


def test_environment_yml_matches_pyproject():
    pyproject = tomllib.loads((course.ROOT / "pyproject.toml").read_text())
    pins = set(pyproject["project"]["dependencies"])
    env = yaml.safe_load((course.ROOT / "environment.yml").read_text())
    assert env["channels"][0] == "conda-forge" and set(env["channels"]) <= {"conda-forge", "nodefaults"}
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip_section, "environment.yml must install the project itself"
    assert set(pip_section) - {"-e ."} == pins
    assert all("==" in pin for pin in pins), "every dependency is pinned exactly"
    assert "python=3.11" in env["dependencies"]


def test_student_package_pins_are_the_course_pins():
    pins = set(tomllib.loads((course.ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    student = tomllib.loads((course.ROOT / "coursekit" / "pyproject.toml").read_text())["project"]
    wanted = set(student["dependencies"]) | {pin for extra in student["optional-dependencies"].values()
                                             for pin in extra}
    assert wanted - pins == set(), "coursekit/pyproject.toml pins what the course does not, or otherwise"


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
