"""Covers: course.hangs.

Lab 10's broken programs: drawn from a seed (which ranks, which call, skip / reorder / shape), run on real gloo
ranks, they leave in every rank's Flight Recorder the calls the plan says, up to and at the first call where the
ranks part; a hang ends in collective_timeout with every rank's entries; DETAIL names a mismatch at the call; a
gradient average that returns early on an empty shard hangs. The truth of each case is computed here from the
program, never by the module.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import course
from course import hangs

needs_a_dump = pytest.mark.skipif(not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"),
                                  reason=f"torch {torch.__version__} has no Flight Recorder dump for gloo")


def planned(program: hangs.Program, rank: int) -> list[tuple[str, tuple]]:
    """What `rank` calls, by the plan: (op, input sizes) in order, up to and with its call at `program.at`."""
    calls = list(program.calls)
    if rank in program.empty:
        op, shape = calls[program.at]
        if program.kind == "skip":
            del calls[program.at]
        elif program.kind == "reorder":
            calls[program.at], calls[program.at + 1] = calls[program.at + 1], calls[program.at]
        else:
            calls[program.at] = (op, shape[::-1])
    return [(op, () if op == "barrier" else (shape,)) for op, shape in calls[:program.at + 1]]


def assert_parted_as_planned(program, entries):
    assert sorted(entries) == list(range(program.world_size))
    for rank, found in entries.items():
        want = planned(program, rank)
        got = [(e.op, e.sizes) for e in found if e.seq <= program.at + 1]
        assert [e.seq for e in found[:len(got)]] == list(range(1, len(got) + 1)), rank
        assert got == want, (rank, program)
        assert all(e.group == hangs.GROUP for e in found)


def test_a_draw_is_the_seed_s_and_keeps_its_promises():
    for seed in range(200):
        for world_size in (2, 3, 4):
            program = hangs.draw(seed, world_size)
            assert program == hangs.draw(seed, world_size)
            assert program.kind in hangs.KINDS and 4 <= len(program.calls) <= 7
            assert all(a[0] != b[0] for a, b in zip(program.calls, program.calls[1:]))   # neighbours differ
            assert len(program.empty) == 1 if world_size == 2 else 1 <= len(program.empty) < world_size / 2
            if program.kind == "reorder":
                assert program.at + 1 < len(program.calls)
            if program.kind == "shape":
                op, shape = program.calls[program.at]
                assert op != "barrier" and shape != shape[::-1]
    assert {hangs.draw(seed, 4).kind for seed in range(30)} == set(hangs.KINDS)
    assert hangs.draw(3, 4, kind="skip", empty=(1, 3)).empty == (1, 3)


@pytest.mark.parametrize("arguments, message", [
    ((1, 1), "at least 2 ranks"), ((1, 2, "drop"), "kind must be one of"), ((1, 2, "skip", (2,)), "empty must"),
    ((1, 4, "skip", ()), "empty must"), ((1, 4, "skip", (1, 1)), "empty must")])
def test_a_draw_refuses_what_it_cannot_plan(arguments, message):
    with pytest.raises(ValueError, match=message):
        hangs.draw(*arguments)


def test_the_empty_ranks_and_only_they_have_no_rows():
    rows = hangs.shard_rows(7, 4, empty=(2,))
    assert rows[2] == 0 and all(1 <= n <= 6 for i, n in enumerate(rows) if i != 2)
    assert rows == hangs.shard_rows(7, 4, empty=(2,))


@needs_a_dump
@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size, kind, empty", [(2, "skip", (1,)), (4, "reorder", (2,)), (2, "shape", (0,))])
def test_a_program_s_records_part_where_its_plan_says(world_size, kind, empty):
    program = hangs.draw(11, world_size, kind=kind, empty=empty)
    assert_parted_as_planned(program, hangs.run(program))


@needs_a_dump
@pytest.mark.timeout(120)
def test_a_skip_of_the_last_call_leaves_the_others_waiting_in_it():
    drawn = hangs.draw(4, 2, kind="skip", empty=(0,))
    program = hangs.Program(2, drawn.calls, "skip", len(drawn.calls) - 1, (0,), 4)
    entries = hangs.run(program)
    assert len(entries[1]) == len(entries[0]) + 1 == len(program.calls)
    assert_parted_as_planned(program, entries)


def test_records_draws_and_runs_as_run_does():
    shape = next(seed for seed in range(100) if hangs.draw(seed, 2).kind == "shape")   # no hang: quick
    assert hangs.records(shape, 2) == hangs.run(hangs.draw(shape, 2))
    assert hangs.records(1, 2, kind="shape") == hangs.run(hangs.draw(1, 2, kind="shape"))


def test_run_refuses_what_is_not_a_program():
    with pytest.raises(TypeError, match="hangs.Program"):
        hangs.run({"kind": "skip"})


@pytest.mark.timeout(120)
def test_detail_names_a_shape_that_differs_at_the_call():
    program = hangs.draw(5, 2, kind="shape", empty=(1,))
    op, shape = program.calls[program.at]
    with pytest.raises(RuntimeError, match="Detected mismatch between collectives") as raised:
        course.launch(hangs.under_detail, 2, args=(program,), collective_timeout=2)
    assert f"TensorShape=[{shape[0]}, {shape[1]}]" in str(raised.value)
    assert f"TensorShape=[{shape[1]}, {shape[0]}]" in str(raised.value)


@pytest.mark.timeout(120)
def test_detail_names_the_rank_that_skips_its_last_call_and_returns_but_not_the_call():
    drawn = hangs.draw(5, 4, kind="skip", empty=(2,))
    program = hangs.Program(4, drawn.calls, "skip", len(drawn.calls) - 1, (2,), 5)
    with pytest.raises(RuntimeError, match="Ranks 2 failed to pass monitoredBarrier in 2000 ms") as raised:
        course.launch(hangs.under_detail, 4, args=(program, 2), collective_timeout=2)
    assert "Detected mismatch" not in str(raised.value)


def test_the_shards_are_slices_of_one_batch_and_the_model_leaves_the_random_state_alone():
    rows = [0, 3, 2]
    inputs, targets = hangs.regression_batch(9, rows)
    parts = [hangs.regression_shard(9, rows, rank) for rank in range(3)]
    assert torch.equal(torch.cat([x for x, _ in parts]), inputs) and torch.equal(torch.cat([y for _, y in parts]),
                                                                                   targets)
    assert parts[0][0].shape == (0, hangs.FEATURES)
    before = torch.get_rng_state()
    first = hangs.regression_model(3)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(first.weight, hangs.regression_model(3).weight)


def average_on_shards(rows, seed):
    model = hangs.regression_model(seed)
    hangs.broken_average_gradients(model, *hangs.regression_shard(seed, rows, dist.get_rank()))
    return "returned"


@needs_a_dump
@pytest.mark.timeout(120)
def test_the_broken_average_hangs_on_an_empty_shard_and_the_records_show_who_left():
    with pytest.raises(RuntimeError, match="Timed out") as raised:
        course.launch(average_on_shards, 2, args=([3, 0], 1), collective_timeout=2)
    flight = raised.value.flight_records
    assert [e.op for e in flight[1]] == [] and [(e.seq, e.op, e.sizes) for e in flight[0]] == [
        (1, "all_reduce", ((hangs.OUTPUTS, hangs.FEATURES),))]
