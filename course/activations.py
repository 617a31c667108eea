"""What a transformer layer keeps for its backward, and what recomputing it costs, by formula.

    layer_bytes(s=2048, b=1, h=12288, a=96, tp=8, recompute="selective", sequence_parallel=True)
    training_flop(175e9, layers=96, sequence=2048, hidden=12288, tokens=2048, recompute="full")

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 2:
one layer's activations for one micro-batch of b samples of s tokens, width h, a heads, tensor
parallelism over t ranks, in bytes with 16-bit activations (and 1-byte dropout masks):

| `recompute` | what the layer keeps                          | bytes                     | with sequence parallelism |
|-------------|-----------------------------------------------|---------------------------|---------------------------|
| "none"      | everything, the s² attention scores too       | sbh(10 + 24/t + 5as/(ht)) | sbh/t·(34 + 5as/h)        |
| "selective" | all but attention's scores, recomputed in     | sbh(10 + 24/t)            | 34·sbh/t                  |
|             | backward with scores·v (FlashAttention's      |                           |                           |
|             | backward recomputes q·k and the softmax only) |                           |                           |
| "full"      | its input only (activation checkpointing)     | 2sbh                      | 2sbh/t                    |

"none" is the paper's Eq. 2, and Eq. 3 with sequence parallelism; sbh(34 + 5as/h) at t = 1 (Eq. 1).
Tensor parallelism splits what lies between its collectives (24 of the 34, and the scores); the 10 left,
whole on every rank, are the two layer norms' inputs (4), attention's and the MLP's inputs (4) and two
dropout masks (2). Sequence parallelism splits those along the sequence, so all of it divides by t, the
layer's input too: hence 2sbh/t. Under "full", one layer at a time rebuilds its activations in backward:
add one "none" layer.

The count is the paper's GPT layer: a 4h GeLU MLP, dropout, every head its own K and V. Models that
differ (LLaMA-2: SwiGLU MLP of width 3.5h, 8 K/V heads for 70B, no dropout) keep some percent more or less.

In the course's dtypes (`element_bytes`, `dropout`): every 16-bit term is e bytes an element, each mask
1 byte (torch's fused dropout keeps a bool mask on every device). Per token and feature: whole 4e + 2,
split 12e, and the scores as/h·(2e + 1); without dropout 4e, 12e and as/h·e. Left out, as by the paper:
each layer norm's mean and 1/σ (2 floats a token) and a causal mask (s² bools, one for all heads), about
1 % of a small layer's activations.

Context parallelism over c ranks (`context`) splits the sequence itself: each rank holds s/c tokens of
every activation, and its queries' scores against all s keys (a·(s/c)·s per sample); ring attention,
which keeps no scores (FlashAttention's backward recomputes them), is `recompute="selective"` with
`context`. What it sends per layer (`ring_attention_sent`): its K and V blocks, N − 1 times forward, and in
backward the blocks again with their gradients, which travel the ring back to their owners; the
all-gather's and Ulysses' bytes are `all_gather_kv_sent` and `ulysses_sent`. K and V are
`kv_width` wide, h unless the model shares them between heads (grouped-query attention: kv_heads of a heads,
kv_width = kv_heads·h/a; LLaMA-2 70B and Mixtral 8 of 64 and of 32, course.presets): the ring's and the
all-gather's bytes shrink a/kv_heads times. The activation count above still keeps K and V h wide.

FLOPs (`training_flop`), Narayanan et al. 2021's count: 6 a parameter a token (2 forward, 4 backward),
plus attention's q·k and scores·v, 4·L·s·h a token forward (counted whole though the mask is causal),
12·L·s·h with backward. Recomputation runs a forward again: "selective" attention's 4·L·s·h a token,
"full" all of it, 2·P + 4·L·s·h a token: 4/3 of the FLOPs, Narayanan et al.'s 96·B·s·L·h²·(1 + s/(6h))
against 72 (P = 12·L·h², logits left out). "selective" adds s/(18h + 3s) of the step: attention's softmax
and dropout, which it also reruns, cost time but are not counted (elementwise, no matmul FLOPs).

Also used by course.choosing and course.sequence_view.

Used in: lab 7 (07_long_sequences).
"""
from __future__ import annotations

RECOMPUTE = ("none", "selective", "full")


def check(recompute, sequence_parallel) -> None:
    """Refuses, in words, a recomputation or a sequence-parallel flag this module does not know."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE} (none: everything stored; selective: attention's "
                         f"scores recomputed; full: each layer's input kept), got {recompute!r}")
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False (split the layer norms and dropouts over the "
                         f"tp ranks, or not), got {sequence_parallel!r}")


def layer_bytes(s: int, b: int, h: int, a: int, tp: int = 1, *, recompute: str = "selective",
                sequence_parallel: bool = False, element_bytes: int = 2, dropout: bool = True,
                context: int = 1) -> float:
    """One layer's activations for one micro-batch, on one of tp ranks (the table above).

    element_bytes: of each activation, 2 for the paper's 16 bits, 4 for float32; dropout: its three masks
    kept (1 byte an element) or not (no dropout: attention's matmul keeps the softmax's own output, so
    the scores cost e·as²b, not (2e + 1)·as²b); context: ranks of context parallelism, each holding s/context
    of the sequence (every sbh term divides) and its queries' scores against all s keys."""
    check(recompute, sequence_parallel)
    if context < 1 or tp < 1:
        raise ValueError(f"tp and context count ranks, at least 1 each; got tp={tp}, context={context}")
    e, m = element_bytes, (1 if dropout else 0)
    tokens = s * b / context                                         # this rank's share of the sequence
    if recompute == "full":
        return e * tokens * h / (tp if sequence_parallel else 1)
    whole, split = 4 * e + 2 * m, 12 * e                             # per token and feature, the table's 10 and 24
    scores = 0 if recompute == "selective" else a * s / h * (2 * e + m if dropout else e)
    if sequence_parallel:
        return tokens * h * (whole + split + scores) / tp
    return tokens * h * (whole + split / tp + scores / tp)


def mlp_block_bytes(s: int, b: int, h: int, tp: int = 1, *, sequence_parallel: bool = False,
                    element_bytes: int = 2, dropout: bool = True, context: int = 1) -> float:
    """The MLP block's share of `layer_bytes` when it is stored ("none" or "selective"): its input
    (e·sbh) and dropout mask (sbh), whole unless sequence parallelism splits them, and its 4h-wide
    hidden activation twice (the first Linear's output and the second's input, 8e·sbh), split by tp:
    19·sbh of the paper's 34 at 16 bits. A mixture of experts keeps it once for each of a token's k
    experts (course.layout_cost)."""
    if context < 1 or tp < 1:
        raise ValueError(f"tp and context count ranks, at least 1 each; got tp={tp}, context={context}")
    e, m = element_bytes, (1 if dropout else 0)
    whole, split = e + m, 8 * e
    tokens = s * b / context
    if sequence_parallel:
        return tokens * h * (whole + split) / tp
    return tokens * h * (whole + split / tp)


def kv(h: int, kv_width: int | None) -> int:
    """The width of K and of V: h (every head its own, multi-head attention) unless `kv_width` says fewer
    (grouped-query attention: kv_heads · h/a). Refuses, in words, a width that is not 1 to h."""
    kv_width = h if kv_width is None else kv_width
    if not isinstance(kv_width, int) or not 1 <= kv_width <= h:
        raise ValueError(f"kv_width is the width of K and of V, kv_heads × head size: a whole number, kv_width "
                         f"from 1 to h = {h}; got {kv_width!r}")
    return kv_width


def ring_attention_sent(s: int, b: int, h: int, ranks: int, element_bytes: int = 4,
                        backward: bool = True, *, kv_width: int | None = None) -> float:
    """Bytes one rank sends per layer in ring attention over `ranks` ranks, the sequence of s tokens split
    evenly: forward, its K and V blocks (s/N · b · h_kv each, h_kv = `kv_width`, h by default) passed on
    N − 1 times; backward, K and V passed on N − 1 times again and their gradients' accumulators N times
    (each returns to its owner)."""
    if ranks < 1:
        raise ValueError(f"ring attention runs on at least 1 rank, got {ranks}")
    block = 2 * s / ranks * b * kv(h, kv_width) * element_bytes         # one K and one V block
    forward = (ranks - 1) * block
    return forward + ((ranks - 1) * block + (ranks * block if ranks > 1 else 0) if backward else 0)


def all_gather_kv_sent(s: int, b: int, h: int, ranks: int, element_bytes: int = 4,
                       backward: bool = True, *, kv_width: int | None = None) -> float:
    """The same with K and V all-gathered (ring all-gather: each rank sends (N − 1)/N of the whole), and
    their gradients reduce-scattered in backward (the same bytes again)."""
    whole = 2 * s * b * kv(h, kv_width) * element_bytes
    return (ranks - 1) / ranks * whole * (2 if backward else 1)


def ulysses_sent(s: int, b: int, h: int, ranks: int, element_bytes: int = 4,
                 backward: bool = True, *, kv_width: int | None = None) -> float:
    """The same by Ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023): an all-to-all turns each rank's s/N tokens
    of every head into all s tokens of heads/N heads, for q (h wide), K and V (`kv_width`), and one turns the
    output (h) back; each rank sends (N − 1)/N of its s/N tokens' (2h + 2·kv_width) features. Backward sends
    the same again (the output's gradient one way, q's, K's and V's the other). A rank's bytes fall as
    1/N, where the ring's and the all-gather's stay."""
    if ranks < 1:
        raise ValueError(f"Ulysses runs on at least 1 rank, got {ranks}")
    mine = s / ranks * b * (2 * h + 2 * kv(h, kv_width)) * element_bytes
    return (ranks - 1) / ranks * mine * (2 if backward else 1)


def training_flop(parameters: float, *, layers: int, sequence: int, hidden: int, tokens: float,
                  recompute: str = "selective") -> float:
    """FLOPs of one training step over `tokens` tokens, the recomputed forward included (the docstring)."""
    check(recompute, False)
    attention = 4 * layers * sequence * hidden * tokens                          # one forward's q·k and scores·v
    again = {"none": 0, "selective": attention, "full": 2 * parameters * tokens + attention}[recompute]
    return 6 * parameters * tokens + 3 * attention + again
