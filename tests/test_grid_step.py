"""Covers: course.grid_step.

course.grid_step: lab 9's step on a grid (1F1B across stages, the students' reductions, clipping, ZeRO-1),
with correct stand-ins for the students' four functions written here, equals gpt.one_process_training (loss and
norm every step, parameters after) on dp2×tp2, pp2×tp2, cp2×tp2 and pp4 (fewer micro-batches than the first
stage's warm-up) on 4 ranks and dp2×tp2×pp2 on 8; broken stand-ins (the norm counted once per data replica, the
tied embedding's gradient not summed) diverge; a batch dp·micro_batches does not divide is refused; the step's
time and the bytes it sent on each axis are there to read.

Tolerance: the course's float32 one (course.check, rtol 1e-5, atol 1e-6). The grid sums in another order than
one process (gradients over ranks and micro-batches, the norm by parts); after 10 steps on every layout here the
largest difference measured was 2e-7 relative on losses and norms and 1.2e-7 absolute on parameters (one float32
ulp near 1), 8× to 50× inside it, while each broken composition misses it by orders of magnitude. It grows with
the steps: after 30 (batch 16, dp2×tp2×pp2 and cp2×tp2) 1.6e-6 relative on the norms and 43% of the tolerance on
the worst parameter, so a longer run needs a looser one (lab 9's TRAINING_TOLERANCE)."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.distributed as dist

import course
from course import check, gpt, gpt_stage, grid_step, mesh

CONFIG = gpt.Config()
STEPS, BATCH = 5, 8
BATCHES = gpt.token_batches(CONFIG, batch=BATCH, steps=STEPS, seed=3)


# --- the students' four functions, written correctly here (and two of them broken on purpose) ---------------
def cross_entropy(logits, targets, group):
    return gpt_stage.gathered_cross_entropy(logits, targets, group)


def micro_batch_loss(token_losses, targets, step_targets, grid):
    count = torch.tensor(float(gpt.counted_tokens(step_targets)), device=token_losses.device)
    dist.all_reduce(count, group=grid.groups["dp_cp"])
    return token_losses.sum() / count


def _sum(grads, group):
    if grads and group is not None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(piece.view_as(g))


def reduce_gradients(stage, grid, *, tie=True):
    named = list(stage.named_parameters())
    for _, p in named:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    _sum([p.grad for n, p in named if not stage.split_over_tp(n)], grid.groups["tp"])
    if tie:
        _sum([p.grad for n, p in named if stage.tied(n)], grid.groups["embedding"])
    _sum([p.grad for _, p in named], grid.groups["dp_cp"])


def grad_norm(stage, grid, *, per_replica=False):
    split, whole = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for n, p in stage.named_parameters():
        if n != "head.weight":
            square = p.grad.double().square().sum().cpu()
            split, whole = (split + square, whole) if stage.split_over_tp(n) else (split, whole + square)
    dist.all_reduce(split, group=grid.groups["tp"])
    total = split + whole
    dist.all_reduce(total, group=grid.groups["pp"])
    if per_replica:                        # broken: every data replica's copy counted
        dist.all_reduce(total, group=grid.groups["dp_cp"])
    return math.sqrt(float(total))


VARIANTS = {
    "correct": {},
    "norm once per replica": {"grad_norm": lambda s, g: grad_norm(s, g, per_replica=True)},
    "tied gradient not summed": {"reduce_gradients": lambda s, g: reduce_gradients(s, g, tie=False)},
}


def _train(sizes, batches, micro_batches, variants, full_grads=None):
    """Runs on every rank: each variant's training on the grid `sizes`; with `full_grads` (one process's
    gradients of the first batch), one step's gradients and two refusals too."""
    grid = mesh.Grid.from_device_mesh(sizes)
    out = {}
    for variant in variants:
        pieces = {"cross_entropy": cross_entropy, "micro_batch_loss": micro_batch_loss,
                  "reduce_gradients": reduce_gradients, "grad_norm": grad_norm} | VARIANTS[variant]
        run = grid_step.train(CONFIG, batches, grid, micro_batches=micro_batches, **pieces)
        out[variant] = {"losses": run.losses, "norms": run.norms, "parameters": run.parameters,
                        "seconds": run.seconds}
    if full_grads is not None:             # one step's gradients, no update, against one process's sliced
        stage = gpt_stage.Stage(gpt.GPT(CONFIG, 0), grid)
        inputs, targets = batches[0]
        out["step loss"] = grid_step.step_gradients(
            stage, grid, inputs, targets, micro_batches=micro_batches, cross_entropy=cross_entropy,
            micro_batch_loss=micro_batch_loss, reduce_gradients=reduce_gradients)
        expected = gpt_stage.slice_of(stage, grid, full_grads)
        out["gradients"] = {n: (p.grad, expected[n]) for n, p in stage.named_parameters()}
        try:
            grid_step.local_batch(inputs[:6], targets[:6], grid, micro_batches)
        except ValueError as error:
            out["refused"] = str(error)
        try:                               # a loss per sequence, not one number: every rank stops at once
            grid_step.step_gradients(stage, grid, inputs, targets, micro_batches=micro_batches,
                                     cross_entropy=cross_entropy, micro_batch_loss=lambda losses, *_: losses.sum(-1),
                                     reduce_gradients=reduce_gradients)
        except ValueError as error:
            out["not one number"] = str(error)
    return out


@contextlib.contextmanager
def _one_thread():
    """One torch thread in this process while it computes the reference: on a busy 2-core machine the
    default threads make a 0.4 s training take 7 s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _layouts(cases):
    """Runs on every rank: `_train` on each case, one grid after another in one launch (a launch costs seconds)."""
    return [_train(*case) for case in cases]


def _one_step_gradients():
    model = gpt.GPT(CONFIG, 0)
    inputs, targets = BATCHES[0]
    with _one_thread():
        loss = gpt.step_loss(model(inputs), targets)
        loss.backward()
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def one_process():
    with _one_thread():
        return gpt.one_process_training(CONFIG, BATCHES, seed=0)


def _assert_equal_to_one_process(results, one_process, variant="correct"):
    first = results[0][variant]
    for rank, got in enumerate(results):
        got = got[variant]
        check.assert_close(torch.tensor(got["losses"]), torch.tensor(one_process.losses), "losses", rank=rank)
        check.assert_close(torch.tensor(got["norms"]), torch.tensor(one_process.norms), "norms", rank=rank)
        check.assert_close(got["parameters"], one_process.parameters, "parameters", rank=rank)
        for name, tensor in got["parameters"].items():   # gathered copies: the same bits on every rank
            assert torch.equal(tensor, first["parameters"][name]), (rank, name)
        assert len(got["seconds"]) == STEPS and all(s > 0 for s in got["seconds"]), rank


def _diverges(got, one_process):
    with pytest.raises(AssertionError):
        check.assert_close(torch.tensor(got["norms"]), torch.tensor(one_process.norms), "norms")
        check.assert_close(got["parameters"], one_process.parameters, "parameters")


#: The 4-rank cases, one launch: (layout, micro-batches, variants, with the step's gradients and refusals).
FOUR_RANKS = {
    "dp2-tp2": ({"dp": 2, "tp": 2}, 2, ["correct", "norm once per replica"], True),
    "pp2-tp2": ({"pp": 2, "tp": 2}, 2, ["correct", "tied gradient not summed"], False),
    "cp2-tp2": ({"cp": 2, "tp": 2}, 2, ["correct"], False),
    "pp4-fewer-micro-batches-than-warm-up": ({"pp": 4}, 2, ["correct"], False),   # stage 0 warms up 3 > 2
}


@pytest.fixture(scope="module")
def four_ranks():
    loss, grads = _one_step_gradients()
    cases = [(sizes, BATCHES, mb, variants, grads if with_grads else None)
             for sizes, mb, variants, with_grads in FOUR_RANKS.values()]
    results = course.launch(_layouts, 4, args=(cases,), timeout=300)
    by_case = {name: [results[r][i] for r in results.ranks] for i, name in enumerate(FOUR_RANKS)}
    return by_case, results.comm, loss


@pytest.mark.parametrize("case", list(FOUR_RANKS))
def test_each_layout_on_4_ranks_equals_one_process(four_ranks, one_process, case):
    _assert_equal_to_one_process(four_ranks[0][case], one_process)


def test_dp2_tp2_s_gradients_are_one_process_s_sliced(four_ranks):
    by_case, _, loss = four_ranks
    for rank, got in enumerate(by_case["dp2-tp2"]):
        assert got["step loss"] == pytest.approx(loss, rel=1e-5)
        for name, (gradient, expected) in got["gradients"].items():
            check.assert_close(gradient, expected, f"the gradient of {name}", rank=rank)


def test_the_norm_counted_once_per_replica_diverges(four_ranks, one_process):
    broken = four_ranks[0]["dp2-tp2"][0]["norm once per replica"]
    assert broken["norms"][0] == pytest.approx(one_process.norms[0] * math.sqrt(2), rel=1e-5)   # dp = 2 copies
    _diverges(broken, one_process)


def test_the_tied_gradient_not_summed_diverges(four_ranks, one_process):
    broken = four_ranks[0]["pp2-tp2"][0]["tied gradient not summed"]
    assert broken["losses"][0] == pytest.approx(one_process.losses[0], rel=1e-5)   # same start, wrong update
    _diverges(broken, one_process)


def test_a_batch_that_dp_times_micro_batches_does_not_divide_is_refused(four_ranks):
    assert "a batch of 6 sequences does not split into dp × micro_batches = 2 × 2 = 4" in \
        four_ranks[0]["dp2-tp2"][0]["refused"]


def test_a_micro_batch_loss_that_is_not_one_number_is_refused_naming_rank_and_shape(four_ranks):
    for rank, got in enumerate(four_ranks[0]["dp2-tp2"]):
        message = got["not one number"]
        assert message.startswith(f"rank {rank} (pp 0/1 dp {rank // 2}/2 cp 0/1 tp {rank % 2}/2), micro-batch 0: "
                                  "micro_batch_loss returned shape (2,), requires_grad=True; it must return one "
                                  "number"), message


def test_every_byte_the_step_sends_is_on_a_named_axis(four_ranks):
    records = four_ranks[1]
    unnamed = [r for r in records if mesh.axis_of(r) is None]
    assert not unnamed, f"{len(unnamed)} records on no axis of the grid, the first {unnamed[0]}"
    per_axis = mesh.bytes_per_axis(records)
    assert all(per_axis.get(axis, 0) > 0 for axis in ("pp", "cp", "tp", "dp_cp", "embedding")), per_axis
    assert {mesh.axis_of(r) for r in records if r.op in ("isend", "irecv")} == {"pp"}


def test_dp2_tp2_pp2_on_8_ranks_equals_one_process(one_process):
    results = course.launch(_train, 8, args=({"dp": 2, "tp": 2, "pp": 2}, BATCHES, 2, ["correct"]), timeout=300)
    _assert_equal_to_one_process([results[r] for r in results.ranks], one_process)
