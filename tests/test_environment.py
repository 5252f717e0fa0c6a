"""environment.yml and pyproject.toml pin the same packages to the same versions."""
from __future__ import annotations

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
