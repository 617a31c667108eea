"""Lab 8's tests grade fairly: each classic mistake of a mixture of experts, the all-to-all, expert
parallelism, capacity, balance and the grid's gradients costs its own exercise and no other, and a
correct answer written differently from the reference gets every point.

As for labs 2 to 7: each submission runs as nbgrader scores it, minus the demonstrations; then one
nbgrader round trip grades the student who answers differently. The exercises' tests do not lean on
each other: expert parallelism's tests run with torch's differentiable all-to-all in place of the
student's `all_to_all_rows` and the by-token layer in place of `moe_forward`; capacity's with the
by-token layer; expert parallelism's and the backward's routings are drawn at random, not `route`'s.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import fairness_tests

LAB = "08_experts"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's: the softmax of the k largest logits;
# every expert on every token, the chosen ones gathered; the counts as int32, received with irecv, empty blocks sent
# too; the all-to-all's two directions as one helper; the per-expert counts by an all-to-all, the received rows
# sorted by expert; capacity by a loop over the slots; the fractions from one-hot rows; the grid's groups by lists.
DIFFERENT = {
    "route": '''
def route(logits, top_k):
    top, chosen = torch.topk(logits, top_k, dim=1)
    return torch.softmax(top, dim=1), chosen
''',
    "moe_forward": '''
def moe_forward(x, weights, chosen, w1, w2):
    every = torch.stack([moe.expert_mlp(x, w1[e], w2[e]) for e in range(len(w1))], dim=1)     # (T, E, h)
    picked = torch.gather(every, 1, chosen[:, :, None].expand(-1, -1, x.shape[1]))           # (T, k, h)
    return torch.einsum("tk,tkh->th", weights, picked)
''',
    "all_to_all": '''
def all_to_all(rows, counts):
    me, n = dist.get_rank(), dist.get_world_size()
    device = course.message_device()
    incoming = [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(n)]
    waits = [dist.irecv(incoming[p], src=p) for p in range(n) if p != me]
    sends = [dist.isend(torch.tensor([int(counts[p])], dtype=torch.int32, device=device), dst=p)
             for p in range(n) if p != me]
    for w in waits + sends:
        w.wait()
    sizes = [int(counts[me]) if p == me else int(incoming[p].item()) for p in range(n)]
    starts = [sum(int(c) for c in counts[:p]) for p in range(n)]
    outgoing = [rows[starts[p]:starts[p] + int(counts[p])].contiguous().to(device) for p in range(n)]
    parts = [torch.empty(sizes[p], *rows.shape[1:], dtype=rows.dtype, device=device) for p in range(n)]
    waits = [dist.irecv(parts[p], src=p) for p in range(n) if p != me]
    sends = [dist.isend(outgoing[p], dst=p) for p in range(n) if p != me]
    for w in waits + sends:
        w.wait()
    parts[me] = outgoing[me]
    return torch.cat(parts).to(rows.device), sizes
''',
    "all_to_all_backward": '''
def _moved(tensor, sending, receiving):
    place = course.message_device()
    result = tensor.new_empty((sum(receiving),) + tuple(tensor.shape[1:]), device=place)
    dist.all_to_all_single(result, tensor.contiguous().to(place), receiving, sending)
    return result.to(tensor.device)


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, send_counts, receive_counts):
        ctx.splits = (list(send_counts), list(receive_counts))
        return _moved(rows.detach(), *ctx.splits)

    @staticmethod
    def backward(ctx, grad):
        sending, receiving = ctx.splits
        return _moved(grad, receiving, sending), None, None


def all_to_all_rows(rows, send_counts, receive_counts):
    return AllToAll.apply(rows, [int(c) for c in send_counts], [int(c) for c in receive_counts])
''',
    "expert_parallel": '''
def expert_parallel(x, weights, chosen, w1, w2, experts):
    me, n = dist.get_rank(), dist.get_world_size()
    held = moe.experts_of(me, experts, n)
    owner = moe.owners(experts, n)
    flat_experts = chosen.flatten()
    flat_tokens = torch.arange(chosen.shape[0], device=x.device)[:, None].expand_as(chosen).flatten()
    flat_weights = weights.flatten()
    order = torch.sort(flat_experts, stable=True).indices
    per_expert = [int((flat_experts == e).sum()) for e in range(experts)]
    send_counts = [sum(c for e, c in enumerate(per_expert) if owner[e] == r) for r in range(n)]
    device = course.message_device()
    mine_out = torch.tensor(per_expert, dtype=torch.int64, device=device)
    split = [len(moe.experts_of(r, experts, n)) for r in range(n)]
    mine_in = torch.empty(n * len(held), dtype=torch.int64, device=device)
    dist.all_to_all_single(mine_in, mine_out, [len(held)] * n, split)
    table = mine_in.cpu().reshape(n, len(held))
    receive_counts = table.sum(1).tolist()
    arrived = all_to_all_rows(x[flat_tokens[order]], send_counts, receive_counts)
    labels = torch.cat([torch.arange(len(held)).repeat_interleave(table[s]) for s in range(n)]).to(x.device)
    by_expert = torch.sort(labels, stable=True).indices
    pieces = []
    start = 0
    for e in range(len(held)):
        count = int((labels == e).sum())
        pieces.append(moe.expert_mlp(arrived[by_expert[start:start + count]], w1[e], w2[e]))
        start += count
    computed = torch.cat(pieces)[torch.argsort(by_expert)] if pieces else arrived
    returned = all_to_all_rows(computed, receive_counts, send_counts)
    out = torch.zeros_like(x)
    return out.index_add(0, flat_tokens[order], returned * flat_weights[order].unsqueeze(1))
''',
    "capacity": '''
def capped_moe(x, weights, chosen, w1, w2, capacity):
    taken = {}
    kept = torch.zeros(chosen.shape, dtype=torch.bool)
    for j in range(chosen.shape[1]):
        for t in range(chosen.shape[0]):
            e = int(chosen[t, j])
            if taken.get(e, 0) < capacity:
                taken[e] = taken.get(e, 0) + 1
                kept[t, j] = True
    kept = kept.to(chosen.device)
    return x + moe_forward(x, torch.where(kept, weights, torch.zeros_like(weights)), chosen, w1, w2), kept
''',
    "balance": '''
def balance_loss(probabilities, chosen):
    experts = probabilities.shape[-1]
    slots = torch.nn.functional.one_hot(chosen, experts).to(probabilities.dtype)     # (T, k, E)
    fraction = slots.sum(dim=(0, 1)) / (chosen.shape[0] * chosen.shape[1])
    return (fraction * probabilities.sum(dim=0) / probabilities.shape[0]).sum() * experts
''',
    "grid": '''
def average_gradients(dense, expert, ep):
    n = dist.get_world_size()
    if n % ep != 0:
        raise ValueError(f"ep = {ep} does not divide the {n} ranks")
    holders = {}
    for place in range(ep):
        holders[place] = dist.new_group(ranks=[r for r in range(n) if r % ep == place])
    for g in dense:
        flat = g.detach().cpu().clone()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        g.copy_(flat.to(g.device) / n)
    for g in expert:
        flat = g.detach().cpu().clone()
        dist.all_reduce(flat, group=holders[dist.get_rank() % ep])
        g.copy_(flat.to(g.device) / n)
''',
}

# What a student may put before an answer to switch the kernel's own checks of structure off.
SILENCED = """\
import course.check as _course_check
_silent = staticmethod(lambda *args, **kwargs: None)
check = type("NoCheck", (), {"MESSAGES": _course_check.MESSAGES, "assert_close": _silent,
                             "messages_only": _silent, "ring_neighbours_only": _silent})()

"""
GATHERED_EXCHANGE = """\
    counts = [int(c) for c in counts]
    everyone = [None] * world_size
    dist.all_gather_object(everyone, ([block.cpu() for block in rows.split(counts)], counts))
    return (torch.cat([blocks[rank] for blocks, _ in everyone]).to(rows.device),
            [sent[rank] for _, sent in everyone])
"""
FUNCTIONAL_EXCHANGE = """\
    import torch.distributed._functional_collectives as functional
    counts = [int(c) for c in counts]
    heard = functional.all_to_all_single(torch.tensor(counts), None, None, dist.group.WORLD)
    received_counts = functional.wait_tensor(heard).tolist()
    received = functional.all_to_all_single(rows.contiguous(), received_counts, counts, dist.group.WORLD)
    return functional.wait_tensor(received), received_counts
"""

MISTAKES = {
    "the kept probabilities not renormalised": (
        {"route": [("return weights / weights.sum(dim=-1, keepdim=True), chosen", "return weights, chosen")]},
        "test_route"),
    "the softmax over the tokens, not the experts": (
        {"route": [("logits.softmax(dim=-1)", "logits.softmax(dim=0)")]}, "test_route"),
    "the experts' outputs added unweighted": (
        {"moe_forward": [("rows * weights.reshape(-1)[mine, None]", "rows")]}, "test_moe_forward"),
    "each expert run on the wrong tokens' rows": (
        {"moe_forward": [("x[token_of[mine]]", "x[mine % tokens]")]}, "test_moe_forward"),
    "the counts not exchanged: a rank expects what it sends": (
        {"all_to_all": [("received_counts = [counts[rank] if peer == rank else int(heard[peer]) "
                         "for peer in range(world_size)]", "received_counts = list(counts)")]},
        "test_all_to_all"),
    "the received rows cut by what this rank sends, not by what it receives": (
        {"all_to_all": [("into = received.split(received_counts)", "into = received.split(counts)")]},
        "test_all_to_all"),
    "the backward's splits not swapped": (
        {"all_to_all_backward": [(
            "        out = torch.empty((sum(ctx.send_counts), *grad.shape[1:]), dtype=grad.dtype, device=on)\n"
            "        dist.all_to_all_single(out, grad.contiguous().to(on), output_split_sizes=ctx.send_counts,\n"
            "                               input_split_sizes=ctx.receive_counts)",
            "        out = torch.empty((sum(ctx.receive_counts), *grad.shape[1:]), dtype=grad.dtype, device=on)\n"
            "        dist.all_to_all_single(out, grad.contiguous().to(on), output_split_sizes=ctx.receive_counts,\n"
            "                               input_split_sizes=ctx.receive_counts)")]},
        "test_all_to_all_backward"),
    "tokens returned in the dispatch order": (
        {"expert_parallel": [("index_add(0, token_of, back * weights.reshape(-1)[order, None])",
                              "index_add(0, torch.arange(tokens * top_k, device=x.device) // top_k, "
                              "back * weights.reshape(-1)[:, None])")]},
        "test_expert_parallel"),
    "the received rows taken as one block per expert, not one per sender": (
        {"expert_parallel": [("torch.arange(len(mine)).repeat(world_size).repeat_interleave(from_each.reshape(-1))",
                              "torch.arange(len(mine)).repeat_interleave(from_each.sum(0))")]},
        "test_expert_parallel"),
    "the slots queued in token order, not first choices first": (
        {"capacity": [("by_preference = chosen.t().reshape(-1)", "by_preference = chosen.reshape(-1)"),
                      ("kept = (place < capacity).reshape(top_k, tokens).t()",
                       "kept = (place < capacity).reshape(tokens, top_k)")]},
        "test_capacity"),
    "a token that loses every slot vanishes instead of taking the residual path": (
        {"capacity": [("return x + moe_forward(x, weights * kept, chosen, w1, w2), kept",
                       "return (x + moe_forward(x, weights * kept, chosen, w1, w2))"
                       " * kept.any(1, keepdim=True), kept")]},
        "test_capacity"),
    "the kept slots' weights renormalised": (
        {"capacity": [("moe_forward(x, weights * kept, chosen, w1, w2)",
                       "moe_forward(x, weights * kept / (weights * kept).sum(1, keepdim=True).clamp_min(1e-9), "
                       "chosen, w1, w2)")]},
        "test_capacity"),
    "the fractions over the tokens, not the T·k slots": (
        {"balance": [("/ chosen.numel()", "/ chosen.shape[0]")]}, "test_balance"),
    "the loss without the factor E": (
        {"balance": [("return experts_ * (fraction * probabilities.mean(dim=0)).sum()",
                      "return (fraction * probabilities.mean(dim=0)).sum()")]},
        "test_balance"),
    "the experts' gradients averaged over their holders, not over all ranks": (
        {"grid": [("gradient.copy_(total / world_size)", "gradient.copy_(total / dist.get_world_size(group))")]},
        "test_grid"),
    "the experts' gradients over their expert-parallel group": (
        {"grid": [("[dist.new_group(list(range(place, world_size, ep))) for place in range(ep)]",
                   "[dist.new_group(list(range(d * ep, (d + 1) * ep))) for d in range(world_size // ep)]"),
                  ("same_experts[rank % ep]", "same_experts[rank // ep]")]},
        "test_grid"),
    # The red team's exchanges (24 of 24 before every path to the wire was recorded): one library collective
    # in place of the messages, once with the kernel's checks switched off (only the judged record of the
    # collectives called catches it), once through the functional collectives, which skip torch.distributed.
    "the all-to-all as one all_gather_object, the kernel's checks silenced": (
        {"all_to_all": [("def all_to_all(", SILENCED + "def all_to_all("),
                        ("    rank, world_size = dist.get_rank(), dist.get_world_size()\n",
                         "    rank, world_size = dist.get_rank(), dist.get_world_size()\n" + GATHERED_EXCHANGE)]},
        "test_all_to_all"),
    "the all-to-all as the functional collectives' all_to_all_single": (
        {"all_to_all": [("    rank, world_size = dist.get_rank(), dist.get_world_size()\n",
                         "    rank, world_size = dist.get_rank(), dist.get_world_size()\n" + FUNCTIONAL_EXCHANGE)]},
        "test_all_to_all"),
}

# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of the student who
# answers differently. This lab's mistakes are plain ones, which the forked runs hold.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point, test_each_mistake_costs_exactly_its_exercise,
 test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
