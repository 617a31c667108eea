"""Covers: the fairness of lab 8.

Lab 8's tests grade fairly: each classic mistake of a mixture of experts, the all-to-all, expert
parallelism, capacity (in one process and in the dispatch), balance and the grid's gradients costs its own
exercise and no other, and a correct answer written differently from the reference gets every point.

As for labs 2 to 7: each submission runs as nbgrader scores it, minus the demonstrations; then one
nbgrader round trip grades the student who answers differently. The exercises' tests do not lean on
each other: expert parallelism's tests run with torch's differentiable all-to-all in place of the
student's `all_to_all_rows` and the by-token layer in place of `moe_forward`; capacity's with the
by-token layer; capacity in the dispatch's with both; expert parallelism's and the backward's routings are drawn
at random, not `route`'s.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule
from helpers.submissions import fairness_tests

LAB = "08_experts"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's: the softmax of the k largest logits;
# the slots sorted by expert and split, the experts no slot chose skipped; the counts as int32, received with irecv,
# empty blocks sent too; the all-to-all's two directions as one helper; the per-expert counts by an all-to-all, the
# received rows sorted by expert; capacity by a loop over the slots; the dispatch's places by a loop, its buffer
# gathered from a row of zeros, each kept slot combined choice by choice; the fractions from one-hot rows; the grid's
# groups by lists.
DIFFERENT = {
    "route": '''
def route(logits, top_k):
    top, chosen = torch.topk(logits, top_k, dim=1)
    return torch.softmax(top, dim=1), chosen
''',
    "moe_forward": '''
def moe_forward(x, weights, chosen, w1, w2):
    tokens, top_k = chosen.shape
    slots = chosen.flatten()
    order = slots.argsort()
    sizes = torch.bincount(slots, minlength=len(w1)).tolist()
    rows = x.repeat_interleave(top_k, dim=0)[order].split(sizes)
    ran = torch.cat([moe.expert_mlp(part, w1[e], w2[e]) for e, part in enumerate(rows) if len(part)])
    weighted = ran * weights.flatten()[order].unsqueeze(1)
    return torch.zeros_like(x).index_add(0, order // top_k, weighted)
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
    "capped_dispatch": '''
def capped_dispatch(x, weights, chosen, w1, w2, experts, capacity):
    me, n = dist.get_rank(), dist.get_world_size()
    held = moe.experts_of(me, experts, n)
    tokens, top_k = chosen.shape
    kept = torch.zeros(tokens, top_k, dtype=torch.bool, device=chosen.device)
    place = torch.zeros(tokens, top_k, dtype=torch.long)
    taken = [0] * experts
    for j in range(top_k):
        for t in range(tokens):
            e = int(chosen[t, j])
            if taken[e] < capacity:
                kept[t, j], place[t, j] = True, e * capacity + taken[e]
                taken[e] += 1
    index = torch.full((experts * capacity,), -1, dtype=torch.long)
    index[place[kept.cpu()]] = torch.arange(tokens)[:, None].expand(tokens, top_k)[kept.cpu()]
    padded = torch.cat([x, torch.zeros(1, x.shape[1], dtype=x.dtype, device=x.device)])
    buffer = padded[index.to(x.device)]                    # index -1: the row of zeros
    splits = [capacity * len(moe.experts_of(r, experts, n)) for r in range(n)]
    arrived = all_to_all_rows(buffer, splits, [capacity * len(held)] * n)
    arrived = arrived.view(n, len(held), capacity, x.shape[1]).transpose(0, 1)
    done = [moe.expert_mlp(arrived[e].reshape(-1, x.shape[1]), w1[e], w2[e]).view(n, capacity, -1)
            for e in range(len(held))]
    done = torch.stack(done).transpose(0, 1).reshape(-1, x.shape[1])
    returned = all_to_all_rows(done, [capacity * len(held)] * n, splits)
    y = torch.zeros_like(x)
    for j in range(top_k):
        rows = kept[:, j].nonzero().squeeze(1)
        y = y.index_add(0, rows, returned[place[rows.cpu(), j].to(x.device)] * weights[rows, j, None])
    return y, kept
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

# The layer's body (exercise 2) and expert parallelism's experts (exercise 5), as the reference writes them: what the
# mistakes below that run the experts another way replace.
MOE_BODY = """\
    tokens, top_k = chosen.shape
    slots = chosen.reshape(-1)
    token_of = torch.arange(tokens, device=x.device).repeat_interleave(top_k)
    y = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        mine = (slots == e).nonzero().squeeze(1)
        rows = moe.expert_mlp(x[token_of[mine]], w1[e], w2[e])
        y = y.index_add(0, token_of[mine], rows * weights.reshape(-1)[mine, None])
    return y"""
EXPERTS_LOOP = """\
    for e in range(len(mine)):
        at = (local == e).nonzero().squeeze(1)
        out = out.index_add(0, at, moe.expert_mlp(received[at], w1[e], w2[e]))"""

MISTAKES.update({
    # Exercise 1: the order of the choices, their type, the gradient, the pair's order.
    "the chosen experts least probable first": (
        {"route": [("    weights, chosen = logits.softmax(dim=-1).topk(top_k, dim=-1)\n",
                    "    probabilities = logits.softmax(dim=-1)\n"
                    "    chosen = probabilities.argsort(dim=-1)[:, -top_k:]\n"
                    "    weights = probabilities.gather(1, chosen)\n")]}, "test_route"),
    "the k smallest probabilities kept (sorted ascending)": (
        {"route": [("    weights, chosen = logits.softmax(dim=-1).topk(top_k, dim=-1)\n",
                    "    weights, chosen = logits.softmax(dim=-1).sort(dim=-1)\n"
                    "    weights, chosen = weights[:, :top_k], chosen[:, :top_k]\n")]}, "test_route"),
    "the chosen experts returned as int32": (
        {"route": [("keepdim=True), chosen", "keepdim=True), chosen.int()")]}, "test_route"),
    "the weights detached from the logits": (
        {"route": [("logits.softmax(dim=-1)", "logits.detach().softmax(dim=-1)")]}, "test_route"),
    "the pair returned as (chosen, weights)": (
        {"route": [("return weights / weights.sum(dim=-1, keepdim=True), chosen",
                    "return chosen, weights / weights.sum(dim=-1, keepdim=True)")]}, "test_route"),
    # Exercise 2: each expert once, on its rows; the gradients; the rows added back at their tokens.
    "each expert called once per token": (
        {"moe_forward": [(MOE_BODY, """\
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(chosen.shape[1]):
            e = chosen[t, j]
            out = moe.expert_mlp(x[t:t + 1], w1[e], w2[e])
            y = y.index_add(0, torch.tensor([t], device=x.device), weights[t, j] * out)
    return y""")]}, "test_moe_forward"),
    "each expert called once per choice, k times": (
        {"moe_forward": [(MOE_BODY, """\
    y = torch.zeros_like(x)
    for j in range(chosen.shape[1]):
        for e in range(w1.shape[0]):
            mine = (chosen[:, j] == e).nonzero().squeeze(1)
            y = y.index_add(0, mine, weights[mine, j, None] * moe.expert_mlp(x[mine], w1[e], w2[e]))
    return y""")]}, "test_moe_forward"),
    "every expert run on every token, the chosen ones gathered": (
        {"moe_forward": [(MOE_BODY, """\
    every = torch.stack([moe.expert_mlp(x, w1[e], w2[e]) for e in range(len(w1))], dim=1)     # (T, E, h)
    picked = torch.gather(every, 1, chosen[:, :, None].expand(-1, -1, x.shape[1]))           # (T, k, h)
    return torch.einsum("tk,tkh->th", weights, picked)""")]}, "test_moe_forward"),
    "the routing weights detached": (
        {"moe_forward": [("weights.reshape(-1)[mine, None]", "weights.detach().reshape(-1)[mine, None]")]},
        "test_moe_forward"),
    "the results added back at the wrong tokens": (
        {"moe_forward": [("y.index_add(0, token_of[mine],", "y.index_add(0, mine % tokens,")]}, "test_moe_forward"),
    # Exercise 3: one number each; its own block kept; rank order; one tensor; none received; the counts' list.
    "every rank sent the whole counts list to each": (
        {"all_to_all": [("dist.isend(torch.tensor([counts[peer]], device=on), peer)",
                         "dist.isend(torch.tensor(counts, device=on), peer)"),
                        ("torch.zeros(1, dtype=torch.int64, device=on)",
                         "torch.zeros(world_size, dtype=torch.int64, device=on)"),
                        ("int(heard[peer]) for peer", "int(heard[peer][rank]) for peer")]},
        "test_all_to_all"),
    "this rank's own block sent to itself too": (
        {"all_to_all": [("others = [peer for peer in range(world_size) if peer != rank]",
                         "others = list(range(world_size))")]},
        "test_all_to_all"),
    "the blocks cut by what this rank receives": (
        {"all_to_all": [("blocks = rows.split(counts)", "blocks = rows.split(received_counts)")]}, "test_all_to_all"),
    "the received blocks in arrival order, this rank's own first": (
        {"all_to_all": [("return received.to(rows.device), received_counts",
                         "return torch.cat([into[rank], *(into[peer] for peer in others)]).to(rows.device), "
                         "received_counts")]},
        "test_all_to_all"),
    "the rows returned as a list of blocks, not one tensor": (
        {"all_to_all": [("return received.to(rows.device), received_counts",
                         "return [block.to(rows.device) for block in into], received_counts")]},
        "test_all_to_all"),
    "a rank that receives no rows fails (a cat of no blocks)": (
        {"all_to_all": [("return received.to(rows.device), received_counts",
                         "return torch.cat([block for block in into if len(block)]).to(rows.device), "
                         "received_counts")]},
        "test_all_to_all"),
    "the rows sent with a blocking dist.send before receiving": (
        {"all_to_all": [(
            "    sends = [dist.isend(blocks[peer].contiguous().to(on), peer) for peer in others if counts[peer]]\n",
            "    for peer in others:\n"
            "        if counts[peer]:\n"
            "            dist.send(blocks[peer].contiguous().to(on), peer)\n"
            "    sends = []\n")]},
        "test_all_to_all"),
    "the received counts returned as a tensor": (
        {"all_to_all": [("return received.to(rows.device), received_counts",
                         "return received.to(rows.device), torch.tensor(received_counts)")]},
        "test_all_to_all"),
    # Exercise 4: the forward's splits; the backward's three returns; a gradient at all.
    "the forward's splits swapped": (
        {"all_to_all_backward": [(
            "output_split_sizes=ctx.receive_counts,\n                               input_split_sizes=ctx.send_counts)",
            "output_split_sizes=ctx.send_counts,\n                               input_split_sizes=ctx.receive_counts)"
        )]},
        "test_all_to_all_backward"),
    "the backward returns the gradient alone, without the two Nones": (
        {"all_to_all_backward": [("return out.to(grad.device), None, None", "return out.to(grad.device)")]},
        "test_all_to_all_backward"),
    "the backward returns no gradient": (
        {"all_to_all_backward": [("return out.to(grad.device), None, None", "return None, None, None")]},
        "test_all_to_all_backward"),
    # Exercise 5: the experts once each, on this rank's weights; the dispatch's order and exchange; the combine.
    "each expert run once per sending rank": (
        {"expert_parallel": [(EXPERTS_LOOP, """\
    sender = torch.arange(world_size).repeat_interleave(from_each.sum(1)).to(x.device)
    for s in range(world_size):
        for e in range(len(mine)):
            at = ((local == e) & (sender == s)).nonzero().squeeze(1)
            out = out.index_add(0, at, moe.expert_mlp(received[at], w1[e], w2[e]))""")]},
        "test_expert_parallel"),
    "each expert run once per received row": (
        {"expert_parallel": [(EXPERTS_LOOP, """\
    for i in range(len(received)):
        e = int(local[i])
        one = moe.expert_mlp(received[i:i + 1], w1[e], w2[e])
        out = out.index_add(0, torch.tensor([i], device=x.device), one)""")]},
        "test_expert_parallel"),
    "the experts indexed by their number over all ranks": (
        {"expert_parallel": [("moe.expert_mlp(received[at], w1[e], w2[e])",
                              "moe.expert_mlp(received[at], w1[mine[e]], w2[mine[e]])")]},
        "test_expert_parallel"),
    "the slots not sorted by expert": (
        {"expert_parallel": [("order = slots.argsort(stable=True)",
                              "order = torch.arange(len(slots), device=slots.device)")]},
        "test_expert_parallel"),
    "the rows exchanged with dist.all_to_all_single, outside autograd": (
        {"expert_parallel": [("    received = all_to_all_rows(x[token_of], send_counts, receive_counts)\n",
                              "    received = torch.empty(sum(receive_counts), x.shape[1], dtype=x.dtype)\n"
                              "    dist.all_to_all_single(received, x[token_of], receive_counts, send_counts)\n")]},
        "test_expert_parallel"),
    "a rank that receives no rows fails (a cat of no labels)": (
        {"expert_parallel": [(
            "local = torch.arange(len(mine)).repeat(world_size).repeat_interleave(from_each.reshape(-1)).to(x.device)",
            "local = torch.cat([torch.full((n,), i % len(mine)) for i, n in enumerate(from_each.reshape(-1).tolist())"
            " if n]).to(x.device)")]},
        "test_expert_parallel"),
    "the combine's splits not swapped": (
        {"expert_parallel": [("all_to_all_rows(out, receive_counts, send_counts)",
                              "all_to_all_rows(out, send_counts, receive_counts)")]},
        "test_expert_parallel"),
    "the combined rows not weighted": (
        {"expert_parallel": [("back * weights.reshape(-1)[order, None]", "back")]}, "test_expert_parallel"),
    # Exercise 6: capacity places, kept's type, the residual.
    "capacity + 1 places an expert": (
        {"capacity": [("kept = (place < capacity)", "kept = (place <= capacity)")]}, "test_capacity"),
    "kept returned as 0/1 floats": (
        {"capacity": [("kept = (place < capacity)", "kept = (place < capacity).float()")]}, "test_capacity"),
    "the residual x left out": (
        {"capacity": [("return x + moe_forward(", "return moe_forward(")]}, "test_capacity"),
    # Exercise 7: P_i a mean; the gradient through the probabilities; one number.
    "the probabilities summed over the tokens, not averaged": (
        {"balance": [("probabilities.mean(dim=0)", "probabilities.sum(dim=0)")]}, "test_balance"),
    "the probabilities detached": (
        {"balance": [("probabilities.mean(dim=0)", "probabilities.detach().mean(dim=0)")]}, "test_balance"),
    "the loss left per expert, not summed": (
        {"balance": [("(fraction * probabilities.mean(dim=0)).sum()", "fraction * probabilities.mean(dim=0)")]},
        "test_balance"),
    # Exercise 8: in place; the refusal's type and words.
    "the lists' entries rebound, not the tensors changed in place": (
        {"grid": [("        for gradient in gradients:\n", "        for i, gradient in enumerate(gradients):\n"),
                  ("gradient.copy_(total / world_size)", "gradients[i] = total / world_size")]},
        "test_grid"),
    "each gradient's .data rebound, not copied into": (
        {"grid": [("gradient.copy_(total / world_size)", "gradient.data = total / world_size")]}, "test_grid"),
    "the refusal names ep alone": (
        {"grid": [('raise ValueError(f"{world_size} ranks do not split into expert-parallel groups of {ep}: pick an ep'
                   ' that "\n                         f"divides {world_size}")',
                   'raise ValueError(f"ep = {ep} does not divide the number of ranks")')]},
        "test_grid"),
    "each rank makes only the group it is in": (
        {"grid": [("[dist.new_group(list(range(place, world_size, ep))) for place in range(ep)]",
                   "{rank % ep: dist.new_group(list(range(rank % ep, world_size, ep)))}")]},
        "test_grid"),
    "refused with a RuntimeError, not a ValueError": (
        {"grid": [("raise ValueError(", "raise RuntimeError(")]}, "test_grid"),
})

# Exercise 7, capacity in the dispatch: the fill order; the capacity each sending rank's own; the counts not
# exchanged (caught only by the recorded collectives); the empty places zeros (caught only by the buffer sent);
# each expert once on all its places.
COUNTS_EXCHANGED = """\
    told = torch.empty(world_size, dtype=torch.int64)
    dist.all_to_all_single(told, torch.tensor(send_counts))
    receive_counts = told.tolist()
"""
MISTAKES.update({
    "the dispatch's slots queued in token order, not first choices first": (
        {"capped_dispatch": [("by_preference = chosen.t().reshape(-1)", "by_preference = chosen.reshape(-1)"),
                             ("kept = (place < capacity).reshape(top_k, tokens).t()",
                              "kept = (place < capacity).reshape(tokens, top_k)"),
                             ("torch.arange(tokens, device=x.device).repeat(top_k)",
                              "torch.arange(tokens, device=x.device).repeat_interleave(top_k)"),
                             ("weights.t().reshape(-1)[keep, None]", "weights.reshape(-1)[keep, None]")]},
        "test_capped_dispatch"),
    "the capacity shared by the sending ranks, not each rank's": (
        {"capped_dispatch": [("    tokens, top_k = chosen.shape\n    mine = moe.experts_of(",
                              "    tokens, top_k = chosen.shape\n    capacity = -(-capacity // world_size)\n"
                              "    mine = moe.experts_of(")]},
        "test_capped_dispatch"),
    "the counts exchanged anyway": (
        {"capped_dispatch": [("    receive_counts = [len(mine) * capacity] * world_size\n", COUNTS_EXCHANGED)]},
        "test_capped_dispatch"),
    "the empty places filled with token 0's row, not zeros": (
        {"capped_dispatch": [(
            "    buffer = torch.zeros(experts * capacity, x.shape[1], dtype=x.dtype, device=x.device)\n"
            "    buffer = buffer.index_copy(0, slot, x[token_of[keep]])\n",
            "    index = torch.zeros(experts * capacity, dtype=torch.int64, device=x.device)\n"
            "    buffer = x[index.index_copy(0, slot, token_of[keep])]\n")]},
        "test_capped_dispatch"),
    "each expert run once per sender on its buffer places": (
        {"capped_dispatch": [(
            "    out = torch.stack([moe.expert_mlp(received[:, e].reshape(world_size * capacity, -1), w1[e], w2[e])\n"
            "                       .reshape(world_size, capacity, -1) for e in range(len(mine))], dim=1)\n",
            "    out = torch.stack([torch.stack([moe.expert_mlp(received[s, e], w1[e], w2[e])\n"
            "                                    for e in range(len(mine))]) for s in range(world_size)])\n")]},
        "test_capped_dispatch"),
})

# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of the student who
# answers differently. This lab's mistakes are plain ones, which the forked runs hold.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "route": {
        "Take the softmax over the experts": "the softmax over the tokens, not the experts",
        "keep each token's `top_k` largest probabilities and their experts":
            "the k smallest probabilities kept (sorted ascending)",
        "renormalise the kept ones to sum to 1": "the kept probabilities not renormalised",
        "Return `(weights, chosen)`, both (T, top_k)": "the pair returned as (chosen, weights)",
        "carrying gradients back to `logits`": "the weights detached from the logits",
        "the experts (int64)": "the chosen experts returned as int32",
        "each row's most probable expert first": "the chosen experts least probable first",
    },
    "moe_forward": {
        "each expert once, on its tokens": ("each expert called once per token",
                                            "each expert called once per choice, k times"),
        "each token's weighted sum of its k experts' outputs": ("the experts' outputs added unweighted",
                                                                "each expert run on the wrong tokens' rows"),
        "Run each expert **once**, on all the rows routed to it": ("each expert called once per token",
                                                                   "each expert called once per choice, k times"),
        "add the weighted results back at their tokens' positions": "the results added back at the wrong tokens",
        "An expert that no token chose computes nothing": "every expert run on every token, the chosen ones gathered",
        "Gradients must reach `x`, `weights`, `w1` and `w2`": "the routing weights detached",
        "each expert run once on the rows routed to it": ("each expert called once per token",
                                                          "every expert run on every token, the chosen ones gathered"),
    },
    "all_to_all": {
        "with `dist.send`, `dist.recv`, `dist.isend`, `dist.irecv` only": (
            "the all-to-all as one all_gather_object, the kernel's checks silenced",
            "the all-to-all as the functional collectives' all_to_all_single"),
        "first **the counts**": "the counts not exchanged: a rank expects what it sends",
        "(one number each)": "every rank sent the whole counts list to each",
        "then **the rows**, each block to its rank": "the blocks cut by what this rank receives",
        "this rank's own block stays (it is not sent)": "this rank's own block sent to itself too",
        "the rows every rank sent this one, in rank order": (
            "the received blocks in arrival order, this rank's own first",
            "the received rows cut by what this rank sends, not by what it receives"),
        "one tensor (R', ...)": "the rows returned as a list of blocks, not one tensor",
        "(a rank may receive none: (0, ...))": "a rank that receives no rows fails (a cat of no blocks)",
        "the list of how many came from each rank": "the received counts returned as a tensor",
        "Post the sends with `isend` before receiving": "the rows sent with a blocking dist.send before receiving",
        "(gloo sends CPU tensors only)": NotARule("says what gloo can send; asks nothing of the answer"),
    },
    "all_to_all_backward": {
        "the backward of an all-to-all is an all-to-all with the splits swapped": "the backward's splits not swapped",
        "so autograd must get through it": "the backward returns no gradient",
        "exchanges `rows` with `dist.all_to_all_single(output, input, output_split_sizes=..., input_split_sizes=...)`":
            "the forward's splits swapped",
        "returns the gradient of `rows` (and `None` for the two lists)":
            "the backward returns the gradient alone, without the two Nones",
        "so that a mistake here costs this exercise only": NotARule("says how exercise 5's tests are built"),
    },
    "expert_parallel": {
        "returns what `moe_forward` would give for them on one process holding every expert":
            "tokens returned in the dispatch order",
        "this rank's experts only, `moe.experts_of(rank, experts, N)`, in that order":
            "the experts indexed by their number over all ranks",
        "the slots sorted by expert, hence by rank": "the slots not sorted by expert",
        "every rank must also learn how many rows it gets from each rank *for each of its experts*":
            "the received rows taken as one block per expert, not one per sender",
        "then the rows with `all_to_all_rows`": "the rows exchanged with dist.all_to_all_single, outside autograd",
        "each of this rank's experts once, `moe.expert_mlp`, on the rows it received for it": (
            "each expert run once per sending rank", "each expert run once per received row"),
        "the results back with a second `all_to_all_rows` (the splits swapped)": "the combine's splits not swapped",
        "each row weighted by its slot's weight": "the combined rows not weighted",
        "added at **its token's original position**": "tokens returned in the dispatch order",
        "A rank may receive no rows at all.": "a rank that receives no rows fails (a cat of no labels)",
    },
    "capacity": {
        "`kept` (T, k), bool": "kept returned as 0/1 floats",
        "Expert e's places go first to the first choices (`chosen[:, 0]`) in token order, then to the second choices":
            "the slots queued in token order, not first choices first",
        "until `capacity` are taken": "capacity + 1 places an expert",
        "x plus the kept slots' weighted experts": (
            "the residual x left out", "a token that loses every slot vanishes instead of taking the residual path"),
        "The kept slots keep their weights as they were: no renormalisation over what is left":
            "the kept slots' weights renormalised",
    },
    "capped_dispatch": {
        "in exercise 6's fill order (first choices in token order, then second choices)":
            "the dispatch's slots queued in token order, not first choices first",
        "at most `capacity` for each expert, counted on this rank only":
            "the capacity shared by the sending ranks, not each rank's",
        "then zeros in the places left empty": "the empty places filled with token 0's row, not zeros",
        "Exchange no counts: no collective but `all_to_all_rows`.": "the counts exchanged anyway",
        "each of this rank's experts once, `moe.expert_mlp`, on all the N × `capacity` places it received":
            "each expert run once per sender on its buffer places",
    },
    "balance": {
        "balance = E · Σ_i f_i · P_i": ("the loss without the factor E", "the loss left per expert, not summed"),
        "f_i the fraction of the step's T·k slots routed to expert i":
            "the fractions over the tokens, not the T·k slots",
        "P_i the router's probability of expert i averaged over the T tokens":
            "the probabilities summed over the tokens, not averaged",
        "the probabilities do, and the gradient pushes down the probability of the crowded experts":
            "the probabilities detached",
    },
    "grid": {
        "In place: each tensor of `dense` becomes the mean of that tensor over all ranks": (
            "the lists' entries rebound, not the tensors changed in place",
            "each gradient's .data rebound, not copied into"),
        "each of `expert` becomes the sum over the ranks holding the same experts as this one, divided by the number "
        "of ranks": ("the experts' gradients averaged over their holders, not over all ranks",
                     "the experts' gradients over their expert-parallel group"),
        "Make the groups with `dist.new_group` (every rank creates every group, in the same order)":
            "each rank makes only the group it is in",
        "refuse, with a `ValueError` naming both numbers": ("the refusal names ep alone",
                                                           "refused with a RuntimeError, not a ValueError"),
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point, test_each_mistake_costs_exactly_its_exercise,
 test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
