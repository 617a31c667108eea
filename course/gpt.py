"""Lab 9's model, whole, in one process: a small GPT, the token data it learns, and its training.

    config = gpt.Config()                         # vocabulary 512, width 64, 4 heads, 4 layers, 32 tokens
    model = gpt.GPT(config, seed=0)               # the same weights on every rank that builds it
    batches = gpt.token_batches(config, batch=8, steps=20, seed=0)
    run = gpt.one_process_training(config, batches, seed=0)   # what every grid must reproduce

The model is GPT-2's, shrunk: a token embedding and a learned position embedding, `layers` of lab 3's
pre-norm transformer block (`course.transformer.Block`: qkv laid out head by head, the MLP 4 × width), a
final layer norm, and an output layer tied to the token embedding (logits = h · Eᵀ, one matrix used twice,
as GPT-2 and Megatron-LM tie them). Its vocabulary is large enough that the embedding and the output layer
are a real part of the model: 512 × 64 = 32,768 weights beside 4 × 49,984 in the blocks, and the
(tokens × 512) logits are the largest activation of the step.

The data is a made-up language: each token is followed by one of a few successors (a fixed random table,
`SUCCESSORS` of them, the first more likely), so a model that learns the table lowers its loss from
ln(vocabulary) towards the table's entropy. Sequences are documents of random lengths, padded at the end;
the padding's targets are `IGNORE` (-100, PyTorch's `ignore_index`), so micro-batches and ranks hold
different numbers of tokens that count: the loss of a step is the mean over the step's counted tokens,
however they are split (`step_loss`).

Training (`one_process_training`): SGD with momentum, the whole model's gradient clipped to a norm of
`clip` first (so the gradient's norm is part of every update), the loss of each step the mean over its
counted tokens. What one process computes here is what a grid of ranks must compute too, up to the order
of its sums (`course.check`'s tolerances, loosened by the steps: lab 9 explains).

Used in: lab 9 (09_composition).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course import transformer

#: The target of a padding token: counted in no loss (PyTorch's default ignore_index).
IGNORE = -100
#: Each token's possible successors in the made-up language.
SUCCESSORS = 4


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    width: int = 64
    heads: int = 4
    layers: int = 4
    sequence: int = 32

    def __post_init__(self):
        for name in ("vocab", "width", "heads", "layers", "sequence"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Config.{name} must be a positive whole number, got {value!r}")
        if self.width % self.heads:
            raise ValueError(f"a width of {self.width} does not split into {self.heads} heads")


class GPT(nn.Module):
    """The whole model. `forward(tokens, positions)`: tokens (batch, t) int64, positions (t,) their places in
    the sequence (default 0 .. t-1); returns logits (batch, t, vocab). Seeded: every process that builds
    GPT(config, seed) holds the same weights, bit for bit (they are drawn, not computed)."""

    def __init__(self, config: Config, seed: int = 0):
        super().__init__()
        self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embedding = nn.Embedding(config.vocab, config.width)
            self.position = nn.Embedding(config.sequence, config.width)
            nn.init.normal_(self.embedding.weight, std=0.02)     # GPT-2's: N(0, 1) would swamp tied logits
            nn.init.normal_(self.position.weight, std=0.02)
            self.blocks = nn.ModuleList(transformer.Block(config.width, config.heads, seed=seed + 1 + layer)
                                        for layer in range(config.layers))
            self.ln_f = nn.LayerNorm(config.width)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is None:
            positions = torch.arange(tokens.shape[-1], device=tokens.device)
        h = self.embedding(tokens) + self.position(positions)
        for block in self.blocks:
            h = block(h)
        return self.ln_f(h) @ self.embedding.weight.T


def token_table(config: Config, seed: int = 0) -> torch.Tensor:
    """The language: (vocab, SUCCESSORS) the tokens that may follow each token, the first most likely."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    return torch.randint(config.vocab, (config.vocab, SUCCESSORS), generator=generator)


def token_batches(config: Config, *, batch: int, steps: int, seed: int = 0,
                  shortest: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` batches of (inputs, targets), each (batch, sequence) int64: documents of the made-up language,
    each of a random length from `shortest` (default half the sequence) to the whole sequence, padded at the
    end. targets[i] = inputs[i + 1] inside a document, IGNORE past its end; padding inputs are token 0."""
    if batch < 1 or steps < 1:
        raise ValueError(f"need at least one sequence and one step, got batch={batch}, steps={steps}")
    shortest = config.sequence // 2 if shortest is None else shortest
    if not 1 <= shortest <= config.sequence:
        raise ValueError(f"shortest must be 1 to {config.sequence} tokens, got {shortest}")
    table = token_table(config)
    generator = torch.Generator().manual_seed(seed)
    weights = torch.tensor([0.55, 0.25, 0.12, 0.08])[:SUCCESSORS]
    out = []
    for _ in range(steps):
        length = config.sequence + 1
        tokens = torch.empty(batch, length, dtype=torch.int64)
        tokens[:, 0] = torch.randint(config.vocab, (batch,), generator=generator)
        for t in range(1, length):
            pick = torch.multinomial(weights, batch, replacement=True, generator=generator)
            tokens[:, t] = table[tokens[:, t - 1], pick]
        lengths = torch.randint(shortest, config.sequence + 1, (batch,), generator=generator)
        inside = torch.arange(config.sequence) < lengths[:, None]          # (batch, sequence) counted targets
        inputs = torch.where(inside, tokens[:, :-1], torch.zeros_like(tokens[:, :-1]))
        targets = torch.where(inside, tokens[:, 1:], torch.full_like(tokens[:, 1:], IGNORE))
        out.append((inputs, targets))
    return out


def counted_tokens(targets: torch.Tensor) -> int:
    """The tokens whose loss counts (targets not IGNORE)."""
    return int((targets != IGNORE).sum())


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each token's cross-entropy (the shape of targets), 0 where the target is IGNORE."""
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE,
                           reduction="none").view(targets.shape)


def step_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The step's loss: the mean over its counted tokens."""
    return token_losses(logits, targets).sum() / counted_tokens(targets)


def clip_(parameters, clip: float) -> float:
    """Scale the gradients so their norm, over every parameter, is at most `clip`; return the norm before."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
    if norm > clip:
        for g in grads:
            g.mul_(clip / (norm + 1e-6))
    return norm


@dataclass
class Run:
    losses: list[float]             # each step's loss, before its update
    norms: list[float]              # each step's gradient norm, before clipping
    parameters: dict[str, torch.Tensor]   # the state after the last step, by the model's names


#: The training the lab's grids reproduce: SGD with momentum, the gradient clipped to a norm of CLIP.
LEARNING_RATE, MOMENTUM, CLIP = 1.0, 0.9, 0.25


def sgd_step_(parameter: torch.Tensor, grad: torch.Tensor, velocity: torch.Tensor, *,
              learning_rate: float = LEARNING_RATE, momentum: float = MOMENTUM) -> None:
    """SGD with momentum, as torch.optim.SGD runs it (no dampening): v = momentum·v + g; p -= lr·v.
    In place on parameter and velocity: a rank that holds only a chunk updates only that chunk."""
    velocity.mul_(momentum).add_(grad)
    parameter.sub_(learning_rate * velocity)


def one_process_training(config: Config, batches, *, seed: int = 0, learning_rate: float = LEARNING_RATE,
                         momentum: float = MOMENTUM, clip: float = CLIP) -> Run:
    """Train GPT(config, seed) on `batches`, one step a batch, in this process; the run every grid reproduces."""
    model = GPT(config, seed)
    velocities = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    losses, norms = [], []
    for inputs, targets in batches:
        model.zero_grad(set_to_none=True)
        loss = step_loss(model(inputs), targets)
        loss.backward()
        losses.append(float(loss.detach()))
        norms.append(clip_(list(model.parameters()), clip))
        with torch.no_grad():
            for name, p in model.named_parameters():
                sgd_step_(p, p.grad, velocities[name], learning_rate=learning_rate, momentum=momentum)
    return Run(losses, norms, {name: p.detach().clone() for name, p in model.named_parameters()})
