"""Covers: course.sharding.

course.sharding: chunks cut as lab 2's ring cuts them, the library's collectives on them, and ZeRO-3's
layers, each one flat tensor cut once, gathered back whole in one call."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import course
from course import models, sharding


def test_chunk_sizes_are_tensor_splits():
    for length in (0, 1, 5, 12, 13):
        for ranks in (1, 2, 3, 4):
            assert sharding.chunk_sizes(length, ranks) == [len(c) for c in torch.arange(length).tensor_split(ranks)]
    with pytest.raises(ValueError, match="at least 1"):
        sharding.chunk_sizes(4, 0)


def test_a_chunk_is_a_view_and_a_rank_outside_the_world_is_refused():
    t = torch.zeros(2, 5)
    sharding.chunk_of(t, 1, 3).fill_(1)
    assert t.reshape(-1).tolist() == [0] * 4 + [1] * 3 + [0] * 3
    with pytest.raises(ValueError, match="rank 3 is not one of the 3 ranks"):
        sharding.chunk_of(t, 3, 3)


def _collectives(lengths):
    """Runs on every rank: the library's reduce-scatter and all-gather on rank-seeded tensors, and whether
    the inputs were left alone."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    out = []
    for length in lengths:
        tensor = torch.arange(length, dtype=torch.float64) * (rank + 1)
        kept = tensor.clone()
        mine = sharding.reduce_scatter(tensor)
        chunk = sharding.chunk_of(torch.arange(length, dtype=torch.float64) + 100 * rank)
        whole = sharding.all_gather(chunk, length)
        out.append({"mine": mine, "input unchanged": torch.equal(tensor, kept), "whole": whole,
                    "ranks": ranks})
    return out


@pytest.mark.parametrize("ranks", [2, 3])
def test_reduce_scatter_and_all_gather_for_lengths_that_divide_and_that_do_not(ranks):
    lengths = [6, 7, 2, 1]                # divisible by 2 or 3, neither, fewer elements than ranks
    run = course.launch(_collectives, ranks, args=(lengths,))
    total = sum(r + 1 for r in range(ranks))
    for rank in run.ranks:
        for length, got in zip(lengths, run[rank]):
            summed = torch.arange(length, dtype=torch.float64) * total
            assert torch.equal(got["mine"], sharding.chunk_of(summed, rank, ranks)), (rank, length)
            assert got["input unchanged"]
            expected = torch.cat([sharding.chunk_of(torch.arange(length, dtype=torch.float64) + 100 * r, r, ranks)
                                  for r in range(ranks)])
            assert torch.equal(got["whole"], expected), (rank, length)


def _started_gathers(lengths):
    """Runs on every rank: every all-gather started first, then waited for in reverse order, against
    the blocking all_gather; and whether the recorder saw them as asynchronous."""
    rank = dist.get_rank()
    chunks = [sharding.chunk_of(torch.arange(length, dtype=torch.float64) + 100 * rank) for length in lengths]
    pending = [sharding.start_all_gather(chunk, length) for chunk, length in zip(chunks, lengths)]
    started = [p.wait() for p in reversed(pending)][::-1]
    return [torch.equal(s, sharding.all_gather(c, n)) for s, c, n in zip(started, chunks, lengths)]


def test_a_started_all_gather_returns_at_once_and_waits_for_the_same_tensor():
    run = course.launch(_started_gathers, 3, args=([7, 2, 9],))
    assert all(all(run[rank]) for rank in run.ranks)
    gathers = [r for r in run.comm.rank(0) if "gather" in r.op]
    assert [r.async_op for r in gathers] == [True] * 3 + [False] * 3
    with pytest.raises(ValueError, match="rank 1: a chunk of 5 elements"):
        course.launch(_wrong_started_chunk, 2, timeout=30)


def _wrong_started_chunk():
    sharding.start_all_gather(torch.zeros(5 if dist.get_rank() == 1 else 4), 7).wait()


def _wrong_chunk():
    sharding.all_gather(torch.zeros(5 if dist.get_rank() == 1 else 4), 7)     # rank 1's chunk is 3 long


def test_a_chunk_of_the_wrong_size_is_refused_naming_the_rank():
    with pytest.raises(ValueError, match="rank 1: a chunk of 5 elements, but chunk 1 of 7 elements split 2 ways has 3"):
        course.launch(_wrong_chunk, 2, timeout=30)


def test_layers_are_the_modules_with_parameters_of_their_own_in_parameter_order():
    model = models.mlp(in_features=5, hidden=(4, 3), classes=2)
    owned = [p for m in sharding.layers(model) for p in m.parameters(recurse=False)]
    assert [id(p) for p in owned] == [id(p) for p in model.parameters()]
    assert len(sharding.layers(model)) == 3
    assert sharding.flat([torch.ones(2, 2), torch.zeros(3)]).tolist() == [1, 1, 1, 1, 0, 0, 0]


def _layers_round_trip(seed):
    """Runs on every rank: a model cut by layer, its parameters freed, then gathered whole."""
    model = models.mlp(in_features=7, hidden=(5,), classes=3, seed=seed, dtype=torch.float64)
    want = [p.detach().clone() for p in model.parameters()]
    shards = sharding.shard_layers(model)
    sharding.free_parameters(model)
    calls = []

    def counted(chunk, length):
        calls.append(length)
        return sharding.all_gather(chunk, length)
    got = sharding.gather_layers(model, shards, counted)
    return {"same": all(torch.equal(g, w) for g, w in zip(got, want)), "shapes": [tuple(g.shape) for g in got],
            "shards": [s.numel() for s in shards], "calls": calls,
            "freed": sum(p.untyped_storage().nbytes() for p in model.parameters())}


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_model_cut_by_layer_comes_back_whole_with_one_all_gather_a_layer(ranks):
    run = course.launch(_layers_round_trip, ranks, args=(3,))
    layers = [7 * 5 + 5, 5 * 3 + 3]                      # 40 and 18 parameters
    for rank in run.ranks:
        got = run[rank]
        assert got["same"] and got["freed"] == 0
        assert got["shapes"] == [(5, 7), (5,), (3, 5), (3,)]
        assert got["calls"] == layers
        assert got["shards"] == [sharding.chunk_sizes(n, ranks)[rank] for n in layers]
