"""What every test module gets, before any of them is imported.

- matplotlib draws without a display (Agg), in this process only: kernels and
  JupyterLab servers the tests start keep their own backend.
- bench/ is on sys.path, so that its scripts and their shared helpers
  (bench/_*.py) import by their bare names, as bench/report.py runs them.
- the fixture `ax`: one fresh matplotlib Axes, closed after the test.
- the fixture `lab1_class`: the lab 1 class several grading modules share, graded once
  (tests/helpers/lab1_class.py).
- the fixture `round_trip_class`: the students of labs 2 and up that the selected tests
  enrolled, graded once (tests/helpers/round_trips.py).

- `--lab NN_slug` (repeatable): only the tests about that lab, whatever their tier:
  those whose id names it (its notebook, browser page, torchrun run, tamper scan, ...)
  and those of a module marked `pytest.mark.lab("NN_slug")` (its fairness tests and
  round trip). `make test-lab LAB=NN_slug` runs them; tests/README.md lists the tiers.

Helpers that tests import (REPO, submissions, a JupyterLab server, a browser)
are in tests/helpers/; the markers are registered in pyproject.toml.
"""
import re
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


@pytest.fixture(scope="session")
def lab1_class(tmp_path_factory):
    from helpers import lab1_class

    return lab1_class.grade(tmp_path_factory.mktemp("lab1_class"))


@pytest.fixture(scope="session")
def round_trip_class(request, tmp_path_factory):
    from helpers import round_trips

    asking = {item.function for item in request.session.items if "round_trip_class" in item.fixturenames}
    return round_trips.grade(tmp_path_factory.mktemp("round_trips"), asking)


def pytest_addoption(parser):
    parser.addoption("--lab", action="append", default=[], metavar="NN_slug",
                     help="run only the tests about this lab (repeatable), e.g. --lab 02_data_parallel")


def about_lab(item, lab: str) -> bool:
    """Whether a collected test is about `lab`: marked lab(lab), or named after it in its id
    (a parameter such as solutions/02_data_parallel/..., or a module test_lab2_...)."""
    if any(lab in marker.args for marker in item.iter_markers("lab")):
        return True
    return lab in item.nodeid or re.search(rf"\btest_lab{int(lab[:2])}_", item.nodeid) is not None


def pytest_collection_modifyitems(config, items):
    labs = config.getoption("--lab")
    if not labs:
        return
    from grader.common.labs import find_labs

    known = {lab.name for lab in find_labs(REPO)}
    unknown = sorted(set(labs) - known)
    if unknown:
        raise pytest.UsageError(f"--lab {', '.join(unknown)}: no such lab in solutions/; "
                                f"the labs are {', '.join(sorted(known))}")
    kept = [item for item in items if any(about_lab(item, lab) for lab in labs)]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept
