"""Command line: ``python -m grader COMMAND ...`` (``-h`` lists the commands)."""

from __future__ import annotations

import argparse
import sys

from . import GraderError, grade, reference, release

# Each command module provides add_subcommand(subparsers), which registers its
# parser and sets ``func`` (args -> exit status). Add new commands here.
COMMANDS = (release, reference, grade)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grader", description="Course tooling: build the student release, grade submissions."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except GraderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
