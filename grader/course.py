"""Where the course's folders are, which assignments exist, and how ids are named.

One exercise id (``similarity-dot_product``: topic, hyphen, name) names the solution cell's grade_id; its
graded test cell is ``<exercise id>-test``; the grade table has one column per id.
"""
from __future__ import annotations

from pathlib import Path

from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parents[1]
CONFIG_FILE = ROOT / "nbgrader_config.py"
SOLUTIONS = ROOT / "solutions"
NOTEBOOKS = ROOT / "notebooks"
# The self-learner's package (selfstudy/) holds no solutions/: its student notebooks carry the
# same grade ids, points and headings, which is all its check my work reads of the assignments.
if not SOLUTIONS.is_dir() and (ROOT / "attention_course" / "notebooks").is_dir():
    SOLUTIONS = NOTEBOOKS = ROOT / "attention_course" / "notebooks"
SAMPLE_CLASS = ROOT / "sample_class"
TEST_SUFFIX = "-test"


def load_config() -> Config:
    """The course's nbgrader configuration, read from nbgrader_config.py."""
    return PyFileConfigLoader(CONFIG_FILE.name, path=str(ROOT)).load_config()


def assignments() -> list[str]:
    """Assignment ids: the folders of solutions/ that hold a notebook, sorted."""
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def notebook_names(assignment_id: str) -> list[str]:
    """The notebook names (without .ipynb) of one assignment, sorted."""
    return sorted(p.stem for p in (SOLUTIONS / assignment_id).glob("*.ipynb"))


def solution_namespace(assignment_id: str) -> dict:
    """Run the solution cells and the read-only set-up cells (grade ids ending in -setup,
    -data or -helpers; not figures or demos) of an assignment's source notebook in process:
    the reference solutions by name (for the tests and the benchmarks)."""
    import nbformat

    path = SOLUTIONS / assignment_id / f"{assignment_id}.ipynb"
    namespace: dict = {}
    for cell in nbformat.read(path, as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        grade_id = meta.get("grade_id", "")
        # a demo's helpers (notebook 15's "-demo-gpt-helpers") need the demo's own settings
        setup = meta.get("locked") and grade_id.endswith(("-setup", "-data", "-helpers")) and "-demo-" not in grade_id
        if cell.cell_type == "code" and (meta.get("solution") or setup):
            exec(compile(cell.source, f"{path.name}:{grade_id}", "exec"), namespace)
    return namespace


def exercise_id(grade_id: str) -> str:
    """The exercise id that a cell's grade_id belongs to."""
    return grade_id[: -len(TEST_SUFFIX)] if grade_id.endswith(TEST_SUFFIX) else grade_id


def sections(assignment_id: str) -> dict[str, str]:
    """Exercise id -> the title of the section ("## 2. Temperature: ...") it sits in.

    Read from the source notebook: the last level-2 heading above each solution cell,
    without its "## ". An exercise above every heading gets the notebook's title.
    """
    import nbformat

    titles: dict[str, str] = {}
    heading = ""
    for path in sorted((SOLUTIONS / assignment_id).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                for line in cell.source.splitlines():
                    if line.startswith(("# ", "## ")) and (line.startswith("## ") or not heading):
                        heading = line.lstrip("#").strip()
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "code" and meta.get("solution") and meta.get("grade_id"):
                titles[meta["grade_id"]] = heading
    return titles
