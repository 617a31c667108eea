"""Covers: the solution of lab 3.

Lab 3's transformer block, split as Megatron-LM splits it: the reference solution's
training ends where one process's does, on 2 and 4 ranks, with four all-reduces of one
activation per step, and the same parameters as PyTorch's tensor-parallel plan."""
from __future__ import annotations

import functools

import pytest
import torch

import course
from course import check, transformer
from grader.common.solution import load

pytestmark = pytest.mark.lab("03_model_parallel")

WIDTH, HEADS, SEQUENCE, BATCH, STEPS = 32, 4, 6, 4, 3


@functools.cache
def lab3():
    return load("03_model_parallel")


@functools.cache
def data():
    x = torch.randn(STEPS * BATCH, SEQUENCE, WIDTH, generator=torch.Generator().manual_seed(1))
    return x, torch.randn(x.shape, generator=torch.Generator().manual_seed(2))


def train(how, ranks):
    x, y = data()
    return course.launch(lab3().block_training, ranks, args=(how, x, y),
                         kwargs=dict(width=WIDTH, heads=HEADS, steps=STEPS, batch_size=BATCH, lr=0.05))


@functools.cache
def whole():
    return train("whole", 1)[0]


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_split_block_trains_as_one_process_with_four_all_reduces_a_step(ranks):
    run = train("yours", ranks)
    want_params, want_losses, _ = whole()
    for rank in run.ranks:
        params, losses, written = run[rank]
        for i, (p, q) in enumerate(zip(params, want_params)):
            check.assert_close(p, q, f"parameter {i} after {STEPS} steps on {ranks} ranks", rank=rank)
        check.assert_close(torch.tensor(losses), torch.tensor(want_losses), "the losses", rank=rank)
        ops = [r.op for r in run.comm.rank(rank)]
        # 4 a step, then the parameters gathered at the end (all_gather), as the notebook compares them
        assert ops[:4 * STEPS] == ["all_reduce"] * (4 * STEPS), ops
        assert set(ops[4 * STEPS:]) <= {"all_gather"}, ops
        activation = BATCH * SEQUENCE * WIDTH * 4
        predicted = sum(r.predicted for r in run.comm.rank(rank)[:4 * STEPS]) / STEPS
        assert predicted == transformer.split_block_sent(BATCH, SEQUENCE, WIDTH, ranks) \
            == 4 * 2 * (ranks - 1) / ranks * activation
        assert written >= predicted       # gloo writes the payload and its headers


def test_pytorchs_plan_and_data_parallelism_end_with_the_same_parameters():
    want_params = whole()[0]
    for how in ("PyTorch", "data parallel"):
        run = train(how, 2)
        for rank in run.ranks:
            for i, (p, q) in enumerate(zip(run[rank][0], want_params)):
                check.assert_close(p, q, f"{how}: parameter {i} after {STEPS} steps", rank=rank)


def test_heads_that_do_not_split_over_the_ranks_are_refused():
    x, y = data()
    # course.launch raises it again as the rank raised it
    with pytest.raises(ValueError, match="3 heads do not split evenly over 2 ranks"):
        course.launch(lab3().block_training, 2, args=("yours", x[:, :, :24], y[:, :, :24]),
                      kwargs=dict(width=24, heads=3, steps=1, batch_size=BATCH, lr=0.05))
