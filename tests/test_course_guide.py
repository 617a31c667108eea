"""The instructor's guide, course_guide/: one page per lab, in step with the solution notebooks.

Every lab in solutions/ has its page; every graded exercise (a test cell with points in the
notebook's nbgrader metadata) is named there by its test cell's grade_id, with the notebook's points,
and the page's total is their sum; every relative link resolves. The guides are never released:
the release generates labs/ from solutions/<lab>/ only (test_release.py holds labs/ to it).
"""
from __future__ import annotations

import re

import nbformat
import pytest

from grader.labs import find_labs
from helpers import REPO

GUIDE = REPO / "course_guide"
LABS = find_labs(REPO)
# a row of a guide's exercise table: | exercise | `answer` | `test_answer` | points |
ROW = re.compile(r"^\|[^|\n]*\|\s*`(\w+)`\s*\|\s*`(test_\w+)`\s*\|\s*(\d+)\s*\|\s*$", re.MULTILINE)
TOTAL = re.compile(r"^Total: (\d+) points?\.$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def graded_cells(notebook_path) -> dict[str, int]:
    """grade_id -> points of every graded test cell of a solution notebook."""
    notebook = nbformat.read(notebook_path, as_version=4)
    return {cell.metadata.nbgrader["grade_id"]: cell.metadata.nbgrader["points"] for cell in notebook.cells
            if cell.metadata.get("nbgrader", {}).get("grade") and cell.metadata.nbgrader.get("points")}


def test_the_labs_are_found():
    assert [lab.name for lab in LABS][:2] == ["00_ranks", "01_single_gpu"], [lab.name for lab in LABS]


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_every_graded_exercise_is_in_its_lab_s_guide_with_the_notebook_s_points(lab):
    page = GUIDE / f"{lab.name}.md"
    assert page.exists(), f"{lab.name} has no guide: write {page.relative_to(REPO)}"
    text = page.read_text()
    expected = graded_cells(lab.notebook)
    rows = {test: int(points) for _, test, points in ROW.findall(text)}
    assert rows == expected, (f"{page.name}: the exercise table gives {rows}; the notebook's nbgrader "
                              f"metadata gives {expected}")
    for answer, test, _ in ROW.findall(text):
        assert test == f"test_{answer}", f"{page.name}: {answer}'s test cell is test_{answer}, not {test}"
    total, points = TOTAL.findall(text), sum(expected.values())
    assert total == [str(points)], f"{page.name}: total {total}, the notebook's {points}"
    for heading in ("## Learning goals", "## Time in class (an estimate", "## Exercises and points",
                    "## Discussion questions"):
        assert heading in text, f"{page.name} lacks {heading!r}"
    assert text.count("Answer:") >= 2, f"{page.name}: discussion questions need their answers"
    assert len(text.splitlines()) <= 110, f"{page.name} is {len(text.splitlines())} lines: a guide is one page"


def test_the_index_lists_every_guide_with_its_lab_s_points():
    index = (GUIDE / "README.md").read_text()
    for lab in LABS:
        points = sum(graded_cells(lab.notebook).values())
        row = next((line for line in index.splitlines() if f"]({lab.name}.md)" in line), None)
        assert row, f"course_guide/README.md does not link {lab.name}.md"
        assert re.search(rf"\|\s*{points}\b", row), f"the index gives {lab.name} other points than {points}: {row}"
    pages = sorted(p.name for p in GUIDE.glob("*.md") if p.name != "README.md")
    assert pages == sorted(f"{lab.name}.md" for lab in LABS), f"guides for labs that do not exist: {pages}"


@pytest.mark.parametrize("page", sorted(GUIDE.glob("*.md")), ids=lambda p: p.name)
def test_every_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name} links {target}, which is not in the repository"


def test_the_release_copies_nothing_of_the_guide():
    """The release takes labs from solutions/ (grader.labs.find_labs) and writes labs/ only."""
    assert all(lab.notebook.is_relative_to(REPO / "solutions") for lab in LABS)
    assert not list((REPO / "labs").rglob("course_guide*")), "something of course_guide/ is in labs/"
    source = (REPO / "grader" / "release.py").read_text()
    assert "course_guide" not in source
