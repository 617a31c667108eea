"""Covers: grader.grade, grader.grading.autograde_worker.

The grading round trip: `python -m grader grade` on a class of lab 1 submissions.

One run of the command (as instructors run it, in a subprocess, two at a time)
grades the lab 1 class this module shares with others (helpers.lab1_class), in
which each of this module's students tests one promise of the grader:

- the solution gets full marks, and the untouched release zero on every cell;
- one wrong exercise loses exactly that exercise's points, also when only
  the hidden tests catch the mistake;
- feedback never shows hidden tests; the CSV has one row per student;
- the autograded notebook formgrader shows has each written answer's model answer and rubric, from
  solutions/, right after it; no feedback page has them.

Submissions that try to break the grader are tests/test_hostile_grading.py.
"""
from __future__ import annotations

import html

import nbformat
import pytest
from nbgrader.api import Gradebook
from test_lab1_grading import MISTAKES
from test_rubrics import leaked, shown_text

from grader import COURSE_ROOT
from grader.common import rubrics
from grader.common.labs import course_config, graded_cells, read_notebook
from helpers import REPO
from helpers.lab1_class import HONEST, TEST_TIMEOUT_S
from helpers.submissions import hidden_lines, released, solved

LAB = "01_single_gpu"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]
POINTS = graded_cells(read_notebook(REPO / "solutions" / LAB / f"{LAB}.ipynb"))
FULL = sum(POINTS.values())

# Mistakes, each confined to one exercise (from lab 1's fairness tests). A timer that keeps only
# the last lap of a phase lapped twice passes the visible test, whose phases each run once: only
# the hidden tests see that mistake.
MOMENTUM_DAMPENED = MISTAKES["momentum dampened"][0]
LAST_LAP_ONLY = MISTAKES["a phase lapped twice keeps only its last lap"][0]


def _class():
    """student -> (notebook, expected {grade_id: score}); HONEST is the shared class's."""
    full = dict(POINTS)
    wrong = lambda gid: {**full, gid: 0.0}  # noqa: E731
    return {
        HONEST: (solved(LAB), full),
        "untouched": (released(LAB), {gid: 0.0 for gid in POINTS}),
        "wrong_momentum": (solved(LAB, MOMENTUM_DAMPENED), wrong("test_momentum_sgd")),
        "hidden_only": (solved(LAB, LAST_LAP_ONLY), wrong("test_phase_timer")),
    }


def lab1_students(tmp, work) -> dict:
    """This module's students in the shared lab 1 class (helpers.lab1_class)."""
    return {student: nb for student, (nb, _) in _class().items() if student != HONEST}


@pytest.fixture(scope="module")
def graded(lab1_class):
    return {**lab1_class, "students": _class(), "everyone": lab1_class["students"]}


def _cell_scores(work, student):
    course_id = course_config(COURSE_ROOT).CourseDirectory.course_id
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", course_id=course_id) as gb:
        return {gid: gb.find_grade(gid, LAB, LAB, student).score for gid in POINTS}


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("student", [s for s, (_, expected) in _class().items() if expected is not None])
def test_each_mistake_costs_exactly_its_exercise(graded, student):
    expected = graded["students"][student][1]
    assert _cell_scores(graded["work"], student) == expected, graded["log"]
    row = graded["csv"][student]
    assert row[f"{LAB} graded"] == "yes", row
    assert float(row[f"{LAB} score"]) == sum(expected.values())
    assert float(row[f"{LAB} max score"]) == FULL


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_full_marks_and_zero(graded):
    assert float(graded["csv"][HONEST][f"{LAB} score"]) == FULL > 0
    assert all(score == 0 for score in _cell_scores(graded["work"], "untouched").values())


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_csv_has_one_row_per_student(graded):
    assert sorted(graded["csv"]) == sorted(graded["everyone"])
    for row in graded["csv"].values():
        assert row[f"{LAB} graded"] in ("yes", "no")
        assert row[f"{LAB} verdict"].startswith("graded: " if row[f"{LAB} graded"] == "yes" else "not graded: ")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_feedback_shows_no_hidden_tests(graded):
    pages = sorted((graded["work"] / "feedback").glob(f"*/{LAB}/{LAB}.html"))
    assert sorted(p.parent.parent.name for p in pages) == sorted(graded["everyone"]), "one page per student"
    hidden = hidden_lines(LAB)
    for page in pages:
        text = html.unescape(page.read_text())
        # Not even the marker, for a student who printed nothing odd (test_feedback_safety's prints
        # its kernel's history: there the hidden lines are cut, the marker stays).
        if page.parent.parent.name in graded["students"]:
            assert "BEGIN HIDDEN TESTS" not in text, page
        leaked = [line for line in hidden if line in text]
        assert not leaked, f"{page}: hidden test lines in the feedback: {leaked[:3]}"
    # The student still learns what failed: the check's message survives.
    page = graded["work"] / "feedback" / "hidden_only" / LAB / f"{LAB}.html"
    assert "lapped several times" in html.unescape(page.read_text())


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_formgrader_shows_each_rubric_after_its_answer_and_feedback_never(graded):
    answers = rubrics.model_answers(read_notebook(REPO / "solutions" / LAB / f"{LAB}.ipynb"))
    assert answers, f"{LAB} has no written answer to show a rubric for"
    student = "untouched"   # answers as released: whatever of a model answer is on a page, the grader put it
    cells = nbformat.read(graded["work"] / "autograded" / student / LAB / f"{LAB}.ipynb", as_version=4).cells
    after = {cell.metadata.get("nbgrader", {}).get("grade_id"): cells[i + 1] for i, cell in enumerate(cells[:-1])}
    for gid, answer in answers.items():
        assert rubrics.is_rubric(after[gid]) and answer in after[gid].source, f"{student}: no rubric after {gid}"
    assert sum(rubrics.is_rubric(cell) for cell in cells) == len(answers)
    pages = list((graded["work"] / "feedback").glob(f"*/{LAB}/{LAB}.html"))
    assert pages and not [page for page in pages if rubrics.RUBRIC_TITLE in shown_text(page.read_text())]
    page = (graded["work"] / "feedback" / student / LAB / f"{LAB}.html").read_text()
    assert not leaked(page, answers), f"{student}'s feedback shows the model answers of {leaked(page, answers)}"
