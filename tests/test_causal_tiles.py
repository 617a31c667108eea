"""Covers: course.causal_tiles.

The tiles a causal mask leaves each ring step, checked against the causal pairs they must cover (every
pair once, no pair the mask hides outside a masked tile), the contiguous split's load against its
(2N − 1)/N bound as tiles shrink and the zig-zag's balance, and the timed ring on 2 real ranks: its steps
on the timeline and its refusals."""
from __future__ import annotations

import pytest
import torch

import course
from course import causal_tiles, context


def zigzag(sequence, ranks):
    chunks = torch.arange(sequence).tensor_split(2 * ranks)
    return [torch.cat([chunks[r], chunks[2 * ranks - 1 - r]]) for r in range(ranks)]


def shuffled(sequence, ranks):
    return list(torch.randperm(sequence, generator=torch.Generator().manual_seed(3)).tensor_split(ranks))


def test_runs_and_tiles_cut_where_the_positions_jump():
    assert causal_tiles.runs(torch.tensor([0, 1, 2, 7, 8, 4])) == [(0, 3), (3, 5), (5, 6)]
    assert causal_tiles.tiles(torch.tensor([0, 1, 2, 3, 4, 10, 11]), 2) == [(0, 2), (2, 4), (4, 5), (5, 7)]
    with pytest.raises(ValueError, match="at least one token"):
        causal_tiles.tiles(torch.arange(4), 0)


def test_tiles_by_hand_skipped_whole_and_masked():
    # queries at 4..7 against keys 0..3 (all before: whole), 4..7 (the diagonal: masked), 8..11 (all after: skipped)
    queries = torch.arange(4, 8)
    assert causal_tiles.causal_tiles(queries, torch.arange(0, 4), 4) == [(0, 4, 0, 4, False)]
    assert causal_tiles.causal_tiles(queries, torch.arange(4, 8), 4) == [(0, 4, 0, 4, True)]
    assert causal_tiles.causal_tiles(queries, torch.arange(8, 12), 4) == []
    # tiles of 2 on the diagonal: two masked, one whole, one skipped
    assert causal_tiles.causal_tiles(queries, torch.arange(4, 8), 2) == [(0, 2, 0, 2, True), (2, 4, 0, 2, False),
                                                                         (2, 4, 2, 4, True)]


@pytest.mark.parametrize("split", [context.contiguous_positions, zigzag, shuffled])
@pytest.mark.parametrize("sequence, ranks, tile", [(37, 3, 4), (64, 4, 5), (20, 2, 1)])
def test_the_tiles_cover_each_causal_pair_once_and_skip_only_masked_ones(split, sequence, ranks, tile):
    positions = split(sequence, ranks)
    for r in range(ranks):
        covered = torch.zeros(sequence, sequence, dtype=torch.int)      # [query position, key position]
        for j in range(ranks):
            keys = positions[(r - j) % ranks]
            for q0, q1, k0, k1, masked in causal_tiles.causal_tiles(positions[r], keys, tile):
                hidden = context.causal_mask(positions[r][q0:q1], keys[k0:k1])
                assert masked or not hidden.any(), "a tile computed whole holds a pair the mask hides"
                covered[positions[r][q0:q1, None], keys[None, k0:k1]] += (~hidden).int()
        want = (torch.arange(sequence)[None, :] <= positions[r][:, None]).int()
        assert torch.equal(covered[positions[r]], want)
        assert int(covered.sum()) == context.causal_pairs(positions)[r]


def test_the_contiguous_split_nears_its_bound_as_tiles_shrink_and_zig_zag_is_balanced():
    n, sequence = 4, 4096
    bound = (2 * n - 1) / n
    coarse = causal_tiles.busiest_over_mean(causal_tiles.ring_work(context.contiguous_positions(sequence, n), 1024))
    fine = causal_tiles.busiest_over_mean(causal_tiles.ring_work(context.contiguous_positions(sequence, n), 64))
    assert coarse < fine < bound
    assert fine == pytest.approx(context.imbalance(context.contiguous_positions(sequence, n)), rel=0.02)
    assert causal_tiles.busiest_over_mean(causal_tiles.ring_work(zigzag(sequence, n), 64)) == 1.0
    # the contiguous split's first rank skips every step but its first
    assert causal_tiles.ring_work(context.contiguous_positions(sequence, n), 64)[0][1:] == [0] * (n - 1)


def test_the_timed_ring_runs_each_step_on_real_ranks_and_says_what_it_computed():
    positions = zigzag(96, 2)
    run = course.launch(causal_tiles.timed_ring, 2, args=(positions, 2, 8, 16), kwargs={"passes": 2})
    work = causal_tiles.ring_work(positions, 16)
    for rank in run.ranks:
        assert run[rank]["scores"] == work[rank]
        assert len(run[rank]["seconds"]) == 2 and all(s > 0 for s in run[rank]["seconds"])
        names = [s.name for s in run.timeline.rank(rank)]
        assert names == ["ring step 0", "ring step 1"] * 2
    assert run[0]["checksum"] > 0


def test_the_timed_ring_refuses_positions_for_another_number_of_ranks():
    with pytest.raises(ValueError, match="3 ranks' positions for 2 ranks"):
        course.launch(causal_tiles.timed_ring, 2, args=(context.contiguous_positions(12, 3), 2, 8, 4))
