"""Covers: bench.expert_overlap.

bench/expert_overlap.py measures what it says, at --quick's size: both schedules of expert parallelism's step
timed side by side, the figures the medians, differences and ratios of the same rounds, and every all-to-all of
the timed steps sending the formula's bytes. Structure and invariants only, never speed."""
from __future__ import annotations

import json

import expert_overlap  # bench/expert_overlap.py (the conftest puts bench/ on sys.path)
import pytest


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The whole benchmark, once, --quick, over 2 rounds (so that a range and a ratio per round exist)."""
    path = tmp_path_factory.mktemp("bench") / "expert_overlap.json"
    expert_overlap.main(["--quick", "--rounds", "2", "--json", str(path)])
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_both_schedules_are_timed_side_by_side_and_their_bytes_are_the_formula_s(report):
    figures = report["figures"]
    assert figures["quick"] and figures["rounds"] == 2 and figures["ranks"] == expert_overlap.RANKS
    (row,) = figures["settings"]
    assert row["sizes"] == expert_overlap.QUICK["settings"][0]
    for schedule in ("blocking", "overlapped"):
        assert row["ms"][schedule]["n"] == 2 and row["ms"][schedule]["min"] > 0
    assert row["hidden_ms"]["n"] == row["overlapped_over_blocking"]["n"] == 2
    assert row["waited_ms"] > 0
    s = row["sizes"]
    assert row["bytes"]["formula"] == s["tokens"] * s["top_k"] * s["hidden"] * 4 // 2     # half leaves on 2 ranks
    assert sorted((b["rank"], b["schedule"]) for b in row["bytes"]["per_rank"]) == [
        (r, schedule) for r in range(expert_overlap.RANKS) for schedule in ("blocking", "overlapped")]
    for b in row["bytes"]["per_rank"]:            # four all-to-alls a micro-batch, each the formula's bytes
        assert b["calls"] == 4 * expert_overlap.MICRO_BATCHES and b["counted"] == [row["bytes"]["formula"]], b
    assert "| setting | blocking | overlapped |" in report["markdown"]
    assert "can be near zero or below" in report["markdown"]
    (line,) = report["headline"]
    assert line["figure"].startswith("expert-parallel step, overlapped / blocking") and line["over"] == "2 rounds"


def test_sizes_that_cannot_make_the_step_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="multiple of 2"):
        expert_overlap.setting_row(dict(tokens=3, hidden=8, ffn=8, experts=4, top_k=1), rounds=1)
