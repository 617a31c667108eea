"""Course tooling around nbgrader: build the student release, grade submissions.

Run it as ``python -m grader COMMAND`` from anywhere; see ``python -m grader -h``.
Each command lives in its own module that provides ``add_subcommand(subparsers)``
and is listed in ``grader.__main__.COMMANDS``.

Layout (see ``nbgrader_config.py``): ``solutions/<lab>/<lab>.ipynb`` are the
instructor's nbgrader source notebooks, ``labs/<lab>/<lab>.ipynb`` the generated
student release, and ``grader/work/`` (git-ignored) nbgrader's grading work area.
"""

from pathlib import Path

#: The repository root, i.e. the nbgrader course root.
COURSE_ROOT = Path(__file__).resolve().parent.parent


class GraderError(Exception):
    """A user-facing error: the CLI prints the message and exits with status 1."""
