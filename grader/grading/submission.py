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
   be graded;
4. the private gradebook's scores are merged into the class gradebook.

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
import traceback
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course import grading
from grader.common.execute import INLINE_BACKEND
from grader.common.labs import course_config
from grader.common.quoting import quoted
from grader.feedback.worker import FeedbackWorker
from grader.jail import bwrap
from grader.jail.host import Jail
from grader.jail.kernel_manager import OLD_SPEC_ENV, SPEC_ENV
from grader.judge import lab_cells, tampering, wire
from grader.judge.client import STRANGERS_FILE, Judge
from grader.judge.judged_execute import CELL_FILE_ENV
from grader.judge.spawner import JudgeSpawner

from . import collect, gradebook, verdict
from .autograde_worker import AutogradeWorker
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
        """Autograde, judge and give feedback for one student's lab; returns its status entry."""
        started = time.time()
        lab = self.labs[submission.lab]
        errors_log(self.ws, submission).unlink(missing_ok=True)  # an earlier run's
        try:
            why = collect.unreadable(submission.path)
            submitted = None if why else collect.parse_notebook(submission.path)
            why = why or verdict.unmatchable(submitted)
            restored = [] if why else collect.place(submission, submitted, self.ws.submitted, lab.released,
                                                    lab.with_hidden_tests)
        except Exception as error:  # e.g. RecursionError: JSON nested deeper than the parser goes
            why = self._failed(submission, "read this notebook", error)
        if why:
            return self._not_graded(submission, why, started)
        jail_folder = Path(tempfile.mkdtemp(prefix="grader-"))  # short: unix socket paths are limited
        jail = usage = None  # the submission's Jail (grader.jail.host), and what it used
        try:
            with self.lock:
                private = gradebook.private_copy(self.ws.gradebook, jail_folder / "gradebook.db")
            env = {"MPLBACKEND": INLINE_BACKEND,
                   grading.DIR_ENV: bwrap.NO_REFERENCE_DIR}
            if self.jailed:
                jail = Jail(jail_folder, self.limits)
                spec = jail.spec
                # Its old name too, for an nbgrader_config.py of before the rename, which would otherwise
                # not ask for the jail at all (deprecated; goes with the old name).
                env[SPEC_ENV] = env[OLD_SPEC_ENV] = str(spec.spec_file)
                judge_dir = spec.judge_dir
            else:
                judge_dir = jail_folder
            selector = [submission.lab, f"--student={submission.student}", "--force"]
            limits = [f"--Execute.timeout={self.cell_timeout:g}"] if self.cell_timeout else []
            # nbclient's 4 s can pass on a loaded grading machine while a flood's last prints are coming
            limits.append(f"--Execute.iopub_timeout={IOPUB_TIMEOUT_S}")
            values, seed = self.judged.get(lab.name, (None, 0))
            # As root, the judge drops to a uid of the jail's own and answers the jail's uid alone.
            with Judge(lab.name, values, seed, lab.required, judge_dir, jail_folder, jail.judge_uid if jail else None,
                       spawner=self.judges, peer_uid=jail.uid if jail else None) if values else nullcontext() as judge:
                if judge:
                    env[grading.JUDGE_ENV] = str(judge.socket_path)
                    env[CELL_FILE_ENV] = str(judge.cell_file)
                    env[wire.WIRE_FILE_ENV] = str(jail_folder / wire.WIRE_FILE)
                code = self.autograde[slot].run([*selector, *self.ws.flags(private), *limits], env,
                                                jail_folder / "autograde.log", self.limits.wall_s)
            leftovers = jail.stop() if jail else []
            usage = jail.usage() if jail else None
            autograded = self.ws.autograded / submission.student / lab.name / f"{lab.name}.ipynb"
            if code is None:
                graded, problem = False, (f"grading ran past the limit of {self.limits.wall_s:.0f} s "
                                          "for one notebook and was stopped")
            elif code != 0 and ("Kernel died" in (log := _tail(jail_folder / "autograde.log"))
                                or usage and usage.oom_killed):
                console = _tail(spec.console) if self.jailed else ""
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
            # Before the points: a line that can rewrite a check withholds the points of the test cells after it.
            tampered = self._tampering(submission, submitted, lab)
            try:  # the points: what the grade rests on, so no grade without them
                found, wire_flags = wire.judged(judge, jail_folder) if judge else ({}, [])  # the judge's, the wire's
                if judge and (note := judge.strangers_note()):   # for the instructor's log
                    (jail_folder / STRANGERS_FILE).write_text(note, encoding="utf-8")
                scores = gradebook.cell_scores(private, self.course_id, lab.name, submission.student)
                unverified = {gid: f.why for gid, f in found.items() if not f.passed and scores.get(gid, 0) > 0}
                first = min((f for f in tampered if getattr(f, "withholds", False)), key=lambda f: f.index,
                            default=None)
                withheld = [gid for gid in lab_cells.tests_after(submitted, list(lab.points), first.index)
                            if scores.get(gid, 0) > 0 and gid not in unverified] if first else []
                held = verdict.withheld_line(sum(scores[gid] for gid in withheld), withheld, first and first.said)
                gradebook.zero_cells(private, self.course_id, lab.name, submission.student, [*unverified, *withheld])
                judged_failures = {gid: f.detail for gid, f in found.items() if f.detail}
                score = gradebook.score(private, self.course_id, lab.name, submission.student)
                written = gradebook.written_score(private, self.course_id, lab.name, submission.student, lab.written)
                score -= written.given  # the autograded points alone: the written ones are reported apart
            except Exception as error:
                return self._not_graded(submission, self._failed(submission, "score this notebook", error), started)
            lines = verdict.lines(graded=True, score=score, max_score=lab.max_score,
                                  tampered=tampered + restored + wire_flags,
                                  ran=self._ran(submission, autograded, lab, usage),
                                  unverified=unverified, judged=judged_failures, withheld=held)
            # The page is written now, the CSV later from the class gradebook (grader.grading.export): there the
            # written answers' line says what formgrader has given by then.
            said = verdict.written_line(written.given, written.pending, written.max_score, written.unanswered)
            shown = verdict.with_written(lines, said)
            try:
                problem = self.feedback[slot].write(autograded, feedback_page(self.ws, submission),
                                                    gradebook.db_url(private), submission.student, lab.name, shown,
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
            try:
                with self.lock:
                    gradebook.merge(private, self.ws.gradebook, self.course_id, lab.name, submission.student)
            except Exception as error:  # the class gradebook may hold another grade: the export must not show it
                return self._not_graded(
                    submission, self._failed(submission, "merge this notebook's grade into the class gradebook", error),
                    started)
            return {"graded": True, "verdict": lines, "seconds": round(time.time() - started, 1),
                    **({"pending manual": written.pending} if written.pending else {})}
        finally:
            if jail:
                jail.close()
            self._keep_logs(jail_folder, submission)
            shutil.rmtree(jail_folder, ignore_errors=True)

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

    def _keep_logs(self, jail_folder: Path, submission: collect.Submission) -> None:
        """nbgrader's log and the tail of the kernel's console, for the instructor: logs/<student>/<lab>.log."""
        try:
            parts = [(name, _tail(jail_folder / name))
                     for name in ("autograde.log", "console.log", wire.REPORT_FILE, STRANGERS_FILE)]
            text = "".join(f"===== {name}\n{body}\n" for name, body in parts if body)
            if text:
                target = self.ws.root / "logs" / submission.student / f"{submission.lab}.log"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
        except OSError as error:  # the grade stands without its log
            log_failure(self.ws, submission, "keep the logs of this notebook", error)

    def _not_graded(self, submission: collect.Submission, why: str, started: float) -> dict:
        return not_graded(self.ws, submission, why, started)
