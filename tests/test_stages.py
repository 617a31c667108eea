"""Covers: course.stages.

course.stages: a model cut into pipeline stages, the steps timed by micro-batch, and LoneStage,
which plays one stage of a pipeline alone so that a schedule is checked without messages."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import course
from course import models, pipeline, stages, timeline


def mlp(seed=0):
    return models.mlp(in_features=6, hidden=(5, 5, 5), classes=3, seed=seed)


def test_layer_counts_are_even_with_the_first_stages_one_longer():
    assert stages.layer_counts(8, 3) == [3, 3, 2]
    assert stages.layer_counts(4, 4) == [1, 1, 1, 1]
    assert sum(stages.layer_counts(7, 5)) == 7
    for bad in (0, 9, 2.5):
        with pytest.raises(ValueError, match="stages"):
            stages.layer_counts(8, bad)


def test_split_keeps_the_layers_in_order_and_shares_the_parameters():
    model = mlp()
    parts = stages.split(model, 3)
    assert [[name for name, _ in p.named_children()] for p in parts] == [["layer1", "layer2"], ["layer3"], ["output"]]
    x = torch.randn(4, 6)
    h = x
    for part in parts:
        h = part(h)
    torch.testing.assert_close(h, model(x))
    assert parts[0].layer1[0].weight is model.layer1[0].weight
    with pytest.raises(TypeError, match="nn.Sequential"):
        stages.split(torch.nn.Linear(2, 2), 1)


def test_input_width_is_the_first_linears_in_features():
    parts = stages.split(models.mlp(in_features=6, hidden=(5, 4), classes=3), 3)
    assert [stages.input_width(part) for part in parts] == [6, 5, 4]


def gpipe_order(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step, backward_step):
    """A plain GPipe step written for these tests: every forward, then every backward."""
    first, last = inputs is not None, targets is not None
    parts = inputs.chunk(micro_batches) if first else [None] * micro_batches
    answers = targets.chunk(micro_batches) if last else [None] * micro_batches
    kept, sends = [], []
    for part, answer in zip(parts, answers):
        stage_input, stage_output = forward_step(stage, part, shape, sends)
        kept.append((stage_input, stage_output, loss_fn(stage_output, answer) / micro_batches if last else None))
    for stage_input, stage_output, loss in kept:
        backward_step(stage_input, stage_output, loss, sends)
    return sum(loss.item() for *_, loss in kept) if last else None


def ordered(order, keep_all=False, scale=True, keep_requests=False):
    """A schedule that runs the actions `order` lists; keep_all keeps every micro-batch's activations to the
    end; keep_requests keeps every send's request to the end (else a micro-batch's go after its backward)."""
    def schedule(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step, backward_step):
        first, last = inputs is not None, targets is not None
        parts = inputs.chunk(micro_batches) if first else [None] * micro_batches
        answers = targets.chunk(micro_batches) if last else [None] * micro_batches
        kept, requests, every_request = {}, {}, []
        for action, i in order:
            sends = requests.setdefault(i, [])
            if action == "F":
                stage_input, stage_output = forward_step(stage, parts[i], shape, sends)
                loss = loss_fn(stage_output, answers[i]) / (micro_batches if scale else 1) if last else None
                kept[i] = (stage_input, stage_output, loss)
                del stage_input, stage_output, loss
            else:
                backward_step(*(kept[i] if keep_all else kept.pop(i)), sends)
                for request in requests.pop(i):
                    request.wait()
                    if keep_requests:
                        every_request.append(request)
                request = None                      # a loop variable would keep the last one alive
            del sends
        return None
    return schedule


def lone(stage_index, stage_count=4, micro_batches=6):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3 * micro_batches, 6, generator=g), torch.randint(0, 3, (3 * micro_batches,), generator=g)
    return stages.LoneStage(mlp(), stage=stage_index, stages=stage_count, inputs=x, targets=y,
                            micro_batches=micro_batches, loss_fn=F.cross_entropy), x, y


def run(schedule, stage_index, stage_count=4, micro_batches=6):
    player, x, y = lone(stage_index, stage_count, micro_batches)
    loss = schedule(player.stage, x if stage_index == 0 else None, y if stage_index == stage_count - 1 else None,
                    micro_batches=micro_batches, loss_fn=F.cross_entropy, shape=(3, 5),
                    forward_step=player.forward_step, backward_step=player.backward_step)
    return player, loss


@pytest.mark.parametrize("stage_index", [0, 1, 3])
def test_a_gpipe_step_on_a_lone_stage_leaves_one_process_gradients(stage_index):
    player, loss = run(gpipe_order, stage_index)
    assert player.problems == []
    for got, want in zip(player.gradients(), player.expected):
        torch.testing.assert_close(got, want)
    assert player.actions == [("F", i) for i in range(6)] + [("B", i) for i in range(6)]
    assert player.peak_alive == 6
    if stage_index == 3:
        assert loss == pytest.approx(player.expected_loss, rel=1e-6)
    # One process's gradients of the batch's mean loss, by hand.
    model, (_, x, y) = mlp(), lone(stage_index)
    F.cross_entropy(model(x), y).backward()
    for got, p in zip(player.expected, stages.split(model, 4)[stage_index].parameters()):
        torch.testing.assert_close(got, p.grad)


@pytest.mark.parametrize("stage_index", [0, 2, 3])
def test_1f1b_keeps_at_most_n_minus_s_alive_and_keeping_all_is_seen(stage_index):
    order = pipeline.actions("1f1b", stage_index, 4, 6)
    player, _ = run(ordered(order), stage_index)
    assert player.problems == [] and player.actions == order
    assert player.peak_alive == pipeline.peak_micro_batches("1f1b", stage_index, 4, 6)
    for got, want in zip(player.gradients(), player.expected):
        torch.testing.assert_close(got, want)
    hoarder, _ = run(ordered(order, keep_all=True), stage_index)
    assert hoarder.peak_alive == 6


@pytest.mark.parametrize("stage_index", [0, 1, 3])
def test_requests_kept_to_the_end_keep_their_micro_batches_alive(stage_index):
    """A real isend's request holds its tensor until dropped, waited or not: so does a HeldSend."""
    order = pipeline.actions("1f1b", stage_index, 4, 6)
    player, _ = run(ordered(order, keep_requests=True), stage_index)
    assert player.problems == [] and player.actions == order
    assert player.peak_activations_alive == pipeline.peak_micro_batches("1f1b", stage_index, 4, 6)
    # Every micro-batch's activation sent forward or gradient sent back is still held at the end.
    assert player.peak_alive == 6


def test_a_lone_stage_sends_what_a_real_one_would():
    player, x, _ = lone(0)
    sends = []
    stage_input, stage_output = player.forward_step(player.stage, x[:3], (3, 6), sends)
    assert len(sends) == 1 and isinstance(sends[0], stages.HeldSend)
    assert sends[0].tensor.untyped_storage().data_ptr() == stage_output.untyped_storage().data_ptr()
    assert sends[0].wait() and sends[0].waited and sends[0].is_completed()
    middle, *_ = lone(1)
    sends = []
    stage_input, stage_output = middle.forward_step(middle.stage, None, (3, 5), sends)
    middle.backward_step(stage_input, stage_output, None, sends)
    assert len(sends) == 2 and sends[1].tensor is stage_input.grad     # the input's gradient goes back


def test_a_lone_stage_counts_the_requests_never_waited_for():
    middle, *_ = lone(1)
    sends = []
    stage_input, stage_output = middle.forward_step(middle.stage, None, (3, 5), sends)
    middle.backward_step(stage_input, stage_output, None, sends)
    assert (middle.sent, middle.unwaited) == (2, 2)
    sends[0].wait()
    sends[0].wait()                   # a second wait counts once
    assert middle.unwaited == 1
    sends.clear()                     # dropped without a wait: still unwaited
    assert middle.unwaited == 1


def test_an_unscaled_loss_leaves_gradients_m_times_too_large_on_the_last_stage():
    player, _ = run(ordered(pipeline.actions("gpipe", 3, 4, 6), scale=False), 3)
    for got, want in zip(player.gradients(), player.expected):
        torch.testing.assert_close(got, 6 * want)


def test_what_real_neighbours_would_not_allow_is_reported():
    player, x, _ = lone(1)
    sends = []
    player.forward_step(player.stage, None, (4, 5), sends)          # the wrong shape
    assert "expected shape (4, 5)" in player.problems[0]
    player.backward_step(None, torch.zeros(3, 5), None, sends)      # an output no forward returned
    assert "no forward of this stage returned" in player.problems[-1]
    last, *_ = lone(3)
    sends = []
    stage_input, stage_output = last.forward_step(last.stage, None, (3, 5), sends)
    last.backward_step(stage_input, stage_output, None, sends)
    assert "no loss" in last.problems[-1]
    assert sends == []                                  # the last stage sends no activation, and made no gradient
    with pytest.raises(ValueError, match="equal micro-batches"):
        stages.LoneStage(mlp(), stage=0, stages=2, inputs=torch.zeros(5, 6), targets=torch.zeros(5).long(),
                         micro_batches=2, loss_fn=F.cross_entropy)


def two_timed_micro_batches():
    rank = dist.get_rank()

    def forward_step(stage, inputs, shape, sends):
        if rank == 1:
            arrived = torch.empty(shape)
            dist.recv(arrived, src=0)
            inputs = arrived
        time.sleep(0.01)
        out = inputs * 2
        if rank == 0:
            sends.append(dist.isend(out, dst=1))
        return inputs, out

    def backward_step(stage_input, stage_output, loss, sends):
        time.sleep(0.01)

    forward, backward = stages.timed_steps(forward_step, backward_step)
    sends, kept = [], []
    for _ in range(2):
        kept.append(forward(None, torch.ones(2, 2) if rank == 0 else None, (2, 2), sends))
    for pair in reversed(kept):
        backward(*pair, None, sends)
    for request in sends:
        request.wait()


def test_timed_steps_name_spans_by_micro_batch_and_compute_only_cuts_the_waits():
    results = course.launch(two_timed_micro_batches, 2)
    names = [s.name for s in results.timeline.rank(1)]
    assert names == ["forward 0", "forward 1", "backward 1", "backward 0"]
    # Rank 1's first forward begins by waiting for rank 0's message: that wait is cut out.
    work = timeline.compute_only(results)
    whole = results.timeline.rank(1)[0]
    pieces = [s for s in work.rank(1) if s.name == "forward 0"]   # a sliver before the receive, then the work
    (received,) = [r for r in results.comm.rank(1) if r.op == "recv"][:1]
    assert pieces[-1].start == pytest.approx(received.end) and pieces[-1].end == whole.end
    waited = received.end - received.start
    assert sum(p.end - p.start for p in pieces) == pytest.approx(whole.end - whole.start - waited)
    assert [s.name for s in work.rank(0)] == [s.name for s in results.timeline.rank(0)]   # rank 0 never waits
