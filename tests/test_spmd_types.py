"""Covers: course.gpt_stage.

Its tensor- and sequence-parallel regions type-checked by spmd_types, as lab 9's spmd_types cell claims, on 2
gloo ranks (tp = 2, sequence parallelism): with the course's three collectives given their local SPMD types
(`gather` all-gathers S(dim) -> R, `reduce_scatter` sums V -> S(dim), `gather_copies` all-gathers S(dim) -> I),
split parameters V and replicated ones R on tp, the checker accepts `Stage.forward` and types its logits V (a
vocabulary shard); it refuses, in the forward and before any gradient is computed, three classic mistakes: a
split region entered without the backward sum (`gather_copies` where `gather` belongs: the input is I, never
R), a reduction done twice (an all-reduce before the reduce-scatter), and a replicated parameter declared whole
on every tp rank (I: "nobody sums its gradient over tp"), which sequence parallelism makes wrong. The first two
mistakes' numbers are shown wrong too. Skipped where spmd_types is not installed."""
from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import course
from course import gpt, gpt_stage, mesh

spmd = pytest.importorskip("spmd_types", reason="spmd_types is not installed (pip install spmd_types==0.3.1)")

SMALL = gpt.Config(vocab=32, width=16, heads=4, layers=2, sequence=8)
VARIANTS = ("reference", "not_copied", "reduced_twice", "replicated_declared_whole")


def _collective_type(*, x, group, dim, forward, backward):
    """The local SPMD type rule of gpt_stage's `_Collective`, by its (forward, backward) pair."""
    from spmd_types import I, R, S, V, rules
    pair = (forward.__name__, backward.__name__)
    if pair == ("_all_gather", "_reduce_scatter"):          # gather: a split region's input
        return rules.all_gather(x, group, src=S(dim), dst=R)
    if pair == ("_reduce_scatter", "_all_gather"):          # reduce_scatter: partial sums out of it
        return rules.reduce_scatter(x, group, src=V, dst=S(dim))
    if pair == ("_all_gather", "_own_block"):               # gather_copies: a computation repeated alike
        return rules.all_gather(x, group, src=S(dim), dst=I)
    raise TypeError(f"no local SPMD type for a collective doing {pair}")


class _AllReduce(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all-reduce forward, nothing backward (P -> I)."""

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


def _verdicts():
    """Every variant's forward under the checker, on this rank: {variant: 'accepted: ...' or 'refused: ...'}."""
    from spmd_types import I, R, V
    from spmd_types.checker import typecheck
    grid = mesh.Grid.from_device_mesh({"tp": 2})
    model, tp = gpt.GPT(SMALL, 3), grid.groups["tp"]
    reduce_scatter, verdicts = gpt_stage.reduce_scatter, {}
    for variant in VARIANTS:       # fresh tensors each time: a tensor keeps the type it was first given
        stage = gpt_stage.Stage(model, grid)
        tokens = torch.randint(0, SMALL.vocab, (2, SMALL.sequence), generator=torch.Generator().manual_seed(0))
        positions = torch.arange(SMALL.sequence)
        with contextlib.ExitStack() as patches:
            patches.enter_context(mock.patch.object(gpt_stage._Collective, "spmd_typecheck",
                                                    staticmethod(_collective_type), create=True))
            if variant == "not_copied":
                patches.enter_context(mock.patch.object(gpt_stage, "gather", gpt_stage.gather_copies))
            if variant == "reduced_twice":
                patches.enter_context(mock.patch.object(
                    gpt_stage, "reduce_scatter", lambda x, group, dim: reduce_scatter(_AllReduce.apply(x, group),
                                                                                      group, dim)))
            with spmd.set_current_mesh(grid.tp_mesh()), typecheck(local=True):
                for name, parameter in stage.named_parameters():
                    whole = variant == "replicated_declared_whole" and name == "blocks.0.ln1.weight"
                    spmd.assert_type(parameter, {tp: I if whole else V if stage.split_over_tp(name) else R})
                spmd.assert_type(tokens, {tp: R})
                spmd.assert_type(positions, {tp: R})
                try:
                    verdict = f"accepted: {spmd.get_local_type(stage(tokens, positions))}"
                except spmd.SpmdTypeError as error:
                    verdict = f"refused: {error}"
            # The same variant run without the checker: its logits, and a replicated parameter's gradient
            # summed over tp as exercise 5 sums it (what the mistake does to numbers).
            logits = stage(tokens, positions)
            (logits * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
            grad = stage.blocks[0].ln1.weight.grad.clone()
            dist.all_reduce(grad, group=tp)
            verdicts[variant] = {"verdict": verdict, "logits": logits.detach(), "ln1 grad": grad}
    return verdicts


@pytest.fixture(scope="module")
def verdicts():
    run = course.launch(_verdicts, 2)
    return [run[rank] for rank in range(2)]


def test_the_reference_stage_types_and_its_logits_are_a_vocabulary_shard(verdicts):
    for rank in range(2):
        assert verdicts[rank]["reference"]["verdict"] == "accepted: {tp: V}", (rank, verdicts[rank]["reference"])


@pytest.mark.parametrize("variant, says", [
    ("not_copied", "Invariant type on axis tp cannot mix"),
    ("reduced_twice", "expects its input to be V on axis tp, but it is I"),
    ("replicated_declared_whole", "Invariant type on axis tp cannot mix"),
])
def test_each_classic_mistake_is_refused_in_the_forward(verdicts, variant, says):
    for rank in range(2):
        verdict = verdicts[rank][variant]["verdict"]
        assert verdict.startswith("refused: ") and says in verdict, (rank, variant, verdict)


def test_the_mistakes_are_real_and_the_first_invisible_in_the_forward(verdicts):
    """A split region entered without the backward sum computes the same logits and a wrong gradient (what
    only the checker sees before a run is compared); a reduction done twice changes the logits."""
    for rank in range(2):
        reference, not_copied, twice = (verdicts[rank][v] for v in ("reference", "not_copied", "reduced_twice"))
        torch.testing.assert_close(not_copied["logits"], reference["logits"])      # the same code path forward
        assert not torch.allclose(not_copied["ln1 grad"], reference["ln1 grad"], rtol=1e-3, atol=1e-6), rank
        assert not torch.allclose(twice["logits"], reference["logits"], rtol=1e-3, atol=1e-6), rank
