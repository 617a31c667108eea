"""One grading run for the lab 1 classes of several test modules.

A grading run costs more than its students: Python and nbgrader start, the
gradebook is prepared, the judge's values are recorded (about 25 s on 2 cores),
and its last student is graded alone. The modules of MODULES grade lab 1
submissions under the same limits, so their students are graded together, in
one `python -m grader grade` run (the fixture `lab1_class`, once per session),
beside one honest student they share. Each module keeps its own students
(`lab1_students`) and its own assertions on them.

tests/test_hostile_grading.py grades its class apart: its short cell limit and
its process limit are part of what it tests.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

from helpers.submissions import grade_class, solved

LAB = "01_single_gpu"
HONEST = "honest"               # the solution, as submitted: every module's full-marks student
CELL_TIMEOUT_S = 120
MEMORY_GB = 2
NOTEBOOK_TIMEOUT_S = 600
OPTIONS = ("--jobs", "2", f"--cell-timeout={CELL_TIMEOUT_S}", f"--memory-gb={MEMORY_GB}",
           f"--timeout={NOTEBOOK_TIMEOUT_S}")
#: Seconds a test that asks for the class may take, its grading included.
TEST_TIMEOUT_S = 1800
#: Each has lab1_students(tmp, work) -> {student: notebook (a dict)}, called before grading.
MODULES = ("test_feedback_safety", "test_grading_round_trip", "test_hostile_jail", "test_hostile_judge")


def grade(tmp: Path) -> dict:
    """Grade every module's students and HONEST as one class in tmp; returns
    {"work": the work folder, "students": {student: notebook}, "csv": rows by student, "log": ...}."""
    folder, work = tmp / "class", tmp / "work"
    students = {HONEST: solved(LAB)}
    for name in MODULES:
        for student, nb in importlib.import_module(name).lab1_students(tmp, work).items():
            if student in students:
                raise ValueError(f"{name} names a student {student!r} that is already in the class")
            students[student] = nb
    for i, (student, nb) in enumerate(sorted(students.items())):
        # Both layouts classes come in: <student>/<lab>.ipynb, and nbgrader's <student>/<lab>/<lab>.ipynb.
        place = folder / student / LAB if i % 2 else folder / student
        place.mkdir(parents=True)
        # As JSON, not through nbformat: some notebooks carry metadata nbformat would refuse to write.
        (place / f"{LAB}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    grades, log = grade_class(folder, work, LAB, *OPTIONS, timeout=TEST_TIMEOUT_S - 60)
    assert sorted(grades) == sorted(students), log
    return {"work": work, "students": students, "csv": grades, "log": log}
