"""A mixture of experts' parts that are not lab 8's exercises: the experts' weights and their MLP,
which rank holds which expert, routings to test with, and the small model the lab trains on digits.

    w1, w2 = moe.expert_weights(experts=4, hidden=32, ffn=32, seed=0)    # (E, h, f) and (E, f, h)
    y = moe.expert_mlp(rows, w1[e], w2[e])                              # expert e on its rows
    moe.owners(5, 3)                                                    # [0, 0, 1, 1, 2]

An expert is a two-layer MLP without biases, GELU between (Mixtral's are gated SwiGLU: the
routing and the parallelism do not care which MLP an expert is). Expert parallelism on N ranks puts
the experts in N contiguous blocks, the first E mod N ranks holding one more (`owners`), so a rank's
experts are a slice of the stacked weights, and rows sorted by expert are sorted by rank.

Used in: lab 8 (08_experts).
"""
from __future__ import annotations

import torch
from torch import nn


def expert_weights(experts: int, hidden: int, ffn: int, *, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Every expert's two weight matrices, stacked: (E, hidden, ffn) and (E, ffn, hidden), seeded,
    scaled as nn.Linear's default initialisation scales them."""
    generator = torch.Generator().manual_seed(seed)
    w1 = (torch.rand(experts, hidden, ffn, generator=generator, dtype=dtype) * 2 - 1) / hidden ** 0.5
    w2 = (torch.rand(experts, ffn, hidden, generator=generator, dtype=dtype) * 2 - 1) / ffn ** 0.5
    return w1, w2


def expert_mlp(rows: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert on its rows: GELU(rows · w1) · w2, (n, hidden) -> (n, hidden)."""
    return torch.nn.functional.gelu(rows @ w1) @ w2


def owners(experts: int, ranks: int) -> list[int]:
    """The rank that holds each expert under expert parallelism: E experts in N contiguous blocks,
    the first E mod N ranks holding one more. Every rank holds at least one: N <= E."""
    if not 1 <= ranks <= experts:
        raise ValueError(f"{experts} experts over {ranks} ranks: each rank must hold at least one expert, so "
                         f"run at most {experts} ranks (or more experts)")
    blocks = torch.arange(experts).tensor_split(ranks)
    return [rank for rank, block in enumerate(blocks) for _ in block]


def experts_of(rank: int, experts: int, ranks: int) -> list[int]:
    """The experts rank `rank` holds (see `owners`)."""
    return [e for e, owner in enumerate(owners(experts, ranks)) if owner == rank]


def random_routing(tokens: int, experts: int, top_k: int, generator: torch.Generator, *,
                   avoid=()) -> tuple[torch.Tensor, torch.Tensor]:
    """A routing to test with, not a router's: each token's k distinct experts drawn at random (never those
    of `avoid`), and positive weights that sum to 1: (weights (T, k) float32, chosen (T, k) int64)."""
    allowed = torch.tensor([e for e in range(experts) if e not in set(avoid)])
    if len(allowed) < top_k:
        raise ValueError(f"{top_k} experts a token, but only {len(allowed)} of {experts} may be chosen")
    draws = torch.rand(tokens, len(allowed), generator=generator).argsort(dim=1)[:, :top_k]
    weights = torch.rand(tokens, top_k, generator=generator) + 0.1
    return weights / weights.sum(1, keepdim=True), allowed[draws]


class DigitsMixture(nn.Module):
    """The lab's model on digits: 64 pixels -> `hidden` features -> a residual block of experts (or of one
    dense MLP, experts=1 and top_k=1) -> 10 classes. The block is computed by the caller's functions:

        scores, probabilities, chosen = model(x, route, mix)

    route(router_logits, top_k) -> (weights, chosen); mix(h, weights, chosen, w1, w2) -> the experts'
    weighted sum (a rank's own experts' weights under expert parallelism: `model.local(rank, ranks)`).
    Returns the class scores, the router's probabilities and the chosen experts (for the balance loss)."""

    def __init__(self, experts: int, top_k: int, *, hidden: int = 32, ffn: int = 32, seed: int = 0):
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.embed = nn.Linear(64, hidden)
        self.router = nn.Linear(hidden, experts, bias=False)
        self.head = nn.Linear(hidden, 10)
        torch.random.set_rng_state(generator_state)
        w1, w2 = expert_weights(experts, hidden, ffn, seed=seed + 1)
        self.w1, self.w2 = nn.Parameter(w1), nn.Parameter(w2)
        self.experts, self.top_k = experts, top_k

    def local(self, rank: int, ranks: int) -> DigitsMixture:
        """This model as rank `rank` of `ranks` holds it under expert parallelism: its experts only."""
        mine = experts_of(rank, self.experts, ranks)
        self.w1 = nn.Parameter(self.w1.detach()[mine[0]:mine[-1] + 1].clone())
        self.w2 = nn.Parameter(self.w2.detach()[mine[0]:mine[-1] + 1].clone())
        return self

    def dense_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if name not in ("w1", "w2")]

    def expert_parameters(self) -> list[nn.Parameter]:
        return [self.w1, self.w2]

    def forward(self, x, route, mix):
        h = torch.relu(self.embed(x))
        router_logits = self.router(h)
        weights, chosen = route(router_logits, self.top_k)
        h = h + mix(h, weights, chosen, self.w1, self.w2)
        return self.head(h), router_logits.softmax(-1), chosen
