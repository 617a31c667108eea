"""A small transformer block, the model Megatron-LM splits, and what its split sends.

    block = transformer.Block(width=64, heads=8, seed=0)
    y = block(x)                       # x: (batch, sequence, width)

One pre-norm block, as GPT-2 and LLaMA stack them:

    x = x + out(attention(qkv(ln1(x))))
    x = x + mlp(ln2(x))                mlp = Linear(width, 4 width) -> GELU -> Linear(4 width, width)

`qkv` is one Linear(width, 3 width) whose outputs are laid out head by head,
[q, k, v] of head 0, then of head 1, ... (Megatron-LM's layout). So a split of
its outputs into N equal blocks, the column split, gives each rank whole heads,
q, k and v together: what `attention` needs to run a rank's heads with no
message. The output projection split by row then sums the heads' parts, one
all-reduce; the MLP is lab 3's column-then-row block, one more.

What moves (modelled, ring collectives, `course.sizes`): per block and micro-batch,
the split sends 4 all-reduces of an activation (batch × sequence × width), two
forward and two backward; data parallelism all-reduces the block's gradients,
about 12 width² elements, once per step, however many micro-batches the step
accumulates. The split sends less while the step's tokens (batch × sequence,
all micro-batches) < about 3 × width.

Bytes are not the whole comparison. The split's all-reduces are blocking: the
next layer needs their result, so each sits on the critical path, 4 per layer
per micro-batch. Data parallelism's one all-reduce per step overlaps backward
(lab 2's buckets, DDP). So tensor parallelism is chosen for memory (a layer too
big for one device) and kept inside a node, on its fastest links (Narayanan et
al. 2021); `all_reduces_per_step` and `replicas_for_split_to_send_less` give the
numbers.

Used in: lab 3 (03_model_parallel), lab 7 (07_long_sequences).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from course import sizes

#: The MLP's hidden features per feature of the block (GPT-2's, Megatron-LM's).
MLP_RATIO = 4


def attention(qkv: torch.Tensor, head_dim: int, causal: bool = True, dropout: float = 0.0,
              training: bool = False) -> torch.Tensor:
    """Multi-head self-attention of `qkv` (..., sequence, heads × 3 × head_dim), laid out head
    by head as [q, k, v]; returns (..., sequence, heads × head_dim). Any number of whole heads:
    a rank's share of a column-split qkv as well as the whole block's. With `dropout` and
    `training`, the attention probabilities are dropped out (GPT-2's attention dropout)."""
    *lead, sequence, features = qkv.shape
    if features % (3 * head_dim):
        raise ValueError(f"qkv has {features} features, not a whole number of heads of 3 × {head_dim}: "
                         "split the heads, not the features inside a head")
    heads = features // (3 * head_dim)
    q, k, v = qkv.reshape(*lead, sequence, heads, 3, head_dim).movedim(-3, -4).unbind(-2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)          # (..., heads, sequence, sequence)
    if causal:
        later = torch.ones(sequence, sequence, dtype=torch.bool, device=qkv.device).triu(1)
        scores = scores.masked_fill(later, float("-inf"))
    probabilities = scores.softmax(-1)
    if dropout and training:
        probabilities = dropped_out(probabilities, dropout)
    mixed = probabilities @ v                                          # (..., heads, sequence, head_dim)
    return mixed.movedim(-3, -2).reshape(*lead, sequence, heads * head_dim)


class Block(nn.Module):
    """One pre-norm transformer block: attention, then an MLP, each with a residual; with `dropout`,
    GPT-2's three dropouts (attention's probabilities, after the output projection, after the MLP),
    active in training mode (lab 7 counts their masks)."""

    def __init__(self, width: int, heads: int, seed: int = 0, dtype: torch.dtype = torch.float32,
                 dropout: float = 0.0):
        super().__init__()
        if width % heads:
            raise ValueError(f"a width of {width} does not split into {heads} heads")
        self.width, self.heads, self.head_dim, self.dropout = width, heads, width // heads, dropout
        with torch.random.fork_rng(devices=[]):     # seeded weights, the caller's random state untouched
            torch.manual_seed(seed)
            self.ln1 = nn.LayerNorm(width, dtype=dtype)
            self.qkv = nn.Linear(width, 3 * width, dtype=dtype)
            self.out = nn.Linear(width, width, dtype=dtype)
            self.ln2 = nn.LayerNorm(width, dtype=dtype)
            self.mlp = nn.Sequential(nn.Linear(width, MLP_RATIO * width, dtype=dtype), nn.GELU(),
                                     nn.Linear(MLP_RATIO * width, width, dtype=dtype))

    def attend(self, qkv: torch.Tensor) -> torch.Tensor:
        """Attention's core, q·k to scores·v: what selective recomputation recomputes (lab 7 wraps it)."""
        return attention(qkv, self.head_dim, dropout=self.dropout, training=self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropped(self.out(self.attend(self.qkv(self.ln1(x)))))
        return x + self.dropped(self.mlp(self.ln2(x)))

    def dropped(self, x: torch.Tensor) -> torch.Tensor:
        return dropped_out(x, self.dropout) if self.dropout and self.training else x


def dropped_out(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout in training, through torch's fused kernel on every device, which keeps a 1-byte mask for
    backward (as Korthikanti et al. count it); `F.dropout` on CPU keeps a float mask, 4 bytes."""
    return torch.native_dropout(x, p, True)[0]


def head_owners(heads: int, ranks: int) -> list[range]:
    """The heads each rank owns under the column split of qkv: rank k the k-th block of heads."""
    if heads % ranks:
        raise ValueError(f"{heads} heads do not split evenly over {ranks} ranks: every rank must own "
                         "whole heads (pick a number of ranks that divides the heads)")
    per_rank = heads // ranks
    return [range(k * per_rank, (k + 1) * per_rank) for k in range(ranks)]


def block_parameters(width: int) -> int:
    """The block's parameters: qkv and out (4 w² + 4 w), the MLP (8 w² + 5 w), two layer norms (4 w)."""
    hidden = MLP_RATIO * width
    return (3 * width * width + 3 * width) + (width * width + width) \
        + (width * hidden + hidden) + (hidden * width + width) + 4 * width


def split_block_sent(batch: int, sequence: int, width: int, ranks: int, dtype: str = "float32") -> int | float:
    """Bytes one rank sends per step for a block split as Megatron-LM splits it: four ring
    all-reduces of the activation (batch × sequence × width), two forward, two backward."""
    activation = sizes.nbytes(batch * sequence * width, dtype)
    return 4 * sizes.all_reduce_sent(activation, ranks)


def data_parallel_block_sent(width: int, ranks: int, dtype: str = "float32") -> int | float:
    """Bytes one rank sends per step to average the block's gradients (one ring all-reduce)."""
    return sizes.all_reduce_sent(sizes.nbytes(block_parameters(width), dtype), ranks)


def crossover_tokens(width: int) -> float:
    """The tokens per step (batch × sequence, summed over the step's micro-batches) below which the
    split block sends less than data parallelism."""
    return block_parameters(width) / (4 * width)


#: Megatron-LM's tensor-parallel all-reduces per transformer layer and micro-batch: two forward (after
#: the attention's output projection and the MLP's row layer), two backward (the column layers' inputs).
SPLIT_ALL_REDUCES_PER_LAYER = 4


def all_reduces_per_step(layers: int, micro_batches: int) -> dict[str, int]:
    """All-reduces per training step, by scheme.

    The split: 4 per layer per micro-batch, each blocking (the next operation needs its sum), so all
    of their time is on the critical path. Data parallelism: every gradient once per step, after
    the last micro-batch's backward (with `no_sync` on the others), in buckets that start while
    backward still runs (lab 2's exercise 5, DDP): only what is left of the last bucket delays the step."""
    if layers < 1 or micro_batches < 1:
        raise ValueError(f"need at least one layer and one micro-batch, got {layers} layers and "
                         f"{micro_batches} micro-batches")
    return {"Megatron split": SPLIT_ALL_REDUCES_PER_LAYER * layers * micro_batches, "data parallel": 1}


def replicas_for_split_to_send_less(width: int, step_tokens: int) -> float:
    """With `step_tokens` tokens a step (a model's global batch) shared by R groups of GPUs, each group
    processes step_tokens / R tokens. A group split as Megatron splits sends fewer bytes than the same
    GPUs in data parallelism only while that is below `crossover_tokens(width)`: for R above the value
    returned. Below it, splitting sends more, whatever the number of GPUs in the group."""
    if step_tokens < 1:
        raise ValueError(f"a step processes at least one token, got {step_tokens}")
    return step_tokens / crossover_tokens(width)


def training_flop(batch: int, sequence: int, width: int) -> int:
    """Floating-point operations of one forward and backward of the block (modelled: backward = 2 × forward;
    layer norms, biases, GELU and softmax left out). Forward: 2 per multiply-add of each token with the
    12 width² weights of qkv, out and the MLP, and of q·k and scores·v (batch × sequence² × width each;
    the causal mask is applied to full scores, so nothing is skipped)."""
    tokens = batch * sequence
    forward = 2 * tokens * 12 * width * width + 2 * 2 * batch * sequence * sequence * width
    return 3 * forward


def one_process_step(block: Block, x: torch.Tensor, grad_y: torch.Tensor):
    """One forward and backward of the whole block: its output, the input's gradient, and
    every parameter's gradient by name (what a split block must reproduce)."""
    x = x.detach().clone().requires_grad_()
    y = block(x)
    y.backward(grad_y)
    return y.detach(), x.grad, {name: p.grad.detach().clone() for name, p in block.named_parameters()}


def loss_of(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The lab's training loss for a block: mean squared error to `targets`."""
    return F.mse_loss(output, targets)
