"""Covers: tests.helpers.timing_report.

The suite's timing report (tests/helpers/timing_report.py): where a run's time went, from the run itself."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from helpers import REPO
from helpers.timing_report import TimingReport, tier_of


def report(nodeid, when, outcome, duration, *markers):
    keywords = {name: 1 for name in (nodeid.split("::")[-1], *markers)}
    return SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, duration=duration, keywords=keywords)


def test_a_test_s_tier_is_its_marker_and_unit_without_one():
    assert tier_of({"test_x": 1, "grading": 1, "lab": 1}) == "grading"
    assert tier_of({"test_x": 1, "parametrize": 1}) == "unit"


def test_each_test_counts_once_with_its_setup_call_and_teardown_summed_by_tier_and_file(tmp_path):
    timing = TimingReport(tmp_path / "timings.md")
    for r in [report("tests/test_a.py::test_one", "setup", "passed", 1.0, "grading"),
              report("tests/test_a.py::test_one", "call", "passed", 30.0, "grading"),
              report("tests/test_a.py::test_one", "teardown", "passed", 2.0, "grading"),
              report("tests/test_b.py::test_two", "setup", "skipped", 0.5),
              report("tests/test_b.py::test_two", "teardown", "passed", 0.0),
              report("tests/test_b.py::test_three", "setup", "passed", 0.0),
              report("tests/test_b.py::test_three", "call", "failed", 4.0),
              report("tests/test_b.py::test_three", "teardown", "failed", 0.5)]:
        timing.pytest_runtest_logreport(r)
    text = timing.markdown(wall=20.0)
    assert "1 error, 1 failed, 1 passed, 1 skipped" in text
    assert "the tests' own time 38 s (1.90 × the wall clock" in text
    assert "| grading | 1 | 33 | 87% |" in text and "| unit | 2 | 5 | 13% |" in text
    files = [line for line in text.splitlines() if line.startswith("| tests/test_") and "::" not in line]
    assert files == ["| tests/test_a.py | 33 |", "| tests/test_b.py | 5 |"]  # slowest first
    assert "| tests/test_a.py::test_one | grading | 33.0 |" in text


def test_make_test_s_report_holds_every_worker_s_tests_and_is_printed(tmp_path):
    """Under xdist the workers' reports reach the session's process, which writes and prints the whole."""
    path = tmp_path / "timings.md"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                          "tests/test_timing_report.py::test_a_test_s_tier_is_its_marker_and_unit_without_one",
                          "tests/test_timing_report.py::test_each_test_counts_once_with_its_setup_call_and_"
                          "teardown_summed_by_tier_and_file", f"--timing-report={path}"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    text = path.read_text(encoding="utf-8")
    assert "2 passed" in text and "| unit | 2 |" in text
    assert "where the time went" in run.stdout and "| tier | tests | seconds | share |" in run.stdout
