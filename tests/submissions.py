"""Building student submissions for grading tests, from the release and the solutions.

A "student" starts from the released notebook (labs/<lab>/<lab>.ipynb, with its
nbgrader metadata) and fills in the solution regions, as a student would:

    nb = solved("01_single_gpu")                                  # every exercise right
    nb = solved("01_single_gpu", edits={"momentum_sgd": [(old, new)]})   # one exercise wrong
"""
from __future__ import annotations

from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def released(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", as_version=4)


def solved(lab: str, edits: dict[str, list[tuple[str, str]]] | None = None,
           answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The release with every solution cell filled from solutions/; edits change some answers.

    edits: grade_id -> [(old, new)] replacements in that cell's answer; each
    `old` must occur in it (so a test cannot silently edit nothing).
    answers: grade_id -> a whole answer of the student's own, in place of the solution's.
    """
    source = nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    own = dict(answers or {})
    answers = {grade_id(c): c.source for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")}
    unknown = set(own) - set(answers)
    assert not unknown, f"answers for cells that are not exercises of {lab}: {sorted(unknown)}"
    answers.update(own)
    nb = released(lab)
    edits = dict(edits or {})
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid not in answers:
            continue
        text = "\n".join(line for line in answers[gid].split("\n") if line.strip() not in MARKERS)
        for old, new in edits.pop(gid, []):
            assert old in text, f"{lab}/{gid}: cannot edit, {old!r} is not in the answer"
            text = text.replace(old, new)
        cell.source = text
    assert not edits, f"edits for cells that are not exercises of {lab}: {list(edits)}"
    return nb


def write(nb, folder: Path, student: str, lab: str) -> Path:
    path = folder / student / f"{lab}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def hidden_lines(lab: str) -> list[str]:
    """The distinctive lines (over 30 characters) of the lab's hidden tests: what feedback must not show."""
    source = nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    lines = []
    for cell in source.cells:
        if "### BEGIN HIDDEN TESTS" in cell.source:
            region = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            lines += [line.strip() for line in region.split("\n") if len(line.strip()) > 30]
    assert lines, f"{lab} has no hidden tests"
    return lines

