"""Covers: bench.sharded.

bench/sharded.py measures what it says, at a tiny size: lab 5's ZeRO-3 and fully_shard are timed
step by step, send the bytes a hand count gives, and every rank holds what course.memory predicts."""
from __future__ import annotations

import json

import pytest
import sharded  # bench/sharded.py (the conftest puts bench/ on sys.path)

import course
from course import data

WIDTHS = (16, (32, 32))    # 16·32 + 32 + 32·32 + 32 + 32·10 + 10 = 1,930 parameters
SIZES = (16 * 32, 32, 32 * 32, 32, 32 * 10, 10)
LAYERS = (16 * 32 + 32, 32 * 32 + 32, 32 * 10 + 10)     # ZeRO-3 cuts each layer's parameters as one tensor
BATCH = 8


def hand_count(n: int) -> float:
    """Bytes a rank sends per step under ZeRO-3 on gloo: per layer, padded to a multiple of n
    elements (B bytes), two ring all-gathers, (n-1)/n·B each, and gloo's reduce-scatter, an
    all-reduce of the whole input, 2(n-1)/n·B."""
    padded = [4 * n * -(-size // n) for size in LAYERS]
    return sum(2 * (n - 1) / n * b + 2 * (n - 1) / n * b for b in padded)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The whole benchmark, once, at the tiny size: 17 launches, 3 minutes on 2 busy cores."""
    path = tmp_path_factory.mktemp("bench") / "sharded.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sharded, "WIDTHS", WIDTHS)
        patch.setattr(sharded, "BATCH", BATCH)
        patch.setattr(sharded, "STEPS_PER_ROUND", 2)
        sharded.main(["--rounds", "1", "--json", str(path)])
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_report_has_its_tables_and_memory_within_five_percent_of_the_formula(report):
    assert report["title"] and {"timing", "bytes_per_step", "collectives", "memory"} <= report["figures"].keys()
    figures = report["figures"]
    assert figures["parameters"] == sum(SIZES)
    assert [r["ranks"] for r in figures["timing"]] == sharded.timed_ranks()
    for r in figures["timing"]:
        assert r["rounds"] == 1 and r["ours_ms"] > 0 and r["theirs_ms"] > 0

    memory = figures["memory"]
    assert len(memory) == len(sharded.RANKS) * len(sharded.STAGES) * (len(sharded.KINDS) + 1)
    for row in memory:
        if row["kind"] in sharded.KINDS:
            assert row["least"] <= row["rank 0"] <= row["most"]
            assert abs(row["ratio farthest"] - 1) <= sharded.MEMORY_GOAL, row
        else:
            assert row["predicted"] is None and row["least"] > 0
    # a hand count: ZeRO-3 on 4 ranks holds a quarter of the parameters (rank 0 the longer chunks)
    zero3 = {r["kind"]: r for r in memory if r["ranks"] == 4 and r["scheme"] == "ZeRO-3"}
    assert zero3["parameters"]["rank 0"] == 4 * sum(-(-size // 4) for size in LAYERS)

    figures_markdown = report["markdown"]
    assert "| ranks | ZeRO-3 step | `fully_shard` step |" in figures_markdown
    assert "farthest rank / predicted" in figures_markdown
    headline = [row["figure"] for row in report["headline"]]
    timed = [figure for figure in headline if figure.startswith("ZeRO-3 (lab 5) / `fully_shard` step")]
    assert len(timed) == len(figures["timing"])
    assert sum("bytes per rank per step" in figure for figure in headline) == len(sharded.RANKS)
    assert any("memory held / formula" in figure for figure in headline)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_zero3_sends_the_hand_count_and_fully_shard_the_same_on_2_ranks(report):
    for totals in report["figures"]["bytes_per_step"]:
        n = totals["ranks"]
        ours, theirs = (totals[name] for name in sharded.CONTENDERS)
        assert ours["predicted"] == pytest.approx(hand_count(n)), (n, ours)
        if n == 2:   # every first dimension is even: fully_shard pads nothing, and sends the same
            assert theirs["predicted"] == pytest.approx(ours["predicted"]), (n, theirs)
        for sent in (ours, theirs):
            if sent["measured"] is not None:   # gloo on Linux: the sockets carry the bytes, plus headers
                assert sent["measured"] >= sent["predicted"]
    calls = {(r["contender"], r["op"]): r["calls"] for r in report["figures"]["collectives"]
             if r["ranks"] == 2 and r["rank"] == 0}
    # both gather each of the 3 layers twice a step and reduce-scatter it once, one call a layer
    assert sorted(calls.values()) == [3, 3, 6, 6]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_round_times_every_step_but_each_runs_first():
    inputs, targets = data.synthetic(4 * BATCH, WIDTHS[0])
    run = course.launch(sharded.time_steps, 2, args=(sharded.make_model(WIDTHS), inputs, targets, 2, 3, BATCH))
    for rank in run.ranks:
        for name in sharded.CONTENDERS:
            rounds = run[rank][name]
            assert len(rounds) == 2 and all(len(steps) == 3 and min(steps) > 0 for steps in rounds), rounds


def test_timing_leaves_the_labs_memory_tracker_as_it_was():
    names = sharded.LAB.pytorch_training.__globals__
    kept = names["live_memory"]
    with sharded.no_memory_tracker(sharded.LAB.pytorch_training):
        tracker = names["live_memory"].LiveMemory("cpu")
        with tracker as inside:
            assert inside.track(object()) is tracker and tracker.peak is None
    assert names["live_memory"] is kept is course.live_memory
