"""Yadan et al.'s Table 1 measured on the hardware at hand, beside the paper and the time model.

    runs = {row.grid: course.launch(train, row.grid.ranks, args=(row.grid,)) for row in grid_model.TABLE_1}
    table = table_1.table(runs, layers, batch=256, dtype=torch.float64)
    table_1.styled(table)        # the table, formatted, for a notebook
    table_1.plot(ax, table)      # the speed-ups: paper, time model (both splits), measured here

`runs` maps each grid of `grid_model.TABLE_1` to a `course.launch` result whose rank
function wraps each training step in `course.timeline.span("step")` (lab 4's
`hybrid_training` does). A step's time is the median over the steps after the first (the
first pays one-off costs); its collectives and bytes are those recorded on rank 0 inside
those steps: the bytes written to the sockets where measured (gloo on Linux), the
formula's otherwise. The time model's columns are `grid_model.table_1`: Krizhevsky's
network on a TITAN over PCIe 3.0, split the paper's way and this course's way.

Used by lab 4 and by the live demo (`solutions/demo`). No torch needed: dtypes may be
given as `torch.float64` or as "float64".
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping

from course import grid_model
from course.grid_model import Grid

STEP = "step"  # the name of the timeline span around one training step

COLUMNS = ("configuration", "grid", "ms per step", "in collectives", "kB sent per rank", "kB predicted",
           "speed-up here", "paper", "model, paper's split", "model, this lab's split")
FORMATS = {"ms per step": "{:.1f}", "in collectives": "{:.0%}", "kB sent per rank": "{:,.1f}",
           "kB predicted": "{:,.1f}", "speed-up here": "{:.2f}×", "paper": "{:.2f}×",
           "model, paper's split": "{:.2f}×", "model, this lab's split": "{:.2f}×"}
#: The bars of `plot`, in order, and their colours.
BARS = {"paper": "#636363", "model, paper's split": "#3182bd", "model, this lab's split": "#9ecae1",
        "speed-up here": "#de2d26"}


def dtype_name(dtype) -> str:
    """"float64" for torch.float64 or "float64"."""
    return str(dtype).removeprefix("torch.")


def measured(run, rank: int = 0) -> dict:
    """Median seconds per step, seconds in collectives per step and bytes sent per step, on `rank`,
    from the steps after the first; "on sockets": whether every byte counted was measured."""
    steps = sorted((s for s in run.timeline.rank(rank) if s.name == STEP), key=lambda s: s.start)[1:]
    if not steps:
        raise ValueError(f"rank {rank} of this run recorded fewer than 2 {STEP!r} spans: wrap each training "
                         f"step in course.timeline.span({STEP!r}) and run at least 2 steps")
    inside = [r for r in run.comm.rank(rank) if any(s.start <= r.start <= s.end for s in steps)]
    sent = sum(r.sent for r in inside)
    return {"step": statistics.median(s.end - s.start for s in steps), "sent": sent / len(steps),
            "communication": sum(r.end - r.start for r in inside) / len(steps),
            "on sockets": all(r.measured is not None for r in inside)}


def predicted_sent(layers, grid: Grid, batch: int, dtype) -> float:
    """The bytes one rank sends per step by `grid_model`'s count (this course's split)."""
    return sum(t["sent"] for t in grid_model.transfers(layers, grid, batch, dtype=dtype_name(dtype)))


def table(runs: Mapping[Grid, object], layers, batch: int, dtype):
    """A DataFrame, one row per configuration of Table 1 (`COLUMNS`): measured here from `runs`,
    `grid_model`'s bytes for `layers`, the paper's speed-up and the time model's (both splits)."""
    import pandas as pd

    missing = [str(row.grid) for row in grid_model.TABLE_1 if row.grid not in runs]
    if missing:
        raise ValueError(f"Table 1 needs a run on every grid of grid_model.TABLE_1; missing: {', '.join(missing)}")
    paper_scheme = {r["grid"]: r for r in grid_model.table_1(scheme="paper")}
    lab_scheme = {r["grid"]: r for r in grid_model.table_1(scheme="lab")}
    here = {row.grid: measured(runs[row.grid]) for row in grid_model.TABLE_1}
    one = here[Grid(1, 1)]["step"]
    rows = []
    for row in grid_model.TABLE_1:
        m = here[row.grid]
        rows.append({"configuration": row.configuration, "grid": str(row.grid), "ms per step": m["step"] * 1e3,
                     "in collectives": m["communication"] / m["step"], "kB sent per rank": m["sent"] / 1e3,
                     "kB predicted": predicted_sent(layers, row.grid, batch, dtype) / 1e3,
                     "speed-up here": one / m["step"], "paper": row.speedup,
                     "model, paper's split": paper_scheme[row.grid]["predicted speed-up"],
                     "model, this lab's split": lab_scheme[row.grid]["predicted speed-up"]})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def styled(frame):
    """The table for display: no index, each column in its unit."""
    return frame.style.hide(axis="index").format(FORMATS)


def plot(ax, frame, *, title: str | None = None):
    """The speed-ups over 1 GPU as grouped bars, one group per configuration (`BARS`)."""
    at = range(len(frame))
    width = 0.8 / len(BARS)
    for i, (column, colour) in enumerate(BARS.items()):
        ax.bar([x + (i - (len(BARS) - 1) / 2) * width for x in at], frame[column], width, label=column,
               color=colour)
    ax.axhline(1, color="black", linewidth=0.6)
    ax.set_xticks(list(at), [c.replace(", ", ",\n") for c in frame["configuration"]], fontsize="small")
    ax.set_ylabel("speed-up over 1 GPU")
    ax.legend(fontsize="small", frameon=False, ncol=len(BARS))
    if title:
        ax.set_title(title, fontsize="medium")
    return ax
