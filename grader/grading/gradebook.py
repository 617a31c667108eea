"""One gradebook for the class, written by one process.

Each submission is autograded against a private copy of the gradebook (so
several can run side by side without sqlite locks between nbgrader
processes); when it is done, the grader copies its scores and comments into
the class gradebook, one submission at a time.
"""
from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from nbgrader.api import Gradebook
from sqlalchemy.exc import SAWarning

from grader.common import nbgrader_cli


def db_url(path: Path) -> str:
    return f"sqlite:///{Path(path)}"


def private_copy(master: Path, target: Path) -> Path:
    shutil.copyfile(master, target)
    return target


def zero_cells(path: Path, course_id: str, lab: str, student: str, grade_ids: list[str]) -> None:
    """Score these test cells 0: a manual score, which overrides the autograded one (the verdict says why)."""
    if not grade_ids:
        return
    nbgrader_cli.put_scripts_on_path()
    with Gradebook(db_url(path), course_id=course_id) as gb:
        for grade_id in grade_ids:
            grade = gb.find_grade(grade_id, lab, lab, student)
            grade.manual_score = 0.0
        gb.db.commit()


def merge(private: Path, master: Path, course_id: str, lab: str, student: str) -> None:
    """Copy (student, lab)'s submission, scores and comments from a private gradebook into the master."""
    nbgrader_cli.put_scripts_on_path()
    with warnings.catch_warnings(), Gradebook(db_url(private), course_id=course_id) as src, \
            Gradebook(db_url(master), course_id=course_id) as dst:
        # nbgrader's add_submission trips SQLAlchemy's autoflush warnings; the rows are right.
        warnings.simplefilter("ignore", SAWarning)
        submitted = src.find_submission(lab, student)
        dst.update_or_create_student(student)
        target = dst.update_or_create_submission(lab, student, timestamp=submitted.timestamp)
        for notebook in submitted.notebooks:
            into = {n.name: n for n in target.notebooks}[notebook.name]
            into.flagged = notebook.flagged
            grades = {g.name: g for g in into.grades}
            for grade in notebook.grades:
                copy = grades[grade.name]
                copy.auto_score, copy.manual_score = grade.auto_score, grade.manual_score
                copy.extra_credit, copy.needs_manual_grade = grade.extra_credit, grade.needs_manual_grade
            comments = {c.name: c for c in into.comments}
            for comment in notebook.comments:
                comments[comment.name].auto_comment = comment.auto_comment
                comments[comment.name].manual_comment = comment.manual_comment
        dst.db.commit()


def cell_scores(path: Path, course_id: str, lab: str, student: str) -> dict[str, float]:
    """{grade_id: score} of a submission's test cells."""
    nbgrader_cli.put_scripts_on_path()
    with Gradebook(db_url(path), course_id=course_id) as gb:
        return {g.name: g.score for g in gb.find_submission_notebook(lab, lab, student).grades}


def score(path: Path, course_id: str, lab: str, student: str) -> float:
    nbgrader_cli.put_scripts_on_path()
    with Gradebook(db_url(path), course_id=course_id) as gb:
        return gb.find_submission(lab, student).score


@dataclass(frozen=True)
class Written:
    """A submission's answers graded by hand (grader.common.labs.written_cells), as the gradebook has them now."""
    given: float = 0.0       # points given so far: in formgrader, or 0 by autograde for an answer left blank
    pending: float = 0.0     # points of answers that await grading by hand
    max_score: float = 0.0
    unanswered: int = 0      # answers left as released, which autograde scores 0


def written_points(gb: Gradebook, lab: str, student: str, written: dict[str, float]) -> Written:
    """The written answers of (student, lab) in an open gradebook. A grade with neither a manual nor an
    automatic score (nbgrader's Grade.score reads 0 for it), or one the gradebook lacks, is pending:
    formgrader lists it for the instructor, and no one has graded it yet."""
    if not written:
        return Written()
    grades = {g.name: g for notebook in gb.find_submission(lab, student).notebooks for g in notebook.grades}
    given = pending = 0.0
    unanswered = 0
    for grade_id, points in written.items():
        grade = grades.get(grade_id)
        if grade is None or (grade.manual_score is None and grade.auto_score is None):
            pending += points
            continue
        given += grade.score
        unanswered += grade.manual_score is None and grade.auto_score == 0
    return Written(given, pending, sum(written.values()), unanswered)


def written_score(path: Path, course_id: str, lab: str, student: str, written: dict[str, float]) -> Written:
    nbgrader_cli.put_scripts_on_path()
    with Gradebook(db_url(path), course_id=course_id) as gb:
        return written_points(gb, lab, student, written)
