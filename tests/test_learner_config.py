"""The learner's Jupyter configuration (lab/, which `make lab` puts on JUPYTER_CONFIG_PATH),
in process: which of nbgrader's extensions it turns off, and the contents manager that
lets a notebook open unmodified. tests/test_learner_lab.py opens it in a real browser."""
from __future__ import annotations

import asyncio
import json
import runpy

import nbformat
from ipykernel.ipkernel import IPythonKernel
from traitlets.config import Config

from grader import course

LAB = course.ROOT / "lab"


def test_nbgrader_instructor_screens_are_off_and_validate_stays():
    server = json.loads((LAB / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    assert server == {"nbgrader.server_extensions.formgrader": False,
                      "nbgrader.server_extensions.assignment_list": False,
                      "nbgrader.server_extensions.course_list": False}
    # Validate stays as nbgrader's own config enables it where nbgrader is installed; this
    # config does not name it, so a self-learner's install without nbgrader starts with no error
    disabled = json.loads((LAB / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert {name for name, off in disabled.items() if off} == {
        f"@jupyter/nbgrader:{plugin}" for plugin in
        ("formgrader", "create-assignment", "course-list", "assignment-list", "menu")}
    # the venv itself keeps them: the instructor's and the tests' JupyterLab show formgrader
    makefile = (course.ROOT / "Makefile").read_text()
    assert 'JUPYTER_CONFIG_PATH="$(CURDIR)/lab' in makefile and "--allow-root" in makefile


def _config() -> Config:
    config = Config()
    runpy.run_path(str(LAB / "jupyter_server_config.py"), init_globals={"get_config": lambda: config})
    return config


def test_a_python_notebook_is_handed_to_jupyterlab_with_its_kernels_language_info(tmp_path):
    """What JupyterLab writes into the metadata when the kernel starts is already there, so
    the notebook is not modified by opening it; the file on disk is left as released."""
    config = _config()
    assert config.ServerApp.allow_root is True
    manager = config.ServerApp.contents_manager_class(root_dir=str(tmp_path))
    released = nbformat.read(course.NOTEBOOKS / "01_similarity" / "01_similarity.ipynb", as_version=4)
    assert released.metadata.language_info == {"name": "python", "version": "3.11"}
    nbformat.write(released, tmp_path / "a.ipynb")
    other = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "ir", "language": "R", "display_name": "R"},
                                               "language_info": {"name": "R"}})
    nbformat.write(other, tmp_path / "b.ipynb")
    on_disk = (tmp_path / "a.ipynb").read_bytes()

    opened = asyncio.run(manager.get("a.ipynb"))
    assert opened["content"]["metadata"]["language_info"] == IPythonKernel.language_info
    assert opened["content"]["metadata"]["kernelspec"] == released.metadata.kernelspec
    assert asyncio.run(manager.get("b.ipynb"))["content"]["metadata"]["language_info"] == {"name": "R"}
    assert asyncio.run(manager.get("a.ipynb", content=False))["content"] is None
    assert (tmp_path / "a.ipynb").read_bytes() == on_disk
