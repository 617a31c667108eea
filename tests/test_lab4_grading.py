"""Lab 4's tests grade fairly: each classic mistake of hybrid parallelism costs its
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
}


# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of the student
# who answers differently. This lab's mistakes are plain ones, which the forked runs hold; a mistaken
# student would add a whole notebook's grading to the suite for nothing the judge alone could catch.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point,
 test_each_mistake_costs_exactly_its_exercise, test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
