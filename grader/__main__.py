"""Command line: ``python -m grader COMMAND ...`` (``-h`` lists the commands)."""

from __future__ import annotations

import argparse
import os
import sys

from grader.common import command_line

# Each command module provides add_subcommand(subparsers), which registers its
# parser and sets ``func`` (args -> exit status). Add new commands here. They are
# imported when the parser is built.
COMMANDS = ("release", "reference", "grade", "record", "merge")
#: The commands that grade nothing, now ``python -m course_tools``'s: their old names forward
#: there for one term (under torchrun `run` starts on every rank: no nbgrader is imported first).
MOVED = ("run", "site", "handout")


def build_parser() -> argparse.ArgumentParser:
    return command_line.build_parser(
        "python -m grader", "Course tooling: build the student release, grade submissions.", "grader", COMMANDS,
        epilog="A lab's training (run), the website (site) and the students' handout (handout) are "
               "python -m course_tools COMMAND.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in MOVED:
        return _forward(argv)
    return command_line.run(build_parser(), argv)


def _forward(argv: list[str]) -> int:
    """`python -m grader run|site|handout`, deprecated: say the new name (once, not once a rank), run it.
    The one import of course_tools in grader (tests/test_architecture.py allows no other); it goes with
    the old names in the next term."""
    if os.environ.get("RANK", "0") == "0":
        print(f"`python -m grader {argv[0]}` moved to `python -m course_tools {argv[0]}`; "
              "the old name goes in the next term", file=sys.stderr, flush=True)
    from course_tools.__main__ import main as course_tools_main

    return course_tools_main(argv)


if __name__ == "__main__":
    sys.exit(main())
