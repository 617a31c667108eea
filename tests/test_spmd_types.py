"""Covers: course.spmd_check, course.gpt_stage.

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

import pytest
import torch

import course
from course import spmd_check

pytest.importorskip("spmd_types", reason="spmd_types is not installed (pip install spmd_types==0.3.1)")


@pytest.fixture(scope="module")
def verdicts():
    run = course.launch(spmd_check.verdicts, 2)
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
