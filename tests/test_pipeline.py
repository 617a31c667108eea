"""Covers: course.pipeline.

The pipeline cost model: orders written out by hand, grids drawn by hand, and the bubble formula
held by the simulated grid for both schedules, any stages and micro-batches and any stage times."""
from __future__ import annotations

import itertools

import pytest

from course import pipeline
from course.pipeline import Slot


def test_gpipe_runs_every_forward_then_every_backward():
    assert pipeline.actions("gpipe", 1, 3, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]


def test_1f1b_order_of_the_first_and_last_of_4_stages_with_8_micro_batches():
    # stage 0: 3 warm-up forwards, then F3 and B0 in turn ... F7 B4, then the cool-down B5 B6 B7
    assert pipeline.actions("1f1b", 0, 4, 8) == [
        ("F", 0), ("F", 1), ("F", 2),
        ("F", 3), ("B", 0), ("F", 4), ("B", 1), ("F", 5), ("B", 2), ("F", 6), ("B", 3), ("F", 7), ("B", 4),
        ("B", 5), ("B", 6), ("B", 7)]
    # the last stage warms up with nothing: one forward, one backward
    assert pipeline.actions("1f1b", 3, 4, 8) == [(a, i) for i in range(8) for a in ("F", "B")]


def test_1f1b_with_fewer_micro_batches_than_stages_is_gpipe_on_the_first_stage():
    assert pipeline.actions("1f1b", 0, 4, 2) == pipeline.actions("gpipe", 0, 4, 2)
    assert pipeline.actions("1f1b", 2, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
def test_every_stage_runs_each_forward_and_backward_once_forward_first(schedule):
    for stages, m in itertools.product(range(1, 7), range(1, 10)):
        for stage in range(stages):
            order = pipeline.actions(schedule, stage, stages, m)
            assert sorted(order) == sorted((a, i) for a in "FB" for i in range(m))
            assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(m))


def test_gpipe_grid_of_2_stages_and_2_micro_batches_by_hand():
    # f = 1, b = 2. Stage 0: F0 0-1, F1 1-2; stage 1: F0 1-2, F1 2-3, then B0 3-5, B1 5-7;
    # stage 0's B0 waits for stage 1's B0 (5), B1 follows it: 5-7, 7-9.
    assert pipeline.grid("gpipe", 2, 2) == [
        Slot(0, "F", 0, 0, 1), Slot(0, "F", 1, 1, 2), Slot(0, "B", 0, 5, 7), Slot(0, "B", 1, 7, 9),
        Slot(1, "F", 0, 1, 2), Slot(1, "F", 1, 2, 3), Slot(1, "B", 0, 3, 5), Slot(1, "B", 1, 5, 7)]
    assert pipeline.step_time("gpipe", 2, 2) == 9 == (2 + 2 - 1) * (1 + 2)
    assert pipeline.grid_bubble(pipeline.grid("gpipe", 2, 2)) == pytest.approx(1 / 3)   # 6 idle of 18


def test_1f1b_grid_of_2_stages_and_2_micro_batches_by_hand():
    # stage 1 runs B0 (2-4) before F1 (4-5); stage 0 warms up with F0, then F1, B0 when stage 1's B0
    # has ended (4-6), and B1 when stage 1's B1 has (7-9): the same 9, a different inside
    assert pipeline.grid("1f1b", 2, 2) == [
        Slot(0, "F", 0, 0, 1), Slot(0, "F", 1, 1, 2), Slot(0, "B", 0, 4, 6), Slot(0, "B", 1, 7, 9),
        Slot(1, "F", 0, 1, 2), Slot(1, "B", 0, 2, 4), Slot(1, "F", 1, 4, 5), Slot(1, "B", 1, 5, 7)]


def test_a_transfer_delays_each_neighbours_action():
    # 2 stages, 1 micro-batch, f = 1, b = 2, t = 0.5: F0 0-1 | F0 1.5-2.5, B0 2.5-4.5 | B0 5-7
    assert pipeline.grid("gpipe", 2, 1, transfer=0.5) == [
        Slot(0, "F", 0, 0, 1), Slot(0, "B", 0, 5, 7), Slot(1, "F", 0, 1.5, 2.5), Slot(1, "B", 0, 2.5, 4.5)]
    assert pipeline.step_time("1f1b", 2, 1, transfer=0.5) == 7


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
@pytest.mark.parametrize("forward, backward", [(1.0, 2.0), (1.0, 1.0), (0.3, 0.7), (2.5, 0.1), (1e-3, 7.0)])
def test_the_grids_bubble_is_the_formula_without_transfers(schedule, forward, backward):
    for stages, m in itertools.product(range(1, 9), range(1, 17)):
        slots = pipeline.grid(schedule, stages, m, forward=forward, backward=backward)
        assert len(slots) == 2 * stages * m
        assert pipeline.grid_bubble(slots) == pytest.approx(pipeline.bubble_fraction(stages, m), abs=1e-12)
        assert pipeline.step_time(schedule, stages, m, forward=forward, backward=backward) == pytest.approx(
            (m + stages - 1) * (forward + backward), rel=1e-12)


def test_the_formula_by_hand():
    assert pipeline.bubble_fraction(4, 8) == 3 / 11
    assert pipeline.bubble_fraction(1, 5) == 0
    assert pipeline.bubble_fraction(4, 1) == 3 / 4          # one micro-batch: every stage but one idle


def test_1f1b_takes_as_long_as_gpipe_without_transfers_and_no_less_with_them():
    for stages, m in itertools.product(range(1, 7), range(1, 12)):
        assert pipeline.step_time("1f1b", stages, m) == pipeline.step_time("gpipe", stages, m)
        assert pipeline.step_time("1f1b", stages, m, transfer=0.25) >= pipeline.step_time("1f1b", stages, m)


def test_no_stage_runs_two_actions_at_once():
    for schedule in pipeline.SCHEDULES:
        slots = pipeline.grid(schedule, 5, 7, forward=1.0, backward=1.5, transfer=0.2)
        for stage in range(5):
            own = [s for s in slots if s.stage == stage]
            assert all(a.end <= b.start for a, b in zip(own, own[1:]))


def _alive_from_the_order(order) -> int:
    """The most micro-batches between their forward and their backward, walking the order."""
    alive = peak = 0
    for action, _ in order:
        alive += 1 if action == "F" else -1
        peak = max(peak, alive)
    return peak


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
def test_peak_micro_batches_is_what_the_order_keeps_alive(schedule):
    for stages, m in itertools.product(range(1, 8), range(1, 12)):
        for stage in range(stages):
            assert pipeline.peak_micro_batches(schedule, stage, stages, m) == _alive_from_the_order(
                pipeline.actions(schedule, stage, stages, m))
    assert pipeline.peak_micro_batches("gpipe", 0, 4, 8) == 8
    assert [pipeline.peak_micro_batches("1f1b", s, 4, 8) for s in range(4)] == [4, 3, 2, 1]


def test_bytes_sent_by_hand():
    # batch 64 × width 64 float32 = 16,384 bytes each way; the middle stages send both ways
    assert pipeline.boundary_elements(64, 64) == 4096
    assert [pipeline.sent_per_step(s, 4, batch=64, width=64) for s in range(4)] == [16384, 32768, 32768, 16384]
    assert pipeline.sent_per_step(0, 1, batch=64, width=64) == 0
    assert pipeline.sent_per_step(1, 2, batch=8, width=10, dtype="bfloat16") == 160
    assert pipeline.busiest_sent_per_step(4, batch=64, width=64) == 32768
    assert pipeline.busiest_sent_per_step(2, batch=64, width=64) == 16384


def test_a_models_step_time_from_its_layers():
    # 8 layers of 4 s forward and 8 s backward for the whole batch, 4 stages of 2, 8 micro-batches:
    # 1 s and 2 s a micro-batch per stage, (8 + 3) × 3 s
    assert pipeline.stage_seconds(4.0, 8, 4, 8) == 1.0
    assert pipeline.model_step_time("1f1b", 4, 8, layers=8, layer_forward=4.0, layer_backward=8.0) == 33
    assert pipeline.stage_seconds(1.0, 8, 3, 1) == 3.0                      # 3, 3 and 2 layers: the slowest
    with pytest.raises(ValueError, match="8 layers cannot be cut into 16 stages"):
        pipeline.stage_seconds(1.0, 8, 16, 1)


@pytest.mark.parametrize("call, error, words", [
    (lambda: pipeline.actions("zero bubble", 0, 4, 8), ValueError, "schedule must be one of 'gpipe', '1f1b'"),
    (lambda: pipeline.actions("1f1b", 4, 4, 8), ValueError, r"stage 4 must lie in 0\.\.3"),
    (lambda: pipeline.actions("1f1b", -1, 4, 8), ValueError, r"stage -1 must lie in 0\.\.3"),
    (lambda: pipeline.actions("gpipe", 0, 0, 8), ValueError, "number of stages .* at least 1, got stages=0"),
    (lambda: pipeline.actions("gpipe", 0, 2, 0), ValueError,
     "number of micro-batches .* at least 1, got micro_batches=0"),
    (lambda: pipeline.grid("gpipe", 2, 2.0), TypeError, "got micro_batches=2.0"),
    (lambda: pipeline.grid("gpipe", 2, 2, forward=0), ValueError, "forward must be a number of seconds, more than 0"),
    (lambda: pipeline.grid("gpipe", 2, 2, transfer=-1), ValueError, "transfer must be .* at least 0"),
    (lambda: pipeline.grid_bubble([]), ValueError, "no slots"),
    (lambda: pipeline.sent_per_step(2, 2, batch=64, width=64), ValueError, r"stage 2 must lie in 0\.\.1"),
    (lambda: pipeline.sent_per_step(0, 2, batch=0, width=64), ValueError, "batch must be a whole number"),
    (lambda: pipeline.sent_per_step(0, 2, batch=64, width=64, dtype="int8"), ValueError, "dtype must be one of"),
])
def test_bad_arguments_are_refused_in_the_callers_words(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_the_bubble_over_compute_is_the_idle_share_over_the_busy_share():
    for stages, micro_batches in ((2, 1), (4, 8), (8, 3)):
        f = pipeline.bubble_fraction(stages, micro_batches)
        assert pipeline.bubble_over_compute(stages, micro_batches) == pytest.approx(f / (1 - f))
        busy = sum(s.end - s.start for s in pipeline.grid("1f1b", stages, micro_batches))
        idle = stages * pipeline.step_time("1f1b", stages, micro_batches) - busy
        assert pipeline.bubble_over_compute(stages, micro_batches) == pytest.approx(idle / busy)
    assert pipeline.bubble_over_compute(4, 8, virtual_stages=2) == pytest.approx(3 / 16)
    with pytest.raises(ValueError, match="virtual_stages"):
        pipeline.bubble_over_compute(4, 8, virtual_stages=0)
