"""The command lines `python -m grader` and `python -m course_tools` share: a parser built from the
command modules of a package, and a run that turns a GraderError into its message and status 1.

Each command module provides ``add_subcommand(subparsers)``, which registers its parser and sets
``func`` (args -> exit status). The modules are imported when the parser is built.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from grader import GraderError


def build_parser(prog: str, description: str, package: str, commands: tuple[str, ...],
                 epilog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in commands:
        importlib.import_module(f"{package}.{name}").add_subcommand(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """Parse argv and run its command: its exit status, or 1 with `error: ...` for a GraderError."""
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except GraderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
