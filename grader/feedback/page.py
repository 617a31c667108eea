"""Feedback pages: the autograded notebook as HTML, hidden tests removed, the verdict on top.

nbgrader 0.9.6 writes the autograded notebook, hidden tests included, into the
feedback HTML. `HideHiddenTests` (also enabled for ``nbgrader
generate_feedback`` in nbgrader_config.py) removes every ``### BEGIN HIDDEN
TESTS`` ... ``### END HIDDEN TESTS`` region from the graded cells, and
shortens their error outputs to the error's message: a traceback would quote
the hidden lines that raised it. The message itself stays; the course's checks
write it for students (which result, the largest difference, the tolerance).

`render` makes the same page as ``nbgrader generate_feedback`` (its template,
its grades), without starting nbgrader: grader.feedback.worker calls it in a
process that stays up for a whole grading run. What the submission produced
is made inert first (grader.feedback.safety), the template
(grader/feedback/template) shows the student's markdown as text, the verdict
is escaped here, and the page's Content-Security-Policy lets no script run
and nothing load from elsewhere, in case something was missed.
"""
from __future__ import annotations

import html
from pathlib import Path

import nbformat
import nbgrader
from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbformat.v4 import new_markdown_cell
from nbgrader.preprocessors import GetGrades, NbGraderPreprocessor
from traitlets import Unicode
from traitlets.config import Config

from grader.common import rubrics

from .safety import VERDICT, HiddenLines, make_inert

HIDDEN_NOTE = "# (hidden tests, not shown)"
_FORMGRADER = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
_TEMPLATES = Path(__file__).parent / "template"
# Inline styles and data: images only: no script, no plugin, nothing fetched from elsewhere.
CSP = ("default-src 'none'; script-src 'none'; object-src 'none'; style-src 'unsafe-inline'; "
       "img-src data:; font-src data:; base-uri 'none'; form-action 'none'")
CSP_META = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'


class HideHiddenTests(NbGraderPreprocessor):
    begin = Unicode("BEGIN HIDDEN TESTS", help="marks the start of a hidden region").tag(config=True)
    end = Unicode("END HIDDEN TESTS", help="marks the end of a hidden region").tag(config=True)

    def _strip(self, source: str) -> tuple[str, bool]:
        kept, hidden, found = [], False, False
        for line in source.split("\n"):
            if self.begin in line:
                hidden = found = True
                kept.append(line[: len(line) - len(line.lstrip())] + HIDDEN_NOTE)
            elif self.end in line:
                hidden = False
            elif not hidden:
                kept.append(line)
        return "\n".join(kept), found

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        source, found = self._strip(cell.source)
        if not found:
            return cell, resources
        cell.source = source
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}",
                                       "(the traceback is not shown: it would quote the hidden tests)"]
        return cell, resources


class DropRubrics(NbGraderPreprocessor):
    """The grader's model answers and rubrics (grader.common.rubrics) left out of nbgrader's own feedback
    (generate_feedback, formgrader's "Generate Feedback"; nbgrader_config.py): formgrader shows them, no
    student page may."""

    def preprocess(self, nb, resources):
        nb.cells = rubrics.without_rubrics(nb.cells)
        return nb, resources


class GetGradesPending(GetGrades):
    """nbgrader's GetGrades, and for each graded cell whether it still awaits grading by hand: an answer
    with neither a manual nor an automatic score (GetGrades gives it 0, the template says "pending")."""

    def _get_score(self, cell, resources):
        super()._get_score(cell, resources)
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id,
                                          self.assignment_id, self.student_id)
        cell.metadata.nbgrader["pending"] = grade.manual_score is None and grade.auto_score is None


def _exporter(grades: bool = True) -> HTMLExporter:
    # nbgrader's GenerateFeedback configures HTMLExporter the same way.
    config = Config()
    config.HTMLExporter.template_name = "course_feedback"   # nbgrader's "feedback", made safer
    config.HTMLExporter.extra_template_basedirs = [str(_TEMPLATES), str(_FORMGRADER / "templates")]
    config.HTMLExporter.extra_template_paths = [
        str(_FORMGRADER / "static" / "node_modules" / "bootstrap" / "dist" / "css"),
        str(_FORMGRADER / "templates")]   # where course_feedback finds feedback/index.html.j2
    exporter = HTMLExporter(config=config)
    for preprocessor in ([GetGradesPending] if grades else []) + [HideHiddenTests, CSSHTMLHeaderPreprocessor]:
        exporter.register_preprocessor(preprocessor, enabled=True)
    return exporter


def verdict_html(verdict: list[str]) -> str:
    """The verdict as one HTML block, every line escaped: it quotes what the student's code raised."""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in verdict[1:])
    # overflow-wrap: a line with a long unbroken value (a key, a number) wraps inside the page
    return (f'<div class="alert alert-info" style="overflow-wrap: anywhere"><p><b>Grading:</b> '
            f'{html.escape(verdict[0])}</p>'
            + (f"<ul>{items}</ul>" if items else "") + "</div>")


def with_csp(page: str) -> str:
    """The page with CSP_META first in its head, before anything it could apply to."""
    head = page.find("<head>")
    if head < 0:
        raise ValueError("the feedback template wrote no <head>")
    return page[: head + len("<head>")] + "\n" + CSP_META + page[head + len("<head>"):]


def render(autograded: Path, db_url: str, student: str, lab: str, verdict: list[str],
           hidden_lines: list[str] = (), lab_markdown: list[str] = ()) -> str:
    """The feedback HTML of one autograded notebook, its scores read from the gradebook at db_url.

    hidden_lines: the lab's hidden tests, cut from every output and from the verdict;
    lab_markdown: the released lab's markdown cells, the only ones rendered as markdown.
    """
    resources = {"unique_key": lab, "output_files_dir": f"{lab}_files",
                 "nbgrader": {"student": student, "assignment": lab, "notebook": lab, "db_url": db_url}}
    return html_page(nbformat.read(autograded, as_version=4), verdict, hidden_lines, lab_markdown, resources)


def html_page(nb, verdict: list[str], hidden_lines: list[str], lab_markdown: list[str], resources: dict,
              grades: bool = True) -> str:
    """`render` of a notebook already read; grades=False leaves the scores out (no gradebook needed)."""
    nb = make_inert(nb, list(lab_markdown), list(hidden_lines))
    if verdict:
        scrubber = HiddenLines(list(hidden_lines))
        cell = new_markdown_cell(verdict_html([scrubber.scrub(line) for line in verdict]))
        cell.metadata["feedback"] = VERDICT
        nb.cells.insert(0, cell)
    page, _ = _exporter(grades).from_notebook_node(nb, resources=resources)
    return with_csp(page)
