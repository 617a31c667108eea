"""Finding the submitted notebooks in a folder, and placing them where nbgrader looks.

Accepted layouts, one folder per student (the folder name is the student id):

    SUBMISSIONS/<student>/<lab>.ipynb
    SUBMISSIONS/<student>/<lab>/<lab>.ipynb      (nbgrader's submitted/ layout)

SUBMISSIONS may also be a zip of either layout, optionally inside one top
folder (``unpack`` extracts its notebooks, and nothing else, safely).

Anything else (a notebook that is no lab of the course, a file outside a
student folder, a student id nbgrader cannot use) is reported, not graded.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import GraderError
from .labs import NotebookError, parse_notebook, validate_notebook

STUDENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
SKIPPED = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}
MAX_NOTEBOOK_BYTES = 100 << 20   # one notebook, unzipped
MAX_ZIP_BYTES = 2 << 30          # all of a zip's notebooks, unzipped


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


def place(submission: Submission, notebook: dict, submitted_dir: Path, released: dict) -> list[str]:
    """Write the notebook to nbgrader's <submitted>/<student>/<lab>/<lab>.ipynb (replacing an
    earlier copy), its grading metadata put right; returns what was put right, in words.
    notebook: the submission, as parse_notebook read it.

    A cell's nbgrader metadata is the student's to change, and nbgrader trusts it: a
    cell claiming a grade_id the lab does not have, or a solution cell claiming to be a
    test, made nbgrader fail on the whole notebook. Each cell of the lab gets the
    release's metadata back; any other cell loses its claim and runs as the student's own.
    """
    target_dir = Path(submitted_dir) / submission.student / submission.lab
    if target_dir.exists():
        shutil.rmtree(target_dir)
    target_dir.mkdir(parents=True)
    notebook = copy.deepcopy(notebook)  # the caller's stays as the student handed it in
    notes = restore_grading_metadata(notebook, released)
    target = target_dir / f"{submission.lab}.ipynb"
    target.write_text(json.dumps(notebook), encoding="utf-8")
    return notes


def restore_grading_metadata(notebook: dict, released: dict) -> list[str]:
    """Put the release's nbgrader metadata back on the lab's cells and take it off any other (in place)."""
    lab_cells = {}
    for cell in released.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader")
        if isinstance(meta, dict) and meta.get("grade_id"):
            lab_cells[meta["grade_id"]] = meta
    notes = []
    for index, cell in enumerate(notebook.get("cells", [])):
        metadata = cell.get("metadata")
        if not isinstance(metadata, dict) or "nbgrader" not in metadata:
            continue
        claim = metadata["nbgrader"]
        grade_id = claim.get("grade_id") if isinstance(claim, dict) else None
        if isinstance(grade_id, str) and grade_id in lab_cells:
            if {k: v for k, v in claim.items() if k != "checksum"} != \
                    {k: v for k, v in lab_cells[grade_id].items() if k != "checksum"}:
                notes.append(f"cell {grade_id}'s grading metadata was changed; the lab's was put back")
            metadata["nbgrader"] = dict(lab_cells[grade_id])
        else:
            del metadata["nbgrader"]
            name = f"grade_id {str(grade_id)[:40]!r}" if grade_id else "no grade_id"
            notes.append(f"cell {index + 1} claimed grading metadata ({name}) that is no cell of the lab; "
                         "it ran as an ordinary cell")
    return notes


def unpack(archive: Path, target: Path, labs: list[str]) -> tuple[Path, list[str]]:
    """Extract the notebooks of a zip of submissions into target; (folder to grade, problems).

    Only ``.ipynb`` members are written, each at most MAX_NOTEBOOK_BYTES, all
    together at most MAX_ZIP_BYTES; absolute paths, ``..`` and links are refused.
    """
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as e:
        raise GraderError(f"{archive}: not a zip file ({e})") from None
    problems, members = [], []
    with zf:
        for info in zf.infolist():
            parts = [p for p in info.filename.replace("\\", "/").split("/") if p]
            if info.is_dir() or not parts or not parts[-1].endswith(".ipynb"):
                continue
            if info.filename.startswith("/") or ".." in parts or stat.S_ISLNK(info.external_attr >> 16):
                problems.append(f"{info.filename}: refused (an absolute path, '..' or a link)")
            elif any(p.startswith(".") or p in SKIPPED for p in parts):
                continue
            elif info.file_size > MAX_NOTEBOOK_BYTES:
                problems.append(f"{info.filename}: refused ({info.file_size >> 20} MB; a notebook may "
                                f"have at most {MAX_NOTEBOOK_BYTES >> 20} MB)")
            else:
                members.append((info, parts))
        if sum(info.file_size for info, _ in members) > MAX_ZIP_BYTES:
            raise GraderError(f"{archive}: its notebooks unzip to more than {MAX_ZIP_BYTES >> 30} GB")
        # One folder around everything (e.g. submitted/), unless it is a single student's folder.
        tops = {parts[0] for _, parts in members}
        strip = len(tops) == 1 and all(len(parts) >= 3 and parts[1] not in labs for _, parts in members)
        if target.exists():
            shutil.rmtree(target)
        for info, parts in members:
            path = target.joinpath(*parts[1:] if strip else parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, path.open("wb") as dst:
                # file_size is what the zip claims; count what really comes out.
                shutil.copyfileobj(_Capped(src, MAX_NOTEBOOK_BYTES), dst)
    return target, problems


class _Capped:
    """A reader that raises once more than `limit` bytes came out of it."""

    def __init__(self, raw, limit: int):
        self.raw, self.left = raw, limit

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n if n >= 0 else self.left + 1)
        self.left -= len(data)
        if self.left < 0:
            raise GraderError("a notebook in the zip unzips to more than it says; refused")
        return data
