"""Command line: ``python -m course_tools COMMAND ...`` (``-h`` lists the commands)."""

from __future__ import annotations

import argparse
import importlib
import sys

from grader import GraderError

# Each command module provides add_subcommand(subparsers), which registers its parser and
# sets ``func`` (args -> exit status). Add new commands here. They are imported when the
# parser is built; `run` starts on every rank under torchrun, and goes straight to its module.
COMMANDS = ("run", "site", "handout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_tools",
        description="The course's own tools that grade nothing: run a lab's training, build the website, "
                    "write the students' handout.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"course_tools.{name}").add_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:  # the ranks' start: only what the training needs
        from course_tools import run

        run.main(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except GraderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
