"""Covers: grader.judge.server.

The judge holds labs 3 and 4 to account: a submission that silences the kernel's own
checks still earns nothing for a wrong exercise, and the judge says why.

A student cell installs an IPython AST transformer that turns every `assert` into
`pass`, so the test cells' in-kernel checks (asserts) let anything through; the
exercise itself is a stub that returns zeros. Only the judged check, compared
outside the kernel on inputs drawn from the grading run's seed, stands between
the stub and the points. (The transformer is a line that can rewrite a check, so the
scan also withholds every test cell after it pending the instructor's review: the
judge's verdict on the stub is what the review reads.)
"""
from __future__ import annotations

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from grader.common.labs import graded_cells
from helpers import REPO, needs_jail, round_trips
from helpers.submissions import solved, without_demonstrations

pytestmark = pytest.mark.grading

LAB = "03_model_parallel"
POINTS = graded_cells(nbformat.read(REPO / "solutions" / LAB / f"{LAB}.ipynb", as_version=4))

NO_ASSERTS = '''import ast

class NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.copy_location(ast.Pass(), node)

get_ipython().ast_transformers.append(NoAsserts())
'''

# Passes every check of test_elements_sent that is not an assert: it refuses other directions.
STUB = '''
def elements_sent(direction, batch, inputs, outputs, world_size):
    if direction not in ("column", "row"):
        raise ValueError(direction)
    return 0.0
'''


def _stub() -> nbformat.NotebookNode:
    """The stub and the transformer in lab 3, less its demonstrations (without_demonstrations): the judge's
    check is in a test cell. Lab 3's round trip grades a whole notebook in the same class."""
    nb = without_demonstrations(solved(LAB, answers={"elements_sent": STUB}))
    setup = next(i for i, c in enumerate(nb.cells) if "REFERENCE = course.grading.Reference" in c.source)
    nb.cells.insert(setup + 1, new_code_cell(NO_ASSERTS))
    return nb


@needs_jail()  # skipped where no jail can be made, but never in CI
@pytest.mark.timeout(round_trips.TEST_TIMEOUT_S)
def test_a_stub_with_the_asserts_stripped_scores_nothing_for_its_exercise(round_trip_class):
    scores = round_trips.scores(round_trip_class, LAB, ["stub"])
    assert scores == {"stub": 0}   # every test cell after the transformer's, withheld pending review
    # The cell's first error is its judged check, its last statement: every assert before it let
    # the stub through, and the judge's comparison is what failed.
    said = json.loads((round_trip_class["work"] / "status.json").read_text())["stub"][LAB]["verdict"]
    assert any(line.startswith("cell test_elements_sent failed: «elements sent for seeded layers does not match")
               for line in said), said
    assert any(line.startswith("test cell test_elements_sent, the grader's check: elements sent for seeded layers")
               for line in said), said
    assert "points withheld pending the instructor's review: " in said[1] and "AST transformer" in said[1], said


# Graded beside lab 3's round trip, in one run (helpers/round_trips.py).
round_trips.enrol(test_a_stub_with_the_asserts_stripped_scores_nothing_for_its_exercise, LAB, {"stub": _stub})
