"""Covers: the fairness of lab 9.

Lab 9's tests grade fairly: each classic mistake of a composition (groups built in the wrong rank order, a
layout refused for the wrong reason or not at all, the logits gathered whole for the loss, the max not shared
over the vocabulary's ranks, every tensor rank with the same dropout mask, ...) costs its own exercise and no
other, and a correct answer written differently from the reference gets every point.

As for labs 2 to 8: each submission runs as nbgrader scores it, minus the demonstrations. The exercises' tests
do not lean on each other: exercise 1's is arithmetic in the kernel; the tests of exercises 2 to 6 build their
grids with `course.mesh.Grid.from_device_mesh` (or `dist.new_group` directly), not the student's `grid_groups`;
exercise 5's use the naive gathered cross-entropy of `course.gpt_stage`, not the student's exercise 2.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import CHECK_REBOUND, fairness_tests

LAB = "09_composition"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's: the groups from each rank's
# coordinates by divmod, the refusals in another order and wording; the loss in float64, the sum of exponentials
# and the target's logit in one all-reduce, the one-hot from F.one_hot; the dropout seed in mixed radix.
DIFFERENT = {
    "grid_groups": '''
def grid_groups(world_size, sizes, config):
    pp, dp, cp, tp = (int(sizes.get(a, 1)) for a in ("pp", "dp", "cp", "tp"))
    if pp * dp * cp * tp != world_size:
        raise ValueError(f"pp·dp·cp·tp = {pp * dp * cp * tp} but there are {world_size} ranks")
    if config.layers % pp:
        raise ValueError(f"{config.layers} layers cannot be cut into {pp} stages")
    if config.heads % tp or config.vocab % tp:
        bad = config.heads if config.heads % tp else config.vocab
        raise ValueError(f"{bad} (heads or vocabulary) is not a multiple of tp={tp}")
    if config.sequence % (cp * tp):
        raise ValueError(f"sequence {config.sequence} is not a multiple of cp*tp={cp * tp}")
    strides = {"tp": 1, "cp": tp, "dp": tp * cp, "pp": tp * cp * dp}
    size = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    out = {}
    for axis in ("pp", "dp", "cp", "tp"):
        starts = [r for r in range(world_size) if (r // strides[axis]) % size[axis] == 0]
        out[axis] = [[s + k * strides[axis] for k in range(size[axis])] for s in starts]
    return out
''',
    "vocab_parallel_cross_entropy": '''
class _VocabCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, group):
        n = logits.shape[-1]
        start = n * dist.get_rank(group=group)
        z = logits.detach().double()
        m = z.amax(-1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z = z - m[..., None]
        inside = (targets >= start) & (targets < start + n)
        local = (targets - start).clamp(0, n - 1)
        both = torch.stack([z.exp().sum(-1), torch.gather(z, -1, local[..., None])[..., 0] * inside])
        dist.all_reduce(both, group=group)
        keep = targets != gpt.IGNORE
        ctx.save_for_backward(z.exp() / both[0][..., None], local, inside, keep)
        return ((both[0].log() - both[1]) * keep).to(logits.dtype)

    @staticmethod
    def backward(ctx, g):
        p, local, inside, keep = ctx.saved_tensors
        d = p - torch.nn.functional.one_hot(local, p.shape[-1]).double() * inside[..., None]
        return (d * (g.double() * keep)[..., None]).to(g.dtype), None, None


def vocab_parallel_cross_entropy(logits, targets, group):
    return _VocabCE.apply(logits, targets, group)
''',
    "dropout_seed": '''
def dropout_seed(seed, step, layer, grid, split):
    place = grid.coords["dp"] * grid.sizes["cp"] + grid.coords["cp"]
    tensor = grid.coords["tp"] + 1 if split else 0
    mixed = (((seed % 100_003) * 100_003 + step % 100_003) * 1_009 + layer % 1_009) * 2 + int(split)
    return (mixed * 1_009 + place) * 1_009 + tensor
''',
}

MISTAKES = {
    # Exercise 1: the rank order; each refusal; the numbers named.
    "the groups built with dp fastest, not tp": (
        {"grid_groups": [("ranks = torch.arange(world_size).reshape(shape)",
                          "ranks = torch.arange(world_size).reshape(shape[::-1]).permute(3, 2, 1, 0)")]},
        "test_grid_groups"),
    "the groups of each axis in the order the reshape gives, not sorted by first rank": (
        {"grid_groups": [("groups[axis] = sorted(row.tolist() for row in rows)",
                          "groups[axis] = [row.tolist() for row in rows][::-1]")]},
        "test_grid_groups"),
    "a world the layout does not fill accepted": (
        {"grid_groups": [("if math.prod(shape) != world_size:", "if math.prod(shape) > world_size:")]},
        "test_grid_groups"),
    "the refusal names the layout's ranks alone": (
        {"grid_groups": [("needs {math.prod(shape)} ranks, the world has {world_size}\")",
                          "needs {math.prod(shape)} ranks, not the world's\")")]},
        "test_grid_groups"),
    "the heads not checked against tp": (
        {"grid_groups": [('(("heads", config.heads, "tp", tp), ', '(')]}, "test_grid_groups"),
    "the vocabulary not checked against tp": (
        {"grid_groups": [('("vocabulary", config.vocab, "tp", tp),', '')]}, "test_grid_groups"),
    "the layers not checked against pp": (
        {"grid_groups": [('("layers", config.layers, "pp", pp),', '')]}, "test_grid_groups"),
    "the sequence checked against cp alone": (
        {"grid_groups": [('"cp · tp", cp * tp)', '"cp", cp)')]}, "test_grid_groups"),
    # Exercise 2: the max shared and subtracted; the target's owner; the group's rank; IGNORE; what is sent; the
    # backward's scale and one-hot.
    "the max not all-reduced: each shard its own": (
        {"vocab_parallel_cross_entropy": [("peak = all_reduce(logits.max(dim=-1).values, dist.ReduceOp.MAX)",
                                           "peak = logits.max(dim=-1).values")]},
        "test_vocab_parallel_cross_entropy"),
    "the max not subtracted": (
        {"vocab_parallel_cross_entropy": [("shifted = logits - peak.unsqueeze(-1)", "shifted = logits")]},
        "test_vocab_parallel_cross_entropy"),
    "the target's logit taken by every rank, its id modulo the shard": (
        {"vocab_parallel_cross_entropy": [("local = targets - first", "local = targets % shard"),
                                          ("mine = counted & (local >= 0) & (local < shard)", "mine = counted")]},
        "test_vocab_parallel_cross_entropy"),
    "the shard's first token from the global rank": (
        {"vocab_parallel_cross_entropy": [("first = dist.get_rank(group) * shard", "first = dist.get_rank() * shard")]},
        "test_vocab_parallel_cross_entropy"),
    "IGNORE's loss not zeroed, the kernel's check rebound": (
        {"vocab_parallel_cross_entropy": [
            ("return torch.where(counted, total.log() - picked, torch.zeros_like(picked))",
             "return total.log() - picked"),
            ("class VocabParallelCrossEntropy(", CHECK_REBOUND + "class VocabParallelCrossEntropy(")]},
        "test_vocab_parallel_cross_entropy"),
    "the logits gathered whole": (
        {"vocab_parallel_cross_entropy": [("return VocabParallelCrossEntropy.apply(logits, targets, group)",
                                           "return gpt_stage.gathered_cross_entropy(logits, targets, group)")]},
        "test_vocab_parallel_cross_entropy"),
    "the loss detached from the logits": (
        {"vocab_parallel_cross_entropy": [("return VocabParallelCrossEntropy.apply(logits, targets, group)",
                                           "return VocabParallelCrossEntropy.apply(logits.detach(), targets, group)")]},
        "test_vocab_parallel_cross_entropy"),
    "the backward not scaled by the loss's gradient": (
        {"vocab_parallel_cross_entropy": [("return (softmax - one_hot) * (grad * counted).unsqueeze(-1), None, None",
                                           "return (softmax - one_hot) * counted.unsqueeze(-1), None, None")]},
        "test_vocab_parallel_cross_entropy"),
    "the one-hot at the local index on every rank": (
        {"vocab_parallel_cross_entropy": [("scatter_(-1, index, mine.unsqueeze(-1)",
                                           "scatter_(-1, index, counted.unsqueeze(-1)")]},
        "test_vocab_parallel_cross_entropy"),
    # Exercise 4: what tells two activations apart, and the seed's range.
    "every tensor rank with the same mask in a split region": (
        {"dropout_seed": [('tensor_place = c["tp"] if split else -1', "tensor_place = -1")]}, "test_dropout_seed"),
    "the tp coordinate in a replicated region too": (
        {"dropout_seed": [('tensor_place = c["tp"] if split else -1', 'tensor_place = c["tp"]')]},
        "test_dropout_seed"),
    "the dp coordinate left out": (
        {"dropout_seed": [('c["dp"], c["cp"], tensor_place', 'c["cp"], tensor_place')]}, "test_dropout_seed"),
    "the cp coordinate left out": (
        {"dropout_seed": [('c["dp"], c["cp"], tensor_place', 'c["dp"], tensor_place')]}, "test_dropout_seed"),
    "the step left out": (
        {"dropout_seed": [("key = (seed, step, layer,", "key = (seed, layer,")]}, "test_dropout_seed"),
    "the run's seed left out": (
        {"dropout_seed": [("key = (seed, step, layer,", "key = (step, layer,")]}, "test_dropout_seed"),
    "a replicated region's seed that of tp rank 0's split region": (
        {"dropout_seed": [('tensor_place = c["tp"] if split else -1', 'tensor_place = c["tp"] if split else 0'),
                          ("key = (seed, step, layer, split,", "key = (seed, step, layer,")]},
        "test_dropout_seed"),
    "the seed Python's hash, negative at times": (
        {"dropout_seed": [("return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "
                           '"big") >> 1', "return hash(key)")]},
        "test_dropout_seed"),
}

# >>> helper G2: exercises 3, 5 and 6 (global_grad_norm, micro_batch_loss/reduce_gradients, checkpoint_state):
# add their DIFFERENT answers, MISTAKES and RULES entries below, in this block.
# Exercises 3, 5 and 6 answered in other correct ways: the replicated squares divided by tp, then every square
# summed over tp and pp in turn, the tied copy skipped by its name; the count as a float, the gradients reduced
# one parameter at a time (the reference buckets them); the names by a regular expression, the stage's
# blocks counted as a set, the placements by pattern.
DIFFERENT.update({
    "global_grad_norm": '''
def global_grad_norm(stage, grid):
    squares = torch.zeros((), dtype=torch.float64)
    for name, p in stage.named_parameters():
        if name == "head.weight":
            continue
        s = p.grad.double().pow(2).sum().cpu()
        squares += s if stage.split_over_tp(name) else s / grid.sizes["tp"]
    for axis in ("tp", "pp"):
        dist.all_reduce(squares, group=grid.groups[axis])
    return squares.sqrt().item()
''',
    "reduce_gradients": '''
def micro_batch_loss(token_losses, targets, step_targets, grid):
    count = (step_targets != gpt.IGNORE).sum().double().cpu()
    dist.all_reduce(count, group=grid.groups["dp_cp"])
    return (token_losses * (targets != gpt.IGNORE)).sum() / count.item()


def reduce_gradients(stage, grid):
    for name, p in stage.named_parameters():
        groups = [grid.groups["dp_cp"]]
        if not stage.split_over_tp(name):
            groups.append(grid.groups["tp"])
        if stage.tied(name):
            groups.append(grid.groups["embedding"])
        total = p.grad.cpu()
        for group in groups:
            dist.all_reduce(total, group=group)
        p.grad.copy_(total)
''',
    "checkpoint_state": '''
def checkpoint_state(local, grid):
    tp_mesh = grid.tp_mesh()
    blocks = {name.split(".")[1] for name in local if name.startswith("blocks.")}
    offset = grid.coords["pp"] * len(blocks)
    out = {}
    for name, tensor in local.items():
        full = re.sub(r"^blocks\\.(\\d+)\\.", lambda m: f"blocks.{int(m.group(1)) + offset}.", name)
        full = "embedding.weight" if full == "head.weight" else full
        if re.search(r"(qkv|mlp\\.0)\\.(weight|bias)$", full) or full == "embedding.weight":
            where = Shard(dim=0)
        elif re.search(r"(out|mlp\\.2)\\.weight$", full):
            where = Shard(dim=1)
        else:
            where = Replicate()
        out[full] = DTensor.from_local(tensor, tp_mesh, (where,), run_check=False)
    return out
''',
})

MISTAKES.update({
    # Exercise 3: each parameter once: split ones over tp, replicated ones and the tied copy once, stages summed,
    # replicas not.
    "the norm counted once per replica": (
        {"global_grad_norm": [('    dist.all_reduce(total, group=grid.groups["pp"])',
                               '    dist.all_reduce(total, group=grid.groups["pp"])\n'
                               '    dist.all_reduce(total, group=grid.groups["dp_cp"])')]},
        "test_global_grad_norm"),
    "the replicated parameters' squares summed over tp": (
        {"global_grad_norm": [("torch.tensor([split]", "torch.tensor([split + replicated]"),
                              ("    total += replicated", "    total += 0.0")]},
        "test_global_grad_norm"),
    "the split parameters' squares of this tp rank's part alone": (
        {"global_grad_norm": [('    dist.all_reduce(total, group=grid.groups["tp"])', "")]},
        "test_global_grad_norm"),
    "the tied copy on the last stage counted too": (
        {"global_grad_norm": [("(stage.tied(name) and not grid.first_stage)", "False")]}, "test_global_grad_norm"),
    "the stages' sums not added over pp": (
        {"global_grad_norm": [('    dist.all_reduce(total, group=grid.groups["pp"])', "")]},
        "test_global_grad_norm"),
    # Exercise 5: the loss over the whole step's tokens; each gradient summed once over each of its groups.
    "the loss averaged per micro-batch, not per token": (
        {"reduce_gradients": [("    return token_losses.sum() / int(counted)",
                               "    micro_batches = len(step_targets) // len(targets)\n"
                               "    return token_losses.sum() / gpt.counted_tokens(targets) / micro_batches / "
                               "dist.get_world_size(grid.groups[\"dp_cp\"])")]},
        "test_reduce_gradients"),
    "the step's tokens counted on this rank alone": (
        {"reduce_gradients": [('    dist.all_reduce(counted, group=grid.groups["dp_cp"])', "")]},
        "test_reduce_gradients"),
    "the gradients averaged over dp·cp, not summed": (
        {"reduce_gradients": [("            dist.all_reduce(total, group=grid.groups[axis])",
                               "            dist.all_reduce(total, group=grid.groups[axis])\n"
                               "            if axis == \"dp_cp\":\n"
                               "                total /= dist.get_world_size(grid.groups[axis])")]},
        "test_reduce_gradients"),
    "the replicated gradients not summed over tp": (
        {"reduce_gradients": [('            axes += ("tp",)', "            pass")]},
        "test_reduce_gradients"),
    "the tied gradient not summed over the embedding group": (
        {"reduce_gradients": [('            axes += ("embedding",)', "            pass")]},
        "test_reduce_gradients"),
    "the gradients summed over dp·cp, then over dp again": (
        {"reduce_gradients": [('        axes = ("dp_cp",)', '        axes = ("dp_cp", "dp")')]},
        "test_reduce_gradients"),
    # Exercise 6: global names, placements, the tensors themselves.
    "the blocks saved under their local index": (
        {"checkpoint_state": [('name_ = f"blocks.{int(layer) + first_layer}.{rest}"', "name_ = name")]},
        "test_checkpoint_state"),
    "head.weight saved under its own name": (
        {"checkpoint_state": [('name_ = "embedding.weight" if name == "head.weight" else name', "name_ = name"),
                              ('or name_ == "embedding.weight"', 'or name_ in ("embedding.weight", "head.weight")')]},
        "test_checkpoint_state"),
    "a row-split weight declared Shard(0)": (
        {"checkpoint_state": [("placement = Shard(1)", "placement = Shard(0)")]}, "test_checkpoint_state"),
    "a copy of each tensor given to DCP": (
        {"checkpoint_state": [("DTensor.from_local(tensor,", "DTensor.from_local(tensor.clone(),")]},
        "test_checkpoint_state"),
})

G2_RULES = {
    "global_grad_norm": {
        "return, as a Python float, the norm of the whole model's gradient, the same on every rank": (
            "the norm counted once per replica", "the stages' sums not added over pp"),
        "Each parameter of the model counts once": (
            "the norm counted once per replica", "the replicated parameters' squares summed over tp",
            "the tied copy on the last stage counted too"),
        "each parameter counted once": (
            "the norm counted once per replica", "the replicated parameters' squares summed over tp",
            "the tied copy on the last stage counted too"),
        "its squares are summed over the tp group": "the split parameters' squares of this tp rank's part alone",
        "it counts once, not once per tp rank": "the replicated parameters' squares summed over tp",
        "with the same gradient: skip it": "the tied copy on the last stage counted too",
        "their sums are added over the pp group": "the stages' sums not added over pp",
        "nothing is summed over dp or cp": "the norm counted once per replica",
    },
    "reduce_gradients": {
        "its token losses summed, divided by the number of tokens the whole step counts on every data and context "
        "rank": "the loss averaged per micro-batch, not per token",
        "summed over `grid.groups[\"dp_cp\"]`)": "the step's tokens counted on this rank alone",
        "the mean over the step's tokens, never a mean of means": "the loss averaged per micro-batch, not per token",
        "its sum (not its mean) over `grid.groups[\"dp_cp\"]`, for every parameter":
            "the gradients averaged over dp·cp, not summed",
        "summed over `grid.groups[\"tp\"]` too": "the replicated gradients not summed over tp",
        "summed over `grid.groups[\"embedding\"]` too": "the tied gradient not summed over the embedding group",
        "Each sum once": "the gradients summed over dp·cp, then over dp again",
    },
    "checkpoint_state": {
        "the DTensor holds the tensor of `local` itself, not a copy": "a copy of each tensor given to DCP",
        "DCP's load writes into it in place": "a copy of each tensor given to DCP",
        "It writes every part once": NotARule("says what DCP does with the DTensors; asks nothing of the answer"),
        "(loaded in place)": "a copy of each tensor given to DCP",
        "the stage's block j is layer j + p·n of the model": "the blocks saved under their local index",
        "the last stage's `head.weight` is the model's `embedding.weight`": "head.weight saved under its own name",
        "`Shard(1)` for the row-split weights (`out.weight`, `mlp.2.weight`)": "a row-split weight declared Shard(0)",
    },
}
# <<< helper G2

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "grid_groups": {
        "each group the sorted list of the global ranks that differ in that axis's coordinate alone, in the layout "
        "above (tp fastest, then cp, dp, pp)": "the groups built with dp fastest, not tp",
        "the groups sorted by their first rank":
            "the groups of each axis in the order the reshape gives, not sorted by first rank",
        "a world of `world_size` ranks that the product of the sizes does not equal":
            "a world the layout does not fill accepted",
        "with a `ValueError` whose message names both numbers that disagree":
            "the refusal names the layout's ranks alone",
        "`config.heads` that tp does not divide": "the heads not checked against tp",
        "`config.vocab` that tp does not divide": "the vocabulary not checked against tp",
        "`config.layers` that pp does not divide": "the layers not checked against pp",
        "`config.sequence` that cp · tp does not divide": "the sequence checked against cp alone",
    },
    "vocab_parallel_cross_entropy": {
        "m: each rank's max over its shard, all-reduced with MAX over the group":
            "the max not all-reduced: each shard its own",
        "taken by the rank whose shard holds the target (0 on the others)":
            "the target's logit taken by every rank, its id modulo the shard",
        "(this rank's place in it: `dist.get_rank(group)`)": "the shard's first token from the global rank",
        "0 where the target is `gpt.IGNORE`": "IGNORE's loss not zeroed, the kernel's check rebound",
        "Subtract the max before exponentiating: logits of 10⁴ must not overflow": "the max not subtracted",
        "Send numbers of each token, never logits": "the logits gathered whole",
        "The loss must carry gradients to `logits`": "the loss detached from the logits",
        "the gradient of a token's loss is softmax(z) − one-hot(target) (both on the shard's part of the "
        "vocabulary)": "the one-hot at the local index on every rank",
        "times the loss's gradient": "the backward not scaled by the loss's gradient",
    },
    "dropout_seed": {
        "two ranks that hold the same activation must draw the same mask":
            "the tp coordinate in a replicated region too",
        "Two ranks that hold different activations must draw different masks": (
            "every tensor rank with the same mask in a split region", "the dp coordinate left out"),
        "an int from 0 to 2⁶³ − 1": "the seed Python's hash, negative at times",
        "the same `seed`, step, layer and kind of region": (
            "the run's seed left out", "the step left out",
            "a replicated region's seed that of tp rank 0's split region"),
        "the same dp and cp coordinates": ("the dp coordinate left out", "the cp coordinate left out"),
        "in a split region, the same tp coordinate": "every tensor rank with the same mask in a split region",
    },
}

RULES.update(G2_RULES)     # exercises 3, 5 and 6's, from helper G2's block above

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point, test_each_mistake_costs_exactly_its_exercise,
 test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
