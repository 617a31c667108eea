"""Covers: course.models.

course.models.sleeping_mlp: mlp's layers, each sleeping instead of computing, so that lab 6 times its
bubble where the CPU ranks outnumber the cores. Its forward and backward give mlp's shapes and gradients,
its time is its sleep, and on 4 ranks (however many cores) lab 6's own GPipe, training loop and
measured_bubble find the schedule's bubble with it: falling with the micro-batches, near the formula."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

import course
from course import data, models, pipeline, stages
from grader.common.solution import load


def test_forward_and_backward_give_mlps_outputs_and_gradients():
    sleeping = models.sleeping_mlp(in_features=6, hidden=(5, 4), classes=3, seconds_per_row=0.0, seed=3)
    plain = models.mlp(in_features=6, hidden=(5, 4), classes=3, seed=3)
    assert [name for name, _ in sleeping.named_children()] == ["layer1", "layer2", "output"]
    x, y = torch.randn(7, 6), torch.randint(0, 3, (7,))
    out = sleeping(x)
    assert out.shape == (7, 3)
    torch.testing.assert_close(out, plain(x))
    F.cross_entropy(out, y).backward()
    F.cross_entropy(plain(x), y).backward()
    for got, want in zip(sleeping.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_split_cuts_it_into_stages_of_whole_layers():
    model = models.sleeping_mlp(seconds_per_row=0.0)
    parts = stages.split(model, 4)
    assert [[name for name, _ in part.named_children()] for part in parts] == [
        ["layer1", "layer2"], ["layer3", "layer4"], ["layer5", "layer6"], ["layer7", "output"]]
    assert [stages.input_width(part) for part in parts] == [64, 16, 16, 16]
    h = torch.randn(4, 64)
    for part in parts:
        h = part(h)
    assert h.shape == (4, 10)


def test_a_pass_lasts_at_least_its_sleep_and_longer_with_more_rows():
    layer = models.Sleep(2e-4)
    spent = {}
    for rows in (10, 40):
        x = torch.randn(rows, 3, requires_grad=True)
        begin = time.perf_counter()
        out = layer(x)
        middle = time.perf_counter()
        out.sum().backward()
        spent[rows] = (middle - begin, time.perf_counter() - middle)
        assert spent[rows][0] >= rows * 2e-4, f"{rows} rows: the forward slept {spent[rows][0]} s"
        assert spent[rows][1] >= 2 * rows * 2e-4, f"{rows} rows: the backward slept {spent[rows][1]} s"
        torch.testing.assert_close(x.grad, torch.ones_like(x))
    assert spent[40][0] > spent[10][0] and spent[40][1] > spent[10][1]
    with pytest.raises(ValueError, match="seconds_per_row"):
        models.Sleep(-1.0)


def test_gpipe_on_4_sleeping_stages_measures_the_schedules_bubble():
    """The point: 4 ranks on 2 cores computing for real measured 47 % at m = 1 and 44 % at m = 4 (formula 75 %
    and 43 %): the band below fails m = 1, and the fall asked for fails both. Sleeping, the bubble falls with m
    and lies near the formula (measured 75 % and 45-46 % at load 4.5). m = 4, not 8: at m = 8 a micro-batch
    sleeps 4.5 ms a stage, and a loaded machine's message latency and wake-ups add 5-12 points to the bubble."""
    lab = load("06_pipeline_parallel")
    x, y = data.synthetic(3 * lab.TIMED_BATCH, 64)
    bubbles = {}
    for micro_batches in (1, 4):
        run = course.launch(lab.pipeline_training, 4, args=(lab.gpipe, models.sleeping_mlp, x, y),   # lab 6's sleep
                            kwargs=dict(steps=3, batch_size=lab.TIMED_BATCH, micro_batches=micro_batches))
        bubbles[micro_batches] = lab.measured_bubble(run)
    formula = {m: pipeline.bubble_fraction(4, m) for m in bubbles}
    for m, measured in bubbles.items():
        assert abs(measured - formula[m]) <= 0.15, f"m = {m}: measured {measured:.1%}, formula {formula[m]:.1%}"
    assert bubbles[4] < bubbles[1] - 0.15, f"the bubble did not fall with the micro-batches: {bubbles}"
