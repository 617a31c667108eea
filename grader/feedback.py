"""Feedback without the hidden tests: a preprocessor for ``nbgrader generate_feedback``.

nbgrader 0.9.6 writes the autograded notebook, hidden tests included, into the
feedback HTML. `HideHiddenTests` (enabled in nbgrader_config.py) removes every
``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` region from the graded
cells, and shortens their error outputs to the error's message: a traceback
would quote the hidden lines that raised it. The message itself stays; the
course's checks write it for students (which result, the largest difference,
the tolerance).
"""
from __future__ import annotations

import json
import os

from nbformat.v4 import new_markdown_cell
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from .verdict import as_markdown

HIDDEN_NOTE = "# (hidden tests, not shown)"
VERDICT_ENV = "GRADER_VERDICT"  # the verdict's lines as JSON, set by grader.grade for generate_feedback


class AddVerdict(NbGraderPreprocessor):
    """Put the grading verdict (grader.verdict) at the top of the feedback."""

    def preprocess(self, nb, resources):
        verdict = json.loads(os.environ.get(VERDICT_ENV) or "[]")
        if verdict:
            nb.cells.insert(0, new_markdown_cell(as_markdown(verdict)))
        return nb, resources


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
