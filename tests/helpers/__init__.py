"""What the tests share besides fixtures (those are in tests/conftest.py): REPO, the
checkout's root; graded_labs(), the labs every per-lab rule is held to; needs_jail(),
the skip mark of tests that start the grader's jail; package_files(), a package's modules by
dotted name; and one module per helper:

- submissions: student notebooks built from the release and the solutions, graded
  as nbgrader grades them (`solved`, `graded_only`, `grade_class`, the fairness tests).
- forked_cells: many variants of one notebook run in one process, forked where each
  first differs (the fairness tests' planted mistakes and other correct answers).
- lab_server: a JupyterLab server started with the command a Makefile target runs.
- jails: the grader's jail made in a test's folder (`jail_in`), code run inside it (`run_in_jail`).
- browser: headless Chromium driving JupyterLab (`chromium`, `Notebook`).
- collecting: the course's collect (grader/grading/exchange.py) run as formgrader runs it, in a
  test's folder, its students' uids a mapping of the test's.
- notebooks: notebooks and a gradebook built cell by cell for the grader's unit tests
  (`write_notebook`, `graded_cell`, `tagged_cell`, `gradebook_with_written_answers`).
- kernel_session: a script, not a module: one Jupyter kernel through the launcher's
  notebook scenarios, in a process of its own (tests/test_launch_contexts.py).

Imported as `from helpers.submissions import solved`: pytest puts tests/ on sys.path.
"""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def session_pid() -> int:
    """The process of this test session: pytest's own, or under pytest-xdist the controller that
    started this worker. What the session's workers share is named after it, and it removes that
    at the end (conftest.py's pytest_unconfigure)."""
    return os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()


def graded_labs(root: Path = REPO) -> list:
    """The labs of the course at root that have graded test cells, in lab order (grader.common.labs.Lab).

    Found as the grader finds them (grader.common.labs.find_labs, as grader.grading.workspace.gradable_labs),
    never listed by hand: a test of every lab takes its labs from here, so a new lab folder is
    held to each rule as soon as it is in solutions/.
    """
    from grader.common.labs import find_labs

    return [lab for lab in find_labs(root) if lab.points]


def needs_jail():
    """Skipped where this machine cannot make a jail; never in CI, which must."""
    from grader.jail.host import unavailable  # a probe that starts a jail: only for the tests that need one

    return pytest.mark.skipif(unavailable() is not None and not os.environ.get("CI"),
                              reason=f"no jail here: {unavailable()}")


def make_environment() -> dict[str, str]:
    """This process's environment for a `make` it runs: a parent `make test` passes its own settings
    down through MAKEFLAGS, MFLAGS and MAKELEVEL; dropped."""
    return {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}


def package_files(root: Path, package: str) -> dict[str, Path]:
    """{dotted module name: its file}, for root/package and every package folder in it."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if all((root.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files
