"""Covers: course.timeline.

Timelines of real runs: compute spans from course.timeline.span, on the clock
of the communication records, returned by course.launch and drawn per rank."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

import course
from course import timeline


def compute_then_overlap():
    t = torch.ones(1000, 500)
    with timeline.span("first"):
        time.sleep(0.02)
    work = dist.all_reduce(t, async_op=True)
    with timeline.span("while communicating"):
        time.sleep(0.03)
    work.wait()
    return dist.get_rank()


def test_spans_come_back_by_rank_on_the_records_clock():
    results = course.launch(compute_then_overlap, 2)
    for rank in (0, 1):
        spans = results.timeline.rank(rank)
        assert [s.name for s in spans] == ["first", "while communicating"]
        first, second = spans
        assert first.end - first.start >= 0.02 and second.end - second.start >= 0.03
        assert first.end <= second.start
        (record,) = results.comm.rank(rank)
        # The asynchronous all-reduce was called between the spans and ended after its call.
        assert first.end <= record.start <= second.start
        assert record.end is not None and record.end >= record.start
    frame = results.timeline.to_frame()
    assert list(frame.columns) == ["rank", "name", "start", "end"] and len(frame) == 4


def no_spans():
    return 1


def test_no_spans_no_timeline_and_spans_outside_a_rank_do_nothing():
    assert len(course.launch(no_spans, 2).timeline) == 0
    with timeline.span("in the notebook itself"):
        ran = True
    assert ran


def test_plot_draws_compute_and_communication_per_rank(ax):
    results = course.launch(compute_then_overlap, 2)
    timeline.plot(ax, results)
    assert len(ax.collections) == 4  # a compute row and a communication row per rank
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]


def test_an_interval_without_holes_keeps_the_parts_outside_them():
    assert timeline._without((0.0, 10.0), []) == [(0.0, 10.0)]
    assert timeline._without((0.0, 10.0), [(2.0, 3.0), (5.0, 7.0)]) == [(0.0, 2.0), (3.0, 5.0), (7.0, 10.0)]
    assert timeline._without((0.0, 10.0), [(-1.0, 1.0), (9.0, 12.0)]) == [(1.0, 9.0)]
    assert timeline._without((0.0, 10.0), [(4.0, 6.0), (5.0, 8.0)]) == [(0.0, 4.0), (8.0, 10.0)]
    assert timeline._without((2.0, 3.0), [(0.0, 10.0)]) == []


def blocking_inside_a_span():
    with timeline.span("forward"):
        total = torch.ones(1000)
        dist.all_reduce(total)           # blocking: the rank waits, inside the span
        total = total * 2


def test_plot_can_leave_blocking_collectives_out_of_compute_bars(ax):
    results = course.launch(blocking_inside_a_span, 2)
    timeline.plot(ax, results, waits_in_spans=True)
    compute_rank_0 = ax.collections[0].get_paths()
    assert len(compute_rank_0) == 2, "the span is drawn as the two pieces around the all-reduce"
    timeline.plot(ax, results)
    assert len(ax.collections[4].get_paths()) == 1, "by default a span is one bar"
