"""Covers: course.flight_records, course.launch, course._processes, course.errors.

What course.launch returns of a failed launch: `collective_timeout`, `error.records`, `error.flight_records`.

A launch with a short collective_timeout ends a hang with each rank's own error, and its exception carries
what every rank that replied had begun: PyTorch's Flight Recorder entries (gloo records collectives on the
pinned torch: bench/debug_tools.py, in bench/results/report.md) and the course's records, from the ranks that
raised and from the ranks that returned.
"""
from __future__ import annotations

import inspect
import os

import pytest
import torch
import torch.distributed as dist

import course
from course import flight_records
from course.flight_records import FlightEntry

HERE = os.path.basename(__file__)
needs_a_dump = pytest.mark.skipif(not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"),
                                  reason=f"torch {torch.__version__} has no Flight Recorder dump for gloo "
                                         "(torch 2.6 and later have one)")


def one_rank_skips_a_collective(skipper):
    """Each rank all-reduces, then every rank but `skipper` all-reduces again; then all broadcast (2, 3)."""
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() != skipper:
        dist.all_reduce(t)
    dist.broadcast(torch.ones(2, 3), 0)
    return "returned"


def skipper_returns(skipper):
    """As above, but the rank that skips returns at once: the other waits in its second all_reduce."""
    dist.all_reduce(torch.ones(4))
    if dist.get_rank() == skipper:
        return "returned"
    dist.all_reduce(torch.ones(4))


def raises_after_one_call():
    dist.all_reduce(torch.ones(4))
    if dist.get_rank() == 0:
        raise ValueError("rank 0 gives up")
    dist.all_reduce(torch.ones(4))


def line_of(fn, text: str) -> str:
    """`HERE:line fn` of the one line of fn's source that is `text` (its indentation included)."""
    lines, first = inspect.getsourcelines(fn)
    (offset,) = [i for i, line in enumerate(lines) if line.rstrip() == text]
    return f"{HERE}:{first + offset} {fn.__name__}"


@needs_a_dump
@pytest.mark.timeout(120)
def test_a_hang_ends_with_every_rank_s_entries_where_they_disagree():
    with pytest.raises(RuntimeError, match="Timed out") as raised:
        course.launch(one_rank_skips_a_collective, 2, args=(1,), collective_timeout=2, timeout=60)
    flight, records = raised.value.flight_records, raised.value.records
    assert set(flight) == set(records) == {0, 1}
    first = FlightEntry(1, "all_reduce", ((4,),), "default_pg", line_of(one_rank_skips_a_collective,
                                                                          "    dist.all_reduce(t)"))
    assert flight[0][0] == flight[1][0] == first
    second = line_of(one_rank_skips_a_collective, "        dist.all_reduce(t)")
    assert flight[0][1] == FlightEntry(2, "all_reduce", ((4,),), "default_pg", second)
    assert flight[1][1] == FlightEntry(2, "broadcast", ((2, 3),), "default_pg",
                                       line_of(one_rank_skips_a_collective,
                                               "    dist.broadcast(torch.ones(2, 3), 0)"))
    assert [r.op for r in records[0]] == ["all_reduce", "all_reduce"]
    assert [r.op for r in records[1]] == ["all_reduce", "broadcast"]


@needs_a_dump
@pytest.mark.timeout(120)
def test_a_rank_that_returned_still_reports_what_it_began():
    with pytest.raises(RuntimeError, match="Timed out") as raised:
        course.launch(skipper_returns, 2, args=(0,), collective_timeout=2, timeout=60)
    flight = raised.value.flight_records
    assert [e.seq for e in flight[0]] == [1] and [e.seq for e in flight[1]] == [1, 2]
    assert [r.op for r in raised.value.records[0]] == ["all_reduce"]


@pytest.mark.timeout(120)
def test_without_a_collective_timeout_a_failure_carries_the_records_and_no_flight_entries():
    with pytest.raises(ValueError, match="rank 0 gives up") as raised:
        course.launch(raises_after_one_call, 2, timeout=60)
    assert raised.value.flight_records.get(0) is None
    assert [r.op for r in raised.value.records[0]] == ["all_reduce"]


@pytest.mark.parametrize("value", [0, -1, float("nan"), 30, 60, "2"])
def test_a_collective_timeout_that_is_not_a_number_under_the_launch_s_is_refused(value):
    with pytest.raises(ValueError, match="collective_timeout must be a positive number of seconds under"):
        course.launch(raises_after_one_call, 2, timeout=30, collective_timeout=value)


def test_entries_keep_collectives_and_name_the_first_caller_outside_torch_and_the_course():
    torch_file = os.path.join(os.path.dirname(torch.__file__), "distributed", "distributed_c10d.py")
    course_file = os.path.join(os.path.dirname(course.__file__), "recorder.py")
    trace = {"entries": [
        {"collective_seq_id": 3, "profiling_name": "gloo:all_gather", "input_sizes": [[2, 5]], "is_p2p": False,
         "process_group": ("1", "tp"), "frames": [{"filename": torch_file, "line": 9, "name": "all_gather"},
                                                  {"filename": course_file, "line": 4, "name": "wrapper"},
                                                  {"filename": "/home/s/step.py", "line": 12, "name": "step"}]},
        {"collective_seq_id": 0, "profiling_name": "gloo:send", "input_sizes": [[2]], "is_p2p": True,
         "process_group": ("0", "default_pg"), "frames": []},
        {"collective_seq_id": 4, "profiling_name": "gloo:barrier", "input_sizes": [], "is_p2p": False,
         "process_group": ("7", ""), "frames": [{"filename": torch_file, "line": 1, "name": "barrier"}]}]}
    assert flight_records.entries(trace) == [FlightEntry(3, "all_gather", ((2, 5),), "tp", "step.py:12 step"),
                                             FlightEntry(4, "barrier", (), "7", None)]
    assert flight_records.entries({}) == []


def test_a_torch_without_a_dump_reads_none(monkeypatch):
    monkeypatch.delattr(torch._C._distributed_c10d, "_dump_fr_trace", raising=False)
    assert flight_records.read() is None


def waits_for_nobody():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(4))
    return "returned"


@pytest.mark.timeout(120)
def test_the_launch_s_own_timeout_carries_the_records_of_the_ranks_that_returned():
    with pytest.raises(course.RankTimeout) as raised:
        course.launch(waits_for_nobody, 2, timeout=3)
    assert set(raised.value.records) == {1} and list(raised.value.records[1]) == []
    assert raised.value.flight_records == {1: None}
