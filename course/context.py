"""Context parallelism's bookkeeping: which tokens a rank holds, one process's attention to check
against, and the causal work each rank does.

    positions = context.contiguous_positions(sequence=10, ranks=3)      # [0..3], [4..6], [7..9]
    out, lse = context.attention(q, k, v, causal=True)                  # one process, the whole sequence
    context.causal_pairs(positions)                                     # (query, key) pairs per rank

A rank of context parallelism holds some of the sequence's tokens, every layer's activations for
those tokens only; attention is the one operation that needs the others' keys and values. A split is a
list, rank by rank, of the global positions (0 to s − 1) of the tokens each rank holds: contiguous
(rank r the r-th of `tensor_split(N)`, the first ranks one token longer where N does not divide s), or
any other order, lab 7's zig-zag included. Under a causal mask a query at position i attends the keys
at positions ≤ i, wherever they are held.

Tensors are (batch, heads, tokens, head_dim); scores are scaled by 1/√head_dim. The log-sum-exp `lse`
(batch, heads, tokens) is each query's log Σ_j exp(score_j) over the keys it attends: what an online
softmax carries between blocks, and what the backward needs to rebuild the probabilities.

Used in: lab 7 (07_long_sequences).
"""
from __future__ import annotations

import math

import torch


def contiguous_positions(sequence: int, ranks: int) -> list[torch.Tensor]:
    """Rank r's token positions: the r-th block of `arange(sequence).tensor_split(ranks)`."""
    if ranks < 1 or sequence < ranks:
        raise ValueError(f"a sequence of {sequence} tokens cannot give each of {ranks} ranks a token")
    return list(torch.arange(sequence).tensor_split(ranks))


def check_split(positions, sequence: int) -> None:
    """Refuses, in words, a split that does not hold every position once."""
    got = torch.cat([torch.as_tensor(p) for p in positions]).sort().values
    if not torch.equal(got, torch.arange(sequence)):
        missing = sorted(set(range(sequence)) - set(got.tolist()))
        raise ValueError(f"the ranks' positions must hold each of the {sequence} positions exactly once; "
                         f"{len(got)} positions given, missing {missing[:8]}")


def causal_mask(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """True where a key comes after the query (masked out): (queries, keys)."""
    return key_positions[None, :] > query_positions[:, None]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              query_positions: torch.Tensor | None = None, key_positions: torch.Tensor | None = None):
    """One process's attention, the whole score matrix at once: (out, lse). Positions default to
    0..tokens − 1; give them to attend a rank's queries to some keys."""
    if query_positions is None:
        query_positions = torch.arange(q.shape[-2])
    if key_positions is None:
        key_positions = torch.arange(k.shape[-2])
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(causal_mask(query_positions, key_positions).to(q.device), float("-inf"))
    lse = scores.logsumexp(-1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def causal_pairs(positions) -> list[int]:
    """Per rank, the (query, key) pairs a causal mask leaves: the work of its attention, whatever the
    order in which its blocks arrive. A contiguous split gives the last rank the most."""
    every = torch.cat([torch.as_tensor(p) for p in positions])
    return [int((every[None, :] <= torch.as_tensor(p)[:, None]).sum()) for p in positions]


def imbalance(positions) -> float:
    """The busiest rank's causal pairs over the mean: 1 is balanced; the step waits for the busiest."""
    pairs = causal_pairs(positions)
    return max(pairs) / (sum(pairs) / len(pairs))
