"""The labs of the course: finding them in solutions/ and checking each one.

A lab is ``solutions/<lab>/<lab>.ipynb`` (nbgrader source format) with a
two-digit name such as ``00_ranks`` and a ``# Title`` heading. A malformed
lab is a GraderError that names the file. ``solutions/demo.ipynb``
(DEMO_NOTEBOOK), the instructor's live demo, is not a lab: skipped.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from grader import COURSE_ROOT, GraderError

SOURCE_DIR = "solutions"  # must match c.CourseDirectory.source_directory
RELEASE_DIR = "labs"  # must match c.CourseDirectory.release_directory
INDEX_NAME = "index.ipynb"
LAB_NAME_RE = re.compile(r"^\d{2}_[a-z0-9][a-z0-9_]*$")  # e.g. 00_ranks
# The instructor's live demo (`make demo`): no exercises, never released nor graded.
# A file, not a folder, because nbgrader takes every folder of solutions/ for an
# assignment (formgrader would offer to release it).
DEMO_NOTEBOOK = "demo.ipynb"


KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

_HEADING_RE = re.compile(r"^#[ \t]+(.*?)[ \t#]*$")  # a level-1 ATX heading


@dataclass(frozen=True)
class Lab:
    name: str  # folder name, e.g. "00_ranks"; also nbgrader's assignment id
    notebook: Path  # solutions/<lab>/<lab>.ipynb
    title: str  # first "# ..." heading of the notebook
    points: dict[str, float]  # grade_id -> points of its autograded test cells (empty: nothing graded)
    written: dict[str, float] = field(default_factory=dict)  # grade_id -> points of its answers graded by hand


# --------------------------------------------------------------------------
# Finding and checking labs
# --------------------------------------------------------------------------


def display_path(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def source_text(cell: dict) -> str:
    """A cell's source as one string (nbformat allows a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


class NotebookError(ValueError):
    """Why a file cannot be opened as a notebook, in plain words."""


def parse_notebook(path: Path) -> dict:
    """The notebook's JSON, checked to be text, JSON and nbformat 4; NotebookError says why not."""
    return notebook_from_bytes(Path(path).read_bytes())


def notebook_from_bytes(raw: bytes) -> dict:
    """A notebook's JSON from its file's bytes, checked as parse_notebook checks it."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise NotebookError(f"not UTF-8 text ({e})") from None
    except json.JSONDecodeError as e:
        raise NotebookError(f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list) or data.get("nbformat") != 4:
        raise NotebookError("not a Jupyter notebook in nbformat 4")
    return data


def validate_notebook(data: dict) -> None:
    """nbformat's schema check; NotebookError says what is malformed."""
    # Imported here: nbformat takes 2 s to import (its JSON schema's format checkers), and
    # processes that only read cells (the judge, once per submission) never validate.
    import nbformat

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nbformat.validate(nbformat.from_dict(data))
    except nbformat.ValidationError as e:
        raise NotebookError(f"not a valid Jupyter notebook: {e.message}") from None


def read_notebook(path: Path, root: Path = COURSE_ROOT) -> dict:
    """Parse and validate one source notebook; GraderError names the file."""
    name = display_path(path, root)
    try:
        data = parse_notebook(path)
    except NotebookError as e:
        raise GraderError(f"{name}: {e}") from None
    # nbformat would replace a missing/duplicate cell id by a random one on
    # write, making the release differ on every run.
    cells = data.get("cells")
    if data.get("nbformat_minor", 0) >= 5 and isinstance(cells, list):
        seen: dict[str, int] = {}
        for i, cell in enumerate(cells):
            cid = cell.get("id") if isinstance(cell, dict) else None
            if cid is None:
                raise GraderError(
                    f"{name}: cell {i} has no id; open and save the notebook in "
                    "JupyterLab (or run nbformat.validator.normalize) to add ids"
                )
            if cid in seen:
                raise GraderError(
                    f"{name}: cells {seen[cid]} and {i} have the same id {cid!r}; "
                    "give one of them a new unique id"
                )
            seen[cid] = i
    try:
        validate_notebook(data)
    except NotebookError as e:
        raise GraderError(f"{name}: {e}") from None
    return data


def lab_notebooks(folder: Path) -> list[Path]:
    """The notebooks one folder down (``folder/<lab>/*.ipynb``), in order, none under a hidden folder:
    JupyterLab's ``.ipynb_checkpoints/`` (which `make demo` and `make lab` leave in solutions/ and labs/)
    holds copies, not labs."""
    folder = Path(folder)
    return [p for p in sorted(folder.glob("*/*.ipynb"))
            if not any(part.startswith(".") for part in p.relative_to(folder).parts)]


def notebook_title(nb: dict) -> str | None:
    """The text of the first level-1 markdown heading ("# Title"), if any."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        for line in source_text(cell).splitlines():
            m = _HEADING_RE.match(line)
            if m and m.group(1):
                return m.group(1)
    return None


def find_labs(root: Path = COURSE_ROOT) -> list[Lab]:
    """All labs ``solutions/<lab>/<lab>.ipynb`` in lab order, checked.

    Raises GraderError listing every problem found (each naming its file).
    """
    root = Path(root).resolve()
    source = root / SOURCE_DIR
    if not source.is_dir():
        raise GraderError(f"{display_path(source, root)}/: no such directory")
    labs, problems = [], []
    for entry in sorted(source.iterdir()):
        if entry.name.startswith(".") or entry.name in ("__pycache__", DEMO_NOTEBOOK):
            continue
        if not entry.is_dir():
            if entry.suffix == ".ipynb":
                problems.append(
                    f"{display_path(entry, root)}: notebooks belong in a lab folder, "
                    f"as {SOURCE_DIR}/<lab>/<lab>.ipynb"
                )
            continue
        if not LAB_NAME_RE.match(entry.name):
            problems.append(
                f"{display_path(entry, root)}/: bad lab folder name; expected two digits, "
                "an underscore and a lowercase slug, e.g. 00_ranks"
            )
            continue
        notebook = entry / f"{entry.name}.ipynb"
        if not notebook.is_file():
            problems.append(f"{display_path(notebook, root)}: missing (each lab folder needs <lab>/<lab>.ipynb)")
            continue
        try:
            # nbgrader converts every notebook at the top of the lab folder.
            for extra in sorted(entry.glob("*.ipynb")):
                if extra != notebook:
                    read_notebook(extra, root)
            nb = read_notebook(notebook, root)
        except GraderError as e:
            problems.append(str(e))
            continue
        title = notebook_title(nb)
        if title is None:
            problems.append(f"{display_path(notebook, root)}: no '# Title' markdown heading (the index needs one)")
            continue
        labs.append(Lab(entry.name, notebook, title, graded_cells(nb), written_cells(nb)))
    if problems:
        raise GraderError("malformed lab(s):\n  " + "\n  ".join(problems))
    if not labs:
        raise GraderError(f"no labs found: expected {SOURCE_DIR}/<lab>/<lab>.ipynb under {root}")
    return labs


def select(all_labs: list[Lab], names: list[str] | None) -> list[Lab]:
    """The labs named (all of them if none), in the order given; GraderError for an unknown name.

    Names may be paths such as "solutions/00_ranks/": the last part counts.
    """
    if not names:
        return list(all_labs)
    by_name = {lab.name: lab for lab in all_labs}
    names = [Path(x).name for x in names]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise GraderError(f"unknown lab(s) {', '.join(unknown)}; labs are: {', '.join(by_name)}")
    return [by_name[n] for n in dict.fromkeys(names)]


def course_config(root: Path = COURSE_ROOT):
    """The course's nbgrader_config.py, loaded as nbgrader loads it."""
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()


def ignore_patterns(root: Path = COURSE_ROOT) -> list[str]:
    """nbgrader's CourseDirectory.ignore from the course config (never released)."""
    return list(course_config(root).CourseDirectory.ignore)


def _points(notebook: dict, kind) -> dict[str, float]:
    """{grade_id: points} of the graded cells for which kind(cell, its nbgrader metadata) holds."""
    cells = {}
    for cell in notebook.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and kind(cell, meta):
            cells[meta["grade_id"]] = float(meta.get("points", 0))
    return cells


def graded_cells(notebook: dict) -> dict[str, float]:
    """{grade_id: points} of the autograded test cells of a source notebook."""
    return _points(notebook, lambda cell, meta: not meta.get("solution") and cell.get("cell_type") == "code")


def written_cells(notebook: dict) -> dict[str, float]:
    """{grade_id: points} of the answers graded by hand (nbgrader's cells that are both an answer and
    graded: the written answers, ``written_*``). Autograde scores such an answer 0 if it is left as
    released, and otherwise leaves it to the instructor in formgrader: its points are pending."""
    return _points(notebook, lambda cell, meta: meta.get("solution"))
