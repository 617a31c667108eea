"""``python -m grader record --work FOLDER``: the judge's values of a grading, recorded once.

Each lab's solution runs as a grading run runs it (grader.judge_values), on a seed drawn now,
into FOLDER/judge. Grading a class in shards on many machines, give every shard that folder
(``python -m grader grade --shard K/N --judge-values FOLDER/judge``): the shards' hidden tests then
draw the same inputs and are judged against the same values, as one machine's run would be
(grader.grading.shards). FOLDER and what is recorded in it are this account's alone (0700, 0600): on a
file system the shards' nodes share, keep FOLDER where only the grading account may read.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from . import COURSE_ROOT
from .common.labs import find_labs
from .grading.workspace import Workspace, lab_infos, privately
from .judge_values import record_judged_values


@privately
def record(work: Path, labs: list[str] | None = None, root: Path = COURSE_ROOT, say=print) -> Path:
    """Record the judge's values of `labs` (default: every lab whose tests check some) into work/judge."""
    root = Path(root).resolve()
    chosen = [lab for lab, info in lab_infos(root, labs).items() if info.required]
    ws = Workspace(Path(work).resolve())
    ws.make_private(say)
    solutions = {lab.name: lab for lab in find_labs(root)}
    for lab in chosen:
        record_judged_values(ws, root, solutions[lab], say)
    say(f"recorded {len(chosen)} lab(s) into {ws.root / 'judge'}: give it to every shard as --judge-values")
    return ws.root / "judge"


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "record", help="record the judge's values once, for the shards of a class graded on many machines",
        description="Run each lab's solution on a seed drawn now and keep its values in WORK/judge, for "
                    "`python -m grader grade --shard K/N --judge-values WORK/judge` on every shard.")
    p.add_argument("--work", type=Path, required=True, help="folder to record into (WORK/judge)")
    p.add_argument("--lab", dest="labs", action="append", metavar="LAB",
                   help="this lab only (repeatable; default: every lab whose hidden tests check values)")
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    record(args.work, args.labs, args.root)
    return 0
