"""A model cut into pipeline stages, and what lab 6's schedules are run and checked with.

    stages = split(model, 4)              # whole layers, in order, one nn.Sequential per stage
    input_width(stages[1])                # the features stage 1 takes in: its first Linear's
    forward, backward = timed_steps(forward_step, backward_step)   # spans "forward i", "backward i"
    lone = LoneStage(model, stage=2, stages=4, inputs=x, targets=y, micro_batches=8, loss_fn=loss)

A schedule (GPipe, 1F1B) decides when each stage runs which micro-batch's forward
and backward; the steps (`forward_step`, `backward_step`, lab 6's first exercise) do
the work and the sends. A schedule takes its steps as arguments, so it can be run
with other ones:

- `timed_steps` wraps the student's steps so that the run's timeline names each
  compute span by its micro-batch, which the schedule view draws as a grid.
- `LoneStage` plays one stage alone, with no messages: its neighbours' part is taken from
  one process running the whole model on the whole batch. What arrives from the
  stage before is that process's activation, what arrives from the stage after is its
  gradient (of the batch's mean loss), for the micro-batch being run. So a schedule is
  checked on its own: the order it runs (`actions`), the micro-batches whose
  activations it keeps alive (`peak_alive`), and the gradients it leaves on the stage,
  which equal one process's only if it accumulates them and scales the loss right. A
  mistake in the steps cannot fail it, and a schedule cannot deadlock it.
  Where a real step would send (`dist.isend`), it appends a `HeldSend` to `sends`: like
  the request a real isend returns, it keeps the tensor it would send alive for as long as
  the schedule keeps it, waited or not (c10d's work object holds its tensor until it is
  dropped), so a micro-batch whose requests are kept counts as alive.

Used in: lab 6 (06_pipeline_parallel).
"""
from __future__ import annotations

import copy
import weakref
from collections import OrderedDict

import torch
from torch import nn

from course import sharding, timeline


def layer_counts(layers: int, stages: int) -> list[int]:
    """Layers per stage: as even as whole layers allow, the first stages one longer (the ring's chunks)."""
    if not (isinstance(stages, int) and 1 <= stages <= layers):
        raise ValueError(f"cannot cut {layers} layers into {stages!r} stages of whole layers: "
                         f"choose between 1 and {layers} stages")
    return sharding.chunk_sizes(layers, stages)


def split(model: nn.Sequential, stages: int) -> list[nn.Sequential]:
    """The model's top-level layers cut in order into `stages` nn.Sequentials (sharing its parameters)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"split cuts an nn.Sequential by its layers, got {type(model).__name__}")
    named = list(model.named_children())
    cuts, start = [], 0
    for count in layer_counts(len(named), stages):
        cuts.append(nn.Sequential(OrderedDict(named[start:start + count])))
        start += count
    return cuts


def input_width(stage: nn.Module) -> int:
    """The features a stage takes in: its first Linear's."""
    return next(layer for layer in stage.modules() if isinstance(layer, nn.Linear)).in_features


def timed_steps(forward_step, backward_step):
    """The two steps, each call timed as a span named "forward i" or "backward i" (i: the micro-batch).

    Forwards run in micro-batch order in every schedule (they arrive in that order), so the
    i-th forward is micro-batch i; a backward is named by the output it is given.
    """
    numbers: dict[int, int] = {}

    def forward(stage, inputs, shape, sends):
        number = len(numbers)
        with timeline.span(f"forward {number}"):
            stage_input, stage_output = forward_step(stage, inputs, shape, sends)
        numbers[id(stage_output)] = number
        return stage_input, stage_output

    def backward(stage_input, stage_output, loss, sends):
        number = numbers.pop(id(stage_output), "?")
        with timeline.span(f"backward {number}"):
            return backward_step(stage_input, stage_output, loss, sends)

    return forward, backward


class HeldSend:
    """What a LoneStage step appends to `sends` where a real step appends `dist.isend`'s request:
    `wait()` returns at once (nobody receives), and the object keeps `tensor` alive until dropped.
    on_wait, if given, is called at its first wait()."""

    def __init__(self, tensor: torch.Tensor, on_wait=None):
        self.tensor = tensor
        self.waited = False
        self._on_wait = on_wait

    def wait(self, timeout=None) -> bool:
        if not self.waited and self._on_wait is not None:
            self._on_wait()
        self.waited = True
        return True

    def is_completed(self) -> bool:
        return True


class LoneStage:
    """One stage of a pipeline, run alone: `forward_step` and `backward_step` in place of the real ones.

    model: the whole nn.Sequential (not changed: the one-process run uses a copy);
    inputs, targets: the whole batch; loss_fn(outputs, targets): a mean over the samples.
    After a schedule has run with these steps, `stage` holds the gradients it left,
    `expected` one process's, `actions` the ("F", i) and ("B", i) it ran in order,
    `peak_alive` the most micro-batches alive at once (an activation of theirs, or a request of
    theirs in `sends`, still held), `peak_activations_alive` the same without the requests,
    `unwaited` how many of its sends' requests the schedule never waited for, and `problems`
    what it did that real neighbours would not allow.
    """

    def __init__(self, model: nn.Sequential, *, stage: int, stages: int, inputs: torch.Tensor,
                 targets: torch.Tensor, micro_batches: int, loss_fn):
        if len(inputs) % micro_batches:
            raise ValueError(f"a batch of {len(inputs)} does not cut into {micro_batches} equal micro-batches")
        self.micro_batches = micro_batches
        self.first, self.last = stage == 0, stage == stages - 1
        parts = split(copy.deepcopy(model), stages)
        self.arrivals, self.output_grads, losses = [], [], []
        for x, t in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
            outputs, h = [], x
            for s, part in enumerate(parts):
                if s == stage:
                    self.arrivals.append(h.detach().clone())
                h = part(h)
                h.retain_grad()
                outputs.append(h)
            loss = loss_fn(h, t)
            losses.append(loss.item())
            (loss / micro_batches).backward()
            self.output_grads.append(outputs[stage].grad.clone())
        self.expected = [p.grad.clone() for p in parts[stage].parameters()]
        self.expected_loss = sum(losses) / micro_batches
        self.stage = split(copy.deepcopy(model), stages)[stage]
        self.actions: list[tuple[str, int]] = []
        self.problems: list[str] = []
        self._alive: list[tuple] = []   # per forward run: weak references to its input and output
        self._requests: list[list] = []  # per forward run: weak references to its HeldSends
        self.peak_alive = self.peak_activations_alive = 0
        self.sent = self.waited = 0     # requests appended to `sends`, and those waited for

    def _count_alive(self) -> None:
        def alive(refs):
            return any(ref() is not None for ref in refs)
        activations = [alive(refs) for refs in self._alive]
        either = [a or alive(requests) for a, requests in zip(activations, self._requests)]
        self.peak_activations_alive = max(self.peak_activations_alive, sum(activations))
        self.peak_alive = max(self.peak_alive, sum(either))

    @property
    def unwaited(self) -> int:
        """Requests appended to `sends` that the schedule has not waited for (yet)."""
        return self.sent - self.waited

    def _waited_one(self) -> None:
        self.waited += 1

    def _send(self, sends, number: int, tensor: torch.Tensor) -> None:
        request = HeldSend(tensor, on_wait=self._waited_one)
        self.sent += 1
        self._requests[number].append(weakref.ref(request))
        sends.append(request)

    def forward_step(self, stage, inputs, shape, sends):
        number = len(self._alive)
        self._count_alive()
        if number >= self.micro_batches:
            self.problems.append(f"forward {number + 1} run, but there are only {self.micro_batches} micro-batches")
            number = self.micro_batches - 1
        if self.first:
            if inputs is None:
                self.problems.append("the first stage was given no inputs (None) for a forward")
                inputs = self.arrivals[number]
            stage_input = inputs
        else:
            arrival = self.arrivals[number]
            if tuple(shape) != tuple(arrival.shape):
                self.problems.append(f"forward {number}: expected shape {tuple(shape)}, but the activation "
                                     f"that arrives is {tuple(arrival.shape)}")
            stage_input = arrival.clone().requires_grad_()
        stage_output = stage(stage_input)
        refs = (weakref.ref(stage_output),) + (() if self.first else (weakref.ref(stage_input),))
        self._alive.append(refs)
        self._requests.append([])
        if not self.last:
            self._send(sends, len(self._alive) - 1, stage_output.detach())   # the same storage as the output
        self.actions.append(("F", number))
        self._count_alive()
        return stage_input, stage_output

    def backward_step(self, stage_input, stage_output, loss, sends):
        self._count_alive()
        number = next((i for i, refs in enumerate(self._alive) if refs[0]() is stage_output), None)
        if number is None:
            self.problems.append("a backward was given an output that no forward of this stage returned")
            return
        self.actions.append(("B", number))
        if self.last:
            if loss is None:
                self.problems.append(f"backward {number} on the last stage was given no loss (None)")
                return
            loss.backward()
        else:
            stage_output.backward(self.output_grads[number])
        if not self.first and stage_input is not None and stage_input.grad is not None:
            self._send(sends, number, stage_input.grad)
        self._count_alive()

    def gradients(self) -> list[torch.Tensor]:
        """The stage's gradients now (zeros where a parameter has none)."""
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in self.stage.parameters()]
