"""Where a run of the suite spent its time, written by the run itself (`--timing-report PATH`).

`make test` asks for it (test-artifacts/timings.md) and prints it at the end of the run, so CI's log
ends with it: each tier's time, the slowest files and tests, beside the machine that ran them.
The figures are a run's own, never typed into prose: hosts differ threefold (AVX2 against AVX-512),
runs of one host by about 15 %.

A test's time is its setup, call and teardown together, as its worker measured them; with two
workers the tests' time is about twice the wall clock, the suite's CPU work over 2 cores.
"""
from __future__ import annotations

import datetime
import os
import platform
import time
from collections import defaultdict
from pathlib import Path

#: The tiers of pyproject.toml's markers, in tests/README.md's order; a test with none is a unit test.
TIERS = ("slow", "notebook", "grading", "browser", "torchrun", "gpu", "hub", "slurm")
UNIT = "unit"
#: How many files and tests the report names.
SLOWEST = 15


def tier_of(keywords) -> str:
    """A test's tier, from its report's keywords (its markers are among them); a test has at most one."""
    return next((tier for tier in TIERS if tier in keywords), UNIT)


def instruction_set() -> str:
    """The widest vector instructions torch's CPU kernels use here: what the hosts' threefold gap follows."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512"


class TimingReport:
    """A pytest plugin, in the session's own process: with xdist, every worker's reports reach it."""

    def __init__(self, path: Path):
        self.path = path
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)  # nodeid -> setup + call + teardown
        self.tier: dict[str, str] = {}
        self.outcomes: dict[str, int] = defaultdict(int)

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration
        self.tier.setdefault(report.nodeid, tier_of(report.keywords))
        outcome = self.outcome(report)
        if outcome:
            self.outcomes[outcome] += 1

    @staticmethod
    def outcome(report) -> str | None:
        """What the report settles about its test, as pytest's summary counts it: the call's outcome,
        a skip at setup, or an error at setup or teardown; None where the report settles nothing."""
        if report.when == "call":
            return report.outcome
        if report.outcome == "skipped":
            return "skipped"
        return "error" if report.outcome == "failed" else None

    def pytest_sessionfinish(self, session):
        if not self.seconds:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_text(self.markdown(time.monotonic() - self.started), encoding="utf-8")
        partial.replace(self.path)

    def pytest_terminal_summary(self, terminalreporter):
        if self.path.is_file():
            terminalreporter.section(f"where the time went ({self.path})")
            terminalreporter.write(self.path.read_text(encoding="utf-8"))

    def markdown(self, wall: float) -> str:
        total = sum(self.seconds.values())
        by_tier: dict[str, list[float]] = defaultdict(list)
        by_file: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.seconds.items():
            by_tier[self.tier[nodeid]].append(seconds)
            by_file[nodeid.split("::", 1)[0]] += seconds
        from _machine import cpu_model  # bench/'s, on sys.path (conftest.py): the benchmarks' machine line

        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes.items()))
        lines = [
            "# Where the suite's time went",
            "",
            f"{datetime.date.today().isoformat()}, {cpu_model()} ({instruction_set()}), {os.cpu_count()} cores, "
            f"Python {platform.python_version()}; {counts}.",
            f"Wall clock {wall / 60:.1f} minutes ({wall:.0f} s); the tests' own time {total:.0f} s "
            f"({total / max(wall, 1e-9):.2f} × the wall clock: the workers' overlap).",
            "",
            "| tier | tests | seconds | share |",
            "|---|---:|---:|---:|",
        ]
        for tier in sorted(by_tier, key=lambda t: -sum(by_tier[t])):
            seconds = sum(by_tier[tier])
            lines.append(f"| {tier} | {len(by_tier[tier])} | {seconds:.0f} | {seconds / total:.0%} |")
        lines += ["", f"The {SLOWEST} slowest files:", "", "| file | seconds |", "|---|---:|"]
        for name, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:SLOWEST]:
            lines.append(f"| {name} | {seconds:.0f} |")
        lines += ["", f"The {SLOWEST} slowest tests:", "", "| test | tier | seconds |", "|---|---|---:|"]
        for nodeid, seconds in sorted(self.seconds.items(), key=lambda item: -item[1])[:SLOWEST]:
            lines.append(f"| {nodeid.replace('|', '/')} | {self.tier[nodeid]} | {seconds:.1f} |")
        return "\n".join(lines) + "\n"
