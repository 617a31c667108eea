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

    def rank(self, rank: int) -> "Timeline":
        return Timeline(s for s in self if s.rank == rank)


def _wait_for_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()


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


def plot(ax, results, *, compute_colour: str = "#6baed6", comm_colour: str = "#de2d26"):
    """Draw each rank's compute spans and collectives on ax (time in ms)."""
    ranks = list(results.ranks)
    for row, rank in enumerate(ranks):
        base = row * 3
        bars = [(s.start * 1e3, (s.end - s.start) * 1e3) for s in results.timeline.rank(rank)]
        ax.broken_barh(bars, (base + 1.05, 0.9), color=compute_colour,
                       label="compute" if row == 0 else None)
        comm_bars = [(r.start * 1e3, ((r.end if r.end is not None else r.start) - r.start) * 1e3)
                     for r in results.comm.rank(rank) if r.op != "barrier"]
        ax.broken_barh(comm_bars, (base + 0.05, 0.9), color=comm_colour,
                       label="communication" if row == 0 else None)
    ax.set_yticks([row * 3 + 1 for row in range(len(ranks))], [f"rank {r}" for r in ranks])
    ax.set_xlabel("ms since the function started")
    ax.invert_yaxis()
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    return ax
