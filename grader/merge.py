"""``python -m grader merge SHARD... --work FOLDER``: a class graded in shards, joined.

The work folders of ``python -m grader grade --shard K/N`` runs (all N of one split, graded with
the same ``--judge-values``) become one class's work folder: its gradebook, status, autograded
notebooks, feedback pages and CSV, as one machine's run would have written them
(grader.grading.shards says what is refused).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from . import COURSE_ROOT
from .grading import shards


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "merge", help="join the work folders of a class graded in shards (grade --shard K/N)",
        description="Merge the work folders of `python -m grader grade --shard K/N` runs into one class's "
                    "gradebook, feedback and CSV.")
    p.add_argument("shards", nargs="+", type=Path, metavar="SHARD", help="a shard's --work folder (all N of them)")
    p.add_argument("--work", type=Path, required=True, help="the class's work folder to write (a new folder)")
    p.add_argument("--csv", type=Path, help="where to write the grades (default: WORK/grades.csv)")
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    shards.merge(args.shards, args.work, Path(args.root).resolve(), args.csv)
    return 0
