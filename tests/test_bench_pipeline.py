"""Covers: bench.pipeline.

bench/pipeline.py measures what it says, at --quick's size: lab 6's 1F1B and Schedule1F1B are timed
side by side and both end with one process's parameters, and the bubble is measured for both schedules
on 2 and 4 stages against (N-1)/(m+N-1), lab 6's sleeping stages where they outnumber the cores. Structure and
invariants only, never speed."""
from __future__ import annotations

import json
import re

import pipeline  # bench/pipeline.py (the conftest puts bench/ on sys.path)
import pytest

from course import stages


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The whole benchmark, once, --quick: 1 round, the lab's small MLP; 5 launches."""
    path = tmp_path_factory.mktemp("bench") / "pipeline.json"
    pipeline.main(["--quick", "--json", str(path)])
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_both_contenders_are_timed_and_end_as_one_process(report):
    assert report["title"] and {"timing", "bubble"} <= report["figures"].keys()
    figures = report["figures"]
    assert figures["quick"] and figures["rounds"] == 1 and figures["micro_batches"] == 8
    assert figures["parameters"] == 64 * 64 * 7 + 64 * 7 + 64 * 10 + 10     # 8 Linears: 7 of 64 → 64, 64 → 10
    assert [r["stages"] for r in figures["timing"]] == pipeline.timed_stages()
    for r in figures["timing"]:
        assert r["rounds"] == 1 and r["ours_ms"] > 0 and r["theirs_ms"] > 0
        assert 0 < r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
        assert r["parameters_match"] is True
        assert all(len(r["per_round_ms"][name]) == 1 for name in pipeline.CONTENDERS)
    assert "| stages | 1F1B (lab 6) step | `Schedule1F1B` step |" in report["markdown"]
    timed = [row for row in report["headline"] if row["figure"].startswith("1F1B (lab 6) / `Schedule1F1B` step")]
    assert len(timed) == len(figures["timing"]) and all("goal ≤ 1.1×" in row["value"] for row in timed)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bubble_of_both_schedules_on_2_and_4_stages_against_the_formula(report):
    figures = report["figures"]
    rows = {(r["stages"], r["schedule"]): r for r in figures["bubble"]}
    assert sorted(rows) == sorted((n, s) for n in pipeline.STAGES for s in ("gpipe", "1f1b"))
    hand = {2: 1 / 9, 4: 3 / 11}          # (N-1)/(m+N-1) at m = 8
    for (n, _), r in rows.items():
        assert r["formula"] == pytest.approx(hand[n])
        assert r["measured"]["n"] == r["ratio"]["n"] == 1
        assert 0 < r["measured"]["median"] < 1
        assert r["ratio"]["median"] == pytest.approx(r["measured"]["median"] / r["formula"])
        assert r["parameters_match"] is True and r["cores"] == figures["cores"]
    # fewer cores than stages: those rows time lab 6's sleeping stages, and the report says so
    for (n, _), r in rows.items():
        assert r["stages_sleep"] is (n > figures["cores"]), (n, r)
    assert ("These rows time **sleeping stages** instead" in report["markdown"]) == (figures["cores"] < 4)
    assert sum(row["figure"].startswith("bubble measured") for row in report["headline"]) == len(rows)


def _parameters(model, ranks, name_changed=None):
    """A run's parameters as time_steps returns them: {rank: {"parameters": {contender: [...]}}}, one
    contender's last parameter on the last stage nudged if asked."""
    parts = stages.split(model, ranks)
    run = pipeline._Run()
    for rank, part in enumerate(parts):
        run[rank] = {"parameters": {name: [p.detach().clone() for p in part.parameters()]
                                    for name in pipeline.CONTENDERS}}
    if name_changed:
        run[ranks - 1]["parameters"][name_changed][-1] += 0.01
    return run


def test_a_contender_whose_parameters_are_not_one_process_s_fails_the_benchmark():
    model = pipeline.make_model(pipeline.QUICK["widths"])()
    pipeline.same_as_one_process(_parameters(model, 2), model)
    for name in pipeline.CONTENDERS:
        with pytest.raises(AssertionError, match=re.escape(f"{name}, 2 stages: stage 1")):
            pipeline.same_as_one_process(_parameters(model, 2, name_changed=name), model)
