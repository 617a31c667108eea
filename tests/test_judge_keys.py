"""Covers: grader.judge.server.

The judge's keys: every graded test cell of every lab earns its points through a check the judge
holds, on inputs of the run's seed, and the lab's stored reference values are exactly the keys its
test cells check; a new lab folder is held to these rules without being listed.

The judge itself, a process of its own, is tests/test_judge.py's.
"""
from __future__ import annotations

import re
import shutil

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from course import grading
from grader import COURSE_ROOT, reference
from grader.common.labs import graded_cells
from grader.grading.workspace import gradable_labs
from grader.judge.server import required_checks
from helpers import graded_labs
from helpers.notebooks import graded_cell, tagged_cell, write_notebook

# Every lab with graded cells, found in solutions/ as the grader finds them: a new lab is held to
# these rules without being listed (test_a_new_lab_folder_is_held_to_the_judge_s_rules_unlisted).
GRADED_LABS = graded_labs()


def assert_every_stored_value_is_required(lab, root=COURSE_ROOT):
    """The lab's stored reference values are exactly the keys its test cells check: none unasked for."""
    source = nbformat.read(lab.notebook, as_version=4)
    required = {key for keys in required_checks(source).values() for key in keys}
    path = root / reference.REFERENCE_DIR / f"{lab.name}.json"
    assert path.is_file(), (f"{lab.name} has graded cells but no stored values: run `make reference` and "
                            f"commit {reference.REFERENCE_DIR}/{lab.name}.json")
    stored = set(grading.read(path))
    assert required == stored, f"{lab.name}: checks the judge cannot hold to account: {stored ^ required}"


# The hidden tests' seeded inputs: REFERENCE.seed(), or a generator seeded from it (course.grading.Reference).
SEEDED = re.compile(r"REFERENCE\.(seed|generator|random)\(")


def assert_every_graded_cell_is_judged(lab):
    """Each graded test cell has a hidden check the judge holds, on inputs of the run's seed."""
    source = nbformat.read(lab.notebook, as_version=4)
    judged = required_checks(source)
    unjudged = set(graded_cells(source)) - set(judged)
    assert not unjudged, f"{lab.name}: test cells whose points no check outside the kernel decides: {sorted(unjudged)}"
    for cell in source.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in judged:
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[-1]
            assert SEEDED.search(hidden), \
                f"{lab.name}/{cell.metadata.nbgrader.grade_id}: the judged inputs must come from REFERENCE.seed() " \
                "(or REFERENCE.generator() / REFERENCE.random(), which it seeds)"


@pytest.mark.parametrize("lab", GRADED_LABS, ids=lambda lab: lab.name)
def test_every_stored_reference_value_is_required_by_a_test_cell(lab):
    assert_every_stored_value_is_required(lab)


@pytest.mark.parametrize("lab", GRADED_LABS, ids=lambda lab: lab.name)
def test_every_graded_test_cell_earns_its_points_through_the_judge(lab):
    assert_every_graded_cell_is_judged(lab)


def test_every_stored_reference_file_is_a_graded_lab_s():
    stored = {path.stem for path in (COURSE_ROOT / reference.REFERENCE_DIR).glob("*.json")}
    unasked = sorted(stored - {lab.name for lab in GRADED_LABS})
    assert not unasked, f"stored values of no lab with graded cells, which nothing asks for: {unasked}"


NEW_LAB = "07_new_lab"


def _course_with_a_new_lab(root, judged=True):
    """A course of an ungraded tour and one new graded lab, NEW_LAB, in folders no test names."""
    root.mkdir(exist_ok=True)
    shutil.copy(COURSE_ROOT / "nbgrader_config.py", root)
    answer = new_code_cell("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION")
    answer.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": "add",
                                   "schema_version": 3, "task": False}
    hidden = ("a = REFERENCE.seed()\nREFERENCE.check('add/a sum', add(a, 1))" if judged
              else "assert add(20, 22) == 42")
    test = graded_cell(f"assert add(1, 2) == 3\n### BEGIN HIDDEN TESTS\n{hidden}\n### END HIDDEN TESTS",
                        "test_add", False)
    labs = {"00_tour": [nbformat.v4.new_markdown_cell("# 00 · A tour"), new_code_cell("print('no exercise')")],
            NEW_LAB: [nbformat.v4.new_markdown_cell("# 07 · A new lab"),
                      tagged_cell(f"import course\nREFERENCE = course.grading.Reference({NEW_LAB!r})", "setup"),
                      answer, test]}
    for name, cells in labs.items():
        write_notebook(root / "solutions" / name / f"{name}.ipynb", cells)


def test_a_new_lab_folder_is_held_to_the_judge_s_rules_unlisted(tmp_path):
    """graded_labs, which the tests of every lab iterate over (these and tests/test_tampering.py's), finds
    a new lab folder as the grader does; the judge's rules above then hold it to account."""
    course, unjudged = tmp_path / "course", tmp_path / "unjudged"
    _course_with_a_new_lab(course)
    assert [lab.name for lab in graded_labs(course)] == [NEW_LAB] == list(gradable_labs(course))
    new_lab, = graded_labs(course)
    assert_every_graded_cell_is_judged(new_lab)
    stored = course / reference.REFERENCE_DIR / f"{NEW_LAB}.json"
    with pytest.raises(AssertionError, match=f"{NEW_LAB} has graded cells but no stored values"):
        assert_every_stored_value_is_required(new_lab, course)
    grading.write(stored, NEW_LAB, {"add/a sum": 1.0})
    assert_every_stored_value_is_required(new_lab, course)
    grading.write(stored, NEW_LAB, {"add/a sum": 1.0, "x": 2.0})
    with pytest.raises(AssertionError, match=re.escape("checks the judge cannot hold to account: {'x'}")):
        assert_every_stored_value_is_required(new_lab, course)
    _course_with_a_new_lab(unjudged, judged=False)
    with pytest.raises(AssertionError, match="test cells whose points no check outside the kernel decides"):
        assert_every_graded_cell_is_judged(graded_labs(unjudged)[0])
    # this checkout's labs come the same way: the grader's own list of what it grades
    assert [lab.name for lab in GRADED_LABS] == list(gradable_labs(COURSE_ROOT))
