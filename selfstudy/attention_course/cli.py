"""``attention-course``: the course's notebooks in a folder of the learner's, and JupyterLab on it.

    attention-course lab [FOLDER] [JUPYTERLAB OPTIONS]
                                         write the notebooks into FOLDER (default
                                         ./attention-from-scratch), then open JupyterLab there
                                         (its options, as --name=value, go to it: --port=8890)
    attention-course notebooks FOLDER    only write them

The notebooks go to ``FOLDER/<assignment>/<assignment>.ipynb``, as the course's
``notebooks/`` holds them. JupyterLab runs with the course's learner configuration (lab/,
held by this package), as ``make lab`` runs it: notebooks open unmodified. A notebook already there is the learner's work and is never
written over: it is kept, and one line says which were kept.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

DEFAULT_FOLDER = "attention-from-scratch"


def shipped() -> dict[str, bytes]:
    """The student notebooks in this package: ``"<assignment>/<assignment>.ipynb"`` -> bytes."""
    root = resources.files("attention_course") / "notebooks"
    return {f"{folder.name}/{notebook.name}": notebook.read_bytes()
            for folder in sorted(root.iterdir(), key=lambda f: f.name) if folder.is_dir()
            for notebook in sorted(folder.iterdir(), key=lambda f: f.name) if notebook.name.endswith(".ipynb")}


def write_notebooks(folder: Path) -> tuple[list[str], list[str]]:
    """Write every notebook into ``folder`` (made if missing), never over a file that exists.

    Returns:
        (written, kept): the relative paths written, and those left as they were because
        a file was already there.

    Raises:
        NotADirectoryError: ``folder``, or an assignment's folder in it, is a file.
        OSError: a folder or file cannot be made (no permission, disk full).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, not a folder")
    written, kept = [], []
    for name, data in shipped().items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(target, "xb") as f:  # "x": fails rather than replace what is there
                f.write(data)
        except FileExistsError:
            kept.append(name)
            continue
        written.append(name)
    return written, kept


def report(folder: Path, written: list[str], kept: list[str]) -> str:
    """The one line saying what ``write_notebooks`` did."""
    if not written:
        return f"attention-course: all {len(kept)} notebooks are already in {folder}: kept as they are, none written over"
    line = f"attention-course: wrote {len(written)} notebook{'s' if len(written) != 1 else ''} into {folder}"
    return line + (f"; kept {len(kept)} already there, not written over: {', '.join(kept)}" if kept else "")


def lab_environment(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the learner's Jupyter configuration this package holds (the course's
    lab/: notebooks open unmodified, no instructor screens) first on ``JUPYTER_CONFIG_PATH``,
    as ``make lab`` puts it."""
    config = str(resources.files("attention_course") / "lab")
    rest = environ.get("JUPYTER_CONFIG_PATH", "")
    return {**environ, "JUPYTER_CONFIG_PATH": config + (os.pathsep + rest if rest else "")}


def lab_command(folder: Path, options: list[str]) -> list[str]:
    """JupyterLab on ``folder``, from this Python, with JupyterLab's own ``options``; as root
    (a container, a hosted notebook) with ``--allow-root``, which JupyterLab otherwise refuses."""
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}", *options]
    root = getattr(os, "geteuid", lambda: -1)() == 0  # (Windows has no uids)
    return command + (["--allow-root"] if root and "--allow-root" not in options else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attention-course", description="Attention from Scratch for "
                                     "self-learners: the notebooks in a folder of yours, and JupyterLab on it.")
    sub = parser.add_subparsers(dest="command", required=True)
    lab = sub.add_parser("lab", help="write the notebooks into FOLDER (never over your work) and open JupyterLab there",
                         epilog="JupyterLab's own options follow, as --name=value: e.g. attention-course lab "
                                "--port=8890 --no-browser")
    lab.add_argument("folder", nargs="?", default=DEFAULT_FOLDER, type=Path,
                     help=f"where the notebooks go (default: ./{DEFAULT_FOLDER})")
    notebooks = sub.add_parser("notebooks", help="only write the notebooks into FOLDER (never over your work)")
    notebooks.add_argument("folder", type=Path, help="where the notebooks go, e.g. ./attention-from-scratch")
    args, options = parser.parse_known_args(argv)
    if args.command == "notebooks" and options:
        parser.error(f"unrecognized arguments: {' '.join(options)}")
    folder = args.folder.expanduser().resolve()
    try:
        written, kept = write_notebooks(folder)
    except OSError as error:
        print(f"attention-course: cannot write the notebooks into {folder} ({error.strerror or error}): "
              "name another folder, e.g. attention-course lab ~/attention-from-scratch", file=sys.stderr)
        return 2
    print(report(folder, written, kept))
    if args.command == "notebooks":
        return 0
    command = lab_command(folder, options)
    print(f"attention-course: opening JupyterLab on {folder} (Ctrl-C stops it)", flush=True)
    environment = lab_environment(dict(os.environ))
    if os.name == "nt":  # no exec there: JupyterLab runs as a child, its exit status ours
        return subprocess.call(command, env=environment)
    os.execve(command[0], command, environment)  # JupyterLab takes this process: its output, its Ctrl-C


if __name__ == "__main__":
    sys.exit(main())
