"""``python -m grader grade SUBMISSIONS``: a whole class, in one command.

1. collect: each student's notebooks in SUBMISSIONS, a folder or a zip (see
   grader.grading.collect), are copied into nbgrader's submitted/ folder;
2. record the judge's reference values for this run: each lab's solution,
   executed outside the jail as autograde executes it, with a seed drawn for
   the run; the hidden tests draw their inputs from it (grader.judge_values:
   ``--judge-values`` reuses an earlier run's, for a class graded in batches);
3. grade each student's lab in a jail (grader.grading.submission): autograde,
   verdict, feedback page, scores into the class gradebook; several at once
   with ``--jobs``, recordings included: a lab's students start as soon as its
   own recording is done;
4. export: one CSV row per student (grader.grading.export), the written answers' points
   apart: given in formgrader, or pending until then (a later run exports them).

A step that fails for one submission (collecting it, reading it, grading,
scanning, merging or exporting it) is that submission's verdict alone, and the
class goes on (grader.grading.collect, grader.grading.submission, grader.grading.export); only what
concerns the whole run stops it (no jail, a lab whose recording failed, a
folder of submissions that cannot be read).

Everything goes under the work folder (default grader/work/, git-ignored), which is the
grading account's alone: 0700 folders, 0600 files (grader.grading.workspace.privately).
Finished submissions are recorded one by one in status.json with a
fingerprint of the notebook and of the lab: a second run grades only what
changed, and an interrupted run picks up where it stopped.
"""
from __future__ import annotations

import argparse
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from . import COURSE_ROOT, GraderError
from .common.labs import display_path, find_labs
from .feedback.worker import FeedbackWorker
from .grading import collect, export, receipts, shards, unzip, verdict
from .grading.autograde_worker import AutogradeWorker
from .grading.logs import log_failure, not_graded
from .grading.submission import SubmissionGrader
from .grading.workspace import Workspace, fingerprint, lab_infos, prepare_gradebook, privately
from .jail import bwrap
from .jail.host import unavailable as jail_unavailable
from .judge.spawner import JudgeSpawner
from .judge_values import record_judged_values

DEFAULT_WORK = COURSE_ROOT / "grader" / "work"
FEEDBACK_TIMEOUT_S = 600
DEFAULT_LIMITS = bwrap.Limits()  # frozen: one instance serves every call


@privately
def grade(submissions: Path, *, labs: list[str] | None = None, work: Path = DEFAULT_WORK,
          root: Path = COURSE_ROOT, csv_path: Path | None = None, limits: bwrap.Limits = DEFAULT_LIMITS,
          cell_timeout: float | None = None, jobs: int = 1, unsafe: bool = False, regrade: bool = False,
          judge_values: Path | None = None, shard: tuple[int, int] | None = None, whole_term: bool = False,
          say=print) -> Path:
    """Collect, autograde, give feedback and export (the module's four steps); returns the CSV's path.
    The CSV reports the labs named in `labs`, or every graded lab with `whole_term`; else the labs
    handed in (grader.grading.export.reported_labs).

    judge_values: an earlier run's judge/ folder, whose recordings are reused where they can be
    (grader.judge_values); shard: (K, N), grade only the K-th of N shards of the class
    (grader.grading.shards)."""
    root = Path(root).resolve()
    if judge_values is not None and not Path(judge_values).is_dir():
        raise GraderError(f"--judge-values {judge_values}: no such folder; give an earlier run's "
                          "WORK/judge folder, or leave the option out to record the values for this run")
    ws = Workspace(Path(work).resolve())
    ws.make_private(say)
    infos = lab_infos(root, labs)
    # nbgrader learns each lab's test cells (seconds a lab) while the jail is probed and the
    # judge's values are recorded: a student's grading waits for it, the export too.
    with ThreadPoolExecutor(max_workers=1) as preparing:
        gradebook_ready = preparing.submit(prepare_gradebook, ws, root, infos)
        found, uncollected, why_not = _collect(ws, Path(submissions), infos, shard, unsafe, say)      # 1. collect
        status = ws.load_status()
        todo = _changed(found, status, infos, regrade, say)
        _record_and_grade(root, ws, infos, todo, status, gradebook_ready, jobs=jobs, limits=limits,  # 2. and 3.
                          cell_timeout=cell_timeout, jailed=not why_not, judge_values=judge_values, say=say)
        for submission in found:  # the receipts of a resubmission change even where its notebook did not
            receipts.keep(submission, ws.feedback / submission.student / submission.lab)
        gradebook_ready.result()
        return _export(ws, root, infos, status, found, uncollected, csv_path, shard,           # 4. export
                       every_lab=bool(labs) or whole_term, say=say)


def _collect(ws: Workspace, submissions: Path, infos: dict, shard: tuple[int, int] | None, unsafe: bool,
             say) -> tuple[list[collect.Submission], dict[str, dict], str | None]:
    """Step 1: the submissions found (unzipped first, from a zip), those of the shard alone; the labs that
    could not be collected ({student: {lab: status entry}}); and why no jail can be made (None: it can),
    which stops the run unless `unsafe`."""
    problems = []
    if submissions.is_file():
        submissions, problems = unzip.unpack(submissions, ws.root / "unzipped" / submissions.stem, list(infos))
    why_not = jail_unavailable()
    if why_not and not unsafe:
        raise GraderError(f"cannot jail the submissions: {why_not}. Fix that, or pass --unsafe to grade "
                          "without a jail (only for notebooks you trust)")
    if why_not:
        say(f"WARNING: grading without a jail ({why_not})")
    found, more = collect.find(submissions, list(infos))
    for problem in problems + more:
        say(f"skipped {problem}")
    uncollected = _uncollected(problems + more, found, infos)
    if shard:
        mine = shards.students_of(shard, [s.student for s in found] + list(uncollected))
        found = [s for s in found if s.student in mine]
        uncollected = {student: labs_ for student, labs_ in uncollected.items() if student in mine}
        say(f"shard {shard[0]}/{shard[1]}: {len(mine)} students, {len(found)} submissions")
    return found, uncollected, why_not


def _export(ws: Workspace, root: Path, infos: dict, status: dict, found: list[collect.Submission],
            uncollected: dict[str, dict], csv_path: Path | None, shard: tuple[int, int] | None, *, every_lab: bool,
            say) -> Path:
    """Step 4: the class's CSV (and the shard's record of this run, for `merge`); returns the CSV's path."""
    target = Path(csv_path) if csv_path else ws.root / "grades.csv"
    shards.write_run(ws, list(infos), shard, uncollected, every_lab)
    export.write_class(target, ws.gradebook, root, infos, status, uncollected, {s.student for s in found},
                       every=every_lab)
    say(f"wrote {display_path(target, root)}; feedback in {display_path(ws.feedback, root)}/")
    return target


def _changed(found: list[collect.Submission], status: dict, infos: dict, regrade: bool,
             say) -> list[collect.Submission]:
    """What to grade: the submissions not graded before as they are now (all of them with `regrade`)."""
    todo = []
    for submission in found:
        entry = status.get(submission.student, {}).get(submission.lab)
        if regrade or not entry or entry.get("fingerprint") != _fingerprint(submission, infos):
            todo.append(submission)
    if len(todo) < len(found):
        say(f"{len(found) - len(todo)} submissions unchanged since they were graded: kept "
            "(--regrade grades them again)")
    return todo


def _record_and_grade(root: Path, ws: Workspace, infos: dict, todo: list[collect.Submission], status: dict,
                      gradebook_ready, *, jobs: int, limits: bwrap.Limits, cell_timeout: float | None, jailed: bool,
                      judge_values: Path | None, say) -> None:
    """Steps 2 and 3: each lab's judge values recorded, then its students graded, `jobs` at a time, each slot
    with its warm workers; status.json written after each submission."""
    jobs = min(jobs, len(todo))  # no idle slots, and no renderer when nothing is to be graded
    logs = ws.root / "logs"
    autograde = {slot: AutogradeWorker(root, logs / f"autograde-{slot}.log") for slot in range(jobs)}
    feedback = {slot: FeedbackWorker(root, FEEDBACK_TIMEOUT_S, logs / f"feedback-{slot}.log") for slot in range(jobs)}
    judges = JudgeSpawner(root, logs / "judges.log")  # one for all slots: a fork takes milliseconds
    workers = [*autograde.values(), *feedback.values(), *([judges] if jobs else [])]
    for worker in workers:
        worker.start()
    judged: dict[str, tuple[Path, int]] = {}  # filled by each lab's recording before its students start
    grader = SubmissionGrader(root, ws, infos, limits, cell_timeout, jailed, threading.Lock(),
                              autograde, feedback, judged, judges=judges)
    slots: queue.Queue[int] = queue.Queue()
    for slot in range(jobs):
        slots.put(slot)
    done = iter(range(1, len(todo) + 1))
    solutions = {x.name: x for x in find_labs(root)}

    def record(lab: str) -> None:
        if infos[lab].required:  # a lab whose tests check no reference value has none to record
            judged[lab] = record_judged_values(ws, root, solutions[lab], say, reuse=judge_values)

    def run(submission: collect.Submission) -> None:
        recordings[submission.lab].result()  # this lab's values are in `judged` (or its recording failed)
        gradebook_ready.result()
        slot = slots.get()
        started = time.time()
        try:
            entry = grader.grade(submission, slot)
        except Exception as error:  # this student's alone: the class goes on (grader.grading.submission)
            log_failure(ws, submission, "grade this notebook", error)
            entry = not_graded(ws, submission, verdict.could_not("grade this notebook", error), started)
        finally:
            slots.put(slot)
        if mark := _fingerprint(submission, infos):
            entry["fingerprint"] = mark  # none: the next run grades it again
        with grader.lock:
            status.setdefault(submission.student, {})[submission.lab] = entry
            ws.save_status(status)  # after each one: an interrupted run keeps what it graded
            say(f"[{next(done)}/{len(todo)}] {submission.student} {submission.lab}: "
                f"{verdict.as_text(entry['verdict'])}{_pending(entry)} ({entry['seconds']:.0f} s)")

    # The labs' recordings go first, `jobs` at a time, in the pool that then grades: a lab's
    # students start as soon as its own recording is done, while the others' go on.
    pool = ThreadPoolExecutor(max_workers=max(jobs, 1))
    try:
        recordings = {lab: pool.submit(record, lab) for lab in sorted({s.lab for s in todo})}
        for future in [*recordings.values(), *[pool.submit(run, s) for s in todo]]:
            future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # after a failure: nothing more starts
        for worker in workers:
            worker.close()


def _pending(entry: dict) -> str:
    pending = entry.get("pending manual")
    return f"; {pending:g} points await manual grading in formgrader" if pending else ""


def _fingerprint(submission: collect.Submission, infos: dict) -> str | None:
    """The submission's fingerprint; None where its file cannot be read (grading it then says why)."""
    try:
        return fingerprint(submission, infos[submission.lab])
    except OSError:
        return None


def _uncollected(problems: list[str], found: list[collect.Submission], infos: dict) -> dict[str, dict]:
    """{student: {lab: status entry}} of the labs that could not be collected (damaged in the zip, too
    big), for this run's CSV: "not graded" and why, rather than "no submission" or an earlier grade."""
    handed_in = {(s.student, s.lab) for s in found}
    out: dict[str, dict] = {}
    for problem in problems:
        if isinstance(problem, collect.Problem) and problem.lab in infos \
                and (problem.student, problem.lab) not in handed_in:
            out.setdefault(problem.student, {})[problem.lab] = {
                "graded": False, "verdict": verdict.lines(graded=False, why_not=problem.why)}
    return out


def _shard(text: str) -> tuple[int, int]:
    try:
        return shards.parse(text)
    except GraderError as error:        # argparse says it with the usage line
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--shard {text!r}: ")) from None


def add_subcommand(subparsers) -> None:
    defaults = DEFAULT_LIMITS
    p = subparsers.add_parser(
        "grade", help="collect, autograde, give feedback and export grades for a class's submissions",
        description="Grade SUBMISSIONS (a folder, or a zip, of <student>/<lab>.ipynb or "
                    "<student>/<lab>/<lab>.ipynb): autograde each notebook in a jail, write feedback "
                    "HTML without hidden tests, and export one CSV row per student.")
    p.add_argument("submissions", type=Path, help="folder (or zip) with one subfolder per student")
    p.add_argument("--lab", dest="labs", action="append", metavar="LAB",
                   help="grade only this lab (repeatable; default: every graded lab handed in; the CSV reports "
                        "the labs named, or those handed in)")
    p.add_argument("--whole-term", action="store_true",
                   help="report every graded lab in the CSV, those nobody handed in yet too")
    p.add_argument("--work", type=Path, default=DEFAULT_WORK,
                   help="where the gradebook and nbgrader's folders go (default: grader/work)")
    p.add_argument("--csv", type=Path, help="where to write the grades (default: WORK/grades.csv)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded at once (default 1)")
    p.add_argument("--timeout", type=float, default=defaults.wall_s,
                   help=f"seconds one notebook may take, all cells together (default {defaults.wall_s:.0f})")
    p.add_argument("--cell-timeout", type=float,
                   help="seconds one cell may run before it is interrupted (default: nbgrader_config.py's)")
    p.add_argument("--memory-gb", type=float, default=defaults.memory_bytes / 2**30,
                   help=f"memory of one submission's jail, all its processes together, GiB "
                        f"(default {defaults.memory_bytes / 2**30:g}; per process where no cgroup can be made)")
    p.add_argument("--max-processes", type=int, default=defaults.processes,
                   help=f"processes and threads one submission may run (default {defaults.processes})")
    p.add_argument("--cpus", type=float, default=defaults.cpus,
                   help=f"CPU time of one submission's jail, in cores (default {defaults.cpus:g}: this machine's)")
    p.add_argument("--regrade", action="store_true", help="grade again what was graded before, even unchanged")
    p.add_argument("--judge-values", type=Path, metavar="FOLDER",
                   help="an earlier run's WORK/judge folder: reuse its labs' reference values and seeds, "
                        "where the labs and the course are unchanged, to grade one class in batches "
                        "(default: record them for this run)")
    p.add_argument("--shard", type=_shard, metavar="K/N",
                   help="grade only the K-th of N shards of the class (every N-th student by name, from the K-th), "
                        "into its own --work folder; `python -m grader merge` joins the N (give them all the "
                        "same --judge-values, recorded by `python -m grader record`)")
    p.add_argument("--unsafe", action="store_true",
                   help="grade without the jail when it is unavailable (only for notebooks you trust)")
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise GraderError(f"--jobs must be at least 1, not {args.jobs}")
    if args.cpus <= 0:
        raise GraderError(f"--cpus must be more than 0, not {args.cpus:g}")
    limits = replace(bwrap.Limits(), wall_s=args.timeout, memory_bytes=int(args.memory_gb * 2**30),
                     processes=args.max_processes, cpus=args.cpus)
    grade(args.submissions, labs=args.labs, work=args.work, root=args.root, csv_path=args.csv, limits=limits,
          cell_timeout=args.cell_timeout, jobs=args.jobs, unsafe=args.unsafe, regrade=args.regrade,
          judge_values=args.judge_values, shard=args.shard, whole_term=args.whole_term)
    return 0
