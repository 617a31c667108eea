"""Yadan et al.'s Table 1 measured on the hardware at hand, beside the paper and the time model.

    runs = {row.grid: course.launch(train, row.grid.ranks, args=(row.grid,)) for row in grid_model.TABLE_1}
    table = table_1.table(runs, layers, batch=256, dtype=torch.float64)
    table_1.styled(table)        # the table, formatted, for a notebook
    table_1.plot(ax, table)      # the speed-ups: paper, time model (both splits), measured here
    table_1.styled(table_1.model_table())   # the paper beside the time model, with and without its assumption

`runs` maps each grid of `grid_model.TABLE_1` to a `course.launch` result whose rank
function wraps each training step in `course.timeline.span("step")` (lab 4's
`hybrid_training` does). A step's time is the median over the steps after the first (the
first pays one-off costs); its collectives and bytes are those recorded on rank 0 inside
those steps: the bytes written to the sockets where measured (gloo on Linux), the
formula's otherwise, counted for the run's backend (gloo's reduce-scatter is an all-reduce).
The time model's columns are `grid_model.table_1`: Krizhevsky's network on a TITAN over
PCIe 3.0, split the paper's way and this course's way, ring collectives as NCCL runs them.
The TITAN preset assumes a pass over fewer than 128 images costs as much as one over 128
(`timemodel.Processor.full_batch`); `model_table` and the column "model, paper's split,
no full batch" show the prediction without that assumption.

No torch needed: dtypes may be given as `torch.float64` or as "float64".

Used in: lab 4 (04_hybrid), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping

from course import grid_model, timemodel
from course.grid_model import Grid

STEP = "step"  # the name of the timeline span around one training step

NO_FULL_BATCH = "model, paper's split, no full batch"
COLUMNS = ("configuration", "grid", "ms per step", "in collectives", "kB sent per rank", "kB predicted",
           "speed-up here", "paper", "model, paper's split", NO_FULL_BATCH, "model, this lab's split")
FORMATS = {"ms per step": "{:.1f}", "in collectives": "{:.0%}", "kB sent per rank": "{:,.1f}",
           "kB predicted": "{:,.1f}", "speed-up here": "{:.2f}×", "paper": "{:.2f}×",
           "model, paper's split": "{:.2f}×", NO_FULL_BATCH: "{:.2f}×", "model, this lab's split": "{:.2f}×"}
#: The bars of `plot`, in order, and their colours.
BARS = {"paper": "#636363", "model, paper's split": "#3182bd", NO_FULL_BATCH: "#c6dbef",
        "model, this lab's split": "#9ecae1", "speed-up here": "#de2d26"}
EAGER_TITAN = grid_model.TITAN_NO_FULL_BATCH
MODEL_COLUMNS = ("configuration", "grid", "paper", "model, full batch 128", "model, no full batch",
                 "set by the assumption")


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


def predicted_sent(layers, grid: Grid, batch: int, dtype, backend: str = "gloo") -> float:
    """The bytes one rank sends per step by `grid_model`'s count (this course's split) on `backend`."""
    return sum(t["sent"] for t in grid_model.transfers(layers, grid, batch, dtype=dtype_name(dtype), backend=backend))


def model_table():
    """A DataFrame, one row per configuration of Table 1 (`MODEL_COLUMNS`): the paper's speed-up,
    the time model's (the paper's split) with the TITAN's full batch of 128 and without it
    (`EAGER_TITAN`), and whether that assumption sets the row (`grid_model.full_batch_bound`)."""
    import pandas as pd

    assumed = grid_model.table_1(scheme="paper")
    without = grid_model.table_1(scheme="paper", processor=EAGER_TITAN)
    rows = [{"configuration": row.configuration, "grid": str(row.grid), "paper": row.speedup,
             "model, full batch 128": a["predicted speed-up"], "model, no full batch": w["predicted speed-up"],
             "set by the assumption": grid_model.full_batch_bound(row.grid, timemodel.TITAN)}
            for row, a, w in zip(grid_model.TABLE_1, assumed, without)]
    return pd.DataFrame(rows, columns=list(MODEL_COLUMNS))


def table(runs: Mapping[Grid, object], layers, batch: int, dtype):
    """A DataFrame, one row per configuration of Table 1 (`COLUMNS`): measured here from `runs`,
    `grid_model`'s bytes for `layers`, the paper's speed-up and the time model's (both splits)."""
    import pandas as pd

    missing = [str(row.grid) for row in grid_model.TABLE_1 if row.grid not in runs]
    if missing:
        raise ValueError(f"Table 1 needs a run on every grid of grid_model.TABLE_1; missing: {', '.join(missing)}")
    paper_scheme = {r["grid"]: r for r in grid_model.table_1(scheme="paper")}
    eager = {r["grid"]: r for r in grid_model.table_1(scheme="paper", processor=EAGER_TITAN)}
    lab_scheme = {r["grid"]: r for r in grid_model.table_1(scheme="lab")}
    here = {row.grid: measured(runs[row.grid]) for row in grid_model.TABLE_1}
    one = here[Grid(1, 1)]["step"]
    rows = []
    for row in grid_model.TABLE_1:
        m = here[row.grid]
        rows.append({"configuration": row.configuration, "grid": str(row.grid), "ms per step": m["step"] * 1e3,
                     "in collectives": m["communication"] / m["step"], "kB sent per rank": m["sent"] / 1e3,
                     "kB predicted": predicted_sent(layers, row.grid, batch, dtype, runs[row.grid].backend) / 1e3,
                     "speed-up here": one / m["step"], "paper": row.speedup,
                     "model, paper's split": paper_scheme[row.grid]["predicted speed-up"],
                     NO_FULL_BATCH: eager[row.grid]["predicted speed-up"],
                     "model, this lab's split": lab_scheme[row.grid]["predicted speed-up"]})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def styled(frame):
    """The table for display (`table`'s or `model_table`'s): no index, each column in its unit."""
    formats = {column: f for column, f in {**FORMATS, "model, full batch 128": "{:.2f}×",
                                           "model, no full batch": "{:.2f}×"}.items() if column in frame}
    return frame.style.hide(axis="index").format(formats)


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
