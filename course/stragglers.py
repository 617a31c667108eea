"""Slow ranks on purpose: data-parallel training in which one rank is slower, for lab 10's exercise 5.

A straggler does not raise: every step the other ranks reach the gradients' all-reduce first and wait
inside it for the slow one, which itself never waits. This module plants one, drawn from a seed, and runs it:

    from course import stragglers
    case = stragglers.draw(seed, 4)          # which rank, which span, the delay, the communication
    results = stragglers.run(case)           # course.launch's RankResults: .comm, .timeline
    results.timeline.rank(case.slow_rank)    # its spans: data, forward, backward, optimizer, each step
    apart = stragglers.began_apart(results, {0: 5.0})   # the same run, rank 0's clock started 5 s earlier

Each rank trains a small MLP on its own batches for `STEPS` steps, marking its compute with
`course.timeline.span`: "data" (every rank waits `LOADING` s for its batch, as it would for a disk), "forward",
"backward", "optimizer". The slow rank sleeps `delay` s a step inside one of forward, backward or optimizer: a
sleep models a slower device or a noisy neighbour (what is measured is what the other ranks lose to it). The
gradients travel one of three ways (`VARIANTS`): "bucketed", one all-reduce of every gradient after the
backward; "unbucketed", one all-reduce per parameter from a hook, inside the backward span (a span then
holds the time its rank waited: `course.timeline.compute_only` cuts it out); "synchronised", two micro-batches
a step, each followed by an all-reduce of its loss for logging (a synchronisation in a loop).

The delay (0.15 s a step at least, three steps) is large against what a loaded machine adds to a span, so
which rank and which span are slow never depends on the machine; the seconds do.

Each rank's records and spans are timed on its own clock, seconds since it began its function. Ranks begin
at different moments (on a cluster, seconds apart): `began_apart` gives a run as ranks that began apart would
have recorded it, the same durations on shifted clocks.

Used in: lab 10 (10_debugging).
"""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course import timeline
from course.comm import CommLog
from course.launch import RankResults, launch

SPANS = ("data", "forward", "backward", "optimizer")   # each step's spans, in the order a rank runs them
SLOW_SPANS = ("forward", "backward", "optimizer")      # where the drawn rank is slow
VARIANTS = ("bucketed", "unbucketed", "synchronised")
STEPS = 3
LOADING = 0.3                # seconds every rank waits for its batch each step (the "data" span)
DELAYS = (0.15, 0.18, 0.21)  # seconds a step the slow rank loses, drawn; all under LOADING
MICRO_BATCHES = 2            # "synchronised": micro-batches a step, each with its loss all-reduced
WIDTHS = (16, 32, 32, 4)     # the MLP's layers: 3 Linears, 6 parameters
ROWS = 8                     # a rank's rows a step
LEARNING_RATE = 0.05


@dataclass(frozen=True)
class Straggler:
    """One planted straggler: `slow_rank` sleeps `delay` s a step inside its `span`."""
    world_size: int
    slow_rank: int
    span: str
    delay: float
    variant: str
    seed: int = 0
    steps: int = STEPS
    loading: float = LOADING

    def __post_init__(self):
        if not isinstance(self.world_size, int) or self.world_size < 2:
            raise ValueError(f"a straggler needs 2 ranks or more to wait for it, got world_size={self.world_size!r}")
        if not 0 <= self.slow_rank < self.world_size:
            raise ValueError(f"slow_rank {self.slow_rank} is not a rank of {self.world_size} (0 to "
                             f"{self.world_size - 1})")
        if self.span not in SLOW_SPANS:
            raise ValueError(f"span {self.span!r} is not one the rank can be slow in: one of {SLOW_SPANS}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant {self.variant!r} is not one of {VARIANTS}")
        if not (0 <= self.delay < self.loading) or self.steps < 1:
            raise ValueError(f"delay {self.delay!r} s must be 0 or more and under the loading time "
                             f"{self.loading!r} s, and steps ({self.steps!r}) 1 or more")

    def fixed(self) -> Straggler:
        """The same training without its problems: no delay, the gradients in one bucket."""
        return dataclasses.replace(self, delay=0.0, variant="bucketed")


def draw(seed: int, world_size: int, variant: str | None = None) -> Straggler:
    """A straggler drawn from `seed`: the rank, its slow span, the delay, and (unless given) the variant."""
    rng = random.Random(f"stragglers {seed} {world_size}")
    return Straggler(world_size, rng.randrange(world_size), rng.choice(SLOW_SPANS), rng.choice(DELAYS),
                     variant if variant is not None else rng.choice(VARIANTS), seed)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = []
    for i, (inputs, outputs) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        layers += [torch.nn.Linear(inputs, outputs)] + ([torch.nn.Tanh()] if i < len(WIDTHS) - 2 else [])
    return torch.nn.Sequential(*layers)


def _batch(case: Straggler, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(case.seed * 1_000_003 + step * 1_009 + rank)
    return torch.randn(ROWS, WIDTHS[0], generator=generator), torch.randn(ROWS, WIDTHS[-1], generator=generator)


def _average_in_one_bucket(model: torch.nn.Module, world_size: int) -> None:
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g) / world_size)


def train(case: Straggler) -> dict:
    """Runs on every rank: `case.steps` steps of data-parallel training, its problems planted.
    Returns {"seconds": each step's, measured on this rank; "loss": the last step's, averaged over ranks;
    "logged": "synchronised"'s loss of each micro-batch, averaged over ranks}."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = _model(case.seed)
    if case.variant == "unbucketed":   # each gradient all-reduced as soon as the backward has it
        for parameter in model.parameters():
            parameter.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad))
    pieces = MICRO_BATCHES if case.variant == "synchronised" else 1

    def work(name: str, occurrences: int = 1):
        """The span `name`, with this rank's share of the delay where it is the slow one."""
        if rank == case.slow_rank and name == case.span and case.delay:
            time.sleep(case.delay / occurrences)

    seconds, logged, last = [], [], torch.zeros(1)
    for step in range(case.steps):
        started = time.perf_counter()
        with timeline.span("data"):
            time.sleep(case.loading)
            inputs, targets = _batch(case, rank, step)
        model.zero_grad()
        last.zero_()
        for rows, wanted in zip(inputs.chunk(pieces), targets.chunk(pieces)):
            with timeline.span("forward"):
                work("forward", pieces)
                loss = torch.nn.functional.mse_loss(model(rows), wanted) / pieces
            with timeline.span("backward"):
                work("backward", pieces)
                loss.backward()
            last += loss.detach()
            if case.variant == "synchronised":      # the loss logged after each micro-batch: every rank waits
                reported = loss.detach().reshape(1) / world_size
                dist.all_reduce(reported)
                logged.append(float(reported))
        if case.variant == "unbucketed":
            for parameter in model.parameters():
                parameter.grad /= world_size
        else:
            _average_in_one_bucket(model, world_size)
        with timeline.span("optimizer"):
            work("optimizer")
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter -= LEARNING_RATE * parameter.grad
        seconds.append(time.perf_counter() - started)
    dist.all_reduce(last)      # the last step's loss, averaged: every rank waits for the last step too
    return {"seconds": seconds, "loss": float(last) / world_size, "logged": logged}


def run(case: Straggler, **launch_options) -> RankResults:
    """`train(case)` on `case.world_size` ranks: course.launch's results, with every rank's records and spans."""
    if not isinstance(case, Straggler):
        raise TypeError(f"run takes a Straggler (stragglers.draw(seed, world_size)), got {type(case).__name__}")
    return launch(train, case.world_size, args=(case,), **launch_options)


def began_apart(results: RankResults, earlier: dict[int, float]) -> RankResults:
    """The run `results` as it would read had rank r begun its function `earlier[r]` s before the others (a
    negative number: after): each of its records and spans `earlier[r]` s later on its own clock. Durations
    are unchanged; ranks not named keep their clock."""
    unknown = sorted(set(earlier) - set(results.ranks))
    if unknown:
        raise ValueError(f"began_apart: no rank {unknown[0]} in this run (its ranks: {list(results.ranks)})")
    shift = {rank: float(earlier.get(rank, 0.0)) for rank in results.ranks}
    comm = CommLog(dataclasses.replace(r, start=r.start + shift[r.rank],
                                       end=None if r.end is None else r.end + shift[r.rank])
                   for r in results.comm)
    spans = [dataclasses.replace(s, start=s.start + shift[s.rank], end=s.end + shift[s.rank])
             for s in results.timeline]
    return RankResults({rank: results[rank] for rank in results.ranks}, results.world_size, comm,
                       results.backend, results.devices, dict(results.seconds), spans)
