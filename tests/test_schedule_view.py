"""Covers: course.schedule_view.

The schedule view of lab 6: boxes and labels read back from the figure and counted by hand; a run's
spans read into the same grid; its bytes and its line of numbers checked against the cost models;
the measured grid only at the run's settings.
The contracts every view keeps (bad settings, nbgrader, sliders) are in tests/test_views.py.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from course import pipeline, schedule_view, sizes, widgets
from course.pipeline import Slot
from course.timeline import Span


def _boxes(ax):
    return [patch for patch in ax.patches if patch.get_width() > 0]


def _spans_of(slots, offset=0.0):
    """A fake run: one span per slot, named as the lab names them, in seconds, shifted by offset."""
    return [Span(s.stage, f"{'forward' if s.action == 'F' else 'backward'} {s.micro_batch}", offset + s.start / 1e3,
                 offset + s.end / 1e3) for s in slots]


def test_one_box_per_action_per_stage_labelled_with_its_micro_batch():
    fig = schedule_view.draw(schedule="gpipe", stages=4, micro_batches=8)
    grid_ax = fig.axes[0]
    boxes = _boxes(grid_ax)
    assert len(boxes) == 2 * 4 * 8                                          # F and B of 8 micro-batches, 4 stages
    labels = sorted(int(t.get_text()) for t in grid_ax.texts)
    assert labels == sorted(list(range(8)) * 8)                             # each number once per action per stage
    # stage 3's first box is F0, from 3 to 4 forwards: the grid, in units of a forward
    first = min((b for b in boxes if b.get_y() + b.get_height() / 2 == 3), key=lambda b: b.get_x())
    assert (first.get_x(), first.get_width()) == (3, 1)
    assert "bubble 27.3% of the grid, (N−1)/(m+N−1) = 27.3%" in grid_ax.get_title()   # 3/11
    plt.close(fig)


def test_forwards_are_blue_and_backwards_orange():
    fig = schedule_view.draw(stages=2, micro_batches=1)
    boxes = _boxes(fig.axes[0])
    forward = min(boxes, key=lambda b: b.get_width())            # a forward is 1 wide, a backward 2
    backward = max(boxes, key=lambda b: b.get_width())
    red, _, blue, _ = forward.get_facecolor()
    assert blue > red
    red, _, blue, _ = backward.get_facecolor()
    assert red > blue
    plt.close(fig)


def test_boxes_too_narrow_for_a_number_go_unlabelled():
    fig = schedule_view.draw(stages=16, micro_batches=64)
    assert len(_boxes(fig.axes[0])) == 2 * 16 * 64
    assert len(fig.axes[0].texts) < 2 * 16 * 64
    plt.close(fig)


def test_measured_grid_reads_forward_and_backward_spans_and_ignores_the_rest():
    spans = [Span(1, "forward 0", 0.2, 0.3), {"rank": 0, "name": "forward 0", "start": 0.1, "end": 0.2},
             Span(0, "optimizer", 0.0, 0.05), Span(1, "backward 0", 0.3, 0.5), Span(0, "forward", 0.0, 0.1),
             Span(0, "backward 0", 0.5, 0.7), Span(0, "forward 12", 0.7, 0.8)]
    slots = schedule_view.measured_grid(spans)
    assert [(s.stage, s.action, s.micro_batch) for s in slots] == [
        (0, "F", 0), (0, "B", 0), (0, "F", 12), (1, "F", 0), (1, "B", 0)]
    assert slots[0].start == 0 and slots[2].end == pytest.approx(0.7)      # from the earliest such span
    assert schedule_view.measured_grid(spans, ranks=4)[-1].stage == 1


def test_measured_grid_counts_each_rank_from_its_own_step():
    spans = [Span(0, "step", 1.0, 2.0), Span(0, "forward 0", 1.25, 1.5),
             Span(1, "step", 3.0, 4.0), Span(1, "forward 0", 3.5, 3.75)]
    assert schedule_view.measured_grid(spans) == [Slot(0, "F", 0, 0.25, 0.5), Slot(1, "F", 0, 0.5, 0.75)]


def test_measured_grid_of_several_steps_is_the_last():
    spans = [Span(0, "step", 0.0, 1.0), Span(0, "forward 0", 0.25, 0.5),
             Span(0, "step", 2.0, 3.0), Span(0, "forward 0", 2.5, 2.75)]
    assert schedule_view.measured_grid(spans) == [Slot(0, "F", 0, 0.5, 0.75)]
    assert schedule_view.measured_grid(spans[1::2]) == [Slot(0, "F", 0, 0.0, 0.25)]   # no step spans


@pytest.mark.parametrize("spans, ranks, words", [
    ([Span(0, "optimizer", 0, 1), Span(0, "forward", 0, 1)], None, "named 'forward i' or 'backward i'"),
    ([], None, "none of the 0 spans"),
    ([Span(5, "forward 0", 0, 1)], 4, "rank 5 lies outside ranks=4"),
])
def test_measured_grid_says_what_it_needs(spans, ranks, words):
    with pytest.raises(ValueError, match=words):
        schedule_view.measured_grid(spans, ranks)


def test_a_measured_run_is_drawn_beneath_in_ms():
    predicted = pipeline.grid("1f1b", 4, 8)
    fig = schedule_view.draw(measured=_spans_of(predicted, offset=0.5) + [Span(2, "optimizer", 0.6, 0.7)])
    run_ax = fig.axes[1]
    assert len(_boxes(run_ax)) == 2 * 4 * 8
    assert run_ax.get_xlabel() == "time since the step started (ms)"
    assert "bubble 27.3%, step 33 ms" in run_ax.get_title()                # the predicted grid, 1 ms a forward
    assert len(fig.axes) == 3
    plt.close(fig)


def test_bytes_per_rank_are_the_cost_models_and_by_hand():
    fig = schedule_view.draw(stages=4, batch=64, width=64, layers=8)
    bar_ax = fig.axes[-1]
    assert bar_ax.get_ylabel() == "kB sent per rank per step"
    heights = [patch.get_height() * 1e3 for patch in bar_ax.patches]
    layers = schedule_view.model_layers(8, 64)
    assert sum(layer.weights for layer in layers) == 7 * (64 * 64 + 64) + 64 * 10 + 10      # 29,770 parameters
    # a middle stage: 64 × 64 float32 each way; data parallel: 1.5 × 29,770 × 4; split weights: lab 3's blocks,
    # 3 row layers all-reduce 64 × 64 and 1 row layer 64 × 10 forward, 3 column layers 64 × 64 backward, × 1.5
    by_hand = [2 * 64 * 64 * 4, 1.5 * 29_770 * 4, 1.5 * 4 * (6 * 64 * 64 + 64 * 10)]
    assert heights == pytest.approx(by_hand)
    assert heights[1] == pytest.approx(sizes.data_parallel_total(layers, 4))
    plt.close(fig)


def test_a_scheme_that_cannot_run_is_said_in_words():
    fig = schedule_view.draw(stages=3)                   # 64 features do not split over 3 ranks
    bar_ax = fig.axes[-1]
    assert len(bar_ax.patches) == 2
    assert any("split weights: 64 features do not split over 3 ranks" in t.get_text() for t in bar_ax.texts)
    plt.close(fig)
    fig = schedule_view.draw(stages=16)                  # 8 layers make no 16 stages
    assert any("pipeline: 8 layers make at most 8 stages" in t.get_text() for t in fig.axes[-1].texts)
    plt.close(fig)


def test_the_views_numbers_are_the_models():
    text = schedule_view.describe(schedule="1f1b", stages=4, micro_batches=8)
    assert text.startswith("**1f1b, 4 stages, 8 micro-batches:** bubble 27.3% of the grid, (N−1)/(m+N−1) = 27.3%")
    assert f"a step takes {pipeline.step_time('1f1b', 4, 8):.3g} forwards" in text and "takes 33 forwards" in text
    assert "Stage 0 keeps at most 4 micro-batches' activations (gpipe 8)" in text
    assert "pipeline 32.8 kB; data parallel 179 kB; split weights 151 kB." in text
    gpipe = schedule_view.describe(schedule="gpipe", stages=2, micro_batches=3, forward=0.5, backward=0.5)
    assert "bubble 25.0%" in gpipe and "a step takes 8 forwards" in gpipe and "at most 3" in gpipe


def test_the_measured_grid_only_at_the_runs_settings(monkeypatch):
    seen, built = [], {}
    monkeypatch.setattr(schedule_view, "draw", lambda measured=None, **v: seen.append((measured, v)) or plt.figure())
    monkeypatch.setattr(widgets, "interactive_figure",
                        lambda draw, controls, describe: built.update(draw=draw, controls=controls))
    spans = _spans_of(pipeline.grid("1f1b", 4, 8))
    schedule_view.show(measured={"schedule": "1f1b", "stages": 4, "micro_batches": 8, "spans": spans}, batch=128)
    controls = built["controls"]
    assert list(controls) == ["schedule", "stages", "micro_batches"]
    assert (controls["stages"].min, controls["stages"].max, controls["micro_batches"].max) == (2, 16, 64)
    run = {k: c.value for k, c in controls.items()}
    assert run == {"schedule": "1f1b", "stages": 4, "micro_batches": 8}
    built["draw"](**run)
    built["draw"](**{**run, "schedule": "gpipe"})
    built["draw"](**{**run, "micro_batches": 16})
    assert [measured for measured, _ in seen] == [spans, None, None]
    assert all(settings["batch"] == 128 for _, settings in seen)            # fixed settings reach draw
    plt.close("all")


def test_measured_must_be_one_run():
    with pytest.raises(ValueError, match="keys schedule, stages, micro_batches and spans"):
        schedule_view.show(measured=[{"schedule": "1f1b"}])
