"""What the tests share besides fixtures (those are in tests/conftest.py):

- submissions: student notebooks built from the release and the solutions, graded
  as nbgrader grades them (`solved`, `failing_tests`, `grade_class`, the fairness tests).
- lab_server: a JupyterLab server started with the command a Makefile target runs.
- browser: headless Chromium driving JupyterLab (`chromium`, `Notebook`).
- kernel_session: a script, not a module: one Jupyter kernel through the launcher's
  notebook scenarios, in a process of its own (tests/test_launch_contexts.py).

Imported as `from helpers.submissions import solved`: pytest puts tests/ on sys.path.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
