"""Context parallelism's bookkeeping: which tokens a rank holds, one process's attention to check
against, and the causal work each rank does.

    positions = context.contiguous_positions(sequence=10, ranks=3)      # [0..3], [4..6], [7..9]
    out, lse = context.attention(q, k, v, causal=True)                  # one process, the whole sequence
    mask = context.document_mask(starts=[0, 4, 7])                      # (query, key positions) -> masked
    out, lse = context.attention(q, k, v, mask=mask)                    # one process, any mask
    context.ring_hiding_tokens(989.5e12, 450e9, h=8192, kv_width=1024)  # s/N for the ring's steps to hide
    context.causal_pairs(positions)                                     # (query, key) pairs per rank

A rank of context parallelism holds some of the sequence's tokens, every layer's activations for
those tokens only; attention is the one operation that needs the others' keys and values. A split is a
list, rank by rank, of the global positions (0 to s − 1) of the tokens each rank holds: contiguous
(rank r the r-th of `tensor_split(N)`, the first ranks one token longer where N does not divide s), or
any other order, lab 7's zig-zag included. Under a causal mask a query at position i attends the keys
at positions ≤ i, wherever they are held. A mask in general is a function of (query positions, key
positions), each 1-D, giving a bool (queries, keys) matrix, True where the key is masked out:
`causal_mask`, `no_mask`, and `document_mask(starts)`, the causal mask of documents packed into one
sequence (Llama 3's: a token attends the tokens before it in its own document only).

Tensors are (batch, heads, tokens, head_dim); scores are scaled by 1/√head_dim. The log-sum-exp `lse`
(batch, heads, tokens) is each query's log Σ_j exp(score_j) over the keys it attends: what an online
softmax carries between blocks, and what the backward needs to rebuild the probabilities.

Used in: lab 7 (07_long_sequences).
"""
from __future__ import annotations

import math

import torch

from course import activations


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


def no_mask(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """Nothing masked: every query attends every key."""
    return torch.zeros(len(query_positions), len(key_positions), dtype=torch.bool, device=query_positions.device)


def document_mask(starts):
    """The mask of documents packed into one sequence, each starting at one of `starts` (positions, the
    first 0): a query attends the keys at or before it in its own document. Returns the mask function."""
    starts = torch.as_tensor(starts)
    if starts.dim() != 1 or len(starts) == 0 or int(starts[0]) != 0 or bool((starts.diff() <= 0).any()):
        raise ValueError(f"document starts must be increasing positions beginning with 0, got {starts.tolist()}")

    def masked(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        on = starts.to(query_positions.device)
        query_document = torch.bucketize(query_positions, on, right=True)
        key_document = torch.bucketize(key_positions, on, right=True)
        return causal_mask(query_positions, key_positions) | (key_document[None, :] != query_document[:, None])

    return masked


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              query_positions: torch.Tensor | None = None, key_positions: torch.Tensor | None = None, *,
              mask=None):
    """One process's attention, the whole score matrix at once: (out, lse). Positions default to
    0..tokens − 1; give them to attend a rank's queries to some keys. `mask`, a mask function (the
    docstring), replaces `causal`; a query that it leaves no key gets lse −inf and a NaN output."""
    if query_positions is None:
        query_positions = torch.arange(q.shape[-2])
    if key_positions is None:
        key_positions = torch.arange(k.shape[-2])
    if mask is None and causal:
        mask = causal_mask
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        hidden = mask(query_positions.to(q.device), key_positions.to(q.device))
        scores = scores.masked_fill(hidden, float("-inf"))
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


def ring_hiding_tokens(peak_flop_per_s: float, link_bytes_per_s: float, h: int, *, kv_width: int | None = None,
                       element_bytes: int = 2, causal: bool = False) -> float:
    """The fewest tokens a rank must hold, s/N, for ring attention's messages to hide under its compute. A ring
    step computes its queries against the block it holds, 4·(s/N)²·h FLOPs forward (q·k and scores·v; half of
    that on average under a causal mask, balanced by the zig-zag), while it sends one K and one V block,
    2·(s/N)·kv_width·e bytes (kv_width = h, every head its own K and V, unless grouped-query attention shares
    them). It hides when 4(s/N)²h / F ≥ 2(s/N)·kv_width·e / B: s/N ≥ (F/B)·kv_width·e / (2h), which is F/B
    itself at 16 bits with kv_width = h. At the peak F: a kernel below peak computes longer and hides sooner."""
    kv_width = activations.kv(h, kv_width)
    if min(peak_flop_per_s, link_bytes_per_s) <= 0:
        raise ValueError(f"peak FLOP/s and link bytes/s must be positive; got {peak_flop_per_s} and {link_bytes_per_s}")
    return peak_flop_per_s / link_bytes_per_s * kv_width * element_bytes / (2 * h) * (2 if causal else 1)
