"""The grades as CSV: one row per student, and per lab whether grading ran.

nbgrader's own export writes 0.0 for a notebook whose grading failed, the same
as a real zero. Here each lab has four columns:

    <lab> score         the autograded points (empty when not graded)
    <lab> max score     the points available
    <lab> graded        yes / no
    <lab> verdict       what happened, in plain words (grader.verdict): "graded: 9 of 13
                        points; ..." or "not graded: <why>"

then ``total score`` (graded labs only) and ``total max score``.

A row that cannot be made (a gradebook query or a status entry that fails)
says so in each lab's verdict; the other students' rows are written.
"""
from __future__ import annotations

import csv
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

from . import nbgrader_cli
from .labs import course_config
from .verdict import as_text, could_not


def columns(labs: list[str]) -> list[str]:
    cols = ["student_id"]
    for lab in labs:
        cols += [f"{lab} score", f"{lab} max score", f"{lab} graded", f"{lab} verdict"]
    return cols + ["total score", "total max score"]


def rows(students: list[str], points: dict[str, float], status: dict, db_url: str, root: Path) -> list[dict]:
    course_id = course_config(root).CourseDirectory.course_id
    nbgrader_cli.put_scripts_on_path()
    out = []
    with Gradebook(db_url, course_id=course_id) as gradebook:
        for student in students:
            try:
                out.append(_row(gradebook, student, points, status))
            except Exception as error:  # this student's row alone
                out.append(_unexported_row(student, points, error))
                try:  # a failed query leaves the session to be rolled back before the next one
                    gradebook.db.rollback()
                except Exception:
                    pass
    return out


def _row(gradebook: Gradebook, student: str, points: dict[str, float], status: dict) -> dict:
    row, total, total_max = {"student_id": student}, 0.0, 0.0
    for lab, max_score in points.items():
        entry = status.get(student, {}).get(lab)
        row[f"{lab} max score"] = max_score
        total_max += max_score
        if entry is None:
            row.update({f"{lab} score": "", f"{lab} graded": "no",
                        f"{lab} verdict": "not graded: no submission"})
            continue
        score, lines = None, entry["verdict"]
        if entry["graded"]:
            try:
                score = gradebook.find_submission(lab, student).score
            except MissingEntry:
                lines = ["not graded: the gradebook has no grade for it"]
        if score is None:
            row.update({f"{lab} score": "", f"{lab} graded": "no", f"{lab} verdict": as_text(lines)})
        else:
            total += score
            row.update({f"{lab} score": score, f"{lab} graded": "yes", f"{lab} verdict": as_text(lines)})
    row["total score"], row["total max score"] = total, total_max
    return row


def _unexported_row(student: str, points: dict[str, float], error: Exception) -> dict:
    """The row of a student whose grades could not be read: every lab says so, none counts."""
    why = "not graded: " + could_not("export this student's grades", error)
    row = {"student_id": student}
    for lab, max_score in points.items():
        row.update({f"{lab} score": "", f"{lab} max score": max_score, f"{lab} graded": "no", f"{lab} verdict": why})
    row["total score"], row["total max score"] = 0.0, sum(points.values())
    return row


def write_csv(path: Path, students: list[str], points: dict[str, float], status: dict, db_url: str,
              root: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns(list(points)))
        writer.writeheader()
        writer.writerows(rows(students, points, status, db_url, root))
    return path
