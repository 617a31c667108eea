"""nbgrader's Execute that tells the judge which graded test cell is running.

The judge (grader.judge.server) answers only while a graded test cell runs, and only
for the keys that cell checks. This preprocessor, outside the jail, is the one
that knows which cell the kernel is executing: before each cell it writes the
cell's grade_id (after nbgrader has put the lab's own test cells back) into
the judge's cell file, and clears it after. The file lies in the grader's
folder of the jail, which the kernel never sees.
"""
from __future__ import annotations

import os

from nbgrader.preprocessors import Execute

from grader.jail.kernel import SandboxedExecute

from .client import announce

CELL_FILE_ENV = "GRADER_JUDGE_CELL_FILE"


class AnnouncesCells:
    """Mixin for an Execute preprocessor: the running graded test cell, written for the judge."""

    def preprocess_cell(self, cell, resources, index):
        cell_file = os.environ.get(CELL_FILE_ENV)
        meta = cell.metadata.get("nbgrader", {})
        graded = cell.cell_type == "code" and meta.get("grade") and meta.get("grade_id")
        if cell_file:
            announce(cell_file, meta["grade_id"] if graded else None)
        try:
            return super().preprocess_cell(cell, resources, index)
        finally:
            if cell_file:
                announce(cell_file, None)


class JudgedExecute(AnnouncesCells, Execute):
    """nbgrader's own Execute (grading without a sandbox, --unsafe)."""


class JudgedSandboxedExecute(AnnouncesCells, SandboxedExecute):
    """The jailed Execute (grader.jail.kernel)."""
