"""One grading run for the nbgrader round trips of labs 2 and up.

A grading run costs more than its students: the grader starts, and each lab's
solution runs once to record the judge's values before any student is graded,
with one core idle while it does. So each test that grades students of a lab
enrols them (`enrol`, when its module is imported), and the fixture
`round_trip_class` (conftest.py) grades the enrolments of every selected test
that asks for it, the first time one does: one `python -m grader grade` with a
`--lab` for each lab, two submissions at a time, as an instructor grades a
class on 2 cores, on ROUND_TRIP_SETTING (torch's "default" instruction set and
2 threads). Each test then asserts on its own students (`scores`).

Lab 1's class is helpers/lab1_class.py: its limits differ.
"""
from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest

from grader.common.labs import graded_cells

from . import REPO
from .forked_cells import SETTINGS_PROBE, settings_env
from .solution_runs import assert_ran_as_asked, with_probe
from .submissions import ROUND_TRIP_SETTING, grade_class, hidden_lines, solved, write

#: Seconds a test that asks for the class may take, its grading included.
TEST_TIMEOUT_S = 1800
#: A student who answers differently, graded on ROUND_TRIP_SETTING; their notebook's last cell reports it.
DIFFERENT = "different"

# (the test functions, their lab, its students: id -> what builds their notebook)
_ENROLLED: list[tuple[tuple[Callable, ...], str, dict[str, Callable[[], nbformat.NotebookNode]]]] = []


def enrol(tests: Callable | tuple[Callable, ...], lab: str,
          students: dict[str, Callable[[], nbformat.NotebookNode]]) -> None:
    """Put `students` (id -> a function that builds the notebook) of `lab` in the class, for `tests` (one
    test, or several that share these students: the class grades them when any of those is selected)."""
    tests = tests if isinstance(tests, tuple) else (tests,)
    for others_tests, other_lab, others in _ENROLLED:
        taken = set(students) & set(others) if other_lab == lab else set()
        if taken:
            other = others_tests[0]
            raise ValueError(f"{tests[0].__module__}.{tests[0].__name__} enrols {sorted(taken)} in {lab}, "
                             f"whom {other.__module__}.{other.__name__} enrolled already")
    _ENROLLED.append((tests, lab, dict(students)))


def grade(tmp: Path, tests) -> dict:
    """Grade the enrolments of `tests` (test functions) as one class in tmp:
    {"work", "csv" (rows by student), "log", "labs" (lab -> its students)}."""
    enrolled: dict[str, dict] = {}
    for enrolled_for, lab, students in _ENROLLED:
        if set(enrolled_for) & set(tests):
            enrolled.setdefault(lab, {}).update(students)
    assert enrolled, "no selected test enrolled students in the round-trip class"
    submissions, work = tmp / "submitted", tmp / "work"
    for lab, students in enrolled.items():
        for student, build in students.items():
            write(build(), submissions, student, lab)
    rows, log = grade_class(submissions, work, sorted(enrolled), "--jobs", "2",
                            timeout=TEST_TIMEOUT_S - 60, env=settings_env(*ROUND_TRIP_SETTING))
    return {"work": work, "csv": rows, "log": log, "labs": {lab: sorted(s) for lab, s in enrolled.items()}}


def scores(graded: dict, lab: str, students) -> dict[str, float]:
    """Each student's score in lab, after checking that none of their feedback pages shows a hidden test's line."""
    assert lab in graded["labs"], f"{lab} was not graded in this class: {graded['log'][-2000:]}"
    rows, work = graded["csv"], graded["work"]
    hidden = hidden_lines(lab)
    found = {}
    for student in students:
        row = rows.get(student)
        assert row and row[f"{lab} graded"] == "yes", f"{student}, {lab}: {row}\n{graded['log'][-3000:]}"
        found[student] = float(row[f"{lab} score"])
        page = html.unescape((work / "feedback" / student / lab / f"{lab}.html").read_text())
        leaked = [line for line in hidden if line in page]
        assert not leaked, f"{student}'s feedback for {lab} shows hidden test lines: {leaked[:3]}"
    return found


def lab_columns(row: dict, lab: str) -> dict:
    """A CSV row's columns of `lab`: the round-trip class has other labs, whose totals these leave out."""
    return {key: value for key, value in row.items() if key.startswith(f"{lab} ")}


def probe_output(work: Path, student: str, lab: str) -> str:
    """What the SETTINGS_PROBE cell at the end of a student's graded notebook printed."""
    nb = nbformat.read(work / "autograded" / student / lab / f"{lab}.ipynb", as_version=4)
    probe = nb.cells[-1]
    assert probe.source == SETTINGS_PROBE, f"{student}'s last cell is not the settings probe: {probe.source[:80]!r}"
    return "".join(o.get("text", "") for o in probe.get("outputs", []) if o.get("name") == "stdout")


def round_trip_test(lab: str, different: dict[str, str], mistakes: dict, *chosen: str):
    """A test for a lab's module to bind: the lab in the round-trip class, one student who answers
    differently (every point) and one per `chosen` mistake (all but its exercise's).

    The class is graded on ROUND_TRIP_SETTING, the answer written differently's second setting
    (fairness_tests, given round_trip, binds this test in its place); a cell the student added
    at the end, which the grader runs as any other, reports the settings its kernel had."""
    points = graded_cells(nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4))

    students = {DIFFERENT: lambda: with_probe(solved(lab, answers=different))}
    students.update({f"mistaken_{i}": (lambda name=name: solved(lab, mistakes[name][0]))
                     for i, name in enumerate(chosen)})
    full = sum(points.values())
    expected = {DIFFERENT: full}
    expected.update({f"mistaken_{i}": full - points[mistakes[name][1]] for i, name in enumerate(chosen)})

    # each exercise's column of the CSV: every point for the different student, the mistaken exercise's 0
    by_exercise = {DIFFERENT: dict(points)}
    by_exercise.update({f"mistaken_{i}": {**points, mistakes[name][1]: 0.0} for i, name in enumerate(chosen)})

    @pytest.mark.timeout(TEST_TIMEOUT_S)
    def test_grading_round_trip(round_trip_class):
        got = scores(round_trip_class, lab, expected)
        assert got == expected, f"scores {got}, expected {expected}; the mistakes: {dict(enumerate(chosen))}"
        for student, want in by_exercise.items():
            row = round_trip_class["csv"][student]
            assert {gid: float(row[f"{lab} {gid}"]) for gid in points} == want, (student, row)
        assert_ran_as_asked(f"{DIFFERENT}'s graded {lab}", probe_output(round_trip_class["work"], DIFFERENT, lab),
                            ROUND_TRIP_SETTING)

    enrol(test_grading_round_trip, lab, students)
    return test_grading_round_trip
