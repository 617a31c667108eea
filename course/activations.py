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
|             | backward (as FlashAttention's backward does)  |                           |                           |
| "full"      | its input only (activation checkpointing)     | 2sbh                      | 2sbh/t                    |

"none" is the paper's Eq. 2, and Eq. 3 with sequence parallelism; sbh(34 + 5as/h) at t = 1 (Eq. 1).
Tensor parallelism splits what lies between its collectives (24 of the 34, and the scores); the 10 left,
whole on every rank, are the two layer norms' inputs (4), attention's and the MLP's inputs (4) and two
dropout masks (2). Sequence parallelism splits those along the sequence, so all of it divides by t, the
layer's input too: hence 2sbh/t. Under "full", one layer at a time rebuilds its activations in backward:
add one "none" layer.

The count is the paper's GPT layer: a 4h GeLU MLP, dropout, every head its own K and V. Models that
differ (LLaMA-2: SwiGLU MLP of width 3.5h, 8 K/V heads for 70B, no dropout) keep some percent more or less.

FLOPs (`training_flop`), Narayanan et al. 2021's count: 6 a parameter a token (2 forward, 4 backward),
plus attention's q·k and scores·v, 4·L·s·h a token forward (counted whole though the mask is causal),
12·L·s·h with backward. Recomputation runs a forward again: "selective" attention's 4·L·s·h a token,
"full" all of it, 2·P + 4·L·s·h a token: 4/3 of the FLOPs, Narayanan et al.'s 96·B·s·L·h²·(1 + s/(6h))
against 72 (P = 12·L·h², logits left out). "selective" adds s/(18h + 3s) of the step: attention's softmax
and dropout, which it also reruns, cost time but are not counted (elementwise, no matmul FLOPs).

Used by: course.choosing.
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
                sequence_parallel: bool = False) -> float:
    """One layer's activations for one micro-batch, 16-bit, on one of tp ranks (the table above)."""
    check(recompute, sequence_parallel)
    if recompute == "full":
        return 2 * s * b * h / (tp if sequence_parallel else 1)
    scores = 0 if recompute == "selective" else 5 * a * s / h       # the s² scores, their softmax and dropout
    if sequence_parallel:
        return s * b * h * (34 + scores) / tp
    return s * b * h * (10 + 24 / tp + scores / tp)


def training_flop(parameters: float, *, layers: int, sequence: int, hidden: int, tokens: float,
                  recompute: str = "selective") -> float:
    """FLOPs of one training step over `tokens` tokens, the recomputed forward included (the docstring)."""
    check(recompute, False)
    attention = 4 * layers * sequence * hidden * tokens                          # one forward's q·k and scores·v
    again = {"none": 0, "selective": attention, "full": 2 * parameters * tokens + attention}[recompute]
    return 6 * parameters * tokens + 3 * attention + again
