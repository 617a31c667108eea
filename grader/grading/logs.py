"""What one submission's grading leaves for the instructor and the student, whatever happened.

The instructor's logs of it: logs/<student>/<lab>.log (nbgrader's log, the kernel's
console, the judge's and the wire's reports) and, for each step that failed, its traceback
in logs/<student>/<lab>.errors.log; the student's feedback page, and a page that says why
where the notebook could not be graded (grader.grading.submission's steps, grader.grade).
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path

from grader.judge import wire
from grader.judge.client import STRANGERS_FILE

from . import collect, verdict
from .workspace import Workspace


def feedback_page(ws: Workspace, submission: collect.Submission) -> Path:
    return ws.feedback / submission.student / submission.lab / f"{submission.lab}.html"


def errors_log(ws: Workspace, submission: collect.Submission) -> Path:
    return ws.root / "logs" / submission.student / f"{submission.lab}.errors.log"


def log_failure(ws: Workspace, submission: collect.Submission, step: str, error: BaseException) -> None:
    """The traceback of a failed step, for the instructor: logs/<student>/<lab>.errors.log."""
    try:
        path = errors_log(ws, submission)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__, limit=20))
        with path.open("a", encoding="utf-8") as log:
            log.write(f"===== the grader could not {step}\n{text[-20000:]}\n")
    except Exception:  # the verdict says what failed; a log that cannot be written adds nothing
        pass


def not_graded(ws: Workspace, submission: collect.Submission, why: str, started: float) -> dict:
    """A status entry: not graded, and why; its feedback page too, where one can be written."""
    lines = verdict.lines(graded=False, why_not=why)
    try:
        verdict.write_page(feedback_page(ws, submission), submission.student, submission.lab, lines)
    except Exception as error:  # the CSV still says why
        log_failure(ws, submission, "write the feedback page of this notebook", error)
    return {"graded": False, "verdict": lines, "seconds": round(time.time() - started, 1)}


def tail(path: Path, chars: int = 20000) -> str:
    """The last chars of a log, "" where there is none."""
    if not path.is_file():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - chars))
        return f.read().decode("utf-8", "replace")


def keep_logs(ws: Workspace, folder: Path, submission: collect.Submission) -> None:
    """nbgrader's log and the tail of the kernel's console, from the jail's folder, for the instructor:
    logs/<student>/<lab>.log."""
    try:
        parts = [(name, tail(folder / name))
                 for name in ("autograde.log", "console.log", wire.REPORT_FILE, STRANGERS_FILE)]
        text = "".join(f"===== {name}\n{body}\n" for name, body in parts if body)
        if text:
            target = ws.root / "logs" / submission.student / f"{submission.lab}.log"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    except OSError as error:  # the grade stands without its log
        log_failure(ws, submission, "keep the logs of this notebook", error)
