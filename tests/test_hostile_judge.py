"""Attacks on the judge, each a student of a real grading run of lab 1 (`python -m grader grade`: the
class the grading modules share, helpers.lab1_class).

The judge decides every graded test cell's points outside the kernel: a
submission that strips the kernel's asserts, rebinds the course's checks, fakes
the judge's answers, asks it for answers from its own cells, or floods it, gets
what its code earns and no more; the kernel never sees a reference value.
"""
from __future__ import annotations

import html

import pytest
from test_hostile_grading import _with_cells

from course import grading
from grader.labs import graded_cells, read_notebook
from helpers import REPO, needs_sandbox
from helpers.lab1_class import HONEST, TEST_TIMEOUT_S
from helpers.submissions import solved

LAB = "01_single_gpu"
POINTS = graded_cells(read_notebook(REPO / "solutions" / LAB / f"{LAB}.ipynb"))
FULL = sum(POINTS.values())
MOMENTUM = POINTS["test_momentum_sgd"]
# A stub that moves no weight: every kernel-side test of it fails, unless the asserts go.
STUB = ("self.params[i].add_(self.velocity[i], alpha=-self.lr)", "pass")

pytestmark = [pytest.mark.grading, needs_sandbox()]

STRIP_ASSERTS = '''
import ast
class NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.Pass()
get_ipython().ast_transformers.append(NoAsserts())
'''
FAKE_JUDGE = '''
import course.grading
real_ask = course.grading._ask
course.grading._ask = lambda path, request: {"ok": True} if request.get("op") == "check" else real_ask(path, request)
'''
ASK_JUDGE_FROM_A_STUDENT_CELL = '''
import json, os, socket
def ask(request):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["COURSE_REFERENCE_JUDGE"])
        s.sendall(json.dumps(request).encode() + b"\\n")
        return s.makefile().readline()
for key in ("momentum_sgd/weights after 6 steps", "train_step/losses of 5 steps"):
    print("ORACLE", ask({"op": "check", "lab": "01_single_gpu", "key": key, "value": {"number": 0}}))
print("ORACLE", ask({"op": "seed", "lab": "01_single_gpu"}))
'''
FLOOD_THE_JUDGE = '''
import os, socket
with socket.socket(socket.AF_UNIX) as s:
    s.connect(os.environ["COURSE_REFERENCE_JUDGE"])
    try:
        for _ in range(200):
            s.sendall(b"x" * (1 << 20))
    except OSError as e:
        print("the judge hung up:", type(e).__name__)
'''


def _class() -> dict:
    """student -> (notebook, expected score, words the verdict must have)."""
    return {
        HONEST: (solved(LAB), FULL, [f"graded: {FULL:g} of {FULL:g} points"]),
        "stub_without_asserts": (_with_cells(STRIP_ASSERTS, edits={"momentum_sgd": [STUB]}), FULL - MOMENTUM,
                                 ["test_momentum_sgd", "AST transformer"]),
        "stub_with_a_fake_judge": (_with_cells(STRIP_ASSERTS, FAKE_JUDGE, edits={"momentum_sgd": [STUB]}),
                                   0, ["never reached the grader", "course.grading"]),
        "stub_with_checks_rebound": (_with_cells(
            "check.assert_close = lambda *args, **kwargs: None\n"
            "course.check.assert_close = lambda *args, **kwargs: None", edits={"momentum_sgd": [STUB]}),
            FULL - MOMENTUM, ["test_momentum_sgd", "assert_close"]),
        "asks_the_judge": (_with_cells(ASK_JUDGE_FROM_A_STUDENT_CELL), FULL, [f"graded: {FULL:g}"]),
        "floods_the_judge": (_with_cells(FLOOD_THE_JUDGE), FULL, [f"graded: {FULL:g}"]),
        # nbgrader trusts a cell's metadata, and failed on the whole notebook for these two.
        "claims_a_test_cell": (_claims_a_test_cell(), FULL,
                               [f"graded: {FULL:g}", "(grade_id 'bogus') that is no cell of the lab"]),
        "answer_claims_points": (_answer_claims_points(), FULL,
                                 [f"graded: {FULL:g}", "cell momentum_sgd's grading metadata was changed"]),
    }


def _claims_a_test_cell():
    nb = _with_cells("print('worth 100 points')")
    claim = next(c for c in nb.cells if c.source == "print('worth 100 points')")
    claim.metadata["nbgrader"] = {"grade": True, "grade_id": "bogus", "points": 100, "locked": False,
                                        "solution": False, "schema_version": 3, "task": False}
    return nb


def _answer_claims_points():
    nb = solved(LAB)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "momentum_sgd":
            cell.metadata["nbgrader"].update(grade=True, points=50)
    return nb


def lab1_students(tmp, work) -> dict:
    """This module's students in the shared lab 1 class (helpers.lab1_class), beside its honest one."""
    return {student: nb for student, (nb, _, _) in _class().items() if student != HONEST}


@pytest.fixture(scope="module")
def graded(lab1_class):
    return {**lab1_class, "students": _class()}


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("student", list(_class()))
def test_each_attack_gets_what_its_code_earns(graded, student):
    _, expected, words = graded["students"][student]
    row = graded["csv"][student]
    assert row[f"{LAB} graded"] == "yes", row
    assert float(row[f"{LAB} score"]) == expected, f"{student} scored {row[f'{LAB} score']}: {row[f'{LAB} verdict']}"
    for w in words:
        assert w in row[f"{LAB} verdict"], f"{student}: {w!r} not in the verdict {row[f'{LAB} verdict']!r}"


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [value] if isinstance(value, float) else []


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_kernel_never_sees_a_reference_value(graded):
    """The run's reference values appear in no student's graded notebook, and the oracle was refused."""
    values = grading.read(graded["work"] / "judge" / f"{LAB}.json")
    secrets = {repr(x)[:10] for key in ("momentum_sgd/weights after 6 steps", "train_step/losses of 5 steps")
               for x in _numbers(grading.encode(values[key])) if abs(x) > 1e-3}
    assert len(secrets) > 10
    for student in graded["students"]:
        notebook = (graded["work"] / "autograded" / student / LAB / f"{LAB}.ipynb").read_text(encoding="utf-8")
        seen = [s for s in secrets if s in notebook]
        assert not seen, f"{student}'s kernel printed reference values {seen[:3]}"
    oracle = (graded["work"] / "autograded" / "asks_the_judge" / LAB / f"{LAB}.ipynb").read_text(encoding="utf-8")
    assert oracle.count("ORACLE") >= 3 and oracle.count("it answers only while a graded test cell runs") == 3, \
        "a student's cell got answers from the judge"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_feedback_of_a_cheat_says_what_the_judge_found(graded):
    page = html.unescape((graded["work"] / "feedback" / "stub_with_checks_rebound" / LAB / f"{LAB}.html")
                         .read_text(encoding="utf-8"))
    assert "the grader's check" in page and "largest difference" in page, \
        "the feedback names how far the stub was off, for the instructor and the student"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_judges_seed_is_the_runs_own(graded):
    """Drawn for the run: not the stored values' seed 0, so stored answers are worth nothing."""
    recorded = grading.read(graded["work"] / "judge" / f"{LAB}.json")
    stored = grading.read(REPO / "grader" / "reference" / f"{LAB}.json")
    key = "momentum_sgd/weights after 6 steps"
    assert not all(a.shape == b.shape and bool((a == b).all()) for a, b in zip(recorded[key], stored[key]))
