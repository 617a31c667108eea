"""Finding the submitted notebooks in a folder, and placing them where nbgrader looks.

Accepted layouts, one folder per student (the folder name is the student id):

    SUBMISSIONS/<student>/<lab>.ipynb
    SUBMISSIONS/<student>/<lab>/<lab>.ipynb      (nbgrader's submitted/ layout)

Anything else (a notebook that is no lab of the course, a file outside a
student folder, a student id nbgrader cannot use) is reported, not graded.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from . import GraderError
from .labs import NotebookError, parse_notebook, validate_notebook

STUDENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
SKIPPED = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}


@dataclass(frozen=True)
class Submission:
    student: str
    lab: str
    path: Path  # the notebook as handed in


def find(folder: Path, labs: list[str]) -> tuple[list[Submission], list[str]]:
    """(submissions of the given labs, problems found) in folder, sorted by student then lab."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GraderError(f"{folder}: no such folder of submissions")
    found, problems = {}, []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.name in SKIPPED:
            continue
        if not entry.is_dir():
            problems.append(f"{entry.name}: not in a student folder; expected "
                            f"{folder.name}/<student>/<lab>.ipynb")
            continue
        if not STUDENT_ID_RE.match(entry.name):
            problems.append(f"{entry.name}/: not a usable student id (letters, digits and _ . @ -)")
            continue
        for notebook in sorted(entry.rglob("*.ipynb")):
            relative = notebook.relative_to(folder)
            if any(part.startswith(".") or part in SKIPPED for part in relative.parts):
                continue
            lab = notebook.stem
            depth_ok = len(relative.parts) == 2 or (len(relative.parts) == 3 and relative.parts[1] == lab)
            if lab not in labs or not depth_ok:
                problems.append(f"{relative}: not a lab to grade (expected <student>/<lab>.ipynb or "
                                f"<student>/<lab>/<lab>.ipynb, with <lab> one of {', '.join(labs)})")
                continue
            key = (entry.name, lab)
            if key in found:
                problems.append(f"{relative}: a second copy of {lab} for {entry.name}; "
                                f"grading {found[key].path.relative_to(folder)}")
                continue
            found[key] = Submission(entry.name, lab, notebook)
    return [found[k] for k in sorted(found)], problems


def unreadable(path: Path) -> str | None:
    """Why nbgrader could not open this notebook, in plain words; None if it can."""
    try:
        validate_notebook(parse_notebook(path))
    except NotebookError as e:
        return f"the file is {e}: it could not be graded"
    return None


def place(submission: Submission, submitted_dir: Path) -> Path:
    """Copy the notebook to nbgrader's <submitted>/<student>/<lab>/<lab>.ipynb (replacing an earlier copy)."""
    target_dir = Path(submitted_dir) / submission.student / submission.lab
    if target_dir.exists():
        shutil.rmtree(target_dir)
    target_dir.mkdir(parents=True)
    target = target_dir / f"{submission.lab}.ipynb"
    shutil.copyfile(submission.path, target)
    return target
