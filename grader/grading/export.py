"""The grades as CSV: one row per student, and per lab whether grading ran.

nbgrader's own export writes 0.0 for a notebook whose grading failed, the same
as a real zero, and a written answer nobody has graded yet counts 0 there too.
Here each lab has seven columns and one per exercise:

    <lab> score                 the autograded points: what the code earned (empty when not graded)
    <lab> max score             the autograded points available
    <lab> <test cell>           each exercise's autograded points (its test cell's grade_id; empty
                                when not graded), which add up to <lab> score
    <lab> written score         the written answers' points given so far, by hand in formgrader
                                (an answer left as released gets 0 from autograde)
    <lab> written max score     the written answers' points available
    <lab> pending manual        the written answers' points that await grading by hand: not a zero
    <lab> graded                yes / no
    <lab> verdict               what happened, in plain words (grader.grading.verdict): "graded: 9 of 13
                                points; 4 points await manual grading in formgrader (...)"
                                or "not graded: <why>"

then ``total score`` (autograded and written points given, graded labs only),
``total max score`` (both kinds) and ``total pending manual``. The written
columns are read from the class gradebook at export time, so a run after the
instructor's grading in formgrader exports those points (unchanged submissions
are not graded again).

A row that cannot be made (a gradebook query or a status entry that fails)
says so in each lab's verdict; the other students' rows are written.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

from grader.common import nbgrader_cli
from grader.common.labs import course_config

from .gradebook import db_url, written_points
from .verdict import as_text, could_not, with_written, written_line

WRITTEN = ("written score", "written max score", "pending manual")


def columns(labs: list[str], exercises: dict[str, dict[str, float]] | None = None) -> list[str]:
    cols = ["student_id"]
    for lab in labs:
        cols += [f"{lab} score", f"{lab} max score", *_exercise_columns(lab, exercises),
                 *(f"{lab} {c}" for c in WRITTEN), f"{lab} graded", f"{lab} verdict"]
    return cols + ["total score", "total max score", "total pending manual"]


def _exercise_columns(lab: str, exercises: dict[str, dict[str, float]] | None) -> list[str]:
    return [f"{lab} {grade_id}" for grade_id in (exercises or {}).get(lab, {})]


def rows(students: list[str], points: dict[str, float], status: dict, db_url: str, root: Path,
         written: dict[str, dict[str, float]] | None = None,
         exercises: dict[str, dict[str, float]] | None = None) -> list[dict]:
    """written: {lab: {grade_id: points}} of the answers graded by hand (grader.common.labs.written_cells);
    exercises: {lab: {grade_id: points}} of its autograded test cells, a column each."""
    course_id = course_config(root).CourseDirectory.course_id
    written = {lab: dict((written or {}).get(lab, {})) for lab in points}
    exercises = {lab: dict((exercises or {}).get(lab, {})) for lab in points}
    nbgrader_cli.put_scripts_on_path()
    out = []
    with Gradebook(db_url, course_id=course_id) as gradebook:
        for student in students:
            try:
                out.append(_row(gradebook, student, points, status, written, exercises))
            except Exception as error:  # this student's row alone
                out.append(_unexported_row(student, points, error, written, exercises))
                try:  # a failed query leaves the session to be rolled back before the next one
                    gradebook.db.rollback()
                except Exception:
                    pass
    return out


def _row(gradebook: Gradebook, student: str, points: dict[str, float], status: dict,
         written: dict[str, dict[str, float]], exercises: dict[str, dict[str, float]]) -> dict:
    row, total, total_max, total_pending = {"student_id": student}, 0.0, 0.0, 0.0
    for lab, max_score in points.items():
        entry = status.get(student, {}).get(lab)
        written_max = sum(written[lab].values())
        row.update({f"{lab} max score": max_score, f"{lab} written max score": written_max})
        row.update(dict.fromkeys(_exercise_columns(lab, exercises), ""))
        total_max += max_score + written_max
        if entry is None:
            row.update({f"{lab} score": "", f"{lab} written score": "", f"{lab} pending manual": "",
                        f"{lab} graded": "no", f"{lab} verdict": "not graded: no submission"})
            continue
        score, lines = None, entry["verdict"]
        if entry["graded"]:
            try:
                score = gradebook.find_submission(lab, student).score
                hand = written_points(gradebook, lab, student, written[lab])
                cells = {g.name: g.score for g in gradebook.find_submission_notebook(lab, lab, student).grades}
            except MissingEntry:
                score, lines = None, ["not graded: the gradebook has no grade for it"]
        if score is None:
            row.update({f"{lab} score": "", f"{lab} written score": "", f"{lab} pending manual": "",
                        f"{lab} graded": "no", f"{lab} verdict": as_text(lines)})
        else:
            total += score
            total_pending += hand.pending
            lines = with_written(lines, written_line(hand.given, hand.pending, hand.max_score, hand.unanswered))
            row.update({f"{lab} {grade_id}": cells.get(grade_id, 0.0) for grade_id in exercises[lab]})
            row.update({f"{lab} score": score - hand.given, f"{lab} written score": hand.given,
                        f"{lab} pending manual": hand.pending, f"{lab} graded": "yes",
                        f"{lab} verdict": as_text(lines)})
    row["total score"], row["total max score"], row["total pending manual"] = total, total_max, total_pending
    return row


def _unexported_row(student: str, points: dict[str, float], error: Exception,
                    written: dict[str, dict[str, float]], exercises: dict[str, dict[str, float]]) -> dict:
    """The row of a student whose grades could not be read: every lab says so, none counts."""
    why = "not graded: " + could_not("export this student's grades", error)
    row = {"student_id": student}
    for lab, max_score in points.items():
        row.update(dict.fromkeys(_exercise_columns(lab, exercises), ""))
        row.update({f"{lab} score": "", f"{lab} max score": max_score, f"{lab} written score": "",
                    f"{lab} written max score": sum(written[lab].values()), f"{lab} pending manual": "",
                    f"{lab} graded": "no", f"{lab} verdict": why})
    row["total score"], row["total pending manual"] = 0.0, 0.0
    row["total max score"] = sum(points.values()) + sum(sum(w.values()) for w in written.values())
    return row


def write_csv(path: Path, students: list[str], points: dict[str, float], status: dict, db_url: str,
              root: Path, written: dict[str, dict[str, float]] | None = None,
              exercises: dict[str, dict[str, float]] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)  # the class's grades: a --csv outside the work folder, or one left open, too
        writer = csv.DictWriter(f, fieldnames=columns(list(points), exercises))
        writer.writeheader()
        writer.writerows(rows(students, points, status, db_url, root, written, exercises))
    return path


def reported_labs(labs: list[str], status: dict, uncollected: dict, every: bool) -> list[str]:
    """The labs a run's CSV reports: all of `labs` where asked (the run named its labs, or was asked for the
    whole term); else those some student handed in, graded or not, in this work folder's runs (`status`,
    `uncollected`): a run on one lab's submissions is not a table of labs never given. All where none was."""
    handed_in = {lab for entries in (*status.values(), *uncollected.values()) for lab in entries}
    return list(labs) if every else [lab for lab in labs if lab in handed_in] or list(labs)


def write_class(path: Path, gradebook_path: Path, root: Path, infos: dict, status: dict, uncollected: dict,
                students, every: bool = True) -> Path:
    """The CSV of a grading run (or of its merged shards): a row for each of `students` and each student of
    `status`; each lab's entry from `status`, or from `uncollected` (the labs this run could not collect);
    the labs of `reported_labs`."""
    infos = {lab: infos[lab] for lab in reported_labs(list(infos), status, uncollected, every)}
    graded = {**status, **{student: {**status.get(student, {}), **labs}
                           for student, labs in uncollected.items()}}
    return write_csv(path, sorted(set(students) | set(graded)), {lab: info.max_score for lab, info in infos.items()},
                     graded, db_url(gradebook_path), root,
                     written={lab: info.written for lab, info in infos.items()},
                     exercises={lab: info.points for lab, info in infos.items()})
