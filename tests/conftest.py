"""What every test module gets, before any of them is imported.

- matplotlib draws without a display (Agg), in this process only: kernels and
  JupyterLab servers the tests start keep their own backend.
- bench/ is on sys.path, so that its scripts and their shared helpers
  (bench/_*.py) import by their bare names, as bench/report.py runs them.
- OMP_WAIT_POLICY=PASSIVE (grader.common.cores) in the environment of everything the tests start.
- the fixture `ax`: one fresh matplotlib Axes, closed after the test.
- the fixture `lab1_class`: the lab 1 class several grading modules share, graded once
  (tests/helpers/lab1_class.py).
- the fixture `round_trip_class`: the students of labs 2 and up that the selected tests
  enrolled, graded once (tests/helpers/round_trips.py).

- under pytest-xdist (`make test` runs two workers, `-n 2 --dist loadscope`): each module
  runs on one worker (module-scoped servers and browsers start once), the tests that share
  a class graded once a session (`lab1_class`, `round_trip_class`) on one worker together
  (`pytest_xdist_make_scheduler`; the workers name those tests in a file, since the
  controller collects none), and the tiers that launch ranks or grade go first, so that
  the unit tests fill the end (`pytest_collection_modifyitems`).

- `--timing-report PATH`: where the run's time went, written there and printed at the end
  (tests/helpers/timing_report.py; `make test` asks for test-artifacts/timings.md).

- `--lab NN_slug` (repeatable): only the tests about that lab, whatever their tier:
  those whose id names it (its notebook, browser page, torchrun run, tamper scan, ...)
  and those of a module marked `pytest.mark.lab("NN_slug")` (its fairness tests and
  round trip). `make test-lab LAB=NN_slug` runs them; tests/README.md lists the tiers.

Helpers that tests import (REPO, submissions, a JupyterLab server, a browser)
are in tests/helpers/; the markers are registered in pyproject.toml.
"""
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import matplotlib
import pytest

from grader.common.cores import SHARED_CORES_ENV
from helpers import REPO, session_pid

matplotlib.use("Agg")

# Every kernel, rank and browser a test starts shares the 2 cores with the other worker's: their
# threads sleep while they wait (grader/common/cores.py has what spinning cost), as graded ones do.
for _name, _value in SHARED_CORES_ENV.items():
    os.environ.setdefault(_name, _value)

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


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # the session's own process, not an xdist worker
        from helpers.submissions import judge_values_folder

        shutil.rmtree(judge_values_folder(session_pid()), ignore_errors=True)
        _sharing_file(session_pid()).unlink(missing_ok=True)


def pytest_addoption(parser):
    parser.addoption("--lab", action="append", default=[], metavar="NN_slug",
                     help="run only the tests about this lab (repeatable), e.g. --lab 02_data_parallel")
    parser.addoption("--timing-report", type=Path, metavar="PATH",
                     help="write where the run's time went (tiers, slowest files and tests) to PATH, and print it")


def pytest_configure(config):
    report = config.getoption("--timing-report")
    if report and not hasattr(config, "workerinput"):  # the session's own process sees every worker's reports
        from helpers.timing_report import TimingReport

        config.pluginmanager.register(TimingReport(report), "timing_report")


def about_lab(item, lab: str) -> bool:
    """Whether a collected test is about `lab`: marked lab(lab), or named after it in its id
    (a parameter such as solutions/02_data_parallel/..., or a module test_lab2_...)."""
    if any(lab in marker.args for marker in item.iter_markers("lab")):
        return True
    return lab in item.nodeid or re.search(rf"\btest_lab{int(lab[:2])}_", item.nodeid) is not None


#: Session fixtures that grade a class once for tests of several modules: those tests share a worker.
SHARED_CLASSES = ("lab1_class", "round_trip_class")
#: The scope (xdist's unit of work) of the tests that use them.
SHARED_SCOPE = "the classes graded once"
#: Tiers whose tests take seconds to minutes each; the unit tests run after them.
HEAVY_TIERS = ("grading", "browser", "notebook", "torchrun", "slurm", "hub", "slow")


def _sharing_file(session_pid: int) -> Path:
    """Where the workers tell the controller which tests use SHARED_CLASSES: the controller
    collects no tests, so it cannot see their fixtures."""
    return Path(tempfile.gettempdir()) / f"course-test-scopes-{session_pid}.json"


def scope_of(nodeid: str, sharing: set[str]) -> str:
    """The unit of work a test belongs to: SHARED_SCOPE for the tests in `sharing`, else its module."""
    return SHARED_SCOPE if nodeid in sharing else nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """With `--dist loadscope`, a module runs on one worker (its servers and browsers start once),
    and the tests that share a class graded once run on one worker together."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleAndSharedClass(LoadScopeScheduling):
        sharing: set[str] = set()

        def schedule(self):
            if self.collection is None:  # the first call, every worker's collection in
                self.sharing = set(json.loads(_sharing_file(session_pid()).read_text(encoding="utf-8")))
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid, self.sharing)

    return ByModuleAndSharedClass(config, log)


def pytest_collection_modifyitems(config, items):
    _keep_only_the_labs_asked_for(config, items)
    _order_for_workers(items)


def _order_for_workers(items) -> None:
    """Order the units of work (scope_of) heavy tiers first, each unit's tests together, so that with
    `--no-loadscope-reorder` the workers take the long units first and the unit tests fill the end;
    in an xdist worker, tell the controller which tests share a class."""
    sharing = {item.nodeid for item in items if set(SHARED_CLASSES) & set(item.fixturenames)}
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker writes the same, whole
        partial = _sharing_file(session_pid()).with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(sorted(sharing)), encoding="utf-8")
        partial.replace(_sharing_file(session_pid()))
    scope = {item.nodeid: scope_of(item.nodeid, sharing) for item in items}
    heavy = {scope[item.nodeid] for item in items if any(item.get_closest_marker(t) for t in HEAVY_TIERS)}
    first_seen = {name: i for i, name in reversed(list(enumerate(scope[item.nodeid] for item in items)))}
    items.sort(key=lambda item: (scope[item.nodeid] not in heavy, first_seen[scope[item.nodeid]]))


def _keep_only_the_labs_asked_for(config, items) -> None:
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
