"""Lab 3's tests grade fairly: each classic mistake of split-weight model
parallelism costs its own exercise and no other, and a correct answer written
differently from the reference gets every point.

As for lab 2 (`test_lab2_grading`): each submission runs as nbgrader scores it,
minus the demonstrations; then one nbgrader round trip grades two students.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import CHECK_REBOUND, fairness_tests

LAB = "03_model_parallel"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's.
DIFFERENT = {
    "column_split": '''
def column_split(x, weight, grad_output, world_size):
    n_out = weight.size(1)
    if n_out % world_size != 0:
        raise ValueError(f"can't split {n_out} columns over {world_size} GPUs")
    width = n_out // world_size
    outs, errs = [], []
    for k in range(world_size):
        cols = list(range(k * width, (k + 1) * width))
        outs.append(torch.matmul(x, weight[:, cols]))
        errs.append(torch.matmul(grad_output[:, cols], weight[:, cols].t()))
    return outs, torch.hstack(outs), errs, torch.stack(errs).sum(dim=0)
''',
    "row_split": '''
def row_split(x, weight, grad_output, world_size):
    if weight.shape[0] % world_size:
        raise ValueError(f"weight has {weight.shape[0]} rows, not divisible by {world_size} GPUs")
    ws, xs = torch.tensor_split(weight, world_size), torch.tensor_split(x, world_size, dim=1)
    outs = [torch.einsum("bi,io->bo", xk, wk) for xk, wk in zip(xs, ws)]
    errs = [torch.einsum("bo,io->bi", grad_output, wk) for wk in ws]
    return outs, torch.stack(outs).sum(0), errs, torch.hstack(errs)
''',
    "column_parallel_linear": '''
class CopyToRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)     # in place: autograd hands us our own copy here
        return grad


class GatherFromRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, part):
        ctx.n, ctx.rank = dist.get_world_size(), dist.get_rank()
        rows = part.t().contiguous().cpu()             # gather along dim 0 of the transpose
        out = [torch.zeros_like(rows) for _ in range(ctx.n)]
        dist.all_gather(out, rows)
        return torch.cat(out).t().to(part.device)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.n, dim=-1)[ctx.rank].contiguous()


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, rank, world_size, gather_output=True):
        super().__init__()
        self.gather_output = gather_output
        if full.out_features % world_size:
            raise ValueError(f"out_features={full.out_features} is not a multiple of world_size={world_size}")
        with torch.no_grad():
            self.weight = nn.Parameter(torch.chunk(full.weight, world_size)[rank].contiguous())
            self.bias = nn.Parameter(torch.chunk(full.bias, world_size)[rank].contiguous())

    def forward(self, x):
        out = CopyToRanks.apply(x) @ self.weight.t() + self.bias
        if self.gather_output:
            out = GatherFromRanks.apply(out)
        return out
''',
    "row_parallel_linear": '''
class SplitToRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.chunk(x, dist.get_world_size(), dim=-1)[dist.get_rank()].contiguous()

    @staticmethod
    def backward(ctx, grad):
        pieces = [torch.zeros_like(grad).cpu() for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, grad.contiguous().cpu())
        return torch.hstack(pieces).to(grad.device)


class SumOverRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        partial = partial.contiguous()
        dist.all_reduce(partial)
        return partial

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


class RowParallelLinear(nn.Module):
    def __init__(self, full, rank, world_size, input_is_split=False):
        super().__init__()
        self.input_is_split = input_is_split
        if full.in_features % world_size:
            raise ValueError(f"in_features={full.in_features} is not a multiple of world_size={world_size}")
        with torch.no_grad():
            self.weight = nn.Parameter(torch.chunk(full.weight, world_size, dim=1)[rank].contiguous())
            self.bias = nn.Parameter(full.bias.clone())

    def forward(self, x):
        x = x if self.input_is_split else SplitToRanks.apply(x)
        return torch.add(SumOverRanks.apply(x @ self.weight.t()), self.bias)
''',
    "split_block": '''
class SplitBlock(nn.Module):
    def __init__(self, block, rank, world_size):
        super().__init__()
        self.column = ColumnParallelLinear(block[0], rank, world_size, False)
        self.activation = block[1]
        self.row = RowParallelLinear(block[2], rank, world_size, True)

    def forward(self, x):
        hidden = self.column(x)
        return self.row(self.activation(hidden))
''',
    "elements_sent": '''
def elements_sent(direction, batch, inputs, outputs, world_size):
    share = (world_size - 1) / world_size
    gather, reduce = share, 2 * share
    cost = {"column": (gather, reduce), "row": (reduce, gather)}   # (forward, backward)
    if direction not in cost:
        raise ValueError(direction)
    forward, backward = cost[direction]
    return batch * (forward * outputs + backward * inputs)
''',
    "split_transformer_block": '''
class SplitTransformerBlock(nn.Module):
    def __init__(self, block, rank, world_size):
        super().__init__()
        transformer.head_owners(block.heads, world_size)     # raises ValueError when the heads do not split
        self.mlp = SplitBlock(block.mlp, rank, world_size)
        self.qkv = ColumnParallelLinear(block.qkv, rank, world_size, gather_output=False)
        self.out = RowParallelLinear(block.out, rank, world_size, input_is_split=True)
        self.ln1 = block.ln1
        self.ln2 = block.ln2
        self.head_dim = block.qkv.out_features // (3 * block.heads)

    def forward(self, x):
        attended = transformer.attention(self.qkv(self.ln1(x)), head_dim=self.head_dim)
        h = torch.add(x, self.out(attended))
        return h + self.mlp(self.ln2(h))
''',
}

# The classic mistakes, each in one exercise, and the test cell that must catch it.
MISTAKES = {
    "column split adds its partial outputs": (
        {"column_split": [("torch.cat(partial_outputs, dim=1)", "sum(partial_outputs)")]},
        "test_column_split"),
    "column split stacks its partial errors": (
        {"column_split": [("sum(partial_errors)", "torch.cat(partial_errors, dim=0)")]},
        "test_column_split"),
    "row split stacks its partial outputs": (
        {"row_split": [("sum(partial_outputs)", "torch.cat(partial_outputs, dim=1)")]},
        "test_row_split"),
    "no all-reduce in the column split's backward": (
        {"column_parallel_linear": [("        dist.all_reduce(total)\n", "")]},
        "test_column_parallel_linear"),
    "the gather's backward all-reduces, where it needs no message": (
        {"column_parallel_linear": [("        return grad[..., ctx.columns]\n",
                                     "        total = grad.clone()\n"
                                     "        dist.all_reduce(total)      # the same on every rank: the mean is grad\n"
                                     "        return total[..., ctx.columns] / dist.get_world_size()\n")]},
        "test_column_parallel_linear"),
    "the sum's backward all-reduces again, and divides by N": (
        {"row_parallel_linear": [("    def backward(ctx, grad):\n        return grad\n",
                                  "    def backward(ctx, grad):\n        total = grad.clone()\n"
                                  "        dist.all_reduce(total)\n        return total / dist.get_world_size()\n")]},
        "test_row_parallel_linear"),
    "no all-reduce in the column split's backward, behind a check rebound to a no-op": (
        {"column_parallel_linear": [("        dist.all_reduce(total)\n", ""),
                                    ("class CopyToRanks(", CHECK_REBOUND + "class CopyToRanks(")]},
        "test_column_parallel_linear"),
    "every rank keeps rank 0's shard": (
        {"column_parallel_linear": [("rows = slice(rank * per_rank, (rank + 1) * per_rank)",
                                     "rows = slice(0, per_rank)")]},
        "test_column_parallel_linear"),
    "the row split's shards in reverse order": (
        {"row_parallel_linear": [("columns = slice(rank * per_rank, (rank + 1) * per_rank)",
                                  "columns = slice((world_size - 1 - rank) * per_rank, "
                                  "(world_size - rank) * per_rank)")]},
        "test_row_parallel_linear"),
    "a bias added on every rank of the row split": (
        {"row_parallel_linear": [("SumOverRanks.apply(F.linear(x, self.weight))",
                                  "SumOverRanks.apply(F.linear(x, self.weight, self.bias))"),
                                 ("return y if self.bias is None else y + self.bias", "return y")]},
        "test_row_parallel_linear"),
    "the block gathers, then splits again": (
        {"split_block": [("gather_output=False", "gather_output=True"),
                         ("input_is_split=True", "input_is_split=False")]},
        "test_split_block"),
    "qkv gathered, so every rank runs every head": (
        {"split_transformer_block": [("block.qkv, rank, world_size, gather_output=False",
                                      "block.qkv, rank, world_size, gather_output=True"),
                                     ("block.out, rank, world_size, input_is_split=True",
                                      "block.out, rank, world_size, input_is_split=False")]},
        "test_split_transformer_block"),
    "the rank's heads spread over the whole width": (
        {"split_transformer_block": [("block.ln1, block.ln2, block.head_dim",
                                      "block.ln1, block.ln2, block.width // (block.heads // world_size)")]},
        "test_split_transformer_block"),
    "post-norm: the layer norm after the residual": (
        {"split_transformer_block": [("x = x + self.out(transformer.attention(self.qkv(self.ln1(x)), ",
                                      "x = self.ln1(x + self.out(transformer.attention(self.qkv(x), "),
                                     ("self.head_dim))\n", "self.head_dim)))\n")]},
        "test_split_transformer_block"),
    "no residual around attention": (
        {"split_transformer_block": [("x = x + self.out(", "x = self.out(")]},
        "test_split_transformer_block"),
    "heads that do not split evenly are let through": (
        {"split_transformer_block": [("if block.heads % world_size:", "if False:")]},
        "test_split_transformer_block"),
    "all-gather and all-reduce swapped in the count": (
        {"elements_sent": [('if direction == "column":', 'if direction == "row":')]},
        "test_elements_sent"),
}


# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of the student
# who answers differently, beside tests/test_judged_labs.py's stub. This lab's mistakes are plain ones,
# which the forked runs hold; a mistaken student would add a whole notebook's grading to the suite for
# nothing the judge alone could catch.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point,
 test_each_mistake_costs_exactly_its_exercise, test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
