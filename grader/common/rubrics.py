"""Each written answer's model answer and rubric, beside the student's answer where a grader marks it.

A written answer (`grader.common.labs.written_cells`: a markdown answer cell graded by hand, ``written_*``)
holds, in solutions/<lab>/<lab>.ipynb, the model answer and its ``**Rubric (N points).**`` between
``### BEGIN SOLUTION`` and ``### END SOLUTION``; the release strips them, so the autograded notebook
formgrader shows holds only what the student wrote. `show_beside_answers`, run by the grader after autograde
(grader.grading.submission, outside the jail, once the student's kernel is gone), puts a read-only markdown
cell after each written answer of the autograded notebook: `RUBRIC_HEADING` and that text, taken from the
solution, never from the student's copy, and marked in its metadata as the grader's (`MARK`). Formgrader
renders it as markdown, under the answer and its score box. Nothing of the student's is put into it.

No student sees it: a feedback page drops every marked cell (`without_rubrics`: grader.feedback.safety's
`make_inert` for the course's pages, grader.feedback.page's `DropRubrics` for nbgrader's own
generate_feedback, formgrader's "Generate Feedback"); late students hand in while others' pages are out.
A cell of the submission that carries the mark is the student's, not the grader's: before the grader's are
put in, a plain one is removed and a graded one loses the mark (it stays under the grader's eyes); one whose
text copies the heading is shown under `FORGED_NOTE`.

Used by: grader.grading.workspace, grader.grading.submission, grader.feedback.safety, grader.feedback.page.
"""
from __future__ import annotations

import re
from pathlib import Path

from .private_write import write_private

# grader.common.labs is imported where it is used: formgrader's exporter imports this module (through
# grader.feedback.safety) where `grader` may be a namespace package without its __init__ (a course folder
# holding grader/work/, not the package), and labs needs the package's top.

#: cell.metadata[MARK] = {"rubric_of": grade_id}: a cell the grader added, never a student's.
MARK = "course_grader"
RUBRIC_TITLE = "Grader's model answer and rubric"
RUBRIC_HEADING = f"**{RUBRIC_TITLE}**"
FORGED_NOTE = ("**[grader] the student wrote this cell; it is not the grader's rubric** (the grader's rubrics "
               "come from solutions/ and carry its mark)")
_SOLUTION = re.compile(r"### BEGIN SOLUTION\s*\n(.*?)\n?[ \t]*### END SOLUTION", re.S)


def model_answers(solution: dict) -> dict[str, str]:
    """{grade_id: the model answer and rubric} of each written answer of a solution notebook (its cells
    that are a markdown answer and graded), the text between its solution markers."""
    from .labs import source_text
    found = {}
    for cell in solution.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "markdown" and meta.get("solution") and meta.get("grade"):
            match = _SOLUTION.search(source_text(cell))
            if match and match.group(1).strip():
                found[meta["grade_id"]] = match.group(1).strip()
    return found


def is_rubric(cell: dict) -> bool:
    """Does the cell carry the grader's mark (the grader's rubric, or a student's forgery of it)?"""
    meta = cell.get("metadata")
    return isinstance(meta, dict) and MARK in meta


def without_rubrics(cells: list) -> list:
    """The cells that are not marked as the grader's: what a feedback page may show."""
    return [cell for cell in cells if not is_rubric(cell)]


def _unmarked(cells: list) -> list:
    """The cells without the grader's mark: a marked cell that nbgrader does not know (the grader's own, from
    an earlier run, or a student's plain forgery) dropped; a graded or locked cell of the submission that
    carries the mark keeps its place and loses the mark (a student who marks their own answer must not take
    it out of the grader's view)."""
    kept = []
    for cell in cells:
        if is_rubric(cell):
            if not cell["metadata"].get("nbgrader"):
                continue
            del cell["metadata"][MARK]
        kept.append(cell)
    return kept


def rubric_cell(grade_id: str, text: str) -> dict:
    """The grader's cell for one written answer: the heading, then the solution's text as it is."""
    source = (f"{RUBRIC_HEADING} for `{grade_id}` (from solutions/; shown to graders only, never in feedback)"
              f"\n\n---\n\n{text}\n\n---")
    return {"cell_type": "markdown", "id": f"rubric-{grade_id}"[:64], "source": source,
            "metadata": {MARK: {"rubric_of": grade_id}, "editable": False, "deletable": False}}


def show_beside_answers(nb, answers: dict[str, str]) -> list[str]:
    """Put, in place, the grader's cell after each written answer of an autograded notebook (nbformat's node
    or a dict); remove the submission's marked cells first. Returns the grade_ids that got one."""
    from nbformat import from_dict

    from .labs import source_text

    cells = _unmarked(nb["cells"])
    for cell in cells:
        text = source_text(cell)
        if cell.get("cell_type") == "markdown" and RUBRIC_HEADING in text and not text.startswith(FORGED_NOTE):
            cell["source"] = f"{FORGED_NOTE}\n\n{text}"
    shown, placed = [], []
    for cell in cells:
        placed.append(cell)
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers and grade_id not in shown:
            placed.append(from_dict(rubric_cell(grade_id, answers[grade_id])))
            shown.append(grade_id)
    nb["cells"] = placed
    return shown


def add_to_autograded(path: Path, answers: dict[str, str]) -> list[str]:
    """`show_beside_answers` on the autograded notebook at path, written back private to the grader."""
    import nbformat

    if not answers:
        return []
    nb = nbformat.read(path, as_version=4)
    shown = show_beside_answers(nb, answers)
    write_private(path, nbformat.writes(nb))
    return shown
