"""One step of lab 8's mixture of experts on 4 ranks, data parallel with its experts split over ep of them:
each rank's gradients after the step's reductions, beside one process's.

    gradients, reference = mixture_step.gradients(ep=2, seed=0)      # on every rank of a launch of 4

The model is lab 8's (`moe.DigitsMixture`, smaller: `MIXTURE`) on `ROWS` made-up rows, each rank a quarter of
them and its loss their mean (lab 8's convention). Its dense parameters are replicated on every rank and their
gradients averaged over all of them; its experts are split over ep consecutive ranks (`moe.experts_of`) and
replicated over the 4/ep ranks that hold the same ones, where lab 8's `average_gradients` sums their gradients
and divides by every rank (4): an expert's gradient already counts every token of its ep group, which the
dispatch brought to it. `experts_scaled_by="group"` divides by the 4/ep ranks that summed it instead: ep
times too large (course.wrong_gradients plants it).

The dispatch all-gathers the ep group's tokens and routings (Megatron-Core's all-gather token dispatcher, with
`gpt_stage.gather`), runs this rank's experts on the rows routed to them, and reduce-scatters their weighted
outputs back to the ranks whose tokens they are: rather than lab 8's all-to-all, whose exercise this is not,
and with the same gradients.

Used by: course.wrong_gradients.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import course
from course import gpt_stage, moe

#: The mixture's sizes (lab 8's model, smaller), and the rows of the step, over 4 ranks.
MIXTURE = dict(experts=4, top_k=2, hidden=16, ffn=16)
ROWS = 64


def gradients(ep: int, seed: int, *, experts_scaled_by: str = "world") -> tuple[dict, dict]:
    """Runs on every rank: this rank's gradients after the step ({name: tensor}, its experts' block of w1 and
    w2) and one process's, sliced alike. `experts_scaled_by`: "world" (right) or "group" (the bug)."""
    if experts_scaled_by not in ("world", "group"):
        raise ValueError(f"experts_scaled_by must be 'world' or 'group', got {experts_scaled_by!r}")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % ep or ep > MIXTURE["experts"]:
        raise ValueError(f"{world} ranks do not split into expert-parallel groups of {ep} holding "
                         f"{MIXTURE['experts']} experts: pick an ep that divides both")
    ep_groups = [dist.new_group(list(range(first, first + ep))) for first in range(0, world, ep)]
    same_experts = [dist.new_group(list(range(place, world, ep))) for place in range(ep)]
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(ROWS, 64, generator=generator), torch.randint(10, (ROWS,), generator=generator)
    share = ROWS // world
    mine = slice(rank * share, (rank + 1) * share)
    ep_group, ep_rank = ep_groups[rank // ep], rank % ep
    held = moe.experts_of(ep_rank, MIXTURE["experts"], ep)
    model = _mixture(seed).local(ep_rank, ep).to(course.device())

    def dispatched(h, weights, chosen, w1, w2):
        """Every rank's tokens of the ep group, through this rank's experts; each rank's rows summed back."""
        everyone = [torch.empty_like(chosen) for _ in range(ep)]
        dist.all_gather(everyone, chosen, group=ep_group)
        mixed = _mixed(gpt_stage.gather(h, ep_group, 0), gpt_stage.gather(weights, ep_group, 0),
                       torch.cat(everyone), w1, w2, held)
        return gpt_stage.reduce_scatter(mixed, ep_group, 0)

    scores, _, _ = model(x[mine].to(course.device()), route, dispatched)
    F.cross_entropy(scores, y[mine].to(course.device())).backward()       # the mean over this rank's share
    expert_divisor = world // ep if experts_scaled_by == "group" else world
    for group, parameters, divisor in ((None, model.dense_parameters(), world),
                                       (same_experts[ep_rank], model.expert_parameters(), expert_divisor)):
        for p in parameters:
            total = p.grad.to(course.message_device())
            dist.all_reduce(total, group=group)
            p.grad.copy_(total / divisor)
    whole = _mixture(seed)
    every_expert = list(range(MIXTURE["experts"]))
    scores, _, _ = whole(x, route, lambda h, w, c, w1, w2: _mixed(h, w, c, w1, w2, every_expert))
    F.cross_entropy(scores, y).backward()
    block = slice(held[0], held[-1] + 1)
    return ({n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()},
            {n: (p.grad[block] if n in ("w1", "w2") else p.grad).clone() for n, p in whole.named_parameters()})


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top k experts by the router's probabilities, their weights renormalised to sum to 1."""
    weights, chosen = logits.softmax(-1).topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), chosen


def _mixture(seed: int) -> moe.DigitsMixture:
    return moe.DigitsMixture(MIXTURE["experts"], MIXTURE["top_k"], hidden=MIXTURE["hidden"], ffn=MIXTURE["ffn"],
                             seed=seed)


def _mixed(h, weights, chosen, w1, w2, experts: list[int]) -> torch.Tensor:
    """The weighted sum of `experts`' outputs (w1[i] and w2[i] are experts[i]'s) for every row routed to them."""
    out = torch.zeros_like(h)
    for i, expert in enumerate(experts):
        gate = (weights * (chosen == expert)).sum(-1)
        rows = (chosen == expert).any(-1).nonzero().squeeze(1)
        out = out.index_add(0, rows, gate[rows, None] * moe.expert_mlp(h[rows], w1[i], w2[i]))
    return out
