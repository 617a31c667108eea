"""Command line: ``python -m course_tools COMMAND ...`` (``-h`` lists the commands)."""

from __future__ import annotations

import argparse
import sys

from grader.common import command_line

# Each command module provides add_subcommand(subparsers), which registers its parser and
# sets ``func`` (args -> exit status). Add new commands here. They are imported when the
# parser is built; `run` starts on every rank under torchrun, and goes straight to its module.
COMMANDS = ("run", "site", "handout")


def build_parser() -> argparse.ArgumentParser:
    return command_line.build_parser(
        "python -m course_tools", "The course's own tools that grade nothing: run a lab's training, build the "
        "website, write the students' handout.", "course_tools", COMMANDS)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:  # the ranks' start: only what the training needs
        from course_tools import run

        run.main(argv[1:])
        return 0
    return command_line.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
