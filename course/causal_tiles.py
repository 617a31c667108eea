"""The causal work of each ring step, tile by tile: the (query, key) tiles a causal mask leaves for a
rank's queries against the block of keys it holds, counted, and timed on ranks.

    causal_tiles.causal_tiles(query_positions, key_positions, tile=128)  # [(q0, q1, k0, k1, masked), ...]
    causal_tiles.ring_work(positions, tile=128)                          # [rank][step]: scores computed
    run = course.launch(causal_tiles.timed_ring, ranks, args=(positions, heads, head_dim, 128))
    run[rank]["seconds"]                                                 # per ring step, this rank's

A kernel that skips what the mask hides (FlashAttention's) works tile by tile. Each rank's positions
(a split, as `course.context` writes them) are cut into runs of consecutive positions (a contiguous
split gives one a rank, lab 7's zig-zag two), and each run into tiles of at most `tile` tokens. A
(query tile, key tile) pair is skipped when every key comes after every query, computed whole when
every key is at or before every query, and computed with the mask otherwise (the diagonal's tiles,
which cost a whole tile: the smaller the tiles, the closer the work comes to the causal pairs).
At ring step j rank r holds the keys of rank (r − j) mod N.

What `timed_ring` measures, on each rank (one thread a rank, as `course.launch` sets): the CPU seconds
of its thread in each ring step's tiles, the median of a few passes (CPU time, not wall-clock: other
processes on a shared machine do not add to it), each step also a timeline span "ring step j"
(wall-clock, as every span). A tile's work is
an online softmax's for one tile: the scores q·kᵀ/√d, the mask on a diagonal tile, exp(scores − each
row's maximum), their row sums and the probabilities times V; the tiles' results are summed into a
checksum, not merged into an output (that is ring attention, lab 7's exercises 4 and 5). No K or V is
sent: every rank
draws the whole sequence's seeded q, k and v and takes the block it would hold; the ranks meet at a
barrier after each step, where the ring's exchange makes each wait for its neighbour. A first pass,
untimed, warms the kernels.

Used in: lab 7 (07_long_sequences).
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from course import context, timeline


def runs(positions) -> list[tuple[int, int]]:
    """The local index ranges [start, stop) of `positions` where each position is one more than the last."""
    positions = torch.as_tensor(positions).tolist()
    found, start = [], 0
    for i in range(1, len(positions) + 1):
        if i == len(positions) or positions[i] != positions[i - 1] + 1:
            found.append((start, i))
            start = i
    return found


def tiles(positions, tile: int) -> list[tuple[int, int]]:
    """The runs of `positions` cut into local index ranges of at most `tile` tokens."""
    if not isinstance(tile, int) or tile < 1:
        raise ValueError(f"a tile holds at least one token; got tile={tile!r}")
    return [(i, min(i + tile, stop)) for start, stop in runs(positions) for i in range(start, stop, tile)]


def causal_tiles(query_positions, key_positions, tile: int) -> list[tuple[int, int, int, int, bool]]:
    """The (query tile, key tile) pairs a causal mask leaves, as (q0, q1, k0, k1, masked) local index ranges:
    masked False where every key is at or before every query (computed whole), True where the mask cuts
    the tile; pairs where every key comes after every query are left out."""
    query_positions, key_positions = torch.as_tensor(query_positions), torch.as_tensor(key_positions)
    query_tiles = [(q0, q1, int(query_positions[q0:q1].min()), int(query_positions[q0:q1].max()))
                   for q0, q1 in tiles(query_positions, tile)]
    key_tiles = [(k0, k1, int(key_positions[k0:k1].min()), int(key_positions[k0:k1].max()))
                 for k0, k1 in tiles(key_positions, tile)]
    found = []
    for q0, q1, first_query, last_query in query_tiles:
        for k0, k1, first_key, last_key in key_tiles:
            if first_key > last_query:
                continue
            found.append((q0, q1, k0, k1, last_key > first_query))
    return found


def ring_work(positions, tile: int) -> list[list[int]]:
    """[rank][step]: the scores each rank computes at each ring step, tile by tile (a masked tile whole)."""
    n = len(positions)
    return [[sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1, _ in causal_tiles(positions[r], positions[(r - j) % n],
                                                                            tile))
             for j in range(n)] for r in range(n)]


def busiest_over_mean(work) -> float:
    """The busiest rank's total over the mean: 1 is balanced; each ring step waits for the slowest."""
    totals = [sum(steps) for steps in work]
    return max(totals) / (sum(totals) / len(totals))


def _masks(query_positions, key_positions, found) -> list:
    """Each tile's mask (None for a tile computed whole), made before the timing: a kernel compares indices."""
    return [context.causal_mask(query_positions[q0:q1], key_positions[k0:k1]) if masked else None
            for q0, q1, k0, k1, masked in found]


def _tile_work(q, k, v, found, masks) -> torch.Tensor:
    """The work of the tiles `found` of one ring step; a checksum of their results."""
    total = q.new_zeros(())
    scale = 1 / math.sqrt(q.shape[-1])
    for (q0, q1, k0, k1, _), mask in zip(found, masks):
        scores = q[..., q0:q1, :] @ k[..., k0:k1, :].transpose(-1, -2) * scale
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        total = total + weights.sum() + (weights @ v[..., k0:k1, :]).sum()
    return total


def timed_ring(positions, heads: int, head_dim: int, tile: int, seed: int = 0, passes: int = 3) -> dict:
    """Runs on every rank: the causal tiles of each ring step for this rank's queries (`positions`, every
    rank's), timed step by step, `passes` times; {"seconds": per step, the thread's CPU seconds, the median
    over the passes, "scores": per step (ring_work's), "checksum"}."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if passes < 1:
        raise ValueError(f"rank {rank}: timed_ring needs at least one timed pass; got passes={passes}")
    if len(positions) != world_size:
        raise ValueError(f"rank {rank}: timed_ring was given {len(positions)} ranks' positions for {world_size} "
                         "ranks; give one tensor of positions a rank")
    sequence = sum(len(p) for p in positions)
    context.check_split(positions, sequence)
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, sequence, head_dim, generator=generator) for _ in range(3))
    mine = torch.as_tensor(positions[rank])
    steps = []
    for j in range(world_size):
        owner = torch.as_tensor(positions[(rank - j) % world_size])
        found = causal_tiles(mine, owner, tile)
        steps.append((k[:, :, owner], v[:, :, owner], found, _masks(mine, owner, found)))
    queries = q[:, :, mine]
    for keys, values, found, masks in steps:                   # warm-up, untimed
        _tile_work(queries, keys, values, found, masks)
    dist.barrier()
    seconds, checksum = [[] for _ in steps], 0.0
    for _ in range(passes):
        for j, (keys, values, found, masks) in enumerate(steps):
            with timeline.span(f"ring step {j}"):
                start = time.thread_time()
                checksum += float(_tile_work(queries, keys, values, found, masks))
                seconds[j].append(time.thread_time() - start)
            dist.barrier()
    scores = [sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1, _ in found) for _, _, found, _ in steps]
    return {"seconds": [sorted(times)[len(times) // 2] for times in seconds], "scores": scores, "checksum": checksum}
