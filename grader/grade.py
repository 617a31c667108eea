"""``python -m grader grade SUBMISSIONS``: the whole round trip, in one command.

1. collect: find each student's notebooks in SUBMISSIONS (see grader.collect)
   and copy them into nbgrader's submitted/ folder;
2. autograde: run ``nbgrader autograde`` for each student and lab, and record
   whether grading really ran (a notebook that cannot be opened, or a kernel
   that died before the tests, is "not graded", never a silent 0);
3. feedback: ``nbgrader generate_feedback`` writes one HTML page per student
   and lab, hidden tests removed (grader.feedback);
4. export: one CSV row per student (grader.export).

Everything is written under the work folder (default grader/work/, which git
ignores): gradebook.db, submitted/, autograded/, feedback/, status.json and
grades.csv.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course import grading

from . import COURSE_ROOT, GraderError, collect, export, nbgrader_cli
from .execute import INLINE_BACKEND
from .labs import display_path, find_labs
from .release import generate_assignment

DEFAULT_WORK = COURSE_ROOT / "grader" / "work"
SUBMISSION_TIMEOUT_S = 1800  # the whole autograde of one notebook; cells have their own limit


@dataclass(frozen=True)
class Workspace:
    """The folders and files one grading run writes, and the nbgrader flags that point there."""
    root: Path

    @property
    def submitted(self) -> Path: return self.root / "submitted"
    @property
    def autograded(self) -> Path: return self.root / "autograded"
    @property
    def feedback(self) -> Path: return self.root / "feedback"
    @property
    def gradebook(self) -> Path: return self.root / "gradebook.db"
    @property
    def status_file(self) -> Path: return self.root / "status.json"
    @property
    def db_url(self) -> str: return f"sqlite:///{self.gradebook}"

    def flags(self) -> list[str]:
        return [f"--CourseDirectory.submitted_directory={self.submitted}",
                f"--CourseDirectory.autograded_directory={self.autograded}",
                f"--CourseDirectory.feedback_directory={self.feedback}",
                f"--CourseDirectory.db_url={self.db_url}"]

    def load_status(self) -> dict:
        if self.status_file.is_file():
            return json.loads(self.status_file.read_text(encoding="utf-8"))
        return {}

    def save_status(self, status: dict) -> None:
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.status_file)


def gradable_labs(root: Path) -> dict[str, float]:
    """{lab: total points} for the labs that have graded test cells."""
    return {lab.name: sum(lab.points.values()) for lab in find_labs(root) if lab.points}


def _last_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if "ERROR" in line or "Error" in line]
    return lines[-1][:300] if lines else "no error message"


def inspect_autograded(path: Path) -> tuple[bool, str]:
    """(graded, why not): did every graded test cell of the autograded notebook run?"""
    if not path.is_file():
        return False, "nbgrader wrote no autograded notebook"
    nb = nbformat.read(path, as_version=4)
    cells = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    not_run = [(i, c) for i, c in cells if c.metadata.get("nbgrader", {}).get("grade")
               and c.get("execution_count") is None]
    if not not_run:
        return True, ""
    first = min(i for i, _ in not_run)
    ran = [i for i, c in cells if c.get("execution_count") is not None and i < first]
    last = f"after cell {ran[-1] + 1}" if ran else "before the first cell"
    ids = ", ".join(c.metadata["nbgrader"]["grade_id"] for _, c in not_run)
    return False, (f"execution stopped {last} (the kernel died or was stopped), so the tests "
                   f"{ids} never ran")


def grade_one(submission: collect.Submission, work: Workspace, root: Path, timeout: float,
              cell_timeout: float | None = None) -> dict:
    """Autograde and give feedback for one student's lab; returns its status entry."""
    started = time.time()
    why = collect.unreadable(submission.path)
    if why:
        return {"graded": False, "problem": why, "seconds": 0.0}
    collect.place(submission, work.submitted)
    env = {"MPLBACKEND": INLINE_BACKEND, grading.DIR_ENV: str(root / "grader" / "reference")}
    selector = [submission.lab, f"--student={submission.student}", "--force"]
    limits = [f"--Execute.timeout={cell_timeout:g}"] if cell_timeout else []
    try:
        proc = nbgrader_cli.run(["autograde", *selector, *work.flags(), *limits], root, env=env,
                                timeout=timeout)
    except GraderError:
        return {"graded": False, "problem": f"grading took longer than {timeout:.0f} s and was stopped",
                "seconds": time.time() - started}
    autograded = work.autograded / submission.student / submission.lab / f"{submission.lab}.ipynb"
    if proc.returncode != 0:
        status = {"graded": False, "problem": f"nbgrader autograde failed: {_last_error(proc.stdout)}"}
    else:
        graded, problem = inspect_autograded(autograded)
        status = {"graded": graded, "problem": problem}
    if autograded.is_file():
        feedback = nbgrader_cli.run(["generate_feedback", *selector, *work.flags()], root, env=env)
        if feedback.returncode != 0:
            status["problem"] = (status["problem"] + "; " if status["problem"] else "") + \
                f"no feedback: {_last_error(feedback.stdout)}"
    status["seconds"] = round(time.time() - started, 1)
    return status


def grade(submissions: Path, *, labs: list[str] | None = None, work: Path = DEFAULT_WORK,
          root: Path = COURSE_ROOT, csv_path: Path | None = None, timeout: float = SUBMISSION_TIMEOUT_S,
          cell_timeout: float | None = None, say=print) -> Path:
    """Collect, autograde, give feedback and export; returns the CSV's path."""
    root = Path(root).resolve()
    ws = Workspace(Path(work).resolve())
    ws.root.mkdir(parents=True, exist_ok=True)
    points = gradable_labs(root)
    if labs:
        unknown = [lab for lab in labs if lab not in points]
        if unknown:
            raise GraderError(f"no graded lab(s) {', '.join(unknown)}; graded labs are: {', '.join(points)}")
        points = {lab: points[lab] for lab in labs}
    # The gradebook must know each lab's test cells before autograde can use it.
    with tempfile.TemporaryDirectory(prefix="grader-grade-") as tmp:
        for lab in points:
            generate_assignment(lab, root, Path(tmp), ws.db_url)
    found, problems = collect.find(Path(submissions), list(points))
    for problem in problems:
        say(f"skipped {problem}")
    status = ws.load_status()
    for i, submission in enumerate(found, start=1):
        entry = grade_one(submission, ws, root, timeout, cell_timeout)
        status.setdefault(submission.student, {})[submission.lab] = entry
        ws.save_status(status)  # after each one: an interrupted run keeps what it graded
        outcome = "graded" if entry["graded"] else f"NOT GRADED: {entry['problem']}"
        say(f"[{i}/{len(found)}] {submission.student} {submission.lab}: {outcome} ({entry['seconds']:.0f} s)")
    target = Path(csv_path) if csv_path else ws.root / "grades.csv"
    students = sorted({s.student for s in found} | set(status))
    export.write_csv(target, students, points, status, ws.db_url, root)
    say(f"wrote {display_path(target, root)}; feedback in {display_path(ws.feedback, root)}/")
    return target


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "grade", help="collect, autograde, give feedback and export grades for a folder of submissions",
        description="Grade SUBMISSIONS/<student>/<lab>.ipynb (or <student>/<lab>/<lab>.ipynb): autograde "
                    "with nbgrader, write feedback HTML without hidden tests, and export one CSV row per student.")
    p.add_argument("submissions", type=Path, help="folder with one subfolder per student")
    p.add_argument("--lab", dest="labs", action="append", metavar="LAB",
                   help="grade only this lab (repeatable; default: every graded lab)")
    p.add_argument("--work", type=Path, default=DEFAULT_WORK,
                   help="where the gradebook and nbgrader's folders go (default: grader/work)")
    p.add_argument("--csv", type=Path, help="where to write the grades (default: WORK/grades.csv)")
    p.add_argument("--timeout", type=float, default=SUBMISSION_TIMEOUT_S,
                   help=f"seconds one notebook may take to grade (default {SUBMISSION_TIMEOUT_S})")
    p.add_argument("--cell-timeout", type=float,
                   help="seconds one cell may run before it is interrupted (default: nbgrader_config.py's)")
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    grade(args.submissions, labs=args.labs, work=args.work, root=args.root, csv_path=args.csv,
          timeout=args.timeout, cell_timeout=args.cell_timeout)
    return 0
