"""Covers: bench.labs.

bench/labs.py measures what it says: a notebook's run time, and the peak memory of its
kernel and every rank it launches, all together (summed PSS); a notebook that fails is
reported as failed. On a tiny fabricated notebook, not the labs (those take minutes)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import psutil
import pytest
from _peak_memory import descendants

import labs  # bench/labs.py (the conftest puts bench/ on sys.path)
from helpers import REPO

PER_RANK_BYTES = 1_500_000_000
# Each of 2 ranks fills PER_RANK_BYTES of its own (ones, not empty: pages must be touched to
# count) and holds them a second, longer than the sampler's slowest interval.
ALLOCATING = f"""
import time
import torch
import course

def hold(nbytes):
    block = torch.ones(nbytes // 4, dtype=torch.float32)
    time.sleep(1.5)
    return block.sum().item()

course.launch(hold, 2, args=({PER_RANK_BYTES},))
"""


def notebook(folder: Path, *sources: str) -> Path:
    path = folder / "fabricated.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), path)
    return path


def started_since(before: set[int]) -> list[int]:
    return [p.pid for p in descendants(psutil.Process()) if p.pid not in before]


@pytest.fixture
def before() -> set[int]:
    """What this process runs already (other tests' kernels, say): not the run's to end."""
    return {p.pid for p in descendants(psutil.Process())}


@pytest.mark.timeout(180)
def test_the_peak_counts_what_every_launched_rank_holds(tmp_path, before):
    figures = labs.run_once(notebook(tmp_path, ALLOCATING), {})
    assert "error" not in figures, figures
    # The kernel and the forkserver alone hold under 1 GB, one rank's block with them under
    # 3 GB: the peak reaches both ranks' blocks only if it sums every process of the tree.
    assert figures["peak_bytes"] >= 2 * PER_RANK_BYTES, figures
    assert figures["metric"] == "pss"
    # PSS splits shared pages, RSS counts them in every process: never less than PSS
    assert figures["peak_rss_bytes"] >= figures["peak_pss_bytes"] >= figures["peak_uss_bytes"] > 0
    assert figures["most_processes"] >= 4  # kernel, forkserver, 2 ranks
    assert figures["seconds"] > 1.5
    assert not started_since(before), "the kernel and its ranks outlived the run"


@pytest.mark.timeout(120)
def test_a_failing_notebook_is_reported_with_its_cell(tmp_path, before):
    figures = labs.run_once(notebook(tmp_path, "x = 1", "raise ValueError('the fabricated lab broke')"), {})
    assert figures == {"error": "cell 1: CellExecutionError: ValueError: the fabricated lab broke"}
    assert not started_since(before), "the kernel outlived the failed run"


def test_the_labs_ranks_come_from_course_lab_ranks(tmp_path):
    path = tmp_path / "lab.ipynb"
    for source, ranks in (("n = course.lab_ranks(4)", 4), ("n = course.lab_ranks()", 2), ("course.launch(f, 2)", None)):
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]), path)
        assert labs.default_ranks(path) == ranks, source


def test_an_unknown_lab_is_named_with_the_labs_there_are():
    result = subprocess.run([sys.executable, str(REPO / "bench" / "labs.py"), "--labs", "05_nonesuch"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert "no notebook for 05_nonesuch" in result.stderr
    assert all(lab in result.stderr for lab in labs.all_labs())


def _row(lab: str, peak_gb: float | None, seconds: float = 20.0, slowest_cell_s: float = 5.0,
         ranks: int | None = 4) -> dict:
    """A measured run (peak in GB), or a failed one (None), as bench/labs.py records it."""
    run = {"lab": lab, "ranks": ranks, "env": {labs.RANKS_VARIABLE: "4"} if ranks == 4 else {}}
    if peak_gb is None:
        return {**run, "error": "cell 3: RankExited: rank 2 was killed"}
    peak = {"metric": "pss", "peak_bytes": peak_gb * 1e9, "peak_rss_bytes": 2 * peak_gb * 1e9,
            "pss_interval_s": 0.2, "most_processes": 7}
    return {**run, "seconds": {"median": seconds, "min": seconds, "max": seconds, "n": 1},
            "slowest_cell_s": {"median": slowest_cell_s, "min": slowest_cell_s, "max": slowest_cell_s, "n": 1},
            "in_time": labs.in_time(run, seconds, slowest_cell_s),
            "peak": peak, "within_limit": peak["peak_bytes"] < labs.LIMIT_BYTES}


def test_the_time_verdict_holds_each_run_to_its_promise():
    def verdict(*rows):
        return next(r["value"] for r in labs.headline(list(rows), 1) if r["figure"] == "every notebook within its time")

    at_default, on_four = labs.TIME_BUDGET_S, labs.FOUR_RANKS_TIME_BUDGET_S
    assert verdict(_row("a", 1.0, at_default, ranks=2), _row("a", 1.0, on_four)) == "yes"
    assert verdict(_row("a", 1.0, at_default + 1, ranks=2), _row("b", 1.0, on_four)) == "**no**: `a` on 2 ranks"
    assert verdict(_row("b", 1.0, on_four + 1), _row("c", None)) == "**no**: `b` on 4 ranks"
    assert verdict(_row("a", 1.0), _row("b", None)) == "yes for 1 of 2; the others failed"
    # the demo: its whole run, and each cell on its own
    assert verdict(_row(labs.DEMO, 1.0, 60, labs.DEMO_CELL_BUDGET_S, ranks=None)) == "yes"
    assert verdict(_row(labs.DEMO, 1.0, 60, labs.DEMO_CELL_BUDGET_S + 1, ranks=None)) == "**no**: `demo`"
    table = labs.markdown([_row("a", 1.0, 95, ranks=2)], 1, {"torch": "2.4", "cpu_count": 2, "gpus": []})
    assert "| 7 | 5.0 s | **no** (90 s) |" in table


def test_the_4_gb_verdict_judges_every_measured_run_and_names_failed_ones():
    def verdict(*rows):
        return labs.headline(list(rows), 1)[-1]["value"]

    assert verdict(_row("a", 1.0), _row("b", 1.5)) == "yes (most: `b`, 1.50 GB)"
    assert verdict(_row("a", 1.0), _row("b", 4.2)).startswith("**no**")
    assert verdict(_row("a", 1.0), _row("b", None)) == "yes for 1 of 2; the others failed (most: `a`, 1.00 GB)"
    assert verdict(_row("b", None)) == "not known: every run on 4 ranks failed"
    assert labs.headline([_row("a", 1.0)], 1)[-1]["figure"] == "every lab on 4 ranks under 4.00 GB"
    # without the reruns on 4 ranks (make bench: --ranks with no count), every run is held to the limit
    defaults = [_row("a", 1.0, ranks=2), _row("b", 4.2, ranks=None)]
    assert labs.headline(defaults, 1)[-1] == {"figure": "every lab at its default ranks under 4.00 GB",
                                              "value": "**no** (most: `b`, 4.20 GB)", "over": "1 run"}
    table = labs.markdown([_row("a", 4.2), _row("b", None)], 1, {"torch": "2.4", "cpu_count": 2, "gpus": []})
    assert "| `a` | 4 | 20.0 s | 4.20 GB | **no** |" in table
    assert "| `b` | 4 | FAILED: cell 3: RankExited: rank 2 was killed |" in table
