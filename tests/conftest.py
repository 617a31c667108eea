"""What every test module gets, before any of them is imported.

- matplotlib draws without a display (Agg), in this process only: kernels and
  JupyterLab servers the tests start keep their own backend.
- bench/ is on sys.path, so that its scripts and their shared helpers
  (bench/_*.py) import by their bare names, as bench/report.py runs them.
- the fixture `ax`: one fresh matplotlib Axes, closed after the test.

Helpers that tests import (REPO, submissions, a JupyterLab server, a browser)
are in tests/helpers/; the markers are registered in pyproject.toml.
"""
import sys

import matplotlib
import pytest

from helpers import REPO

matplotlib.use("Agg")

sys.path.insert(0, str(REPO / "bench"))


@pytest.fixture
def ax():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)
