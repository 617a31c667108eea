"""Per-rank timelines of a real run: compute spans beside communication.

Inside a rank's function, mark the compute you want to see:

    with course.timeline.span("backward"):
        loss.backward()

After `results = course.launch(fn, n)`, `results.timeline` holds every span
of every rank and `results.comm` every collective, both timed in seconds
since the rank's function started; `plot(ax, results)` draws them, a row of
compute and a row of communication per rank, so overlap shows as bars side
by side in time. An asynchronous collective's bar runs from its call to its
completion.

On a GPU a span waits for the current stream at both ends, so it covers the
work and not its queueing; collectives on their own streams (NCCL) keep
running meanwhile. Outside `course.launch` (or torchrun via it) spans record
nothing and cost nothing.

Used in: lab 2 (02_data_parallel), lab 3 (03_model_parallel), lab 4 (04_hybrid), lab 5
(05_sharded_data_parallel), lab 6 (06_pipeline_parallel), lab 7 (07_long_sequences), lab 8 (08_experts),
lab 10 (10_debugging), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch

from course import recorder


@dataclass
class Span:
    rank: int
    name: str
    start: float  # seconds since the rank's function started
    end: float


class Timeline(list):
    """Spans of one run, all ranks, in the order they ended per rank."""

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([asdict(s) for s in self], columns=list(Span.__dataclass_fields__))

    def rank(self, rank: int) -> Timeline:
        return Timeline(s for s in self if s.rank == rank)


def _wait_for_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()


def now() -> float | None:
    """Seconds since this rank's function started, on the clock spans use; None outside a rank."""
    calls = recorder.active()
    return None if calls is None else calls.now()


@contextlib.contextmanager
def span(name: str):
    """Record the time the body takes as a compute span of this rank."""
    calls = recorder.active()
    if calls is None:
        yield
        return
    _wait_for_device()
    start = calls.now()
    try:
        yield
    finally:
        _wait_for_device()
        calls.spans.append(Span(calls.rank, name, start, calls.now()))


def _without(span: tuple[float, float], holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of the interval `span` outside every interval of `holes`."""
    pieces, start = [], span[0]
    for hole_start, hole_end in sorted(holes):
        if hole_end <= start or hole_start >= span[1]:
            continue
        if hole_start > start:
            pieces.append((start, hole_start))
        start = max(start, hole_end)
    if start < span[1]:
        pieces.append((start, span[1]))
    return pieces


def _blocking(results, rank: int) -> list[tuple[float, float]]:
    """The intervals `rank` spent waiting in blocking calls: collectives, barriers and receives."""
    return [(r.start, r.end) for r in results.comm.rank(rank) if not r.async_op and r.end is not None]


def compute_only(results) -> Timeline:
    """The run's spans with the time each rank waited in a blocking collective or receive cut out.

    A span around code that receives (a pipeline stage's step, say) covers the wait for the
    message too; what remains is the rank's own work. A span cut in two gives two spans of its name.
    """
    kept = Timeline()
    for rank in results.ranks:
        holes = _blocking(results, rank)
        kept.extend(Span(s.rank, s.name, a, b) for s in results.timeline.rank(rank)
                    for a, b in _without((s.start, s.end), holes))
    return kept


def plot(ax, results, *, compute_colour: str = "#6baed6", comm_colour: str = "#de2d26",
         waits_in_spans: bool = False):
    """Draw each rank's compute spans and collectives on ax (time in ms).

    waits_in_spans: the spans enclose blocking collectives (called inside a
    layer's forward, say); the compute bars then leave out the time those
    collectives held the rank. Asynchronous ones run beside compute and are
    never left out.
    """
    ranks = list(results.ranks)
    for row, rank in enumerate(ranks):
        base = row * 3
        comm = [(r.start, r.end if r.end is not None else r.start) for r in results.comm.rank(rank)
                if r.op != "barrier"]
        blocking = _blocking(results, rank) if waits_in_spans else []
        compute = [piece for s in results.timeline.rank(rank) for piece in _without((s.start, s.end), blocking)]
        ax.broken_barh([(a * 1e3, (b - a) * 1e3) for a, b in compute], (base + 1.05, 0.9), color=compute_colour,
                       label="compute" if row == 0 else None)
        ax.broken_barh([(a * 1e3, (b - a) * 1e3) for a, b in comm], (base + 0.05, 0.9), color=comm_colour,
                       label="communication" if row == 0 else None)
    ax.set_yticks([row * 3 + 1 for row in range(len(ranks))], [f"rank {r}" for r in ranks])
    ax.set_xlabel("ms since the function started")
    ax.invert_yaxis()
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    return ax
