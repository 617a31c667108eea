"""Grading one student's lab, start to finish, in a sandbox (one slot of ``grade --jobs``).

1. autograde: ``nbgrader autograde`` in the slot's warm process, its kernel in a sandbox (grader.sandbox)
   with the limits of `Limits`, the hidden tests' reference answers held
   outside it by the judge (grader.judge), against a private copy of the
   gradebook;
2. verdict: what happened, in plain words (grader.verdict); a test cell gets
   its points only if the judge saw every one of its hidden checks pass while
   it ran;
3. feedback: the page rendered by the slot's feedback worker, hidden tests
   removed, the verdict on top; a page with the verdict where nothing could
   be graded;
4. the private gradebook's scores are merged into the class gradebook.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course import grading

from . import collect, gradebook, sandbox, tampering, verdict
from .autograde_worker import AutogradeWorker
from .execute import INLINE_BACKEND
from .feedback_worker import FeedbackWorker
from .jail import Jail
from .judge import UNPRIVILEGED_UID, Judge
from .judged_execute import CELL_FILE_ENV
from .labs import course_config
from .sandboxed import SPEC_ENV
from .workspace import LabInfo, Workspace


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


def _tail(path: Path, chars: int = 20000) -> str:
    if not path.is_file():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - chars))
        return f.read().decode("utf-8", "replace")


@dataclass
class SubmissionGrader:
    """One grading run's labs, limits and shared state; `grade` may run in several threads, one per slot."""
    root: Path
    ws: Workspace
    labs: dict[str, LabInfo]
    limits: sandbox.Limits
    cell_timeout: float | None
    sandboxed: bool
    lock: threading.Lock
    autograde: dict[int, AutogradeWorker]  # slot -> its nbgrader
    feedback: dict[int, FeedbackWorker]    # slot -> its renderer
    judged: dict[str, tuple[Path, int]]    # lab -> the judge's values for this run, and their seed
    course_id: str = ""                    # read from nbgrader_config.py once, not per submission

    def __post_init__(self):
        self.course_id = self.course_id or course_config(self.root).CourseDirectory.course_id

    def grade(self, submission: collect.Submission, slot: int) -> dict:
        """Autograde, judge and give feedback for one student's lab; returns its status entry."""
        started = time.time()
        lab = self.labs[submission.lab]
        why = collect.unreadable(submission.path)
        submitted = None if why else collect.parse_notebook(submission.path)
        why = why or verdict.unmatchable(submitted)
        if why:
            return self._not_graded(submission, why, started)
        restored = collect.place(submission, submitted, self.ws.submitted, lab.released)
        jail = Path(tempfile.mkdtemp(prefix="grader-"))  # short: unix socket paths are limited
        box = usage = None  # the jail's jail.Jail, and what it used
        try:
            with self.lock:
                private = gradebook.private_copy(self.ws.gradebook, jail / "gradebook.db")
            env = {"MPLBACKEND": INLINE_BACKEND,
                   grading.DIR_ENV: str(jail / "no-reference-here")}
            if self.sandboxed:
                box = Jail(jail, self.limits)
                spec = box.spec
                env[SPEC_ENV] = str(spec.spec_file)
                judge_dir = spec.judge_dir
            else:
                judge_dir = jail
            selector = [submission.lab, f"--student={submission.student}", "--force"]
            limits = [f"--Execute.timeout={self.cell_timeout:g}"] if self.cell_timeout else []
            values, seed = self.judged.get(lab.name, (None, 0))
            with Judge(lab.name, values, seed, lab.required, judge_dir, jail,
                       UNPRIVILEGED_UID if self.sandboxed else None) if values else nullcontext() as judge:
                if judge:
                    env[grading.JUDGE_ENV] = str(judge.socket_path)
                    env[CELL_FILE_ENV] = str(judge.cell_file)
                code = self.autograde[slot].run([*selector, *self.ws.flags(private), *limits], env,
                                                jail / "autograde.log", self.limits.wall_s)
            leftovers = box.stop() if box else []
            usage = box.usage() if box else None
            autograded = self.ws.autograded / submission.student / lab.name / f"{lab.name}.ipynb"
            if code is None:
                graded, problem = False, (f"grading ran past the limit of {self.limits.wall_s:.0f} s "
                                          "for one notebook and was stopped")
            elif code != 0 and ("Kernel died" in (log := _tail(jail / "autograde.log")) or usage and usage.oom_killed):
                console = _tail(spec.console) if self.sandboxed else ""
                graded, problem = False, ("the kernel died while running the notebook"
                                          + verdict.why_died(console, self.limits, usage))
            elif code != 0:
                graded, problem = False, f"nbgrader autograde failed: {_last_error(log)}"
            else:
                graded, problem = inspect_autograded(autograded)
                if not graded and usage and usage.oom_killed:  # nbgrader saw a kernel that stopped answering
                    problem = ("the kernel died while running the notebook"
                               + verdict.why_died(_tail(spec.console), self.limits, usage) + f"; {problem}")
            if leftovers:  # the jail should never let this happen; say so rather than hide it
                problem = (problem + "; " if problem else "") + f"{len(leftovers)} processes outlived the jail"
            if not graded:
                return self._not_graded(submission, problem, started)
            found = judge.findings() if judge else {}
            scores = gradebook.cell_scores(private, self.course_id, lab.name, submission.student)
            unverified = {gid: f.why for gid, f in found.items() if not f.passed and scores.get(gid, 0) > 0}
            gradebook.zero_cells(private, self.course_id, lab.name, submission.student, list(unverified))
            judged_failures = {gid: f.detail for gid, f in found.items() if f.detail}
            done = nbformat.read(autograded, as_version=4)
            lines = verdict.lines(
                graded=True, score=gradebook.score(private, self.course_id, lab.name, submission.student),
                max_score=lab.max_score,
                tampered=verdict.tampering(submitted, lab.released, list(lab.points))
                + tampering.flags(submitted, lab.released) + restored,
                ran=verdict.execution(done, list(lab.points), self.limits, self.cell_timeout, usage),
                unverified=unverified, judged=judged_failures)
            problem = self.feedback[slot].write(autograded, self._page(submission), gradebook.db_url(private),
                                                submission.student, lab.name, lines,
                                                hidden_lines=lab.hidden_lines, lab_markdown=lab.markdown)
            if problem:
                lines.append(f"no feedback page: {problem}")
            with self.lock:
                gradebook.merge(private, self.ws.gradebook, self.course_id, lab.name, submission.student)
            return {"graded": True, "verdict": lines, "seconds": round(time.time() - started, 1)}
        finally:
            if box:
                box.close()
            self._keep_logs(jail, submission)
            shutil.rmtree(jail, ignore_errors=True)

    def _page(self, submission: collect.Submission) -> Path:
        return self.ws.feedback / submission.student / submission.lab / f"{submission.lab}.html"

    def _keep_logs(self, jail: Path, submission: collect.Submission) -> None:
        """nbgrader's log and the tail of the kernel's console, for the instructor: logs/<student>/<lab>.log."""
        parts = [(name, _tail(jail / name)) for name in ("autograde.log", "console.log")]
        text = "".join(f"===== {name}\n{body}\n" for name, body in parts if body)
        if text:
            target = self.ws.root / "logs" / submission.student / f"{submission.lab}.log"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")

    def _not_graded(self, submission: collect.Submission, why: str, started: float) -> dict:
        lines = verdict.lines(graded=False, why_not=why)
        verdict.write_page(self._page(submission), submission.student, submission.lab, lines)
        return {"graded": False, "verdict": lines, "seconds": round(time.time() - started, 1)}
