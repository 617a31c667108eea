"""Covers: course.drawings, course.split_drawing, course._drawing.

The pictures of labs 2, 3 and 4 (course.drawings): the arithmetic each draws, checked without
pixels against an independent computation and against the labs' own code, then what each
figure holds, counted, and the arguments each refuses."""
from __future__ import annotations

import queue
import threading

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle

from course import drawings, sharding, sizes, transfer
from grader.common.solution import load

RANKS = range(1, 9)


def simulate(schedule, ranks, length):
    """Every rank starts with its own numbers (rank r's element i is (r + 1) * 1000 + i), cut into
    chunks as tensor_split cuts them; each step, every rank sends at once what the schedule says,
    and the receiver adds it (reduce-scatter) or copies it (all-gather). Returns each rank's numbers."""
    cuts = np.cumsum([0] + sharding.chunk_sizes(length, ranks))
    held = [[np.arange(cuts[k], cuts[k + 1]) + (r + 1) * 1000 for k in range(ranks)] for r in range(ranks)]
    for step in schedule:
        sent = {move.rank: (move.to, move.sends, held[move.rank][move.sends].copy()) for move in step.moves}
        for move in step.moves:
            to, chunk, values = sent[move.source]
            assert to == move.rank, f"{step}: rank {move.source} sends to {to}, but rank {move.rank} receives from it"
            assert chunk == move.receives, f"{step}: rank {move.rank} receives into c{move.receives}, c{chunk} arrives"
            held[move.rank][chunk] = held[move.rank][chunk] + values if step.phase == "reduce-scatter" else values
    return [np.concatenate(chunks) for chunks in held]


@pytest.mark.parametrize("ranks", RANKS)
def test_the_ring_leaves_the_full_sum_on_every_rank(ranks):
    length = 3 * ranks + 2                   # chunks of two sizes, as tensor_split cuts them
    total = sum(np.arange(length) + (r + 1) * 1000 for r in range(ranks))
    for rank, values in enumerate(simulate(drawings.ring_schedule(ranks), ranks, length)):
        assert np.array_equal(values, total), f"{ranks} ranks: rank {rank} ends with {values}, not the sum {total}"


def test_the_simulation_catches_a_wrong_schedule():
    schedule = drawings.ring_schedule(4)
    # the classic slip: all-gather sending the chunk reduce-scatter would send, (r - s) % N
    wrong = [step if step.phase == "reduce-scatter" else step._replace(moves=tuple(
        move._replace(sends=(move.rank - step.step) % 4, receives=(move.rank - 1 - step.step) % 4)
        for move in step.moves)) for step in schedule]
    total = sum(np.arange(10) + (r + 1) * 1000 for r in range(4))
    assert not all(np.array_equal(v, total) for v in simulate(wrong, 4, 10))


@pytest.mark.parametrize("ranks", RANKS)
def test_each_rank_sends_2_n_minus_1_chunks_to_its_right_and_the_ring_formula_in_all(ranks):
    schedule = drawings.ring_schedule(ranks)
    assert [(s.phase, s.step) for s in schedule] == ([("reduce-scatter", s) for s in range(ranks - 1)]
                                                     + [("all-gather", s) for s in range(ranks - 1)])
    for length in (ranks, 7 * ranks, 7 * ranks + ranks // 2):
        chunk = sharding.chunk_sizes(length, ranks)
        elements = {r: 0 for r in range(ranks)}
        for step in schedule:
            assert sorted(move.sends for move in step.moves) == list(range(ranks)), "each chunk moves once a step"
            for move in step.moves:
                assert move.to == (move.rank + 1) % ranks and move.source == (move.rank - 1) % ranks
                elements[move.rank] += chunk[move.sends]
        assert sum(elements.values()) == 2 * (ranks - 1) * length     # lab 2's bytes_of_a_ring, in elements
        if length % ranks == 0:
            assert set(elements.values()) == {transfer.ring_all_reduce(length, ranks)}   # 2(N-1)/N of the tensor
        assert max(elements.values()) <= 2 * (ranks - 1) * -(-length // ranks)


class ThreadRing:
    """torch.distributed's four messages between threads, one per rank: what lab 2's ring calls,
    recording which of its tensor's chunks each rank sends, and to whom."""

    def __init__(self, ranks, length):
        self.ranks, self.local = ranks, threading.local()
        self.starts = list(np.cumsum([0] + sharding.chunk_sizes(length, ranks))[:-1])
        self.mail = {(a, b): queue.Queue() for a in range(ranks) for b in range(ranks)}
        self.sent = {r: [] for r in range(ranks)}

    def get_rank(self):
        return self.local.rank

    def get_world_size(self):
        return self.ranks

    def isend(self, tensor, dst):
        rank = self.local.rank
        self.sent[rank].append((self.starts.index(tensor.storage_offset()), dst))
        self.mail[rank, dst].put(tensor.clone())
        return self

    send = isend

    def wait(self):
        pass

    def recv(self, tensor, src):
        tensor.copy_(self.mail[src, self.local.rank].get(timeout=30))

    def irecv(self, tensor, src):
        return _Receive(self, tensor, src)


class _Receive:
    """A posted receive: it takes its message when waited for (each peer's messages arrive in order)."""

    def __init__(self, ring, tensor, src):
        self.ring, self.tensor, self.src, self.done = ring, tensor, src, False

    def wait(self):
        if not self.done:
            self.ring.recv(self.tensor, self.src)
            self.done = True


@pytest.fixture(scope="module")
def lab2():
    return load("02_data_parallel")


@pytest.mark.parametrize("ranks", [2, 3, 4, 5])
def test_the_schedule_is_what_lab_2s_ring_sends(lab2, ranks):
    length = 3 * ranks + 1
    ring = ThreadRing(ranks, length)
    lab2.ring_all_reduce.__globals__["dist"] = ring
    tensors = [torch.arange(length, dtype=torch.float64) + 100 * r for r in range(ranks)]

    def run(rank):
        ring.local.rank = rank
        lab2.ring_all_reduce(tensors[rank])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    expected = sum(torch.arange(length, dtype=torch.float64) + 100 * r for r in range(ranks))
    assert all(torch.equal(t, expected) for t in tensors)
    schedule = drawings.ring_schedule(ranks)
    for rank in range(ranks):
        assert ring.sent[rank] == [(step.moves[rank].sends, step.moves[rank].to) for step in schedule], f"rank {rank}"


def test_describe_ring_counts_from_the_schedule():
    assert drawings.describe_ring(4).startswith("**4 ranks**: 6 steps (3 of reduce-scatter, 3 of all-gather); "
                                                "each rank sends 6 chunks of 1/4 of the tensor, 1.5× the tensor")
    assert "1.75×" in drawings.describe_ring(8)


@pytest.mark.parametrize("direction", sizes.DIRECTIONS)
@pytest.mark.parametrize("ranks", RANKS)
def test_the_blocks_tile_w_once_as_lab_3_chunks_it(direction, ranks):
    inputs, outputs = 3 * ranks, 2 * ranks
    blocks = drawings.split_blocks(direction, ranks, inputs, outputs)
    owner = np.full((inputs, outputs), -1)
    for k, b in enumerate(blocks):
        assert (owner[b.row_start:b.row_stop, b.column_start:b.column_stop] == -1).all(), f"block {k} overlaps"
        owner[b.row_start:b.row_stop, b.column_start:b.column_stop] = k
        shape = (b.row_stop - b.row_start, b.column_stop - b.column_start)
        assert shape == sizes.split_weight(sizes.Dense("W", inputs, outputs), 1, ranks, direction)["weight"]
    assert (owner >= 0).all(), "every element of W belongs to a GPU"
    # lab 3, exercise 1: GPU k holds weight.chunk(N, dim=1)[k] (column) or weight.chunk(N, dim=0)[k] (row)
    w = torch.arange(inputs * outputs).reshape(inputs, outputs)
    for k, (b, chunk) in enumerate(zip(blocks, w.chunk(ranks, dim=1 if direction == "column" else 0))):
        assert torch.equal(w[b.row_start:b.row_stop, b.column_start:b.column_stop], chunk), f"GPU {k}"


def test_an_uneven_split_is_refused_naming_the_sizes():
    with pytest.raises(ValueError, match="500 output features to divide evenly over 3 ranks"):
        drawings.split_blocks("column", 3, 1000, 500)
    with pytest.raises(ValueError, match="500"):
        drawings.draw_split("column", 3, inputs=1000, outputs=500, batch=128)


@pytest.fixture(scope="module")
def lab4():
    return load("04_hybrid")


@pytest.mark.parametrize("data,model", [(1, 1), (1, 4), (4, 1), (2, 2), (2, 3), (3, 2), (8, 8)])
def test_the_grids_groups_partition_the_ranks_both_ways_as_lab_4_numbers_them(lab4, data, model):
    groups = drawings.grid_group_members(data, model)
    ranks = list(range(data * model))
    for kind in (groups.data, groups.model):
        assert sorted(r for group in kind for r in group) == ranks, "each rank in exactly one group of each kind"
    assert len(groups.data) == model and len(groups.model) == data
    for column in groups.data:
        for row in groups.model:
            assert len(set(column) & set(row)) == 1, "a data-parallel and a model-parallel group share one rank"
    grid = lab4.Grid(data, model)
    for rank in ranks:
        d, m = lab4.grid_coordinates(rank, grid)           # lab 4's answer to exercise 2
        assert groups.data[m] == [r * model + m for r in range(data)]            # lab 4's test cell
        assert groups.model[d] == [d * model + p for p in range(model)]
        assert rank in groups.data[m] and rank in groups.model[d]


def _patches(fig, kind):
    return [p for ax in fig.axes for p in ax.patches if type(p) is kind]


@pytest.mark.parametrize("ranks", RANKS)
def test_the_ring_figure_has_a_ring_per_step_and_an_arrow_per_message(ranks):
    fig = drawings.draw_ring(ranks)
    steps = max(1, 2 * (ranks - 1))
    assert len(_patches(fig, Circle)) == steps * ranks
    assert len(_patches(fig, FancyArrowPatch)) == 2 * (ranks - 1) * ranks
    labels = sorted(t.get_text() for ax in fig.axes for t in ax.texts if t.get_text().startswith("c"))
    schedule = drawings.ring_schedule(ranks)
    assert labels == sorted(f"c{move.sends}" for step in schedule for move in step.moves)
    plt.close(fig)


def test_the_ring_into_an_axes_draws_the_first_step(ax):
    assert drawings.draw_ring(5, ax=ax) is ax.figure
    assert len([p for p in ax.patches if type(p) is FancyArrowPatch]) == 5


@pytest.mark.parametrize("direction", sizes.DIRECTIONS)
@pytest.mark.parametrize("ranks", RANKS)
def test_the_split_figure_has_a_block_per_gpu_in_each_of_its_six_matrices(direction, ranks):
    for shapes in ({}, {"inputs": 12 * ranks, "outputs": 6 * ranks, "batch": 4}):
        fig = drawings.draw_split(direction, ranks, **shapes)
        # W, Wᵀ, the stacked result, the added partials and one cut input: N blocks each; one whole input
        assert len(_patches(fig, Rectangle)) == 5 * ranks + 1
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert texts.count("0") == 2 and texts.count(str(ranks - 1)) == 2
        assert sum("(all-gather)" in t for t in texts) == 1 and sum("(all-reduce)" in t for t in texts) == 1
        plt.close(fig)


def test_the_split_labels_are_sizes_split_weights_shapes(ax):
    drawings.draw_split("column", 2, inputs=1000, outputs=500, batch=128, ax=ax)
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "2 parts of 128×250" in texts and "2 partial sums of 128×1000" in texts
    assert "W  1000×500" in texts and "Wᵀ  500×1000" in texts


@pytest.mark.parametrize("data,model", [(1, 1), (2, 2), (1, 4), (3, 5), (8, 8)])
def test_the_grid_figure_has_a_box_per_rank_and_an_outline_per_group(data, model):
    fig = drawings.draw_grid(data, model)
    assert len(_patches(fig, Rectangle)) == data * model
    assert len(_patches(fig, FancyBboxPatch)) == data + model
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert all(any(t.startswith(f"rank {r}\n") for t in texts) for r in range(data * model))
    plt.close(fig)


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError),
                                       ("4", TypeError), (None, TypeError)])
def test_a_bad_number_of_ranks_is_refused_in_the_callers_words(bad, error):
    for call in (lambda: drawings.draw_ring(bad), lambda: drawings.draw_split("row", bad),
                 lambda: drawings.ring_schedule(bad)):
        with pytest.raises(error, match=f"got ranks={bad!r}"):
            call()
    with pytest.raises(error, match=f"got data={bad!r}"):
        drawings.draw_grid(bad, 2)
    with pytest.raises(error, match=f"got model={bad!r}"):
        drawings.draw_grid(2, bad)


def test_too_many_to_draw_and_wrong_words_are_refused():
    with pytest.raises(ValueError, match="ranks=17 is more than the 16"):
        drawings.draw_ring(17)
    with pytest.raises(ValueError, match="model=20 is more than the 16"):
        drawings.draw_grid(2, 20)
    with pytest.raises(ValueError, match="direction must be one of .* got 'diagonal'"):
        drawings.draw_split("diagonal", 2)
    with pytest.raises(ValueError, match="give inputs, outputs and batch together"):
        drawings.draw_split("row", 2, inputs=8)
