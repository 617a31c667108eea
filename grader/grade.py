"""``python -m grader grade SUBMISSIONS``: a whole class, in one command.

1. collect: each student's notebooks in SUBMISSIONS, a folder or a zip (see
   grader.collect), are copied into nbgrader's submitted/ folder;
2. autograde: ``nbgrader autograde`` per student and lab, its kernel in a
   sandbox (grader.sandbox) with the limits of `Limits`, the hidden tests'
   reference answers held outside it by the judge (grader.judge); several at
   once with ``--jobs``, each against its own copy of the gradebook;
3. verdict: what happened, in plain words (grader.verdict); a test cell whose
   hidden checks never reached the judge gets no points;
4. feedback: ``nbgrader generate_feedback``, hidden tests removed, the
   verdict on top; a page with the verdict where nothing could be graded;
5. the class gradebook gets the submission's scores, status.json its verdict;
6. export: one CSV row per student (grader.export).

Everything goes under the work folder (default grader/work/, git-ignored).
Finished submissions are recorded one by one with a fingerprint of the
notebook and of the lab: a second run grades only what changed, and an
interrupted run picks up where it stopped.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import nbformat

from course import grading

from . import COURSE_ROOT, GraderError, collect, export, gradebook, nbgrader_cli, sandbox, verdict
from .execute import INLINE_BACKEND
from .feedback import VERDICT_ENV
from .judge import Judge, required_checks
from .labs import course_config, display_path, find_labs, read_notebook
from .release import generate_assignment
from .sandboxed import SPEC_ENV

DEFAULT_WORK = COURSE_ROOT / "grader" / "work"
FEEDBACK_TIMEOUT_S = 600


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

    def flags(self, db: Path | None = None) -> list[str]:
        return [f"--CourseDirectory.submitted_directory={self.submitted}",
                f"--CourseDirectory.autograded_directory={self.autograded}",
                f"--CourseDirectory.feedback_directory={self.feedback}",
                f"--CourseDirectory.db_url={gradebook.db_url(db or self.gradebook)}"]

    def load_status(self) -> dict:
        if self.status_file.is_file():
            return json.loads(self.status_file.read_text(encoding="utf-8"))
        return {}

    def save_status(self, status: dict) -> None:
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.status_file)


@dataclass(frozen=True)
class LabInfo:
    """What grading a lab needs to know about it, read once per run."""
    name: str
    points: dict[str, float]          # grade_id -> points of the test cells
    released: dict                    # the student release, to see what a student changed
    required: dict[str, list[str]]    # grade_id -> reference keys its hidden tests check
    version: str                      # changes when the lab or its reference answers do

    @property
    def max_score(self) -> float:
        return sum(self.points.values())


def lab_infos(root: Path) -> dict[str, LabInfo]:
    """The labs that have graded test cells."""
    infos = {}
    for lab in find_labs(root):
        if not lab.points:
            continue
        source = read_notebook(lab.notebook, root)
        reference = root / "grader" / "reference" / f"{lab.name}.json"
        digest = hashlib.sha256(lab.notebook.read_bytes())
        digest.update(reference.read_bytes() if reference.is_file() else b"")
        released = root / "labs" / lab.name / f"{lab.name}.ipynb"
        infos[lab.name] = LabInfo(lab.name, lab.points,
                                  read_notebook(released, root) if released.is_file() else source,
                                  required_checks(source), digest.hexdigest()[:16])
    return infos


def gradable_labs(root: Path) -> dict[str, float]:
    """{lab: total points} for the labs that have graded test cells."""
    return {lab.name: sum(lab.points.values()) for lab in find_labs(root) if lab.points}


def prepare_gradebook(ws: Workspace, root: Path, infos: dict[str, LabInfo]) -> None:
    """The gradebook must know each lab's test cells before autograde can use it.

    nbgrader takes seconds per lab for that, so it is done again only for a lab
    that changed since (labs.json records the versions the gradebook holds).
    """
    marker = ws.root / "labs.json"
    known = json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() and ws.gradebook.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="grader-grade-") as tmp:
        for lab, info in infos.items():
            if known.get(lab) != info.version:
                generate_assignment(lab, root, Path(tmp), gradebook.db_url(ws.gradebook))
                known[lab] = info.version
                marker.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def fingerprint(submission: collect.Submission, lab: LabInfo) -> str:
    return hashlib.sha256(submission.path.read_bytes()).hexdigest()[:16] + "/" + lab.version


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
class Grader:
    """One grading run: the class's labs, limits and shared state; `grade_one` may run in threads."""
    root: Path
    ws: Workspace
    labs: dict[str, LabInfo]
    limits: sandbox.Limits
    cell_timeout: float | None
    sandboxed: bool
    lock: threading.Lock

    @property
    def course_id(self) -> str:
        return course_config(self.root).CourseDirectory.course_id

    def grade_one(self, submission: collect.Submission, slot: int) -> dict:
        """Autograde, judge and give feedback for one student's lab; returns its status entry."""
        started = time.time()
        lab = self.labs[submission.lab]
        why = collect.unreadable(submission.path) or verdict.unmatchable(collect.parse_notebook(submission.path))
        if why:
            return self._not_graded(submission, why, started)
        collect.place(submission, self.ws.submitted)
        uid = sandbox.BASE_UID + slot if self.sandboxed and os.geteuid() == 0 else None
        sandbox.kill_all(uid)  # anything an interrupted earlier run left behind
        jail = Path(tempfile.mkdtemp(prefix="grader-"))  # short: unix socket paths are limited
        try:
            with self.lock:
                private = gradebook.private_copy(self.ws.gradebook, jail / "gradebook.db")
            env = {"MPLBACKEND": INLINE_BACKEND,
                   grading.DIR_ENV: str(jail / "no-reference-here")}
            if self.sandboxed:
                spec = sandbox.prepare(jail, uid, self.limits)
                env[SPEC_ENV] = str(spec.spec_file)
                judge_dir = spec.judge_dir
            else:
                judge_dir = jail
            selector = [submission.lab, f"--student={submission.student}", "--force"]
            limits = [f"--Execute.timeout={self.cell_timeout:g}"] if self.cell_timeout else []
            with Judge(lab.name, self.root / "grader" / "reference", judge_dir / "judge.sock") as judge:
                env[grading.JUDGE_ENV] = str(judge.socket_path)
                code = nbgrader_cli.run_logged(["autograde", *selector, *self.ws.flags(private), *limits], self.root, env,
                                   jail / "autograde.log", self.limits.wall_s)
            leftovers = sandbox.kill_all(uid)
            autograded = self.ws.autograded / submission.student / lab.name / f"{lab.name}.ipynb"
            if code is None:
                graded, problem = False, (f"grading ran past the limit of {self.limits.wall_s:.0f} s "
                                          "for one notebook and was stopped")
            elif code != 0 and "Kernel died" in _tail(jail / "autograde.log"):
                console = _tail(spec.console) if self.sandboxed else ""
                graded, problem = False, "the kernel died while running the notebook" + verdict.why_died(console, self.limits)
            elif code != 0:
                graded, problem = False, f"nbgrader autograde failed: {_last_error(_tail(jail / 'autograde.log'))}"
            else:
                graded, problem = inspect_autograded(autograded)
            if leftovers:  # the jail should never let this happen; say so rather than hide it
                problem = (problem + "; " if problem else "") + f"{len(leftovers)} processes outlived the jail"
            if not graded:
                return self._not_graded(submission, problem, started)
            unverified = judge.unverified(lab.required)
            scores = gradebook.cell_scores(private, self.course_id, lab.name, submission.student)
            unverified = {gid: why for gid, why in unverified.items() if scores.get(gid, 0) > 0}
            gradebook.zero_cells(private, self.course_id, lab.name, submission.student, list(unverified))
            done = nbformat.read(autograded, as_version=4)
            lines = verdict.lines(
                graded=True, score=gradebook.score(private, self.course_id, lab.name, submission.student),
                max_score=lab.max_score,
                tampered=verdict.tampering(collect.parse_notebook(submission.path), lab.released, list(lab.points)),
                ran=verdict.execution(done, list(lab.points), self.limits, self.cell_timeout),
                unverified=unverified)
            env[VERDICT_ENV] = json.dumps(lines)
            feedback = nbgrader_cli.run_logged(["generate_feedback", *selector, *self.ws.flags(private)], self.root, env,
                                   jail / "feedback.log", FEEDBACK_TIMEOUT_S)
            if feedback != 0:
                lines.append(f"no feedback page: {_last_error(_tail(jail / 'feedback.log'))}")
            with self.lock:
                gradebook.merge(private, self.ws.gradebook, self.course_id, lab.name, submission.student)
            return {"graded": True, "verdict": lines, "seconds": round(time.time() - started, 1)}
        finally:
            sandbox.kill_all(uid)
            self._keep_logs(jail, submission)
            shutil.rmtree(jail, ignore_errors=True)

    def _keep_logs(self, jail: Path, submission: collect.Submission) -> None:
        """nbgrader's log and the tail of the kernel's console, for the instructor: logs/<student>/<lab>.log."""
        parts = [(name, _tail(jail / name)) for name in ("autograde.log", "feedback.log", "console.log")]
        text = "".join(f"===== {name}\n{body}\n" for name, body in parts if body)
        if text:
            target = self.ws.root / "logs" / submission.student / f"{submission.lab}.log"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")

    def _not_graded(self, submission: collect.Submission, why: str, started: float) -> dict:
        lines = verdict.lines(graded=False, why_not=why)
        page = self.ws.feedback / submission.student / submission.lab / f"{submission.lab}.html"
        verdict.write_page(page, submission.student, submission.lab, lines)
        return {"graded": False, "verdict": lines, "seconds": round(time.time() - started, 1)}


def grade(submissions: Path, *, labs: list[str] | None = None, work: Path = DEFAULT_WORK,
          root: Path = COURSE_ROOT, csv_path: Path | None = None, limits: sandbox.Limits = sandbox.Limits(),
          cell_timeout: float | None = None, jobs: int = 1, unsafe: bool = False, regrade: bool = False,
          say=print) -> Path:
    """Collect, autograde, give feedback and export; returns the CSV's path."""
    root = Path(root).resolve()
    ws = Workspace(Path(work).resolve())
    ws.root.mkdir(parents=True, exist_ok=True)
    infos = lab_infos(root)
    if labs:
        unknown = [lab for lab in labs if lab not in infos]
        if unknown:
            raise GraderError(f"no graded lab(s) {', '.join(unknown)}; graded labs are: {', '.join(infos)}")
        infos = {lab: infos[lab] for lab in labs}
    why_not = sandbox.unavailable()
    if why_not and not unsafe:
        raise GraderError(f"cannot sandbox the submissions: {why_not}. Fix that, or pass --unsafe to grade "
                          "without a sandbox (only for notebooks you trust)")
    if why_not:
        say(f"WARNING: grading without a sandbox ({why_not})")
    submissions = Path(submissions)
    problems = []
    if submissions.is_file():
        submissions, problems = collect.unpack(submissions, ws.root / "unzipped" / submissions.stem, list(infos))
    prepare_gradebook(ws, root, infos)
    found, more = collect.find(submissions, list(infos))
    for problem in problems + more:
        say(f"skipped {problem}")
    status = ws.load_status()
    todo = []
    for submission in found:
        entry = status.get(submission.student, {}).get(submission.lab)
        if regrade or not entry or entry.get("fingerprint") != fingerprint(submission, infos[submission.lab]):
            todo.append(submission)
    if len(todo) < len(found):
        say(f"{len(found) - len(todo)} submissions unchanged since they were graded: kept (--regrade grades them again)")
    grader = Grader(root, ws, infos, limits, cell_timeout, not why_not, threading.Lock())
    slots: queue.Queue[int] = queue.Queue()
    for slot in range(jobs):
        slots.put(slot)
    done = iter(range(1, len(todo) + 1))

    def run(submission: collect.Submission) -> None:
        slot = slots.get()
        try:
            entry = grader.grade_one(submission, slot)
        finally:
            slots.put(slot)
        entry["fingerprint"] = fingerprint(submission, infos[submission.lab])
        with grader.lock:
            status.setdefault(submission.student, {})[submission.lab] = entry
            ws.save_status(status)  # after each one: an interrupted run keeps what it graded
            say(f"[{next(done)}/{len(todo)}] {submission.student} {submission.lab}: "
                f"{verdict.as_text(entry['verdict'])} ({entry['seconds']:.0f} s)")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(run, s) for s in todo]:
            future.result()
    target = Path(csv_path) if csv_path else ws.root / "grades.csv"
    students = sorted({s.student for s in found} | set(status))
    export.write_csv(target, students, {lab: info.max_score for lab, info in infos.items()}, status,
                     gradebook.db_url(ws.gradebook), root)
    say(f"wrote {display_path(target, root)}; feedback in {display_path(ws.feedback, root)}/")
    return target


def add_subcommand(subparsers) -> None:
    defaults = sandbox.Limits()
    p = subparsers.add_parser(
        "grade", help="collect, autograde, give feedback and export grades for a class's submissions",
        description="Grade SUBMISSIONS (a folder, or a zip, of <student>/<lab>.ipynb or "
                    "<student>/<lab>/<lab>.ipynb): autograde each notebook in a sandbox, write feedback "
                    "HTML without hidden tests, and export one CSV row per student.")
    p.add_argument("submissions", type=Path, help="folder (or zip) with one subfolder per student")
    p.add_argument("--lab", dest="labs", action="append", metavar="LAB",
                   help="grade only this lab (repeatable; default: every graded lab)")
    p.add_argument("--work", type=Path, default=DEFAULT_WORK,
                   help="where the gradebook and nbgrader's folders go (default: grader/work)")
    p.add_argument("--csv", type=Path, help="where to write the grades (default: WORK/grades.csv)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded at once (default 1)")
    p.add_argument("--timeout", type=float, default=defaults.wall_s,
                   help=f"seconds one notebook may take, all cells together (default {defaults.wall_s:.0f})")
    p.add_argument("--cell-timeout", type=float,
                   help="seconds one cell may run before it is interrupted (default: nbgrader_config.py's)")
    p.add_argument("--memory-gb", type=float, default=defaults.memory_bytes / 2**30,
                   help=f"memory per process, GiB (default {defaults.memory_bytes / 2**30:g})")
    p.add_argument("--max-processes", type=int, default=defaults.processes,
                   help=f"processes and threads one submission may run (default {defaults.processes})")
    p.add_argument("--regrade", action="store_true", help="grade again what was graded before, even unchanged")
    p.add_argument("--unsafe", action="store_true",
                   help="grade without the sandbox when it is unavailable (only for notebooks you trust)")
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise GraderError(f"--jobs must be at least 1, not {args.jobs}")
    limits = replace(sandbox.Limits(), wall_s=args.timeout, memory_bytes=int(args.memory_gb * 2**30),
                     processes=args.max_processes)
    grade(args.submissions, labs=args.labs, work=args.work, root=args.root, csv_path=args.csv, limits=limits,
          cell_timeout=args.cell_timeout, jobs=args.jobs, unsafe=args.unsafe, regrade=args.regrade)
    return 0
