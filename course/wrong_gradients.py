"""Lab 9's grid with one composition bug planted: each rank's gradients beside one process's, to diagnose.

    cases = wrong_gradients.draw(seed, count=3)      # [Case(bug, sizes, layer, data_seed)], drawn from a seed
    found = wrong_gradients.run(cases)               # one launch of 4 ranks for all of them
    gradients, reference = found[0]                  # {rank: {name: tensor}} each: the grid's, one process's slices

Each case is one step of lab 9's GPT (`CONFIG`, small) on a 4-rank grid (`course.mesh.Grid.from_device_mesh`,
1F1B over `course.grid_step.step_gradients`), or, on an expert layout ({"dp": 4, "ep": e}), of lab 8's mixture
(`course.mixture_step`), with the reductions written correctly here but for one bug of `BUGS`, a
composition mistake that raises nothing:

- "reduced twice": the gradients of one layer (`layer`) all-reduced twice over dp (a parameter in two
  buckets); every one of them dp times too large, on the ranks that hold the layer;
- "averaged over dp": every gradient divided by dp after its sum, as DDP does, although the loss is already
  divided by the whole step's tokens: 1/dp;
- "replicated summed twice over tp": the replicated parameters (layer norms, the row-split layers' biases, the
  position embedding) summed over tp twice: tp times too large, those only;
- "tied not summed": the token embedding and its copy, the last stage's output layer, never summed over their
  two stages (pp > 1): each holds its own use's part, not a scale of the whole;
- "input not copied": one layer's tensor-parallel region entered by `gpt_stage.gather_copies` where
  `gpt_stage.gather` belongs (Megatron's copy-to-region left out): the forward is the same, but its input's
  gradient is not summed over tp, and everything upstream of it is wrong, by no one factor;
- "reduced to one rank": every sum over a group a `dist.reduce` to the group's first rank, not an all-reduce:
  the other ranks keep their own part (gloo's reduce leaves them unspecified; here they keep it, the same on
  every machine).
- "dropout identical across tp ranks": the GPT trains with a dropout (`DROPOUT`) on every MLP's hidden
  activation, the tensor-parallel region each tp rank holds different columns of. Each hidden unit's mask is
  drawn from its layer's seed, the whole layer's at once (what one process draws); at `layer`, each tp rank
  indexes it by its own units (0 .. 4w/tp - 1) instead of the layer's, so every tp rank drops the same places,
  as when the seed is not offset by the tp rank (Megatron's model-parallel generator exists for this). The loss
  changes too, by a little: nothing raises;
- "experts scaled by the wrong group size": lab 8's mixture on 4 ranks (`course.mixture_step`), its dense
  parameters' gradients averaged over the 4, its experts split over ep ranks. An expert's gradient, summed over
  the 4/ep ranks holding it, already counts every rank's tokens: it belongs divided by 4 and is divided by the
  4/ep that summed it, ep times too large, the experts' gradients only.

The masks of the dropout are per position and unit, the same for every sequence of a batch, so that one
process and every dp rank and micro-batch draw the same ones.

`gradients[rank]` and `reference[rank]` are keyed by the model's names (`gpt.GPT.named_parameters()`; the last
stage's output layer is `embedding.weight`, the weight it shares; the mixture's, its experts' `w1` and `w2` the
rank's block of them), in the stage's order. The truth of a case
(which parameter, which ranks, which factor) is not here: a lab's tests compute it from the tensors.

Used in: lab 10 (10_debugging).
"""
from __future__ import annotations

import contextlib
import random
from typing import NamedTuple

import torch
import torch.distributed as dist

import course
from course import gpt, gpt_stage, grid_step, mesh, mixture_step

#: The model of every case: lab 9's GPT, shrunk so that a step on 4 ranks takes a fraction of a second.
CONFIG = gpt.Config(vocab=64, width=16, heads=4, layers=4, sequence=8)
BATCH, MICRO_BATCHES = 8, 2
#: Each bug, and the 4-rank layouts on which it shows (the axes it needs).
BUGS = {
    "reduced twice": ({"dp": 2, "tp": 2}, {"dp": 2, "pp": 2}),
    "averaged over dp": ({"dp": 2, "tp": 2}, {"dp": 2, "pp": 2}),
    "replicated summed twice over tp": ({"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}),
    "tied not summed": ({"pp": 2, "tp": 2}, {"dp": 2, "pp": 2}),
    "input not copied": ({"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}),
    "reduced to one rank": ({"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}, {"dp": 2, "pp": 2}),
    "dropout identical across tp ranks": ({"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}),
    "experts scaled by the wrong group size": ({"dp": 4, "ep": 2}, {"dp": 4, "ep": 4}),
}
#: The bugs whose wrong gradients are a scale of the right ones, and those whose are not.
SCALES = ("reduced twice", "averaged over dp", "replicated summed twice over tp",
          "experts scaled by the wrong group size")
NOT_SCALES = ("tied not summed", "input not copied", "reduced to one rank", "dropout identical across tp ranks")
RANKS = 4
#: The share of the GPT's MLP hidden units dropped.
DROPOUT = 0.25
EXPERT_LAYOUTS = BUGS["experts scaled by the wrong group size"]


class Case(NamedTuple):
    bug: str | None        # a name of BUGS, or None: the correct reductions
    sizes: dict            # the grid's layout, 4 ranks
    layer: int = 0         # the layer "reduced twice" and "input not copied" hit
    data_seed: int = 0     # the batch (gpt.token_batches) and the model's weights


def draw(seed: int, count: int = 3) -> list[Case]:
    """`count` cases drawn from `seed`, each a different bug (2 to 8): at least one whose gradients are a scale
    of the right ones and one whose are not; the layout, the layer and the batch drawn too."""
    if not isinstance(count, int) or not 2 <= count <= len(BUGS):
        raise ValueError(f"count must be a whole number from 2 to {len(BUGS)} (one case per bug), got {count!r}")
    rng = random.Random(seed)
    first = [rng.choice(SCALES), rng.choice(NOT_SCALES)]
    bugs = first + rng.sample([b for b in BUGS if b not in first], count - 2)
    rng.shuffle(bugs)
    return [Case(bug, dict(rng.choice(BUGS[bug])), rng.randrange(CONFIG.layers), rng.randrange(10_000))
            for bug in bugs]


def run(cases: list[Case], *, timeout: float | None = None) -> list[tuple[dict, dict]]:
    """Each case's (gradients, reference), {rank: {name: tensor}} each, from one launch of 4 ranks."""
    cases = [_checked(case) for case in cases]
    results = course.launch(_gradients, RANKS, args=(cases,), **({} if timeout is None else {"timeout": timeout}))
    return [({r: results[r][i][0] for r in results.ranks}, {r: results[r][i][1] for r in results.ranks})
            for i in range(len(cases))]


def _checked(case) -> Case:
    case = Case(*case)
    if case.bug is not None and case.bug not in BUGS:
        raise ValueError(f"unknown bug {case.bug!r}: the bugs are {', '.join(map(repr, BUGS))}, or None")
    if "ep" in case.sizes:          # lab 8's mixture, not the GPT's grid
        if case.sizes not in EXPERT_LAYOUTS:
            raise ValueError(f"an expert layout is one of {list(EXPERT_LAYOUTS)} (4 ranks), got {case.sizes}")
        sizes = dict(case.sizes)
    else:
        sizes = mesh.sizes_of(case.sizes)
    if case.bug is not None and not any(sizes == (dict(s) if "ep" in s else mesh.sizes_of(s))
                                        for s in BUGS[case.bug]):
        raise ValueError(f"the bug {case.bug!r} shows on the layouts {list(BUGS[case.bug])}, not on {case.sizes}")
    if not 0 <= case.layer < CONFIG.layers:
        raise ValueError(f"layer must be 0 to {CONFIG.layers - 1}, got {case.layer!r}")
    return case


# --- on every rank ------------------------------------------------------------------------------------------
def _gradients(cases: list[Case]) -> list[tuple[dict, dict]]:
    """Runs on every rank: each case's one step on its grid, with its bug; this rank's gradients and its slices
    of one process's, by the model's names."""
    return [mixture_step.gradients(case.sizes["ep"], case.data_seed, experts_scaled_by=_experts_scaled_by(case))
            if "ep" in case.sizes else _grid_gradients(case) for case in cases]


def _grid_gradients(case: Case) -> tuple[dict, dict]:
    """One step of the GPT on the case's grid, and of one process."""
    grid = mesh.Grid.from_device_mesh(case.sizes)
    inputs, targets = gpt.token_batches(CONFIG, batch=BATCH, steps=1, seed=case.data_seed, shortest=2)[0]
    stage = gpt_stage.Stage(gpt.GPT(CONFIG, case.data_seed), grid).to(course.device())
    for block, layer in zip(stage.blocks, grid.layers(CONFIG)):
        units = block.mlp[0].weight.shape[0]           # this tp rank's hidden units
        first = 0 if case.bug == "dropout identical across tp ranks" and layer == case.layer else \
            grid.coords["tp"] * units
        block.mlp[1].register_forward_hook(_dropout(case.data_seed, layer, slice(first, first + units)))
    if case.bug == "input not copied" and case.layer in grid.layers(CONFIG):
        block = stage.blocks[case.layer - grid.layers(CONFIG).start]
        block.forward = _first_gather_uncopied(block.forward)
    grid_step.step_gradients(stage, grid, inputs, targets, micro_batches=MICRO_BATCHES,
                             cross_entropy=gpt_stage.gathered_cross_entropy, micro_batch_loss=_micro_batch_loss,
                             reduce_gradients=lambda s, g: _reduce_gradients(s, g, case.bug, case.layer))
    whole = gpt.GPT(CONFIG, case.data_seed)
    for layer, block in enumerate(whole.blocks):
        block.mlp[1].register_forward_hook(_dropout(case.data_seed, layer, slice(None)))
    gpt.step_loss(whole(inputs), targets).backward()
    want = gpt_stage.slice_of(stage, grid, {n: p.grad for n, p in whole.named_parameters()})
    return ({stage.global_name(n): p.grad.detach().cpu().clone() for n, p in stage.named_parameters()},
            {stage.global_name(n): want[n].cpu() for n, _ in stage.named_parameters()})


def _dropout(seed: int, layer: int, units: slice):
    """A forward hook on a GELU: its output's hidden `units` of the layer's mask applied, scaled by 1/(1 - p).
    The mask, (sequence, 4w), is drawn whole from the layer's seed: position t, unit u, for every sequence."""
    generator = torch.Generator().manual_seed(seed * 1_000 + layer)
    kept = torch.rand(CONFIG.sequence, 4 * CONFIG.width, generator=generator) >= DROPOUT

    def hook(module, inputs, output):
        mask = kept[:output.shape[-2], units].to(output.device)     # cp = 1: the positions are 0 .. t-1
        return output * mask / (1 - DROPOUT)
    return hook


def _micro_batch_loss(token_losses, targets, step_targets, grid):
    """A micro-batch's part of the step's loss: its token losses over the whole step's counted tokens."""
    counted = torch.tensor([float(gpt.counted_tokens(step_targets))], device=token_losses.device)
    dist.all_reduce(counted, group=grid.groups["dp_cp"])
    return token_losses.sum() / counted[0]


def _sum(gradients: list[torch.Tensor], group, *, to_first: bool = False) -> None:
    """Sum the gradients over `group` in place, in one message; `to_first`: only the group's first rank keeps
    the sum (dist.reduce's result), the others keep their own part."""
    if not gradients or group is None or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in gradients]).to(course.message_device())
    dist.all_reduce(flat, group=group)
    if to_first and dist.get_rank(group) != 0:
        return
    for g, piece in zip(gradients, flat.split([g.numel() for g in gradients])):
        g.copy_(piece.view_as(g))


def _reduce_gradients(stage, grid, bug: str | None, layer: int) -> None:
    """Lab 9's reductions (each gradient summed over dp·cp, a replicated one over tp, the tied ones over their
    two stages), each once, but for `bug`."""
    named = [(n, p) for n, p in stage.named_parameters()]
    for _, p in named:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    to_first = bug == "reduced to one rank"
    replicated = [p.grad for n, p in named if not stage.split_over_tp(n)]
    _sum(replicated, grid.groups["tp"], to_first=to_first)
    if bug == "replicated summed twice over tp":
        _sum(replicated, grid.groups["tp"])
    if bug != "tied not summed":
        _sum([p.grad for n, p in named if stage.tied(n)], grid.groups["embedding"], to_first=to_first)
    _sum([p.grad for _, p in named], grid.groups["dp_cp"], to_first=to_first)
    if bug == "reduced twice":
        prefix = f"blocks.{layer}."
        _sum([p.grad for n, p in named if stage.global_name(n).startswith(prefix)], grid.groups["dp_cp"])
    if bug == "averaged over dp":
        for _, p in named:
            p.grad.div_(grid.sizes["dp"] * grid.sizes["cp"])


def _first_gather_uncopied(forward):
    """A block's forward whose first split region (qkv's input) is entered by gather_copies, not gather."""
    def uncopied(*args, **kwargs):
        with _gather_replaced_once():
            return forward(*args, **kwargs)
    return uncopied


@contextlib.contextmanager
def _gather_replaced_once():
    """gpt_stage.gather, as the block's forward looks it up, is gather_copies for its first call only."""
    real, calls = gpt_stage.gather, []

    def gather(x, group, dim):
        calls.append(dim)
        return (gpt_stage.gather_copies if len(calls) == 1 else real)(x, group, dim)

    gpt_stage.gather = gather
    try:
        yield
    finally:
        gpt_stage.gather = real


def _experts_scaled_by(case: Case) -> str:
    """What the experts' summed gradients are divided by: the whole world's ranks, or with the bug the group's."""
    return "group" if case.bug == "experts scaled by the wrong group size" else "world"
