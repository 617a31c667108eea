"""Lab 9's tensor- and sequence-parallel regions type-checked by spmd_types (Meta's local SPMD types).

    verdicts = course.launch(spmd_check.verdicts, 2)[0]      # {variant: {"verdict": ..., ...}} on tp = 2

spmd_types (BSD, 0.3.1 here; `pip install spmd_types==0.3.1`, the course's `spmd` extra) gives every tensor a
type on each mesh axis and follows it through every torch operation: **V** differs by rank (a shard), **R**
is the same on every rank with a gradient that is a partial sum still to be added up, **I** the same with a
whole gradient, **P** a partial sum. It refuses an operation whose gradient would come out wrong, in the
forward pass, before any loss exists.

`course.gpt_stage`'s three collectives carry their types (their autograd Function's `spmd_typecheck`,
which the checker calls): `gather` (a split region's input, its gradient summed backward) takes S(dim)
to R; `reduce_scatter` (the partial sums out of a region) V to S(dim); `gather_copies` (a computation every
rank repeats alike; backward keeps this rank's block) S(dim) to I. Split parameters are V on tp, replicated
ones R (lab 9's exercise 5 sums their gradients over tp). `verdicts` runs `Stage.forward` of a small GPT on
a tp = 2 grid under the checker: the reference stage, then three classic mistakes, each in a fresh stage (a
tensor keeps the first type it is given):

- a split region entered without the backward sum (`gather_copies` where `gather` belongs): the forward's
  numbers are the reference's, only the gradients are wrong; refused;
- a reduction done twice (an all-reduce, then the reduce-scatter): refused, the second gets I, not V;
- a replicated parameter declared whole (`ln1.weight` typed I): under sequence parallelism each tp rank sees
  only its tokens; refused at the layer norm.

It does not see what communicates outside autograd: a gradient all-reduced by hand (exercise 5), the norm
(exercise 3), an autograd Function without a typing rule (exercise 2's loss). It checks the tp axis only.
Needs torch.distributed.tensor (torch 2.5 or newer); `available()` says why not where it cannot run.

Used in: lab 9 (09_composition).
"""
from __future__ import annotations

import contextlib
from unittest import mock

import torch
import torch.distributed as dist

from course import gpt, gpt_stage, mesh

#: The variants `verdicts` runs: a title each, as the lab prints them.
VARIANTS = {
    "reference": "the reference stage",
    "not_copied": "a split region entered without the backward sum (gather_copies for gather)",
    "reduced_twice": "a reduction done twice (all-reduce, then reduce-scatter)",
    "replicated_declared_whole": "ln1.weight declared whole on every tp rank (its gradient never summed over tp)",
}
SMALL = gpt.Config(vocab=32, width=16, heads=4, layers=2, sequence=8)


def available() -> str | None:
    """None where spmd_types imports; else why not, and what to do."""
    try:
        import spmd_types  # noqa: F401
    except ImportError as error:       # not installed, or a torch older than it needs
        return f"spmd_types cannot be imported ({error}): pip install spmd_types==0.3.1 (torch 2.5 or newer)"
    return None


class AllReduce(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all-reduce forward, nothing backward (V -> I)."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None

    @staticmethod
    def spmd_typecheck(*, x, group):
        from spmd_types import I, V, rules

        return rules.all_reduce(x, group, src=V, dst=I)


def _mistake(variant: str):
    """The patch that plants `variant` in gpt_stage, for the length of one check."""
    if variant == "not_copied":
        return mock.patch.object(gpt_stage, "gather", gpt_stage.gather_copies)
    if variant == "reduced_twice":
        reduce_scatter = gpt_stage.reduce_scatter
        return mock.patch.object(gpt_stage, "reduce_scatter",
                                 lambda x, group, dim: reduce_scatter(AllReduce.apply(x, group), group, dim))
    return contextlib.nullcontext()


def verdicts(config: gpt.Config = SMALL, variants=tuple(VARIANTS)) -> dict:
    """On each of 2 ranks (a tp = 2 grid): {variant: {"verdict": "accepted: <logits' type>" or "refused: <why>",
    "logits": the variant's logits, run again without the checker, "ln1 grad": blocks.0.ln1.weight's gradient
    summed over tp as exercise 5 sums it}}: what each mistake does to the numbers, beside what the checker says."""
    import spmd_types as spmd
    from spmd_types import I, R, V
    from spmd_types.checker import typecheck

    grid = mesh.Grid.from_device_mesh({"tp": 2})
    model, tp, out = gpt.GPT(config, 3), grid.groups["tp"], {}
    tokens = torch.randint(0, config.vocab, (2, config.sequence), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(config.sequence)
    for variant in variants:
        stage = gpt_stage.Stage(model, grid)
        with _mistake(variant):
            with spmd.set_current_mesh(grid.tp_mesh()), typecheck(local=True):
                for name, parameter in stage.named_parameters():
                    whole = variant == "replicated_declared_whole" and name == "blocks.0.ln1.weight"
                    spmd.assert_type(parameter, {tp: I if whole else V if stage.split_over_tp(name) else R})
                spmd.assert_type(tokens, {tp: R})
                spmd.assert_type(positions, {tp: R})
                try:
                    verdict = f"accepted: {spmd.get_local_type(stage(tokens, positions))}"
                except spmd.SpmdTypeError as error:
                    verdict = "refused: " + str(error).split("\n\nSet SPMD_TYPES")[0]
            logits = stage(tokens, positions)
            (logits * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
            grad = stage.blocks[0].ln1.weight.grad.clone()
            dist.all_reduce(grad, group=tp)
        out[variant] = {"verdict": verdict, "logits": logits.detach(), "ln1 grad": grad}
    return out
