"""Covers: the fairness of lab 3.

Lab 3's tests grade fairly: each classic mistake of split-weight model
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
            self.weight = nn.Parameter(torch.chunk(full.weight, world_size)[rank].clone())
            self.bias = nn.Parameter(torch.chunk(full.bias, world_size)[rank].clone())

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
            self.weight = nn.Parameter(torch.chunk(full.weight, world_size, dim=1)[rank].clone())
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
    # Round 4: one planted mistake for each rule the texts state (RULES below).
    "column split's partial outputs in reverse GPU order": (
        {"column_split": [("return partial_outputs, torch.cat(", "return partial_outputs[::-1], torch.cat(")]},
        "test_column_split"),
    "column split cuts strided columns, not contiguous blocks": (
        {"column_split": [("weights = weight.chunk(world_size, dim=1)",
                           "weights = [weight[:, k::world_size] for k in range(world_size)]"),
                          ("errors_above = grad_output.chunk(world_size, dim=1)",
                           "errors_above = [grad_output[:, k::world_size] for k in range(world_size)]")]},
        "test_column_split"),
    "column split refuses an uneven split without naming the numbers": (
        {"column_split": [('f"{outputs} output features do not split evenly over {world_size} GPUs"',
                           '"the output features do not split evenly over the GPUs"')]},
        "test_column_split"),
    "column split lets an uneven split through": (
        {"column_split": [("    if outputs % world_size:\n"
                           "        raise ValueError(f\"{outputs} output features do not split evenly over "
                           "{world_size} GPUs\")\n", "")]},
        "test_column_split"),
    "row split adds its partial errors": (
        {"row_split": [("torch.cat(partial_errors, dim=1)", "sum(partial_errors)")]},
        "test_row_split"),
    "row split's partial outputs in reverse GPU order": (
        {"row_split": [("return partial_outputs, sum(", "return partial_outputs[::-1], sum(")]},
        "test_row_split"),
    "row split cuts strided rows, not contiguous blocks": (
        {"row_split": [("weights = weight.chunk(world_size, dim=0)",
                        "weights = [weight[k::world_size] for k in range(world_size)]"),
                       ("x_parts = x.chunk(world_size, dim=1)",
                        "x_parts = [x[:, k::world_size] for k in range(world_size)]")]},
        "test_row_split"),
    "row split refuses an uneven split without naming the numbers": (
        {"row_split": [('f"{inputs} input features do not split evenly over {world_size} GPUs"',
                        '"the input features do not split evenly over the GPUs"')]},
        "test_row_split"),
    "row split lets an uneven split through": (
        {"row_split": [("    if inputs % world_size:\n"
                        "        raise ValueError(f\"{inputs} input features do not split evenly over "
                        "{world_size} GPUs\")\n", "")]},
        "test_row_split"),
    # the right numbers, by the wrong message: only the collectives of each pass show it
    "the gather done as an all-reduce of zero-padded parts": (
        {"column_parallel_linear": [(
            "        on = course.message_device()\n"
            "        parts = [torch.empty_like(part, device=on) for _ in range(world_size)]\n"
            "        dist.all_gather(parts, part.contiguous().to(on))\n"
            "        return torch.cat(parts, dim=-1).to(part.device)\n",
            "        whole = torch.zeros(*part.shape[:-1], world_size * part.shape[-1], dtype=part.dtype,\n"
            "                            device=part.device)\n"
            "        whole[..., ctx.columns] = part\n"
            "        dist.all_reduce(whole)      # the other ranks' columns are zero here: the sum stacks the parts\n"
            "        return whole\n")]},
        "test_column_parallel_linear"),
    "the gather's backward keeps the first rank's columns": (
        {"column_parallel_linear": [("        return grad[..., ctx.columns]\n",
                                     "        return grad[..., :ctx.columns.stop - ctx.columns.start]\n")]},
        "test_column_parallel_linear"),
    "the column layer gathers even with gather_output=False": (
        {"column_parallel_linear": [("return GatherFromRanks.apply(y) if self.gather_output else y",
                                     "return GatherFromRanks.apply(y)")]},
        "test_column_parallel_linear"),
    "the column layer keeps the whole bias": (
        {"column_parallel_linear": [("nn.Parameter(full.bias.detach()[rows].clone())",
                                     "nn.Parameter(full.bias.detach().clone())")]},
        "test_column_parallel_linear"),
    # the right numbers, but each rank's shard a view that keeps the full weight alive
    "the column shard a view of the full weight, not copied": (
        {"column_parallel_linear": [("nn.Parameter(full.weight.detach()[rows].clone())",
                                     "nn.Parameter(full.weight.detach()[rows])")]},
        "test_column_parallel_linear"),
    "the column layer refuses uneven outputs without naming the numbers": (
        {"column_parallel_linear": [('raise ValueError(f"a {full.in_features}→{full.out_features} layer\'s '
                                     '{full.out_features} output "\n'
                                     '                             f"features do not split evenly over '
                                     '{world_size} ranks")',
                                     'raise ValueError("the output features do not split evenly over the ranks")')]},
        "test_column_parallel_linear"),
    "the column layer lets uneven outputs through": (
        {"column_parallel_linear": [('        if full.out_features % world_size:\n'
                                     '            raise ValueError(f"a {full.in_features}→{full.out_features} '
                                     'layer\'s {full.out_features} output "\n'
                                     '                             f"features do not split evenly over '
                                     '{world_size} ranks")\n', "")]},
        "test_column_parallel_linear"),
    "the row split's partial products not summed": (
        {"row_parallel_linear": [("        dist.all_reduce(total)\n", "")]},
        "test_row_parallel_linear"),
    # the right numbers, by the wrong message: only the collectives of each pass show it
    "the split's backward as an all-reduce of zero-padded parts": (
        {"row_parallel_linear": [(
            "        on = course.message_device()\n"
            "        parts = [torch.empty_like(grad, device=on) for _ in range(dist.get_world_size())]\n"
            "        dist.all_gather(parts, grad.contiguous().to(on))\n"
            "        return torch.cat(parts, dim=-1).to(grad.device)\n",
            "        rank, world_size, width = dist.get_rank(), dist.get_world_size(), grad.shape[-1]\n"
            "        whole = torch.zeros(*grad.shape[:-1], world_size * width, dtype=grad.dtype, device=grad.device)\n"
            "        whole[..., rank * width:(rank + 1) * width] = grad\n"
            "        dist.all_reduce(whole)      # the other ranks' columns are zero here: the sum stacks the parts\n"
            "        return whole\n")]},
        "test_row_parallel_linear"),
    # the right output: the bias enters the sum once, but only rank 0 holds a gradient for it
    "the bias added by rank 0 alone, before the all-reduce": (
        {"row_parallel_linear": [("SumOverRanks.apply(F.linear(x, self.weight))",
                                  "SumOverRanks.apply(F.linear(x, self.weight, self.bias if dist.get_rank() == 0 "
                                  "else None))"),
                                 ("return y if self.bias is None else y + self.bias", "return y")]},
        "test_row_parallel_linear"),
    "the row layer splits its bias like a column layer": (
        {"row_parallel_linear": [("nn.Parameter(full.bias.detach().clone())",
                                  "nn.Parameter(full.bias.detach().chunk(world_size)[rank].clone())")]},
        "test_row_parallel_linear"),
    "the row shard a view of the full weight, not copied": (
        {"row_parallel_linear": [("nn.Parameter(full.weight.detach()[:, columns].clone())",
                                  "nn.Parameter(full.weight.detach()[:, columns])")]},
        "test_row_parallel_linear"),
    "the row layer refuses uneven inputs without naming the numbers": (
        {"row_parallel_linear": [('raise ValueError(f"a {full.in_features}→{full.out_features} layer\'s '
                                  '{full.in_features} input "\n'
                                  '                             f"features do not split evenly over '
                                  '{world_size} ranks")',
                                  'raise ValueError("the input features do not split evenly over the ranks")')]},
        "test_row_parallel_linear"),
    "the row layer lets uneven inputs through": (
        {"row_parallel_linear": [('        if full.in_features % world_size:\n'
                                  '            raise ValueError(f"a {full.in_features}→{full.out_features} '
                                  'layer\'s {full.in_features} input "\n'
                                  '                             f"features do not split evenly over '
                                  '{world_size} ranks")\n', "")]},
        "test_row_parallel_linear"),
    "the activation after the row layer": (
        {"split_block": [("return self.row(self.activation(self.column(x)))",
                          "return self.activation(self.row(self.column(x)))")]},
        "test_split_block"),
    # "the only message [backward] is the column layer's": the block all-reduces its input's error again
    "the block all-reduces its input's error a second time": (
        {"split_block": [("return self.row(self.activation(self.column(x)))",
                          "return self.row(self.activation(self.column(CopyToRanks.apply(x))))")]},
        "test_split_block"),
    "an all-reduce counted as one pass, like an all-gather": (
        {"elements_sent": [("all_reduce = 2 * (world_size - 1) / world_size",
                            "all_reduce = (world_size - 1) / world_size")]},
        "test_elements_sent"),
    "whole matrices counted, not what one rank sends": (
        {"elements_sent": [("all_gather = (world_size - 1) / world_size\n    all_reduce = 2 * (world_size - 1) "
                            "/ world_size", "all_gather = 1\n    all_reduce = 2")]},
        "test_elements_sent"),
    "any direction other than column counted as row": (
        {"elements_sent": [("    if direction not in (\"column\", \"row\"):\n"
                            "        raise ValueError(f\"direction must be 'column' or 'row', got {direction!r}\")\n",
                            "")]},
        "test_elements_sent"),
    "the width checked, not the heads": (
        {"split_transformer_block": [("if block.heads % world_size:", "if block.qkv.out_features % world_size:")]},
        "test_split_transformer_block"),
    "layer norms copied, not the block's own": (
        {"split_transformer_block": [("class SplitTransformerBlock(", "import copy\n\n\nclass SplitTransformerBlock("),
                                     ("= block.ln1, block.ln2, block.head_dim",
                                      "= copy.deepcopy(block.ln1), copy.deepcopy(block.ln2), block.head_dim")]},
        "test_split_transformer_block"),
}


# The nbgrader round trip (its last test): the full notebook, as an instructor grades it, of the student
# who answers differently, beside tests/test_judged_labs.py's stub. This lab's mistakes are plain ones,
# which the forked runs hold; a mistaken student would add a whole notebook's grading to the suite for
# nothing the judge alone could catch.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
ROW_SPLITS_RULE = NotARule("the row split's rule, in the same exercise's text: row_split's table lists it")
COLUMN_SPLITS_RULE = NotARule("the column split's rule, in the same exercise's text: column_split's table lists it")
RULES: dict[str, dict] = {
    "column_split": {
        "The partial outputs are **stacked** side by side.": "column split adds its partial outputs",
        "$\\delta_{Y,k} W_{:,k}^\\top$ has the full shape of $\\delta_X$ but only part of the sum: the partial "
        "errors are **added**": "column split stacks its partial errors",
        "the list of partial outputs (one per GPU, in GPU order)":
            "column split's partial outputs in reverse GPU order",
        "GPU $k$ holds the $k$-th of $N$ equal, contiguous parts (as `torch.chunk` cuts them)":
            "column split cuts strided columns, not contiguous blocks",
        "A split that does not divide evenly must raise `ValueError`, naming the size and the number of GPUs.": (
            "column split refuses an uneven split without naming the numbers",
            "column split lets an uneven split through"),
        "$X_{:,k} W_{k,:}$ has the full shape of $Y$ but only part of the sum over inputs: the partial outputs are "
        "**added**": ROW_SPLITS_RULE,
    },
    "row_split": {
        "$X_{:,k} W_{k,:}$ has the full shape of $Y$ but only part of the sum over inputs: the partial outputs are "
        "**added**": "row split stacks its partial outputs",
        "own columns of $\\delta_X$: the partial errors are **stacked**": "row split adds its partial errors",
        "the list of partial outputs (one per GPU, in GPU order)": "row split's partial outputs in reverse GPU order",
        "GPU $k$ holds the $k$-th of $N$ equal, contiguous parts (as `torch.chunk` cuts them)":
            "row split cuts strided rows, not contiguous blocks",
        "A split that does not divide evenly must raise `ValueError`, naming the size and the number of GPUs.": (
            "row split refuses an uneven split without naming the numbers",
            "row split lets an uneven split through"),
        "$\\delta_{Y,k} W_{:,k}^\\top$ has the full shape of $\\delta_X$ but only part of the sum: the partial "
        "errors are **added**": COLUMN_SPLITS_RULE,
    },
    "column_parallel_linear": {
        "keeps, on rank $k$, the $k$-th of $N$ contiguous blocks of rows of `weight` and the matching block of "
        "`bias`": ("every rank keeps rank 0's shard", "the column layer keeps the whole bias"),
        "if the next layer needs all of them, the ranks **all-gather** them":
            "the gather done as an all-reduce of zero-padded parts",
        "Backward, each rank's partial error for the layer below covers every input but only its own outputs' share "
        "of the sum, so the ranks **all-reduce** it.": (
            "no all-reduce in the column split's backward",
            "no all-reduce in the column split's backward, behind a check rebound to a no-op"),
        "Backward of the gather needs no message": "the gather's backward all-reduces, where it needs no message",
        "keep this rank's part of the gradient": "the gather's backward keeps the first rank's columns",
        "its parameters `weight` and `bias` copied, this rank's share only": (
            "the column shard a view of the full weight, not copied", "the column layer keeps the whole bias"),
        "With `gather_output=False` it returns this rank's columns of the output, ungathered.":
            "the column layer gathers even with gather_output=False",
        "A layer whose outputs do not split evenly must raise `ValueError` naming both numbers.": (
            "the column layer refuses uneven outputs without naming the numbers",
            "the column layer lets uneven outputs through"),
    },
    "row_parallel_linear": {
        "rank $k$ keeps the $k$-th block of *columns* of `linear.weight`": "the row split's shards in reverse order",
        "Its product has the full shape of the output but is only part of the sum: the ranks **all-reduce** it.":
            "the row split's partial products not summed",
        "The bias belongs to the sum, not to each part: add it once, after the all-reduce, and keep all of it on "
        "every rank.": ("a bias added on every rank of the row split",
                        "the bias added by rank 0 alone, before the all-reduce",
                        "the row layer splits its bias like a column layer"),
        "Backward, the gradient of the output is the same on every rank and passes to each partial product "
        "unchanged.": "the sum's backward all-reduces again, and divides by N",
        "backward the ranks **all-gather** their parts of its gradient":
            "the split's backward as an all-reduce of zero-padded parts",
        "`weight` (this rank's share) and `bias` (all of it)": (
            "the row shard a view of the full weight, not copied", "the row layer splits its bias like a column layer"),
        "Uneven splits raise `ValueError`, as before.": (
            "the row layer refuses uneven inputs without naming the numbers",
            "the row layer lets uneven inputs through"),
    },
    "split_block": {
        "the first need not gather and the second need not split": "the block gathers, then splits again",
        "each rank runs the activation on its own columns": "the activation after the row layer",
        "the only message forward is the row layer's all-reduce": "the block gathers, then splits again",
        "Backward, the only message is the column layer's all-reduce of the error for the block's input.": (
            "the block gathers, then splits again", "the block all-reduces its input's error a second time"),
    },
    "elements_sent": {
        "an **all-gather** of a matrix of $M$ elements sends $\\frac{N-1}{N}M$ from every rank": (
            "whole matrices counted, not what one rank sends", "all-gather and all-reduce swapped in the count"),
        "an **all-reduce** sends $2\\frac{N-1}{N}M$": "an all-reduce counted as one pass, like an all-gather",
        '`"column"` (output gathered, error all-reduced) or `"row"` (whole input split, output all-reduced, error '
        "gathered)": "all-gather and all-reduce swapped in the count",
        "Any other direction raises `ValueError`.": "any direction other than column counted as row",
    },
    "split_transformer_block": {
        "your column split of `qkv` gives rank $k$ the $k$-th block of **whole heads**, their q, k and v together": (
            "qkv gathered, so every rank runs every head", "the rank's heads spread over the whole width"),
        "attention runs on a rank's own heads with no message": "qkv gathered, so every rank runs every head",
        "So the split block sends **one all-reduce per sub-block forward** (in `out` and in the MLP's row layer) "
        "**and one backward**": "qkv gathered, so every rank runs every head",
        "the layer norms and the residuals run whole, on every rank, with their parameters whole": (
            "post-norm: the layer norm after the residual", "no residual around attention",
            "layer norms copied, not the block's own"),
        "`ln1`, `ln2` (the block's own)": "layer norms copied, not the block's own",
        "its forward is the block's": ("post-norm: the layer norm after the residual", "no residual around attention"),
        "When the heads do not split evenly over the ranks, raise a `ValueError` that says so: a rank must own whole "
        "heads.": ("heads that do not split evenly are let through", "the width checked, not the heads"),
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point,
 test_each_mistake_costs_exactly_its_exercise, test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
