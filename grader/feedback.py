"""Feedback pages: the autograded notebook as HTML, hidden tests removed, the verdict on top.

nbgrader 0.9.6 writes the autograded notebook, hidden tests included, into the
feedback HTML. `HideHiddenTests` (also enabled for ``nbgrader
generate_feedback`` in nbgrader_config.py) removes every ``### BEGIN HIDDEN
TESTS`` ... ``### END HIDDEN TESTS`` region from the graded cells, and
shortens their error outputs to the error's message: a traceback would quote
the hidden lines that raised it. The message itself stays; the course's checks
write it for students (which result, the largest difference, the tolerance).

`render` makes the same page as ``nbgrader generate_feedback`` (its template,
its grades), without starting nbgrader: grader.feedback_worker calls it in a
process that stays up for a whole grading run.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import nbgrader
from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbformat.v4 import new_markdown_cell
from nbgrader.preprocessors import GetGrades, NbGraderPreprocessor
from traitlets import Unicode
from traitlets.config import Config

from .verdict import as_markdown

HIDDEN_NOTE = "# (hidden tests, not shown)"
_FORMGRADER = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"


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


def _exporter() -> HTMLExporter:
    # nbgrader's GenerateFeedback configures HTMLExporter the same way.
    config = Config()
    config.HTMLExporter.template_name = "feedback"
    config.HTMLExporter.extra_template_basedirs = [str(_FORMGRADER / "templates")]
    config.HTMLExporter.extra_template_paths = [
        str(_FORMGRADER / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    exporter = HTMLExporter(config=config)
    for preprocessor in (GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor):
        exporter.register_preprocessor(preprocessor, enabled=True)
    return exporter


def render(autograded: Path, db_url: str, student: str, lab: str, verdict: list[str]) -> str:
    """The feedback HTML of one autograded notebook, its scores read from the gradebook at db_url."""
    nb = nbformat.read(autograded, as_version=4)
    if verdict:
        nb.cells.insert(0, new_markdown_cell(as_markdown(verdict)))
    resources = {"unique_key": lab, "output_files_dir": f"{lab}_files",
                 "nbgrader": {"student": student, "assignment": lab, "notebook": lab, "db_url": db_url}}
    html, _ = _exporter().from_notebook_node(nb, resources=resources)
    return html
