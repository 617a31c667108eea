"""Covers: the fairness of lab 4.

Lab 4's tests grade fairly: each classic mistake of hybrid parallelism costs its
own exercise and no other, and a correct answer written differently from the
reference gets every point.

As for labs 2 and 3: each submission runs as nbgrader scores it, minus the
demonstrations; then one nbgrader round trip grades two students.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import CHECK_REBOUND, fairness_tests

LAB = "04_hybrid"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's. The hand-over's backward
# here is an all-reduce and the own rows kept, where the reference reduce-scatters: both are correct.
DIFFERENT = {
    "choose_parallelism": '''
def choose_parallelism(layer, batch, gpus):
    if gpus <= 1:
        raise ValueError("choose between schemes on 2 GPUs or more")
    from course import transfer
    gradient, outputs = sizes.nbytes(layer.weights), sizes.nbytes(layer.activations(batch))
    data_parallel = transfer.ring_all_reduce(gradient, gpus)
    model_parallel = transfer.ring_all_gather(outputs, gpus) + transfer.ring_all_reduce(outputs, gpus)
    return {"data": data_parallel, "model": model_parallel,
            "choice": "data" if data_parallel <= model_parallel else "model"}
''',
    "grid": '''
def grid_coordinates(rank, grid):
    if rank < 0 or rank >= grid.data * grid.model:
        raise ValueError(f"no rank {rank} here")
    return rank // grid.model, rank % grid.model


def grid_groups(grid):
    me, mine = dist.get_rank(), {}
    for d in range(grid.data):           # rows first, then columns: the same order on every rank
        group = dist.new_group(list(range(d * grid.model, (d + 1) * grid.model)))
        if me // grid.model == d:
            mine["model"] = group
    for m in range(grid.model):
        group = dist.new_group(list(range(m, grid.ranks, grid.model)))
        if me % grid.model == m:
            mine["data"] = group
    return mine["data"], mine["model"]
''',
    "hand_over": '''
class GatherImages(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, group):
        ctx.group, ctx.rows, ctx.me = group, features.shape[0], dist.get_rank(group)
        flat = features.detach().cpu().contiguous()
        pieces = [torch.zeros_like(flat) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, flat, group=group)
        return torch.cat(pieces, dim=0).to(features.device)

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone().contiguous()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)
        return total.narrow(0, ctx.me * ctx.rows, ctx.rows), None


class SumOverGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, group):
        out = partial.detach().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad.clone(), None
''',
    "hybrid_convnet": '''
class HybridConvNet(nn.Module):
    def __init__(self, full, model_group):
        super().__init__()
        self.g = model_group
        k, n = dist.get_rank(model_group), dist.get_world_size(model_group)
        self.convolutions = nn.Sequential(*full.conv1, *full.conv2)    # flat, the same layers
        dense, out = full.dense[1], full.output
        width, cols = dense.out_features // n, out.in_features // n
        self.dense = nn.Linear(dense.in_features, width).to(dense.weight)
        self.output = nn.Linear(cols, out.out_features).to(out.weight)
        with torch.no_grad():
            self.dense.weight[:] = dense.weight[k * width:(k + 1) * width]
            self.dense.bias[:] = dense.bias[k * width:(k + 1) * width]
            self.output.weight[:] = out.weight[:, k * cols:(k + 1) * cols]
            self.output.bias[:] = out.bias

    def forward(self, images):
        x = torch.flatten(self.convolutions(images), start_dim=1)
        x = torch.relu(self.dense(GatherImages.apply(x, self.g)))
        return SumOverGroup.apply(x @ self.output.weight.t(), self.g) + self.output.bias
''',
    "average_gradients": '''
def average_gradients(convolution_params, dense_params, grid, data_group):
    for p in convolution_params:
        p.grad.div_(grid.data)                      # divide first: the sum comes out averaged
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
    for p in dense_params:
        torch.distributed.all_reduce(p.grad, group=data_group)
        p.grad.mul_(1.0 / grid.data)
''',
}

MISTAKES = {
    "activations counted once, not gathered and all-reduced": (
        {"choose_parallelism": [("model_bytes = 3 * share", "model_bytes = share")]},
        "test_choose_parallelism"),
    "the wrong rank coordinates (position and replica swapped)": (
        {"grid": [("return divmod(rank, grid.model)", "return divmod(rank, grid.model)[::-1]")]},
        "test_grid"),
    "the hand-over keeps its partial error, unsummed": (
        {"hand_over": [("        reduce_scatter(own, whole, group=ctx.group)\n",
                        "        own.copy_(whole.chunk(ctx.size)[ctx.index])\n")]},
        "test_hand_over"),
    # the reference reduce-scatters, which picks the rows by place in the group; the mistake is the
    # all-reduce way's (an all-reduce, then the rows of the global rank)
    "the hand-over keeps the rows of its global rank, not of its place in the group": (
        {"hand_over": [("        own = torch.empty_like(whole.chunk(ctx.size)[ctx.index])\n"
                        "        reduce_scatter(own, whole, group=ctx.group)\n",
                        "        dist.all_reduce(whole, group=ctx.group)\n"
                        "        own = whole.chunk(ctx.size)[dist.get_rank()]\n")]},
        "test_hand_over"),
    "the dense shards of the global rank, not of the place in the group": (
        {"hybrid_convnet": [("size, m = dist.get_world_size(model_group), dist.get_rank(model_group)",
                             "size, m = dist.get_world_size(model_group), dist.get_rank()")]},
        "test_hybrid_convnet"),
    "the dense layers get only this rank's images (no gather)": (
        {"hybrid_convnet": [("GatherImages.apply(features, self.group)", "features")]},
        "test_hybrid_convnet"),
    "the output bias added on every rank of the group": (
        {"hybrid_convnet": [("SumOverGroup.apply(F.linear(hidden, self.output.weight), self.group) + self.output.bias",
                             "SumOverGroup.apply(F.linear(hidden, self.output.weight, self.output.bias), "
                             "self.group)")]},
        "test_hybrid_convnet"),
    "dense shards averaged over every rank, behind a check rebound to a no-op": (
        {"average_gradients": [("dist.all_reduce(p.grad, group=data_group)", "dist.all_reduce(p.grad)"),
                               ("def average_gradients(", CHECK_REBOUND + "def average_gradients(")]},
        "test_average_gradients"),
    "dense shards averaged over every rank": (
        {"average_gradients": [("dist.all_reduce(p.grad, group=data_group)", "dist.all_reduce(p.grad)")]},
        "test_average_gradients"),
    "convolution gradients averaged over the data-parallel group only": (
        {"average_gradients": [("        dist.all_reduce(p.grad)\n        p.grad /= grid.data\n    for p in dense",
                                "        dist.all_reduce(p.grad, group=data_group)\n"
                                "        p.grad /= grid.data\n    for p in dense")]},
        "test_average_gradients"),
    "convolution gradients divided by every rank (a mean where a sum belongs)": (
        {"average_gradients": [("        dist.all_reduce(p.grad)\n        p.grad /= grid.data\n",
                                "        dist.all_reduce(p.grad)\n        p.grad /= grid.ranks\n")]},
        "test_average_gradients"),
    # Round 4: one planted mistake for each rule the texts state (RULES below).
    "the model side counted as NCCL's reduce-scatter, not gloo's all-reduce": (
        {"choose_parallelism": [("model_bytes = 3 * share", "model_bytes = 2 * share")]},
        "test_choose_parallelism"),
    "the gradient counted once, not all-reduced": (
        {"choose_parallelism": [("data_bytes = 2 * share", "data_bytes = share")]},
        "test_choose_parallelism"),
    "elements, not bytes": (
        {"choose_parallelism": [("data_bytes = 2 * share * layer.weights * 4",
                                 "data_bytes = 2 * share * layer.weights"),
                                ("model_bytes = 3 * share * layer.activations(batch) * 4",
                                 "model_bytes = 3 * share * layer.activations(batch)")]},
        "test_choose_parallelism"),
    "a tie goes to the model": (
        {"choose_parallelism": [('"model" if model_bytes < data_bytes else "data"',
                                 '"model" if model_bytes <= data_bytes else "data"')]},
        "test_choose_parallelism"),
    "one GPU let through": (
        {"choose_parallelism": [("    if gpus < 2:\n        raise ValueError(f\"with {gpus} GPU nothing is sent either "
                                 "way: compare on 2 GPUs or more\")\n", "")]},
        "test_choose_parallelism"),
    "a rank outside the grid let through": (
        {"grid": [("    if not 0 <= rank < grid.ranks:\n"
                   "        raise ValueError(f\"rank {rank} is not on a {grid} grid: its ranks are 0 to "
                   "{grid.ranks - 1}\")\n", "")]},
        "test_grid"),
    # the right members on every rank, but each rank makes only its own two groups: the groups are crossed
    "each rank makes only its own two groups": (
        {"grid": [("    columns = [dist.new_group([row * grid.model + position for row in range(grid.data)])\n"
                   "               for position in range(grid.model)]\n"
                   "    rows = [dist.new_group([row * grid.model + position for position in range(grid.model)])\n"
                   "            for row in range(grid.data)]\n"
                   "    return columns[m], rows[d]",
                   "    data_group = dist.new_group([row * grid.model + m for row in range(grid.data)])\n"
                   "    model_group = dist.new_group([d * grid.model + position for position in range(grid.model)])\n"
                   "    return data_group, model_group")]},
        "test_grid"),
    "the groups returned as (model, data)": (
        {"grid": [("return columns[m], rows[d]", "return rows[d], columns[m]")]},
        "test_grid"),
    "features gathered from every rank, not the group": (
        {"hand_over": [("dist.all_gather(parts, features.contiguous().to(on), group=group)",
                        "dist.all_gather(parts, features.contiguous().to(on))")]},
        "test_hand_over"),
    # the right numbers, by the wrong messages: only the collectives show it
    "the features pooled by an all-reduce of zero-padded rows": (
        {"hand_over": [("        on = course.message_device()\n"
                        "        parts = [torch.empty_like(features, device=on) for _ in range(ctx.size)]\n"
                        "        dist.all_gather(parts, features.contiguous().to(on), group=group)\n"
                        "        return torch.cat(parts).to(features.device)\n",
                        "        rows = features.shape[0]\n"
                        "        whole = features.new_zeros(ctx.size * rows, *features.shape[1:])\n"
                        "        whole[ctx.index * rows:(ctx.index + 1) * rows] = features\n"
                        "        dist.all_reduce(whole, group=group)    # the other ranks' rows are zero here\n"
                        "        return whole\n")]},
        "test_hand_over"),
    "the error summed by gathering every rank's whole error": (
        {"hand_over": [("        own = torch.empty_like(whole.chunk(ctx.size)[ctx.index])\n"
                        "        reduce_scatter(own, whole, group=ctx.group)\n",
                        "        everyone = [torch.empty_like(whole) for _ in range(ctx.size)]\n"
                        "        dist.all_gather(everyone, whole, group=ctx.group)\n"
                        "        own = sum(everyone).chunk(ctx.size)[ctx.index]\n")]},
        "test_hand_over"),
    "the partial outputs summed over every rank, not the group": (
        {"hand_over": [("dist.all_reduce(total, group=group)", "dist.all_reduce(total)")]},
        "test_hand_over"),
    "the sum's backward all-reduces the error again": (
        {"hand_over": [("        total = partial.contiguous().clone()\n",
                        "        ctx.group = group\n        total = partial.contiguous().clone()\n"),
                       ("        return grad, None",
                        "        total = grad.contiguous().clone()\n"
                        "        dist.all_reduce(total, group=ctx.group)\n"
                        "        return total, None")]},
        "test_hand_over"),
    "conv2 left out of the convolutions": (
        {"hybrid_convnet": [("nn.Sequential(full.conv1, full.conv2)", "nn.Sequential(full.conv1)")]},
        "test_hybrid_convnet"),
    "the dense bias share not copied": (
        {"hybrid_convnet": [("            self.dense.bias.copy_(dense.bias.chunk(size)[m])\n", "")]},
        "test_hybrid_convnet"),
    "no ReLU after the dense share": (
        {"hybrid_convnet": [("hidden = F.relu(self.dense(GatherImages.apply(features, self.group)))",
                             "hidden = self.dense(GatherImages.apply(features, self.group))")]},
        "test_hybrid_convnet"),
    # the right logits: the bias enters the sum once, but only the group's first rank holds a gradient for it
    "the output bias added by the group's first rank alone, before the sum": (
        {"hybrid_convnet": [("SumOverGroup.apply(F.linear(hidden, self.output.weight), self.group) + self.output.bias",
                             "SumOverGroup.apply(F.linear(hidden, self.output.weight, self.output.bias "
                             "if dist.get_rank(self.group) == 0 else None), self.group)")]},
        "test_hybrid_convnet"),
    # the right numbers, in new tensors: only the memory of each .grad shows it
    "gradients rebound, not averaged in place": (
        {"average_gradients": [("p.grad /= grid.data", "p.grad = p.grad / grid.data")]},
        "test_average_gradients"),
    "the two lists zipped: the loop stops at the shorter": (
        {"average_gradients": [("    for p in convolution_params:\n        dist.all_reduce(p.grad)\n"
                                "        p.grad /= grid.data\n    for p in dense_params:\n"
                                "        dist.all_reduce(p.grad, group=data_group)\n        p.grad /= grid.data",
                                "    for c, p in zip(convolution_params, dense_params):\n"
                                "        dist.all_reduce(c.grad)\n        c.grad /= grid.data\n"
                                "        dist.all_reduce(p.grad, group=data_group)\n        p.grad /= grid.data")]},
        "test_average_gradients"),
    "dense shards summed over the data-parallel group, not averaged": (
        {"average_gradients": [("        dist.all_reduce(p.grad, group=data_group)\n        p.grad /= grid.data",
                                "        dist.all_reduce(p.grad, group=data_group)")]},
        "test_average_gradients"),
}


# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of the student
# who answers differently. This lab's mistakes are plain ones, which the forked runs hold; a mistaken
# student would add a whole notebook's grading to the suite for nothing the judge alone could catch.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "choose_parallelism": {
        "with a ring on $N$ GPUs every rank sends $2\\frac{N-1}{N}W$ elements per step":
            "the gradient counted once, not all-reduced",
        "gathers its **output** forward ($\\frac{N-1}{N}A$ for $A$ activations of the whole batch) and all-reduces "
        "that output's error backward ($2\\frac{N-1}{N}A$): $3\\frac{N-1}{N}A$":
            "activations counted once, not gathered and all-reduced",
        "gloo, which this lab runs on, has no reduce-scatter of its own and all-reduces the whole error: this "
        "exercise counts gloo's $3\\frac{N-1}{N}A$":
            "the model side counted as NCCL's reduce-scatter, not gloo's all-reduce",
        "the float32 **bytes** one rank sends per step each way": "elements, not bytes",
        '(a tie goes to `"data"`: it is the simpler)': "a tie goes to the model",
        "Fewer than 2 GPUs send nothing either way: raise `ValueError`.": "one GPU let through",
    },
    "grid": {
        "rank $r$ sits in data-parallel replica $d = \\lfloor r / \\text{model} \\rfloor$ at model-parallel position "
        "$m = r \\bmod \\text{model}$": "the wrong rank coordinates (position and replica swapped)",
        "**every rank** must call it for **every group**, in the same order, even for groups it is not in":
            "each rank makes only its own two groups",
        "(a rank outside the grid raises `ValueError`)": "a rank outside the grid let through",
        "`grid_groups(grid)` → `(data_group, model_group)`: the calling rank's two groups":
            "the groups returned as (model, data)",
    },
    "hand_over": {
        "every rank of `group` receives the features of all the group's images, stacked in group-rank order "
        "(all-gather)": ("features gathered from every rank, not the group",
                         "the features pooled by an all-reduce of zero-padded rows"),
        "Backward, each rank holds the error of *all* the group's images, but only part of each: the dense layer is "
        "split, so each rank's error is a partial sum": "the hand-over keeps its partial error, unsummed",
        "Sum them over the group and keep the rows of this rank's own images: that is a **reduce-scatter**": (
            "the hand-over keeps its partial error, unsummed",
            "the hand-over keeps the rows of its global rank, not of its place in the group",
            "the error summed by gathering every rank's whole error"),
        "forward, the sum of the group's partial outputs (all-reduce;":
            "the partial outputs summed over every rank, not the group",
        "Backward: the error as it is.": "the sum's backward all-reduces the error again",
        "`dist.get_rank(group)` is this rank's place in the group":
            "the hand-over keeps the rows of its global rank, not of its place in the group",
        "gloo's all-gather takes CPU tensors only": NotARule(
            "says what gloo's all-gather accepts, as the torch docs do; the advice after it (gather on "
            "course.message_device()) changes nothing where every rank is a CPU process, as in these tests"),
    },
    "hybrid_convnet": {
        "`.convolutions`: `full.conv1` then `full.conv2`, whole: every rank keeps a copy":
            "conv2 left out of the convolutions",
        "`.dense`: a `Linear` holding this rank's $m$-th share of the dense layer's **output** features (a column "
        "split: rows of `weight` and of `bias`)": ("the dense shards of the global rank, not of the place in the group",
                                                  "the dense bias share not copied"),
        "the whole bias, added once, after the sum": (
            "the output bias added on every rank of the group",
            "the output bias added by the group's first rank alone, before the sum"),
        "returns the logits of **all** the model-parallel group's images":
            "the dense layers get only this rank's images (no gather)",
        "convolutions, flatten, `GatherImages`, dense share, ReLU, output share, `SumOverGroup`, bias": (
            "no ReLU after the dense share", "the dense layers get only this rank's images (no gather)"),
        "$m$ is `dist.get_rank(model_group)`, the rank's place in its group":
            "the dense shards of the global rank, not of the place in the group",
    },
    "average_gradients": {
        "the **convolutions'**, from its own images only: the replica's gradient is the **sum** over its "
        "model-parallel group; the step's is the **mean** over the `data` replicas of those sums": (
            "convolution gradients averaged over the data-parallel group only",
            "convolution gradients divided by every rank (a mean where a sum belongs)"),
        "One all-reduce over every rank, divided by `grid.data`.": (
            "convolution gradients averaged over the data-parallel group only",
            "convolution gradients divided by every rank (a mean where a sum belongs)"),
        "the mean over the ranks that hold the same shard, its **data-parallel group**": (
            "dense shards averaged over every rank",
            "dense shards averaged over every rank, behind a check rebound to a no-op",
            "dense shards summed over the data-parallel group, not averaged"),
        "in place, on every `.grad`": ("gradients rebound, not averaged in place",
                                       "the two lists zipped: the loop stops at the shorter"),
        "In place: convolution gradients summed over every rank and divided by the replicas; dense shard gradients "
        "averaged over the data-parallel group": (
            "gradients rebound, not averaged in place",
            "convolution gradients averaged over the data-parallel group only",
            "convolution gradients divided by every rank (a mean where a sum belongs)",
            "dense shards averaged over every rank",
            "dense shards summed over the data-parallel group, not averaged"),
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point,
 test_each_mistake_costs_exactly_its_exercise, test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
