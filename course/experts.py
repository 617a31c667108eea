"""A mixture of experts, by formula: the parameters a token uses, and what expert parallelism sends.

    active_parameters(46_702_792_704, 45_097_156_608, experts=8, top_k=2)   # Mixtral 8x7B: 12.9B of 46.7B
    all_to_all_sent(tokens=4096, hidden=4096, top_k=2, ranks=8, element_bytes=2)

A layer of E experts replaces one MLP by E of them and a router that sends each token to its top k
(Shazeer et al. 2017; Switch Transformer, Fedus et al. 2021, k = 1; Mixtral, Jiang et al. 2024, k = 2
of 8). A token runs through k experts: its FLOPs are those of the `active_parameters`, its memory
that of all of them.

Expert parallelism (GShard, Lepikhin et al. 2020) puts E/N experts on each of N ranks. Each rank
routes its own tokens; the rows bound for another rank's experts go there in an all-to-all (the
dispatch), come back after the experts in a second (the combine), and backward runs both again with
the splits swapped. Routed evenly, a rank keeps 1/N of its k·tokens rows and sends the rest:
`all_to_all_sent` is tokens·k·(N−1)/N rows of `hidden` elements an all-to-all, and
`sent_per_layer` the four of one layer's forward and backward. Uneven routing sends more from the
rank whose tokens crowd other ranks' experts, and the step waits for the slowest (left out here).

The alternatives, per layer and step, for the same experts on the same N ranks: split each expert
by tensor parallelism (Megatron's column-then-row: every rank holds 1/N of every expert and sees all
the group's tokens; an all-reduce of the output forward and of the input's gradient backward,
`tensor_parallel_sent`), or replicate them and average their gradients (data parallelism,
`replicated_sent`: no tokens move, the whole of every expert is on every rank). `held_per_rank`
gives each scheme's share of the experts' parameters. `capacity` is Switch Transformer's expert
capacity, rounded up; applied in the dispatch (fixed buffers a sending rank, no counts exchanged), a
rank sends `capacity_dispatch_sent` whatever the routing.

Used in: lab 8 (08_experts).
"""
from __future__ import annotations

import math

from course import sizes, transfer


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    return value


def check(experts: int, top_k: int) -> None:
    """k of E experts a token: 1 <= k <= E."""
    _count(experts, "experts")
    _count(top_k, "top_k")
    if not 1 <= top_k <= experts:
        raise ValueError(f"each token goes to top_k of the experts: 1 <= top_k <= experts, got top_k={top_k} "
                         f"of {experts} experts")


def active_parameters(parameters: int, expert_parameters: int, *, experts: int, top_k: int) -> float:
    """The parameters one token runs through: all but the experts', and k/E of those."""
    check(experts, top_k)
    if not 0 <= _count(expert_parameters, "expert_parameters") <= _count(parameters, "parameters"):
        raise ValueError(f"the experts' {expert_parameters:,} parameters are part of the model's {parameters:,}")
    return parameters - expert_parameters + expert_parameters * top_k / experts


def experts_per_rank(experts: int, ranks: int) -> int:
    """E/N experts on each of N expert-parallel ranks; N must divide E."""
    transfer.check_ranks(ranks)
    if _count(experts, "experts") % ranks:
        raise ValueError(f"{experts} experts do not split over {ranks} ranks: pick a number of ranks that "
                         f"divides {experts}")
    return experts // ranks


def all_to_all_sent(tokens: float, hidden: int, top_k: int, ranks: int, element_bytes: int) -> float:
    """Bytes one rank sends in one all-to-all of its `tokens` tokens' k rows each, routed evenly
    over `ranks` ranks: the (N−1)/N of them bound for the other ranks."""
    transfer.check_ranks(ranks)
    return tokens * top_k * hidden * element_bytes * (ranks - 1) / ranks


def sent_per_layer(tokens: float, hidden: int, top_k: int, ranks: int, element_bytes: int) -> float:
    """Bytes one rank sends for one layer of experts in a training step: the dispatch and the combine
    forward, and both again backward (an all-to-all's backward is an all-to-all, splits swapped)."""
    return 4 * all_to_all_sent(tokens, hidden, top_k, ranks, element_bytes)


def tensor_parallel_sent(tokens: float, hidden: int, ranks: int, element_bytes: int) -> float:
    """Bytes one rank sends for one layer of experts split by tensor parallelism over `ranks`, in a training
    step of `tokens` tokens (the group's, every rank seeing all of them): the output all-reduced forward, the
    input's gradient backward, each a ring all-reduce of tokens·hidden elements."""
    return 2 * sizes.all_reduce_sent(tokens * hidden * element_bytes, ranks)


def replicated_sent(expert_parameters: int, ranks: int, element_bytes: int) -> float:
    """Bytes one rank sends for one layer's experts replicated on `ranks` data-parallel ranks: their
    gradients' ring all-reduce, whatever the tokens."""
    return sizes.all_reduce_sent(expert_parameters * element_bytes, ranks)


SCHEMES = ("replicated", "tensor parallel", "expert parallel")


def held_per_rank(scheme: str, experts: int, parameters_per_expert: int, ranks: int) -> float:
    """A rank's parameters of one layer's experts: all of them (replicated), 1/N of each (tensor parallel),
    or its ceil(E/N) whole experts (expert parallel, the first E mod N ranks holding one more)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    transfer.check_ranks(ranks)
    if scheme == "replicated":
        return experts * parameters_per_expert
    if scheme == "tensor parallel":
        return experts * parameters_per_expert / ranks
    if ranks > experts:
        raise ValueError(f"{experts} experts cannot give each of {ranks} ranks one: run at most {experts}")
    return math.ceil(experts / ranks) * parameters_per_expert


def capacity_dispatch_sent(capacity: int, hidden: int, experts: int, ranks: int, element_bytes: int, *,
                           rank: int = 0) -> float:
    """Bytes rank `rank` sends for one layer of experts in a training step when capacity is applied in the dispatch
    (fixed buffers of E x `capacity` rows a sending rank, the first E mod N ranks holding one more expert): the
    places of its buffer bound for other ranks' experts, and the (N−1)·E_r·C places it received back, forward and
    backward. Whatever the routing: empty places travel too."""
    transfer.check_ranks(ranks)
    if ranks > _count(experts, "experts"):
        raise ValueError(f"{experts} experts cannot give each of {ranks} ranks one: run at most {experts}")
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank!r} is not one of the {ranks} ranks 0 to {ranks - 1}")
    held = experts // ranks + (rank < experts % ranks)
    places = _count(capacity, "capacity") * (experts - held + (ranks - 1) * held)
    return 2 * places * hidden * element_bytes


def capacity(tokens: int, experts: int, top_k: int, factor: float) -> int:
    """Switch Transformer's expert capacity: the slots an expert takes in a step, factor · tokens·k / E, rounded
    up (1.0: exactly the even share; more leaves room for uneven routing)."""
    check(experts, top_k)
    if not factor > 0:
        raise ValueError(f"the capacity factor must be positive, got {factor!r}")
    return math.ceil(factor * _count(tokens, "tokens") * top_k / experts)
