"""Covers: bench.report.

`make bench`'s report (bench/report.py): every benchmark's figures in one place, a failure
reported as one and never dropped, medians and ranges as measured.

The benchmarks here are small fabricated scripts; the real ones take minutes."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import report  # bench/report.py (the conftest puts bench/ on sys.path)
from _rounds import spread, spread_text

from helpers import REPO

# A benchmark that keeps bench/_results.py's contract: its figures are the median and range of
# the measurements it is given.
MEASURING = """
import argparse, sys
from pathlib import Path
sys.path.insert(0, {bench!r})
from _results import emit, headline_row
from _rounds import spread, spread_text
parser = argparse.ArgumentParser()
parser.add_argument("--json", type=Path)
args = parser.parse_args()
seconds = spread([0.30, 0.10, 0.25, 0.20])
emit(args.json, title="Fabricated latency", markdown="| what | seconds |\\n|---|---|\\n| it | 0.225 |",
     headline=[headline_row("fabricated latency", spread_text(seconds, "{{:.3f}}", " s"), "4 runs")],
     figures={{"seconds": seconds}})
"""
CRASHING = """
print("measuring...")
raise RuntimeError("the fabricated benchmark broke")
"""
SILENT = """
print("done, but no --json written")
"""
FIGURES_ONLY = """
import argparse, json
from pathlib import Path
parser = argparse.ArgumentParser()
parser.add_argument("--json", type=Path)
args = parser.parse_args()
print("| batch | ms |\\n|---|---|\\n| 32 | 2.8 |")
args.json.write_text(json.dumps({{"steps": 8}}))
"""
# Starts a child of its own, records its pid, then never finishes.
HANGING = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open({pid_file!r} + ".tmp", "w").write(str(child.pid))
os.replace({pid_file!r} + ".tmp", {pid_file!r})     # whole, or not there
time.sleep(600)
"""
# Long enough for the script to start its child on a machine busy with other work (a second, idle).
HANGING_TIMEOUT_S = 15


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fabricate(folder: Path, name: str, source: str, **values) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source.format(bench=str(REPO / "bench"), **values)))
    return path


def test_spread_is_the_median_and_range_of_the_measurements():
    figures = spread([0.30, 0.10, 0.25, 0.20])
    assert figures == {"median": pytest.approx(0.225), "min": 0.10, "max": 0.30, "n": 4}
    assert spread_text(figures, "{:.3f}", " s") == "0.225 s (0.100-0.300)"
    assert spread_text(spread([2.0]), "{:.1f}", " s") == "2.0 s"  # one measurement has no range
    with pytest.raises(ValueError, match="at least one round"):
        spread([])


def test_a_report_of_good_benchmarks_has_their_headlines_sections_and_the_machine(tmp_path):
    scripts = [fabricate(tmp_path, "measuring.py", MEASURING), fabricate(tmp_path, "figures_only.py", FIGURES_ONLY)]
    out = tmp_path / "results"
    assert report.main([*map(str, scripts), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    saved = json.loads((out / "report.json").read_text())
    assert "| fabricated latency | 0.225 s (0.100-0.300) | 4 runs | `measuring.py` |" in md
    assert "## Fabricated latency" in md and "| it | 0.225 |" in md
    # a script that writes only figures: its printed table is its section
    assert "## bench/figures_only.py" in md and "| 32 | 2.8 |" in md
    assert f"{os.cpu_count()} cores" in md and f"torch {saved['machine']['torch']}" in md
    assert saved["failed"] == []
    by_script = {b["script"]: b for b in saved["benchmarks"]}
    assert by_script["measuring.py"]["figures"]["seconds"]["median"] == pytest.approx(0.225)
    assert by_script["figures_only.py"]["figures"] == {"steps": 8}
    # each section says when it ran, on what and how busy the machine was
    started = by_script["measuring.py"]["started"]
    assert datetime.datetime.fromisoformat(started).tzinfo is not None
    section = md.split("## Fabricated latency", 1)[1]
    assert f"`python bench/measuring.py`: {started}, " in section and f"{os.cpu_count()} cores" in section
    assert "load average" in section and len(by_script["measuring.py"]["load"]) == 2


def test_a_quick_report_says_so_and_goes_elsewhere_by_default(tmp_path, monkeypatch):
    script = fabricate(tmp_path, "measuring.py", MEASURING)
    monkeypatch.setattr(report, "QUICK_OUT", tmp_path / "quick")
    assert report.main([str(script), "--quick"]) == 0
    saved = json.loads((tmp_path / "quick" / "report.json").read_text())
    assert saved["quick"] is True
    assert (tmp_path / "quick" / "report.md").read_text().startswith("# Benchmark report (--quick")


def test_a_failed_benchmark_is_reported_as_failed_and_fails_the_run(tmp_path):
    scripts = [fabricate(tmp_path, name, source) for name, source in
               (("crashing.py", CRASHING), ("measuring.py", MEASURING), ("silent.py", SILENT))]
    out = tmp_path / "results"
    assert report.main([*map(str, scripts), "--out", str(out)]) == 1
    md = (out / "report.md").read_text()
    saved = json.loads((out / "report.json").read_text())
    assert saved["failed"] == ["crashing.py", "silent.py"]
    # the failure's cause is in the headline and its section, and the good figures are still there
    assert "**`crashing.py` failed** | exited with code 1: RuntimeError: the fabricated benchmark broke" in md
    assert "**`silent.py` failed** | wrote no --json file" in md
    assert "| fabricated latency | 0.225 s (0.100-0.300) |" in md
    assert "2 failed**: crashing.py, silent.py" in md


def test_a_benchmark_out_of_time_is_stopped_with_everything_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = fabricate(tmp_path, "hanging.py", HANGING, pid_file=str(pid_file))
    out = tmp_path / "results"
    assert report.main([str(script), "--out", str(out), "--timeout", str(HANGING_TIMEOUT_S)]) == 1
    assert f"was still running after {HANGING_TIMEOUT_S} s and was stopped" in (out / "report.md").read_text()
    assert pid_file.is_file(), f"the benchmark had not started its child {HANGING_TIMEOUT_S} s after it began"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while alive(child):
        assert time.monotonic() < deadline, f"the benchmark's child {child} outlived the report"
        time.sleep(0.1)


def test_a_missing_script_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        report.main([str(tmp_path / "nope.py"), "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "no such benchmark script" in capsys.readouterr().err


def test_make_bench_runs_every_benchmark_through_the_report_then_rewrites_the_cited_figures():
    dry_run = subprocess.run(["make", "-n", "bench"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    commands = [line.split() for line in dry_run.splitlines() if "bench/" in line]
    assert [c[1:] for c in commands] == [["bench/report.py"], ["bench/_citations.py", "--update"]]
    scripts = {p.name for p in report.benchmarks()}
    every = {p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_")} - {"report.py"}
    assert scripts == every - report.HARDWARE_ONLY and "labs.py" in scripts and "grading_cost.py" in scripts
    quick = subprocess.run(["make", "-n", "bench", "BENCH_FLAGS=--quick"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout
    assert "bench/report.py --quick" in quick and "_citations.py" not in quick
    assert set(report.QUICK_ARGUMENTS) <= scripts and set(report.ARGUMENTS) <= scripts


def test_make_check_hardware_reports_each_lab_s_time_memory_values_bytes_and_mfu_in_one_report():
    dry_run = subprocess.run(["make", "-n", "check-hardware"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
    command = next(line for line in dry_run.splitlines() if "bench/report.py" in line).split()
    scripts = [Path(arg) for arg in command[command.index("bench/report.py") + 1:command.index("--out")]]
    # time and peak host and GPU memory of every lab; their hidden values; bytes against formulas; MFU
    assert [p.name for p in scripts] == ["labs.py", "stored_values.py", "comm_bytes.py", "single_gpu.py"]
    assert all((REPO / p).is_file() for p in scripts)
    assert command[command.index("--out") + 1] == "bench/results/hardware"
