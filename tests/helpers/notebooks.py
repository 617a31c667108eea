"""Notebooks and a gradebook built by hand, cell by cell, for the grader's unit tests.

- write_notebook: a notebook of the given cells written at a path (its folders made).
- graded_cell: a locked test cell as nbgrader marks one, executed or not.
- tagged_cell: a code cell with tags (the solution loader's 'setup' and 'reused').
- gradebook_with_written_answers: a class gradebook of WRITTEN_LAB with its WRITTEN answers,
  as `grader grade` leaves it before anyone grades them by hand.
"""
from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from helpers import REPO


def write_notebook(path, cells=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(new_notebook(cells=list(cells)), path)
    return path


def graded_cell(source, grade_id, executed):
    cell = new_code_cell(source, execution_count=1 if executed else None)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "points": 1, "solution": False,
                                 "locked": True, "schema_version": 3, "task": False}
    return cell


def tagged_cell(source, *tags):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = list(tags)
    return cell


WRITTEN_LAB = "01_single_gpu"
WRITTEN = {"written_why": 2.0, "written_sum": 3.0, "written_blank": 1.0}


def gradebook_with_written_answers(path, students):
    """A class gradebook as `grader grade` leaves it: each student's test cell autograded (4 of 5
    points), and three written answers: two answered and not graded yet, one left as released
    (autograde scores it 0). students: {student: {written grade_id: a manual score, as formgrader sets}}."""
    import warnings

    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    from grader.common.labs import course_config
    course_id = course_config(REPO).CourseDirectory.course_id
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{path}", course_id=course_id) as gb:
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission trips autoflush warnings
        gb.add_assignment(WRITTEN_LAB)
        gb.add_notebook(WRITTEN_LAB, WRITTEN_LAB)
        gb.add_grade_cell("test_step", WRITTEN_LAB, WRITTEN_LAB, max_score=5, cell_type="code")
        for gid, points in WRITTEN.items():
            gb.add_grade_cell(gid, WRITTEN_LAB, WRITTEN_LAB, max_score=points, cell_type="markdown")
            gb.add_solution_cell(gid, WRITTEN_LAB, WRITTEN_LAB)
        for student, manual in students.items():
            gb.add_student(student)
            gb.add_submission(WRITTEN_LAB, student)
            gb.find_grade("test_step", WRITTEN_LAB, WRITTEN_LAB, student).auto_score = 4.0
            gb.find_grade("written_blank", WRITTEN_LAB, WRITTEN_LAB, student).auto_score = 0.0
            for gid, score in manual.items():
                gb.find_grade(gid, WRITTEN_LAB, WRITTEN_LAB, student).manual_score = score
        gb.db.commit()
    return f"sqlite:///{path}"
