"""What the tests share besides fixtures (those are in tests/conftest.py): REPO, the
checkout's root; needs_sandbox(), the skip mark of tests that start the grader's jail;
and one module per helper:

- submissions: student notebooks built from the release and the solutions, graded
  as nbgrader grades them (`solved`, `failing_tests`, `grade_class`, the fairness tests).
- lab_server: a JupyterLab server started with the command a Makefile target runs.
- browser: headless Chromium driving JupyterLab (`chromium`, `Notebook`).
- kernel_session: a script, not a module: one Jupyter kernel through the launcher's
  notebook scenarios, in a process of its own (tests/test_launch_contexts.py).

Imported as `from helpers.submissions import solved`: pytest puts tests/ on sys.path.
"""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def needs_sandbox():
    """Skipped where this machine cannot make a jail; never in CI, which must."""
    from grader.jail import unavailable  # a probe that starts a jail: only for the tests that need one

    return pytest.mark.skipif(unavailable() is not None and not os.environ.get("CI"),
                              reason=f"no sandbox here: {unavailable()}")
