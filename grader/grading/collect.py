"""Finding the submitted notebooks in a folder, and placing them where nbgrader looks.

Accepted layouts, one folder per student (the folder name is the student id):

    SUBMISSIONS/<student>/<lab>.ipynb
    SUBMISSIONS/<student>/<lab>/<lab>.ipynb      (nbgrader's submitted/ layout)

SUBMISSIONS may also be a zip of either layout, optionally inside one top
folder (grader.grading.unzip extracts its notebooks, and nothing else, safely).

Anything else (a notebook that is no lab of the course, a file outside a
student folder, a student id nbgrader cannot use or one named like a lab) is
reported, not graded, and the rest of the class is collected: only what
concerns the whole run (no such folder, not a zip, a zip that unzips too big)
is a GraderError. A lab notebook that could not be collected (damaged in the
zip, too big) is a `Problem` that names its student and lab, for their verdict.
"""
from __future__ import annotations

import copy
import errno
import json
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from grader import GraderError
from grader.common.labs import NotebookError, notebook_from_bytes, source_text, validate_notebook
from grader.common.quoting import quoted

from .plain_copy import NotRegular, TooBig, read_regular

STUDENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
SKIPPED = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}
MAX_NOTEBOOK_BYTES = 100 << 20   # one notebook, unzipped
MAX_STUDENT_ID = 100             # characters
LISTED_STRAYS = 5                # a student's notebooks that are no lab, listed one by one; the rest counted


@dataclass(frozen=True)
class Submission:
    student: str
    lab: str
    path: Path  # the notebook as handed in


class Problem(str):
    """A problem found while collecting, in words. Where it is one student's lab that could not be
    collected, `student` and `lab` name it and `why` is its verdict's reason."""
    student: str | None = None
    lab: str | None = None
    why: str = ""


def _problem(text: str, student: str, lab: str, why: str) -> Problem:
    problem = Problem(text)
    problem.student, problem.lab, problem.why = student, lab, why
    return problem


def student_id_problem(name: str, labs: list[str]) -> str | None:
    """Why `name` cannot be a student id, naming it safely (repr); None if it can."""
    shown = repr(name) if len(name) <= 60 else repr(name[:60]) + "…"
    if len(name) > MAX_STUDENT_ID or not STUDENT_ID_RE.fullmatch(name):
        return f"{shown}: not a usable student id (letters, digits and _ . @ -, at most {MAX_STUDENT_ID})"
    if name in labs:
        return (f"{shown}: a folder named like a lab, not a student id; expected <student>/<lab>.ipynb "
                "or <student>/<lab>/<lab>.ipynb")
    return None


def lab_of(parts: list[str] | tuple[str, ...], labs: list[str]) -> str | None:
    """The lab of a notebook at `parts` (student first) in an accepted layout; None if none."""
    if len(parts) not in (2, 3) or not parts[-1].endswith(".ipynb"):
        return None
    lab = parts[-1][: -len(".ipynb")]
    if lab not in labs or (len(parts) == 3 and parts[1] != lab):
        return None
    return lab


def _strays(student: str, paths: list[str], labs: list[str]) -> list[str]:
    """The problems of a student's notebooks that are no lab to grade: the first few by name, the rest counted."""
    out = [f"{path}: not a lab to grade (expected <student>/<lab>.ipynb or <student>/<lab>/<lab>.ipynb, "
           f"with <lab> one of {', '.join(labs)})" for path in paths[:LISTED_STRAYS]]
    if len(paths) > LISTED_STRAYS:
        out.append(f"{student}/: {len(paths) - LISTED_STRAYS} more notebooks that are no lab to grade, not listed")
    return out


def find(folder: Path, labs: list[str]) -> tuple[list[Submission], list[str]]:
    """(submissions of the given labs, problems found) in folder, sorted by student then lab."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GraderError(f"{folder}: no such folder of submissions")
    try:
        entries = sorted(folder.iterdir())
    except OSError as e:
        raise GraderError(f"{folder}: cannot read the folder of submissions ({e.strerror})") from None
    found, problems = {}, []
    for entry in entries:
        if entry.name in SKIPPED:
            continue
        if entry.name.startswith("."):  # hidden: skipped, unless it holds a lab as a student's folder would
            if entry.is_dir() and any((entry / f"{lab}.ipynb").is_file() or (entry / lab / f"{lab}.ipynb").is_file()
                                      for lab in labs):
                problems.append(student_id_problem(entry.name, labs))
            continue
        if entry.is_symlink():  # its notebooks would be read through it, wherever it points
            problems.append(f"{_shown(entry.name)}/: a link, not a student's folder; never followed, not graded")
            continue
        if not entry.is_dir():
            problems.append(f"{entry.name!r}: not in a student folder; expected "
                            f"{folder.name}/<student>/<lab>.ipynb")
            continue
        why = student_id_problem(entry.name, labs)
        if why:
            problems.append(why)
            continue
        for lab in labs:  # rglob does not descend through a link: say so rather than find nothing
            if (entry / lab).is_symlink():
                problems.append(_problem(f"{entry.name}/{lab}/: a link, not a folder; never followed, not graded",
                                         entry.name, lab, f"the folder {lab}/ handed in is a link, which the "
                                         "grader never follows: hand in the folder itself"))
        try:
            notebooks = sorted(entry.rglob("*.ipynb"))
        except OSError as e:  # this student's folder alone
            problems.append(f"{entry.name}/: its notebooks could not be listed ({e.strerror}); not graded")
            continue
        strays = []
        for notebook in notebooks:
            relative = notebook.relative_to(folder)
            if any(part.startswith(".") or part in SKIPPED for part in relative.parts):
                continue
            lab = lab_of(relative.parts, labs)
            if lab is None:
                strays.append(_shown(str(relative)))
                continue
            key = (entry.name, lab)
            kind = _not_plain(notebook)
            if kind:
                problems.append(_problem(f"{relative}: {kind}, not a notebook file; never read, not graded",
                                         entry.name, lab, f"the notebook handed in is {kind}, which the grader "
                                         "never reads through: hand in the notebook file itself"))
                continue
            if key in found:
                problems.append(f"{relative}: a second copy of {lab} for {entry.name}; "
                                f"grading {found[key].path.relative_to(folder)}")
                continue
            found[key] = Submission(entry.name, lab, notebook)
        problems += _strays(entry.name, strays, labs)
    return [found[k] for k in sorted(found)], problems


def _not_plain(path: Path) -> str | None:
    """What path is where it is not a regular file ("a symbolic link", ...), without following it; None if it is."""
    try:
        mode = path.lstat().st_mode
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_submitted(path: Path) -> bytes:
    """A submitted notebook's bytes, opened without following a link, checked to be a regular file of at
    most MAX_NOTEBOOK_BYTES on the descriptor it is read from (plain_copy.read_regular); NotebookError says
    why not. The grader reads as root: a link would read whatever it points to."""
    try:
        return read_regular(path, MAX_NOTEBOOK_BYTES)
    except NotRegular:
        raise NotebookError("not a regular file") from None
    except TooBig:
        raise NotebookError(f"over {MAX_NOTEBOOK_BYTES >> 20} MB, more than is graded") from None
    except OSError as e:
        raise NotebookError("a symbolic link, which the grader never reads through" if e.errno == errno.ELOOP
                            else f"unreadable ({e.strerror})") from None


def parse_notebook(path: Path) -> dict:
    """A submitted notebook's JSON, read by read_submitted and checked as grader.common.labs.parse_notebook
    checks the instructor's (text, JSON, nbformat 4); NotebookError says why not."""
    return notebook_from_bytes(read_submitted(path))


def unreadable(path: Path) -> str | None:
    """Why nbgrader could not open this notebook, in plain words; None if it can."""
    try:
        validate_notebook(parse_notebook(path))
    except NotebookError as e:
        return f"the file is {e}: it could not be graded"
    return None


def place(submission: Submission, notebook: dict, submitted_dir: Path, released: dict,
          with_hidden_tests: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """Write the notebook to nbgrader's <submitted>/<student>/<lab>/<lab>.ipynb (replacing an
    earlier copy), its grading metadata put right; returns what was put right, in words.
    notebook: the submission, as parse_notebook read it.

    A cell's nbgrader metadata is the student's to change, and nbgrader trusts it: a
    cell claiming a grade_id the lab does not have, or a solution cell claiming to be a
    test, made nbgrader fail on the whole notebook. Each cell of the lab gets the
    release's metadata back; any other cell loses its claim and runs as the student's own.

    with_hidden_tests: {grade_id: (released source, source with its hidden tests)}. A test cell
    left as released gets its hidden tests back here, as nbgrader's autograde would put them
    back, but without its warning that the cell "has changed" (nbgrader issue #1961: it
    compares the cell with the gradebook's, taken before the hidden tests were cut). So that
    warning, in a submission's log, means that the student changed the cell.
    """
    target_dir = Path(submitted_dir) / submission.student / submission.lab
    if target_dir.exists():
        shutil.rmtree(target_dir)
    target_dir.mkdir(parents=True)
    notebook = copy.deepcopy(notebook)  # the caller's stays as the student handed it in
    notes = restore_grading_metadata(notebook, released)
    _hidden_tests_back(notebook, with_hidden_tests or {})
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
            name = f"grade_id {quoted(grade_id, 40)}" if grade_id else "no grade_id"   # the student's words
            notes.append(f"cell {index + 1} claimed grading metadata ({name}) that is no cell of the lab; "
                         "it ran as an ordinary cell")
    return notes


def _hidden_tests_back(notebook: dict, with_hidden_tests: dict[str, tuple[str, str]]) -> None:
    """The test cells the student left as released, with their hidden tests (in place)."""
    for cell in notebook.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader")
        released, whole = with_hidden_tests.get(meta.get("grade_id") if isinstance(meta, dict) else None, (None, None))
        if released is not None and cell.get("cell_type") == "code" and source_text(cell) == released:
            cell["source"] = whole


def _shown(name: str) -> str:
    """A name from a zip or a folder, its control characters escaped."""
    return repr(name)[1:-1]
