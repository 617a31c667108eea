"""Covers: the fairness of lab 6.

Lab 6's tests grade fairly: each classic mistake of pipeline parallelism costs its own
exercise and no other, and a correct answer written differently from the reference gets
every point.

As for labs 2 to 5: each submission runs as nbgrader scores it, minus the
demonstrations; then one nbgrader round trip grades two students. The schedules'
tests run each stage alone (course.stages.LoneStage), so a mistake in the steps of
exercise 1, even one that deadlocks, costs exercise 1 only. A deadlock stops at the
launch's own timeout (30 s unless COURSE_RANK_TIMEOUT says otherwise): the fairness
of a verdict must not hang on how fast this machine runs the launches that work.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule
from helpers.submissions import CHECK_REBOUND, fairness_tests

LAB = "06_pipeline_parallel"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's: receives that are
# irecv(...).wait(), sends through dist.batch_isend_irecv, a clone of the output sent; GPipe with
# tensor_split, each micro-batch's loss weighted by its share of the batch, the backwards newest first
# and the loss returned as a tensor; 1F1B with a deque; the idle fraction by merging each rank's spans.
DIFFERENT = {
    "pipeline_steps": '''
def forward_step(stage, inputs, shape, sends):
    me, n = dist.get_rank(), dist.get_world_size()
    if me > 0:
        buffer = torch.zeros(*shape, device=course.message_device())
        dist.irecv(buffer, src=me - 1).wait()
        x = buffer.to(course.device())
        x.requires_grad = True
    else:
        x = inputs.to(course.device())
    out = stage(x)
    if me + 1 < n:
        outgoing = out.detach().clone().to(course.message_device())
        sends.extend(dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, me + 1)]))
    return x, out


def backward_step(stage_input, stage_output, loss, sends):
    me, n = dist.get_rank(), dist.get_world_size()
    if me + 1 < n:
        incoming = torch.zeros_like(stage_output, device=course.message_device())
        dist.irecv(incoming, src=me + 1).wait()
        torch.autograd.backward(stage_output, grad_tensors=incoming.to(stage_output.device))
    else:
        torch.autograd.backward(loss)
    if me > 0:
        outgoing = stage_input.grad.detach().clone().to(course.message_device())
        sends.extend(dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, me - 1)]))
''',
    "gpipe": '''
def gpipe(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step=forward_step,
          backward_step=backward_step):
    me, n = dist.get_rank(), dist.get_world_size()
    first, last = me == 0, me == n - 1
    xs = inputs.tensor_split(micro_batches) if first else [None] * micro_batches
    ys = targets.tensor_split(micro_batches) if last else [None] * micro_batches
    sends, done = [], []
    for x, y in zip(xs, ys):
        a, b = forward_step(stage, x, shape, sends)
        done.append((a, b, loss_fn(b, y.to(b.device)) / micro_batches if last else None))
    for a, b, share in reversed(done):             # GPipe's backwards may run in either order
        backward_step(a, b, share, sends)
    for request in sends:
        request.wait()
    return sum(share.item() for _, _, share in done) if last else None
''',
    "idle_fraction": '''
def idle_fraction(spans, ranks, start, end):
    covered = 0.0
    for r in ranks:
        pieces = sorted([max(s.start, start), min(s.end, end)] for s in spans if s.rank == r)
        merged = []
        for lo, hi in pieces:
            if hi <= lo:
                continue
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        covered += sum(hi - lo for lo, hi in merged)
    return (len(ranks) * (end - start) - covered) / (len(ranks) * (end - start))
''',
    "one_f_one_b": '''
from collections import deque


def one_f_one_b(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step=forward_step,
                backward_step=backward_step):
    me, n = dist.get_rank(), dist.get_world_size()
    last = me == n - 1
    xs = list(inputs.chunk(micro_batches)) if me == 0 else [None] * micro_batches
    ys = list(targets.chunk(micro_batches)) if last else [None] * micro_batches
    sends, in_flight, losses = [], deque(), []
    started = 0
    warm_up = min(n - me - 1, micro_batches)
    while started < warm_up:
        in_flight.append(forward_step(stage, xs[started], shape, sends) + (ys[started],))
        started += 1
    while in_flight or started < micro_batches:
        if started < micro_batches:
            in_flight.append(forward_step(stage, xs[started], shape, sends) + (ys[started],))
            started += 1
        a, b, y = in_flight.popleft()                 # the oldest micro-batch
        loss = loss_fn(b, y.to(b.device)) / micro_batches if last else None
        backward_step(a, b, loss, sends)
        if last:
            losses.append(loss.item())
        del a, b, loss                                # its activations go now, not at the next turn
        for request in sends:                         # and every message sent so far: none is needed again
            request.wait()
        sends.clear()
    return sum(losses) if last else None
''',
}

# More correct answers, each graded as a whole submission beside the others: blocking receives, sends
# through dist.isend straight; GPipe with the losses kept whole until their backward; 1F1B
# as a warm-up of N - s forwards and then (backward, forward) pairs (the same sequence), or walking
# course.pipeline's own order; the idle fraction by sweeping each rank's sorted endpoints.
ALSO_DIFFERENT = {
    "backward then forward, idle time by a sweep": {
        "pipeline_steps": '''
def forward_step(stage, inputs, shape, sends):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        stage_input = inputs.to(course.device())
    else:
        stage_input = torch.empty(shape, device=course.message_device())
        dist.recv(stage_input, rank - 1)
        stage_input = stage_input.to(course.device()).requires_grad_(True)
    stage_output = stage(stage_input)
    if rank != world_size - 1:
        sends.append(dist.isend(stage_output.detach().to(course.message_device()).clone(), rank + 1))
    return stage_input, stage_output


def backward_step(stage_input, stage_output, loss, sends):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if loss is not None:
        loss.backward()
    else:
        gradient = torch.empty_like(stage_output, device=course.message_device())
        dist.recv(gradient, rank + 1)
        stage_output.backward(gradient.to(stage_output.device))
    if rank != 0:
        sends.append(dist.isend(stage_input.grad.to(course.message_device()), rank - 1))
''',
        "gpipe": '''
def gpipe(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step=forward_step,
          backward_step=backward_step):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    last = rank == world_size - 1
    sends, outputs, losses = [], [], []
    for i in range(micro_batches):
        part = inputs.chunk(micro_batches)[i] if rank == 0 else None
        outputs.append(forward_step(stage, part, shape, sends))
        if last:
            losses.append(loss_fn(outputs[-1][1], targets.chunk(micro_batches)[i].to(outputs[-1][1].device)))
    for i in range(micro_batches):
        backward_step(*outputs[i], losses[i] / micro_batches if last else None, sends)
    for request in sends:
        request.wait()
    return sum((loss / micro_batches).item() for loss in losses) if last else None
''',
        "idle_fraction": '''
def idle_fraction(spans, ranks, start, end):
    window = end - start
    busy = 0.0
    for rank in ranks:
        edges = []
        for span in spans:
            if span.rank == rank and span.end > start and span.start < end:
                edges += [(max(span.start, start), +1), (min(span.end, end), -1)]
        edges.sort(key=lambda edge: (edge[0], -edge[1]))
        depth, since = 0, None
        for when, step in edges:
            if depth == 0 and step == +1:
                since = when
            depth += step
            if depth == 0:
                busy += when - since
    return 1 - busy / (window * len(ranks))
''',
        "one_f_one_b": '''
def one_f_one_b(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step=forward_step,
                backward_step=backward_step):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    last = rank == world_size - 1
    parts = inputs.chunk(micro_batches) if rank == 0 else [None] * micro_batches
    answers = targets.chunk(micro_batches) if last else [None] * micro_batches
    sends, alive, total = [], [], 0.0

    def forward(i):
        stage_input, stage_output = forward_step(stage, parts[i], shape, sends)
        alive.append((stage_input, stage_output, answers[i]))

    def backward():
        nonlocal total
        stage_input, stage_output, answer = alive.pop(0)
        loss = loss_fn(stage_output, answer.to(stage_output.device)) / micro_batches if last else None
        backward_step(stage_input, stage_output, loss, sends)
        total += loss.item() if last else 0.0

    def let_go():                                      # the messages sent so far, waited for and dropped
        while sends:
            sends.pop().wait()

    filled = min(world_size - rank, micro_batches)     # N - s forwards, then a backward before each forward
    for i in range(filled):
        forward(i)
    for i in range(filled, micro_batches):
        backward()
        let_go()
        forward(i)
    while alive:
        backward()
        let_go()
    return total if last else None
''',
    },
    "1F1B walking course.pipeline's order": {
        "one_f_one_b": '''
def one_f_one_b(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step=forward_step,
                backward_step=backward_step):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    last = rank == world_size - 1
    parts = inputs.chunk(micro_batches) if rank == 0 else None
    answers = targets.chunk(micro_batches) if last else None
    sends, pending, total = [], {}, 0.0
    for action, i in pipeline.actions("1f1b", rank, world_size, micro_batches):
        if action == "F":
            pending[i] = forward_step(stage, parts[i] if parts else None, shape, sends)
        else:
            stage_input, stage_output = pending.pop(i)
            loss = loss_fn(stage_output, answers[i].to(stage_output.device)) / micro_batches if last else None
            backward_step(stage_input, stage_output, loss, sends)
            total += loss.item() if last else 0.0
            del stage_input, stage_output, loss
            for request in sends:
                request.wait()
            sends = []
    return total if last else None
''',
    },
}

# The steps: the input's gradient goes back as the reference sends it (its answer's last line), and
# the gradient that arrived sent back on (its output's) instead; on 2 stages no stage is in the middle,
# on 3 one is.
INPUT_GRADIENT_SENT = ("    if rank > 0:\n"
                       "        sends.append(dist.isend(stage_input.grad.to(course.message_device()), dst=rank - 1))")
OUTPUT_GRADIENT_SENT = (
    ("        loss.backward()\n", "        loss.backward()\n        gradient = stage_input.grad\n"),
    (INPUT_GRADIENT_SENT,
     "    if rank > 0:\n        sends.append(dist.isend(gradient.to(course.message_device()), dst=rank - 1))"))

# GPipe's and 1F1B's loops, as the reference writes them.
GPIPE_LOOPS = """    for part, answer in zip(parts, answers):
        stage_input, stage_output = forward_step(stage, part, shape, sends)
        loss = loss_fn(stage_output, answer.to(stage_output.device)) / micro_batches if last else None
        kept.append((stage_input, stage_output, loss))
    for stage_input, stage_output, loss in kept:
        backward_step(stage_input, stage_output, loss, sends)
        total += loss.item() if last else 0.0
"""
INTERLEAVED = """    for part, answer in zip(parts, answers):
        stage_input, stage_output = forward_step(stage, part, shape, sends)
        loss = loss_fn(stage_output, answer.to(stage_output.device)) / micro_batches if last else None
        backward_step(stage_input, stage_output, loss, sends)
        total += loss.item() if last else 0.0
"""
ONE_F_ONE_B_LOOPS = """    warmup = min(world_size - rank - 1, micro_batches)
    for i in range(warmup):
        forward(i)
    for i in range(warmup, micro_batches):
        forward(i)
        backward()
"""
ALL_FORWARDS_FIRST = """    for i in range(micro_batches):
        forward(i)
"""

# The classic mistakes, each in one exercise, and the test cell that must catch it.
MISTAKES = {
    # On 2 ranks, rank 1 waits for a rank 2 that does not exist: gloo hangs (the launch's timeout) or
    # its process dies of SIGSEGV; the cell fails either way.
    "the forward receives from rank + 1, not rank - 1": (
        {"pipeline_steps": [("dist.recv(arrived, src=rank - 1)", "dist.recv(arrived, src=rank + 1)")]},
        "test_pipeline_steps"),
    # Right on 2 ranks by chance; on 3 each rank waits for the next, round the ring: a deadlock, stopped by
    # the launch's timeout.
    "the forward receives from (rank + 1) % N, not rank - 1: a deadlock on 3 stages": (
        {"pipeline_steps": [("dist.recv(arrived, src=rank - 1)", "dist.recv(arrived, src=(rank + 1) % world_size)")]},
        "test_pipeline_steps"),
    "blocking dist.send in place of isend: two micro-batches crossing deadlock": (
        {"pipeline_steps": [("sends.append(dist.isend(stage_output.detach().to(course.message_device()), "
                             "dst=rank + 1))",
                             "dist.send(stage_output.detach().to(course.message_device()), dst=rank + 1)"),
                            ("sends.append(dist.isend(stage_input.grad.to(course.message_device()), dst=rank - 1))",
                             "dist.send(stage_input.grad.to(course.message_device()), dst=rank - 1)")]},
        "test_pipeline_steps"),
    "the received input without requires_grad_: no gradient to send back": (
        {"pipeline_steps": [("stage_input = arrived.to(course.device()).requires_grad_()",
                             "stage_input = arrived.to(course.device())")]},
        "test_pipeline_steps"),
    "the gradient that arrived sent back, not the input's": (
        {"pipeline_steps": list(OUTPUT_GRADIENT_SENT)},
        "test_pipeline_steps"),
    "the gradient that arrived sent back, behind a check rebound to a no-op": (
        {"pipeline_steps": [*OUTPUT_GRADIENT_SENT,
                            ("def forward_step(", CHECK_REBOUND + "def forward_step(")]},
        "test_pipeline_steps"),
    # Right on 2 stages, where each stage has one neighbour; on 3, a middle stage's receive could take the
    # gradient coming back (the activation's shape) for its input. The recorded receives name no sender.
    "both receives from any rank (no src)": (
        {"pipeline_steps": [("dist.recv(arrived, src=rank - 1)", "dist.recv(arrived)"),
                            ("dist.recv(gradient, src=rank + 1)", "dist.recv(gradient)")]},
        "test_pipeline_steps"),
    # The stages narrow (narrowing_mlp): the gradient of a stage's output is narrower than its input. Received into
    # a buffer shaped like the input, it fills part of it, and the backward refuses a gradient of the input's shape;
    # on a model that widens (the lab's 64 -> 512) gloo aborts the rank. Either way only exercise 1 fails.
    "the output's gradient received into a buffer shaped like the stage's input": (
        {"pipeline_steps": [("gradient = torch.empty(stage_output.shape, device=course.message_device())",
                             "gradient = torch.empty(stage_input.shape, device=course.message_device())")]},
        "test_pipeline_steps"),
    "the input received as (rows, WIDTH), the setup cell's width, not `shape`": (
        {"pipeline_steps": [("arrived = torch.empty(shape, device=course.message_device())",
                             "arrived = torch.empty(shape[0], WIDTH, device=course.message_device())")]},
        "test_pipeline_steps"),
    "the input received into a float64 buffer": (
        {"pipeline_steps": [("arrived = torch.empty(shape, device=course.message_device())",
                             "arrived = torch.empty(shape, dtype=torch.float64, device=course.message_device())")]},
        "test_pipeline_steps"),
    "the last stage sends its output too, to a rank N that does not exist": (
        {"pipeline_steps": [("    if rank < world_size - 1:\n", "    if rank < world_size:\n")]},
        "test_pipeline_steps"),
    "forward_step returns `inputs`, not the stage's input": (
        {"pipeline_steps": [("    return stage_input, stage_output\n", "    return inputs, stage_output\n")]},
        "test_pipeline_steps"),
    "the last stage back-propagates ones, not the loss": (
        {"pipeline_steps": [("        loss.backward()\n",
                             "        stage_output.backward(torch.ones_like(stage_output))\n")]},
        "test_pipeline_steps"),
    "the gradient that arrived taken through torch.autograd.grad: no parameter gets a gradient": (
        {"pipeline_steps": [("        stage_output.backward(gradient.to(stage_output.device))\n",
                             "        stage_input.grad, = torch.autograd.grad(stage_output, stage_input,\n"
                             "                                                gradient.to(stage_output.device))\n")]},
        "test_pipeline_steps"),
    # gloo sends a message whose request was dropped all the same: the values are right, the requests missing.
    "the isends' requests dropped, not appended to sends": (
        {"pipeline_steps": [("sends.append(dist.isend(stage_output.detach().to(course.message_device()), "
                             "dst=rank + 1))",
                             "dist.isend(stage_output.detach().to(course.message_device()), dst=rank + 1)"),
                            ("sends.append(dist.isend(stage_input.grad.to(course.message_device()), dst=rank - 1))",
                             "dist.isend(stage_input.grad.to(course.message_device()), dst=rank - 1)")]},
        "test_pipeline_steps"),
    # The request irecv returns, dropped at once: gloo never fills the buffer, and the stage runs on what it held.
    "the input received with dist.irecv, its request never waited for": (
        {"pipeline_steps": [("dist.recv(arrived, src=rank - 1)", "dist.irecv(arrived, src=rank - 1)")]},
        "test_pipeline_steps"),
    "GPipe's micro-batch losses not divided by m": (
        {"gpipe": [("loss_fn(stage_output, answer.to(stage_output.device)) / micro_batches if last",
                    "loss_fn(stage_output, answer.to(stage_output.device)) if last")]},
        "test_gpipe"),
    "GPipe zeroes the gradients between micro-batches": (
        {"gpipe": [("    for stage_input, stage_output, loss in kept:\n",
                    "    for stage_input, stage_output, loss in kept:\n        stage.zero_grad()\n")]},
        "test_gpipe"),
    "GPipe returns the last micro-batch's loss, not the batch's": (
        {"gpipe": [("total += loss.item() if last else 0.0", "total = loss.item() if last else 0.0")]},
        "test_gpipe"),
    "GPipe with each backward right after its forward (F0 B0 F1 B1 ...)": (
        {"gpipe": [(GPIPE_LOOPS, INTERLEAVED)]},
        "test_gpipe"),
    "GPipe cuts the batch with split(m): parts of m rows, not m parts": (
        {"gpipe": [("inputs.chunk(micro_batches)", "inputs.split(micro_batches)"),
                   ("targets.chunk(micro_batches)", "targets.split(micro_batches)")]},
        "test_gpipe"),
    "GPipe never waits for its sends": (
        {"gpipe": [("    for request in sends:\n        request.wait()\n", "")]},
        "test_gpipe"),
    "GPipe returns 0.0, not None, on the stages before the last": (
        {"gpipe": [("return total if last else None", "return total")]},
        "test_gpipe"),
    "the idle fraction with spans not cut at the window's edges": (
        {"idle_fraction": [("(max(s.start, start), min(s.end, end))", "(s.start, s.end)")]},
        "test_idle_fraction"),
    "the idle fraction counts overlapping spans of a rank twice": (
        {"idle_fraction": [("            begin = max(begin, reached)\n", "")]},
        "test_idle_fraction"),
    "the idle fraction divided by one rank's window, not len(ranks) of them": (
        {"idle_fraction": [("busy / (len(ranks) * (end - start))", "busy / (end - start)")]},
        "test_idle_fraction"),
    "the idle fraction counts every rank's spans as each rank's": (
        {"idle_fraction": [(" for s in spans if s.rank == rank)", " for s in spans)")]},
        "test_idle_fraction"),
    "the idle fraction's area counts only the ranks that have spans": (
        {"idle_fraction": [("busy / (len(ranks) * (end - start))",
                            "busy / (len({s.rank for s in spans} & set(ranks)) * (end - start))")]},
        "test_idle_fraction"),
    "1F1B runs the newest micro-batch's backward first": (
        {"one_f_one_b": [("waiting.pop(0)", "waiting.pop()")]},
        "test_one_f_one_b"),
    "1F1B keeps every micro-batch's input and output until the step ends": (
        {"one_f_one_b": [("    waiting, total = [], 0.0", "    waiting, done, total = [], [], 0.0"),
                         ("stage_input, stage_output, loss, sends = waiting.pop(0)",
                          "stage_input, stage_output, loss, sends = waiting[len(done)]\n        done.append(loss)"),
                         ("    while waiting:\n", "    while len(done) < micro_batches:\n")]},
        "test_one_f_one_b"),
    "1F1B keeps every send's request in one list until the step ends, then waits for them": (
        {"one_f_one_b": [("    waiting, total = [], 0.0", "    every_send, waiting, total = [], [], 0.0"),
                         ("        for request in sends:                                   # then its messages go, "
                          "with its activations\n            request.wait()\n", "        every_send.extend(sends)\n"),
                         ("    while waiting:\n        backward()\n",
                          "    while waiting:\n        backward()\n"
                          "    for request in every_send:\n        request.wait()\n")]},
        "test_one_f_one_b"),
    "1F1B warms up with N - s forwards, one too many": (
        {"one_f_one_b": [("warmup = min(world_size - rank - 1, micro_batches)",
                          "warmup = min(world_size - rank, micro_batches)")]},
        "test_one_f_one_b"),
    "1F1B's warm-up not capped at m: N - s - 1 forwards even when fewer micro-batches remain": (
        {"one_f_one_b": [("warmup = min(world_size - rank - 1, micro_batches)", "warmup = world_size - rank - 1")]},
        "test_one_f_one_b"),
    "GPipe's order submitted as 1F1B": (
        {"one_f_one_b": [(ONE_F_ONE_B_LOOPS, ALL_FORWARDS_FIRST)]},
        "test_one_f_one_b"),
    "1F1B without its last backwards (the cool-down)": (
        {"one_f_one_b": [("    while waiting:\n        backward()\n", "")]},
        "test_one_f_one_b"),
    "1F1B drops each micro-batch's requests without waiting for them": (
        {"one_f_one_b": [("        for request in sends:                                   # then its messages go, "
                          "with its activations\n            request.wait()\n", "")]},
        "test_one_f_one_b"),
    "1F1B returns 0.0, not None, on the stages before the last": (
        {"one_f_one_b": [("return total if last else None", "return total")]},
        "test_one_f_one_b"),
    "1F1B's micro-batch losses not divided by m": (
        {"one_f_one_b": [("loss_fn(stage_output, answers[i].to(stage_output.device)) / micro_batches if last",
                          "loss_fn(stage_output, answers[i].to(stage_output.device)) if last")]},
        "test_one_f_one_b"),
    "1F1B returns the last micro-batch's loss, not the batch's": (
        {"one_f_one_b": [("total += loss.item() if last else 0.0", "total = loss.item() if last else 0.0")]},
        "test_one_f_one_b"),
}


# Correct answers whose batch loss is the same float32 number summed another way, or a float32 tensor:
# the hidden checks judge it as float32, under float32's tolerance, so its last bits do not count.
LOSS_SUMMED_OTHERWISE = {
    "GPipe weighting each micro-batch's loss by its share of the batch, the loss a float32 tensor": {
        "gpipe": '''
def gpipe(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step=forward_step,
          backward_step=backward_step):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    last = rank == world_size - 1
    parts = inputs.tensor_split(micro_batches) if rank == 0 else [None] * micro_batches
    answers = targets.tensor_split(micro_batches) if last else [None] * micro_batches
    sends, kept = [], []
    for part, answer in zip(parts, answers):
        stage_input, stage_output = forward_step(stage, part, shape, sends)
        loss = loss_fn(stage_output, answer.to(stage_output.device)) * (len(answer) / len(targets)) if last else None
        kept.append((stage_input, stage_output, loss))
    for stage_input, stage_output, loss in kept:
        backward_step(stage_input, stage_output, loss, sends)
    for request in sends:
        request.wait()
    return torch.stack([loss.detach() for _, _, loss in kept]).sum() if last else None
''',
    },
    "GPipe summing the micro-batches' losses, then dividing by m": {
        "gpipe": '''
def gpipe(stage, inputs, targets, *, micro_batches, loss_fn, shape, forward_step=forward_step,
          backward_step=backward_step):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    last = rank == world_size - 1
    parts = inputs.chunk(micro_batches) if rank == 0 else [None] * micro_batches
    answers = targets.chunk(micro_batches) if last else [None] * micro_batches
    sends, kept, losses = [], [], []
    for part, answer in zip(parts, answers):
        stage_input, stage_output = forward_step(stage, part, shape, sends)
        loss = loss_fn(stage_output, answer.to(stage_output.device)) if last else None
        kept.append((stage_input, stage_output, loss / micro_batches if last else None))
        if last:
            losses.append(loss.item())
    for stage_input, stage_output, loss in kept:
        backward_step(stage_input, stage_output, loss, sends)
    for request in sends:
        request.wait()
    return sum(losses) / micro_batches if last else None
''',
    },
    "1F1B returning the sum of its micro-batches' losses as a float32 tensor": {
        "one_f_one_b": DIFFERENT["one_f_one_b"].replace(
            "            losses.append(loss.item())\n", "            losses.append(loss.detach())\n").replace(
            "    return sum(losses) if last else None\n", "    return torch.stack(losses).sum() if last else None\n"),
    },
}


# Every correct answer above, beside the mistakes, in one forked run (helpers.forked_cells); the
# nbgrader round trip (its last test): the full notebook, as an instructor grades it, of one student
# who answers differently. The mistake behind a check rebound is in the forked runs, against the stored
# values; the judge's catch of one through the grader is lab 2's round trip's.

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "pipeline_steps": {
        "every other stage receives its input from rank r − 1": (
            "the forward receives from rank + 1, not rank - 1",
            "the forward receives from (rank + 1) % N, not rank - 1: a deadlock on 3 stages",
            "both receives from any rank (no src)"),
        "(a float32 tensor of `shape`)": ("the input received as (rows, WIDTH), the setup cell's width, not `shape`",
                                          "the input received into a float64 buffer"),
        "marks it `requires_grad`": "the received input without requires_grad_: no gradient to send back",
        "every stage but the last sends its output to rank r + 1":
            "the last stage sends its output too, to a rank N that does not exist",
        "Return `(stage_input, stage_output)`": "forward_step returns `inputs`, not the stage's input",
        "the last stage calls `loss.backward()`": "the last stage back-propagates ones, not the loss",
        "every other stage receives the gradient of its output from rank r + 1": "both receives from any rank (no src)",
        "a float32 tensor of the output's shape, which need not be the input's":
            "the output's gradient received into a buffer shaped like the stage's input",
        "back-propagates it (`stage_output.backward(gradient)`)":
            "the gradient that arrived taken through torch.autograd.grad: no parameter gets a gradient",
        "Every stage but the first sends its input's gradient to rank r − 1": (
            "the gradient that arrived sent back, not the input's",
            "the gradient that arrived sent back, behind a check rebound to a no-op"),
        "**Send without waiting.**": "blocking dist.send in place of isend: two micro-batches crossing deadlock",
        "Receive with the blocking `dist.recv`": "the input received with dist.irecv, its request never waited for",
        "send with `dist.isend` and append the request it returns to `sends`": (
            "blocking dist.send in place of isend: two micro-batches crossing deadlock",
            "the isends' requests dropped, not appended to sends"),
    },
    "gpipe": {
        "into `micro_batches` equal parts": "GPipe cuts the batch with split(m): parts of m rows, not m parts",
        "runs every micro-batch's forward, then every backward":
            "GPipe with each backward right after its forward (F0 B0 F1 B1 ...)",
        "do not zero them in between": "GPipe zeroes the gradients between micro-batches",
        "each micro-batch's loss, a mean over m times fewer samples, counts 1/m":
            "GPipe's micro-batch losses not divided by m",
        "wait for every send": "GPipe never waits for its sends",
        "return the batch's loss (a number) on the last stage, None elsewhere": (
            "GPipe returns the last micro-batch's loss, not the batch's",
            "GPipe returns 0.0, not None, on the stages before the last"),
    },
    "idle_fraction": {
        "of the area len(ranks) × (end − start)":
            "the idle fraction divided by one rank's window, not len(ranks) of them",
        "the fraction that no span of that rank covers": "the idle fraction counts every rank's spans as each rank's",
        "count only its part inside": "the idle fraction with spans not cut at the window's edges",
        "count that time once": "the idle fraction counts overlapping spans of a rank twice",
        "A rank with no span was idle all along.": "the idle fraction's area counts only the ranks that have spans",
    },
    "one_f_one_b": {
        "first runs w = min(N − s − 1, m) warm-up forwards": (
            "1F1B warms up with N - s forwards, one too many",
            "1F1B's warm-up not capped at m: N - s - 1 forwards even when fewer micro-batches remain"),
        "one forward and one backward in turn, each backward the oldest micro-batch's": (
            "1F1B runs the newest micro-batch's backward first", "GPipe's order submitted as 1F1B"),
        "then the remaining backwards": "1F1B without its last backwards (the cool-down)",
        "Write `one_f_one_b` with `gpipe`'s arguments and result": (
            "1F1B returns 0.0, not None, on the stages before the last",
            "1F1B's micro-batch losses not divided by m",
            "1F1B returns the last micro-batch's loss, not the batch's"),
        "Let go of a micro-batch's stage input and output once its backward has run":
            "1F1B keeps every micro-batch's input and output until the step ends",
        "keep each micro-batch's requests apart, and once its backward has run here, wait for them and drop them": (
            "1F1B keeps every send's request in one list until the step ends, then waits for them",
            "1F1B drops each micro-batch's requests without waiting for them"),
        "PyTorch's `Schedule1F1B` waits for each send before the next, and Megatron-LM frees each output's memory "
        "once it is sent": NotARule("says what PyTorch and Megatron-LM do, as the reason; asks nothing more of the "
                                    "answer than the sentence before"),
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point, test_each_mistake_costs_exactly_its_exercise,
 test_other_correct_answers_get_every_point, test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, {**ALSO_DIFFERENT, **LOSS_SUMMED_OTHERWISE}, round_trip=())
