"""Grading one student's lab, start to finish, in a jail (one slot of ``grade --jobs``).

1. autograde: ``nbgrader autograde`` in the slot's warm process, its kernel in a jail (grader.jail.bwrap)
   with the limits of `Limits`, the hidden tests' reference answers held
   outside it by the judge (grader.judge.server), against a private copy of the
   gradebook;
2. verdict: what happened, in plain words (grader.grading.verdict); a test cell gets
   its points only if the judge saw every one of its hidden checks pass while
   it ran; written answers (grader.common.labs.written_cells) await the instructor in
   formgrader: their points are pending, apart from the autograded score;
3. feedback: the page rendered by the slot's feedback worker, hidden tests
   removed, the verdict on top; a page with the verdict where nothing could
   be graded; then, in the autograded notebook formgrader shows, the solution's model
   answer and rubric after each written answer (grader.common.rubrics), never on the page;
4. the private gradebook's scores are merged into the class gradebook.

`SubmissionGrader.grade` is these steps in order, each a method (`_autograde`, `_points`
and the verdict, `_feedback`, the merge), after `_read` has read the notebook; what one
step leaves for the next is the submission's `_Attempt`. What the run leaves for the
instructor and the student, the logs and a page where nothing was graded, is grader.grading.logs'.

Each step's failure, whatever it raises (a notebook nested too deep for a
parser, a renderer or gradebook that fails), is this submission's verdict
alone, never the run's: what it must not vouch for is not graded (a notebook
that cannot be read, scores that cannot be read or merged), what it only
reports on says so in the verdict (a tampering scan that could not run is
flagged for the instructor, and withholds every test cell's points pending
review: it vouches for nothing). The traceback goes to logs/<student>/<lab>.errors.log.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course import grading
from grader.common import rubrics
from grader.common.execute import INLINE_BACKEND
from grader.common.labs import course_config
from grader.common.quoting import quoted
from grader.feedback.worker import FeedbackWorker
from grader.jail import bwrap
from grader.jail.host import Jail, JailUsage
from grader.jail.kernel_manager import OLD_SPEC_ENV, SPEC_ENV
from grader.judge import lab_cells, tampering, wire
from grader.judge.client import STRANGERS_FILE, Judge
from grader.judge.judged_execute import CELL_FILE_ENV
from grader.judge.spawner import JudgeSpawner

from . import collect, gradebook, verdict
from .autograde_worker import AutogradeWorker
from .logs import errors_log, feedback_page, keep_logs, log_failure, not_graded, tail
from .workspace import LabInfo, Workspace

#: How long nbgrader waits, after a cell's reply, for the rest of its output (nbclient's default is 4 s).
IOPUB_TIMEOUT_S = 30


def _last_error(log: str) -> str:
    """nbgrader's last error line, quoted: it may carry what the submission raised or printed."""
    lines = [line.strip() for line in log.splitlines() if "ERROR" in line or "Error" in line]
    return quoted(lines[-1], 160) if lines else "no error message"


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


@dataclass
class _Attempt:
    """One submission's grading as it goes: what each step leaves for the next."""
    submission: collect.Submission
    lab: LabInfo
    started: float
    submitted: dict | None = None    # the notebook as handed in
    restored: list = field(default_factory=list)  # what putting its test cells back says (collect.place)
    folder: Path | None = None       # the jail's folder on the host: the gradebook's copy, the judge, the logs
    jail: Jail | None = None         # None: --unsafe
    private: Path | None = None      # this submission's copy of the gradebook
    judge: Judge | None = None       # None: a lab whose tests check no recorded value
    usage: JailUsage | None = None   # what the jail used
    autograded: Path | None = None   # nbgrader's autograded notebook


@dataclass
class _Points:
    """Step 2's points, and what the verdict says of them."""
    score: float           # the autograded points, the written answers' apart
    unverified: dict       # grade_id -> why the judge did not vouch for a cell nbgrader gave points
    judged: dict           # grade_id -> what the judge saw fail
    withheld: str | None   # the line that says which points the tampering scan withholds
    written: gradebook.Written  # the written answers' points, given and pending
    wire_flags: list       # what the jail's network says against the records


@dataclass
class SubmissionGrader:
    """One grading run's labs, limits and shared state; `grade` may run in several threads, one per slot."""
    root: Path
    ws: Workspace
    labs: dict[str, LabInfo]
    limits: bwrap.Limits
    cell_timeout: float | None
    jailed: bool                           # False: --unsafe, where no jail can be made
    lock: threading.Lock
    autograde: dict[int, AutogradeWorker]  # slot -> its nbgrader
    feedback: dict[int, FeedbackWorker]    # slot -> its renderer
    judged: dict[str, tuple[Path, int]]    # lab -> the judge's values for this run, and their seed
    judges: JudgeSpawner | None = None     # forks each submission's judge; None: each starts with python -m
    course_id: str = ""                    # read from nbgrader_config.py once, not per submission

    def __post_init__(self):
        self.course_id = self.course_id or course_config(self.root).CourseDirectory.course_id

    def grade(self, submission: collect.Submission, slot: int) -> dict:
        """The module's four steps for one student's lab, each failure its verdict; returns its status entry."""
        errors_log(self.ws, submission).unlink(missing_ok=True)  # an earlier run's
        at = _Attempt(submission, self.labs[submission.lab], time.time())
        if why := self._read(at):
            return self._not_graded(submission, why, at.started)
        at.folder = Path(tempfile.mkdtemp(prefix="grader-"))  # short: unix socket paths are limited
        try:
            if problem := self._autograde(at, slot):                                       # 1. autograde
                return self._not_graded(submission, problem, at.started)
            # Before the points: a line that can rewrite a check withholds the points of the test cells after it.
            tampered = self._tampering(submission, at.submitted, at.lab)
            try:  # the points: what the grade rests on, so no grade without them
                points = self._points(at, tampered)
            except Exception as error:
                return self._not_graded(submission, self._failed(submission, "score this notebook", error), at.started)
            lines = verdict.lines(graded=True, score=points.score, max_score=at.lab.max_score,   # 2. verdict
                                  tampered=tampered + at.restored + points.wire_flags,
                                  ran=self._ran(submission, at.autograded, at.lab, at.usage),
                                  unverified=points.unverified, judged=points.judged, withheld=points.withheld)
            self._feedback(at, slot, lines, points.written)                                  # 3. feedback
            self._rubrics(at, lines)   # the written answers' rubrics, for formgrader: after the page, never in it
            try:                                                                             # 4. the class gradebook
                with self.lock:
                    gradebook.merge(at.private, self.ws.gradebook, self.course_id, at.lab.name, submission.student)
            except Exception as error:  # the class gradebook may hold another grade: the export must not show it
                return self._not_graded(
                    submission, self._failed(submission, "merge this notebook's grade into the class gradebook", error),
                    at.started)
            return {"graded": True, "verdict": lines, "seconds": round(time.time() - at.started, 1),
                    **({"pending manual": points.written.pending} if points.written.pending else {})}
        finally:
            if at.jail:
                at.jail.close()
            keep_logs(self.ws, at.folder, submission)
            shutil.rmtree(at.folder, ignore_errors=True)

    def _read(self, at: _Attempt) -> str:
        """The notebook as handed in, its test cells put back where the student changed them; why not, if not."""
        submission, lab = at.submission, at.lab
        try:
            why = collect.unreadable(submission.path)
            at.submitted = None if why else collect.parse_notebook(submission.path)
            why = why or verdict.unmatchable(at.submitted)
            at.restored = [] if why else collect.place(submission, at.submitted, self.ws.submitted, lab.released,
                                                       lab.with_hidden_tests)
        except Exception as error:  # e.g. RecursionError: JSON nested deeper than the parser goes
            why = self._failed(submission, "read this notebook", error)
        return why

    def _autograde(self, at: _Attempt, slot: int) -> str:
        """Step 1: nbgrader's autograde of the notebook, its kernel in a jail, the judge beside it; what stopped
        it, or "" where every graded test cell ran."""
        submission, lab, folder = at.submission, at.lab, at.folder
        with self.lock:
            at.private = gradebook.private_copy(self.ws.gradebook, folder / "gradebook.db")
        env = {"MPLBACKEND": INLINE_BACKEND,
               grading.DIR_ENV: bwrap.NO_REFERENCE_DIR}
        if self.jailed:
            at.jail = Jail(folder, self.limits)
            # Its old name too, for an nbgrader_config.py of before the rename, which would otherwise
            # not ask for the jail at all (deprecated; goes with the old name).
            env[SPEC_ENV] = env[OLD_SPEC_ENV] = str(at.jail.spec.spec_file)
        judge_dir = at.jail.spec.judge_dir if at.jail else folder
        selector = [submission.lab, f"--student={submission.student}", "--force"]
        limits = [f"--Execute.timeout={self.cell_timeout:g}"] if self.cell_timeout else []
        # nbclient's 4 s can pass on a loaded grading machine while a flood's last prints are coming
        limits.append(f"--Execute.iopub_timeout={IOPUB_TIMEOUT_S}")
        values, seed = self.judged.get(lab.name, (None, 0))
        jail = at.jail
        # As root, the judge drops to a uid of the jail's own and answers the jail's uid alone.
        with Judge(lab.name, values, seed, lab.required, judge_dir, folder, jail.judge_uid if jail else None,
                   spawner=self.judges, peer_uid=jail.uid if jail else None) if values else nullcontext() as judge:
            if judge:
                env[grading.JUDGE_ENV] = str(judge.socket_path)
                env[CELL_FILE_ENV] = str(judge.cell_file)
                env[wire.WIRE_FILE_ENV] = str(folder / wire.WIRE_FILE)
            code = self.autograde[slot].run([*selector, *self.ws.flags(at.private), *limits], env,
                                            folder / "autograde.log", self.limits.wall_s)
        at.judge = judge
        leftovers = jail.stop() if jail else []
        usage = at.usage = jail.usage() if jail else None
        at.autograded = self.ws.autograded / submission.student / lab.name / f"{lab.name}.ipynb"
        if code is None:
            graded, problem = False, (f"grading ran past the limit of {self.limits.wall_s:.0f} s "
                                      "for one notebook and was stopped")
        elif code != 0 and ("Kernel died" in (log := tail(folder / "autograde.log")) or usage and usage.oom_killed):
            console = tail(jail.spec.console) if self.jailed else ""
            graded, problem = False, ("the kernel died while running the notebook"
                                      + verdict.why_died(console, self.limits, usage))
        elif code != 0:
            graded, problem = False, f"nbgrader autograde failed: {_last_error(log)}"
        else:
            graded, problem = inspect_autograded(at.autograded)
            if not graded and usage and usage.oom_killed:  # nbgrader saw a kernel that stopped answering
                problem = ("the kernel died while running the notebook"
                           + verdict.why_died(tail(jail.spec.console), self.limits, usage) + f"; {problem}")
        if leftovers:  # the jail should never let this happen; say so rather than hide it
            problem = (problem + "; " if problem else "") + f"{len(leftovers)} processes outlived the jail"
        return "" if graded else problem

    def _points(self, at: _Attempt, tampered: list) -> _Points:
        """Step 2's points: the autograded ones the judge vouches for, less those the tampering scan withholds,
        the written answers' apart. Raises where the grade cannot rest on them."""
        submission, lab, judge = at.submission, at.lab, at.judge
        found, wire_flags = wire.judged(judge, at.folder) if judge else ({}, [])  # the judge's, the wire's
        if judge and (note := judge.strangers_note()):   # for the instructor's log
            (at.folder / STRANGERS_FILE).write_text(note, encoding="utf-8")
        scores = gradebook.cell_scores(at.private, self.course_id, lab.name, submission.student)
        unverified = {gid: f.why for gid, f in found.items() if not f.passed and scores.get(gid, 0) > 0}
        first = min((f for f in tampered if getattr(f, "withholds", False)), key=lambda f: f.index, default=None)
        withheld = [gid for gid in lab_cells.tests_after(at.submitted, list(lab.points), first.index)
                    if scores.get(gid, 0) > 0 and gid not in unverified] if first else []
        held = verdict.withheld_line(sum(scores[gid] for gid in withheld), withheld, first and first.said)
        gradebook.zero_cells(at.private, self.course_id, lab.name, submission.student, [*unverified, *withheld])
        judged_failures = {gid: f.detail for gid, f in found.items() if f.detail}
        score = gradebook.score(at.private, self.course_id, lab.name, submission.student)
        written = gradebook.written_score(at.private, self.course_id, lab.name, submission.student, lab.written)
        score -= written.given  # the autograded points alone: the written ones are reported apart
        return _Points(score, unverified, judged_failures, held, written, wire_flags)

    def _feedback(self, at: _Attempt, slot: int, lines: list[str], written) -> None:
        """Step 3: the feedback page, the verdict on top; the verdict alone where the page fails (lines says so)."""
        submission, lab = at.submission, at.lab
        # The page is written now, the CSV later from the class gradebook (grader.grading.export): there the
        # written answers' line says what formgrader has given by then.
        said = verdict.written_line(written.given, written.pending, written.max_score, written.unanswered)
        shown = verdict.with_written(lines, said)
        try:
            problem = self.feedback[slot].write(at.autograded, feedback_page(self.ws, submission),
                                                gradebook.db_url(at.private), submission.student, lab.name, shown,
                                                hidden_lines=lab.hidden_lines, lab_markdown=lab.markdown)
        except Exception as error:
            problem = self._failed(submission, "render the feedback page of this notebook", error)
        if problem:
            lines.append(f"no feedback page: {problem}")
            try:  # the verdict alone, rather than no page or an earlier run's
                verdict.write_page(feedback_page(self.ws, submission), submission.student, submission.lab,
                                   [*shown, lines[-1]])
            except Exception as error:  # the verdict already says there is no page
                log_failure(self.ws, submission, "write the feedback page of this notebook", error)

    def _rubrics(self, at: _Attempt, lines: list[str]) -> None:
        """The model answers and rubrics after the written answers, for formgrader (grader.common.rubrics)."""
        try:
            rubrics.add_to_autograded(at.autograded, at.lab.rubrics)
        except Exception as error:  # the grade stands; the rubric is in solutions/
            lines.append("no rubric beside the written answers in formgrader: "
                         + self._failed(at.submission, "add the rubrics to the autograded notebook", error))

    def _tampering(self, submission: collect.Submission, submitted: dict, lab: LabInfo) -> list[str]:
        """What the student did to the tests, and the lines the scan flags (grader.judge.tampering.Flag, each
        saying whether it withholds); a scan that could not run is itself flagged, and withholds every
        test cell's points: what it would have found is unknown."""
        try:
            edited = verdict.tampering(submitted, lab.released, list(lab.points))
        except Exception as error:
            why = self._failed(submission, "compare this notebook's test cells with the lab's", error)
            edited = [f"{why}; flagged for the instructor to compare by hand"]
        try:
            return edited + tampering.flags(submitted, lab.released)
        except Exception as error:  # e.g. RecursionError on an expression nested thousands deep
            why = self._failed(submission, "scan this notebook for tampering", error)
            return [tampering.Flag(why, 0, True, f"{why}; flagged for the instructor to read by hand"), *edited]

    def _ran(self, submission: collect.Submission, autograded: Path, lab: LabInfo, usage) -> list[str]:
        """What each cell raised or what cut it short, as verdict.execution says it."""
        try:
            done = nbformat.read(autograded, as_version=4)
            return verdict.execution(done, list(lab.points), self.limits, self.cell_timeout, usage)
        except Exception as error:
            return [self._failed(submission, "report how this notebook's cells ran", error)]

    def _failed(self, submission: collect.Submission, step: str, error: Exception) -> str:
        log_failure(self.ws, submission, step, error)
        return verdict.could_not(step, error)

    def _not_graded(self, submission: collect.Submission, why: str, started: float) -> dict:
        return not_graded(self.ws, submission, why, started)
