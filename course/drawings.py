"""Pictures of the algorithms, drawn from the arithmetic the labs use, for any number of ranks.

    drawings.draw_ring(4)                  # lab 2: the ring all-reduce, step by step
    drawings.draw_split("column", 2)       # lab 3: which block of W each GPU owns, what is stacked or added
    drawings.draw_grid(2, 2)               # lab 4: a data x model grid of ranks and its two kinds of groups

Each picture has a pure function beside it that says what it draws, so that a test can check
the arithmetic without pixels: `ring_schedule` (lab 2's ring: in reduce-scatter step s rank r
sends chunk (r - s) % N to its right and adds what its left sends into chunk (r - s - 1) % N;
in all-gather step s it sends (r + 1 - s) % N and overwrites (r - s) % N), `split_blocks`
(the blocks of `course.sizes.split_weight`, W as lab 3 writes it: inputs x outputs) and
`grid_group_members` (`course.grid_model.Grid`'s numbering, rank = d * model + m).
Readable for 2 to 8 ranks; at most `MOST_RANKS` are drawn. Lab 3's picture and its arithmetic
are course.split_drawing's, re-exported here.

Used in: lab 2 (02_data_parallel), lab 3 (03_model_parallel), lab 4 (04_hybrid).
"""
from __future__ import annotations

from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle

from course import transfer
from course._drawing import MOST_RANKS, _check_drawable, _colour  # noqa: F401 (MOST_RANKS: drawings.MOST_RANKS)
from course.grid_model import Grid

# Lab 3's picture, re-exported: the notebooks say drawings.draw_split.
from course.split_drawing import Block, draw_split, split_blocks  # noqa: F401

PHASES = ("reduce-scatter", "all-gather")


# --- lab 2: the ring all-reduce ----------------------------------------------------

class RingMove(NamedTuple):
    """What one rank does in one step of the ring: sends its chunk `sends` to rank `to`, and
    receives chunk `receives` from rank `source` (added in reduce-scatter, copied in all-gather)."""
    rank: int
    sends: int
    to: int
    receives: int
    source: int


class RingStep(NamedTuple):
    phase: str              # "reduce-scatter" or "all-gather"
    step: int               # 0 .. N-2 within its phase
    moves: tuple            # one RingMove per rank, in rank order


def ring_schedule(ranks: int) -> list[RingStep]:
    """The 2(N-1) steps of lab 2's ring all-reduce on `ranks` ranks (N): reduce-scatter, then
    all-gather, each rank's chunks numbered as `tensor.view(-1).tensor_split(N)` numbers them."""
    transfer.check_ranks(ranks)
    n = ranks
    # the chunk a rank sends and the one it receives into, counted back from its own: the chunk
    # arriving is the one its left neighbour sent, so each chunk travels round the ring
    first = {"reduce-scatter": (0, -1), "all-gather": (1, 0)}
    steps = []
    for phase in PHASES:
        send_at, receive_at = first[phase]
        for s in range(n - 1):
            moves = tuple(RingMove(r, (r + send_at - s) % n, (r + 1) % n, (r + receive_at - s) % n, (r - 1) % n)
                          for r in range(n))
            steps.append(RingStep(phase, s, moves))
    return steps


def describe_ring(ranks: int) -> str:
    """One line of markdown: what each rank sends in the ring, counted from `ring_schedule`."""
    schedule = ring_schedule(ranks)
    sent = sum(1 for step in schedule for move in step.moves if move.rank == 0)
    share = transfer.ring_all_reduce(ranks, ranks) / ranks     # the formula, in tensors
    return (f"**{ranks} ranks**: {len(schedule)} steps ({ranks - 1} of reduce-scatter, {ranks - 1} of all-gather); "
            f"each rank sends {sent} chunks of 1/{ranks} of the tensor, {sent / ranks:.3g}× the tensor "
            f"(the formula 2(N−1)/N gives {share:.3g}×), and the busiest rank sends no more than any other.")


def _ring_panel(ax, step: RingStep | None, ranks: int) -> None:
    angles = np.pi / 2 - 2 * np.pi * np.arange(ranks) / ranks      # rank 0 on top, clockwise
    centres = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    node = min(0.3, 0.45 * np.sin(np.pi / ranks)) if ranks > 1 else 0.3
    for r, (x, y) in enumerate(centres):
        ax.add_patch(Circle((x, y), node, facecolor="white", edgecolor="black", zorder=3))
        ax.text(x, y, str(r), ha="center", va="center", zorder=4, fontsize="medium")
    for move in step.moves if step else ():
        start, end = centres[move.rank], centres[move.to]
        direction = (end - start) / np.linalg.norm(end - start)
        colour = _colour(move.sends)
        # negative rad: the arc bulges out of the ring (arc3 bends to the right of start -> end)
        ax.add_patch(FancyArrowPatch(start + node * direction, end - node * direction, arrowstyle="-|>",
                                     mutation_scale=12, color=colour, linewidth=1.6, shrinkA=0, shrinkB=0,
                                     connectionstyle=f"arc3,rad={-0.35 if ranks == 2 else -0.25}", zorder=2))
        middle = angles[move.rank] - np.pi / ranks
        ax.text(1.42 * np.cos(middle), 1.42 * np.sin(middle), f"c{move.sends}", color=colour,
                ha="center", va="center", fontsize="small", fontweight="bold")
    ax.set_xlim(-1.7, 1.7)
    ax.set_ylim(-1.7, 1.7)
    ax.set_aspect("equal")
    ax.axis("off")


def draw_ring(ranks: int, ax=None):
    """Lab 2's ring all-reduce on `ranks` ranks, one small ring per step: top row reduce-scatter
    (the arrow's chunk is added into the receiver's), bottom row all-gather (copied). An arrow
    goes from each rank to its right neighbour, coloured and labelled by the chunk it carries.
    With `ax`, only the first reduce-scatter step is drawn, into it. Returns the Figure."""
    _check_drawable(ranks)
    schedule = ring_schedule(ranks)
    if ax is not None:
        _ring_panel(ax, schedule[0] if schedule else None, ranks)
        ax.set_title(f"{ranks} ranks, reduce-scatter step 1" if schedule else "1 rank: nothing to send",
                     fontsize="medium")
        return ax.figure
    if ranks == 1:
        fig, only = plt.subplots(figsize=(3, 3))
        _ring_panel(only, None, 1)
        only.set_title("1 rank: it holds the sum already, nothing is sent", fontsize="medium")
        return fig
    columns = ranks - 1
    fig, axes = plt.subplots(2, columns, figsize=(min(max(2.4 * columns, 5), 18) + 0.6, 5.6), squeeze=False)
    for step in schedule:
        panel = axes[PHASES.index(step.phase), step.step]
        _ring_panel(panel, step, ranks)
        action = "add" if step.phase == "reduce-scatter" else "copy"
        panel.set_title(f"{step.phase} {step.step + 1}: {action}", fontsize="small")
    fig.suptitle(f"Ring all-reduce on {ranks} ranks: reduce-scatter (top row), then all-gather (bottom row)",
                 fontsize="medium")
    fig.tight_layout()
    return fig


# --- lab 4: a grid of ranks and its groups ------------------------------------------

class GridGroups(NamedTuple):
    data: list      # data-parallel groups, one per position m: the ranks holding the same shard
    model: list     # model-parallel groups, one per replica d: the ranks splitting the dense layers


def grid_group_members(data: int, model: int) -> GridGroups:
    """The ranks of each group of a `data` x `model` grid, numbered as `Grid` numbers them,
    rank = d * model + m: a data-parallel group is a column (m fixed), a model-parallel one a row."""
    grid = Grid(data, model)
    return GridGroups(data=[[d * grid.model + m for d in range(grid.data)] for m in range(grid.model)],
                      model=[[d * grid.model + m for m in range(grid.model)] for d in range(grid.data)])


def draw_grid(data: int, model: int, ax=None):
    """A `data` x `model` grid of ranks (lab 4): one row per data-parallel replica d, each a
    model-parallel group (solid outline), one column per position m, each a data-parallel group
    (dashed outline). Each box gives the rank and its (d, m). Returns the Figure."""
    _check_drawable(data, "data", "data-parallel replicas")
    _check_drawable(model, "model", "ranks per model-parallel group")
    groups = grid_group_members(data, model)
    fig, ax = plt.subplots(figsize=(2.4 + 1.9 * model, 1.6 + 1.1 * data)) if ax is None else (ax.figure, ax)
    width, height = 1.3, 0.75
    place = {r: (m * 1.9, -d * 1.1) for d, row in enumerate(groups.model) for m, r in enumerate(row)}
    for r, (x, y) in place.items():
        d, m = divmod(r, model)
        ax.add_patch(Rectangle((x, y), width, height, facecolor="white", edgecolor="black", linewidth=0.8))
        ax.text(x + width / 2, y + height / 2, f"rank {r}\n(d={d}, m={m})", ha="center", va="center", fontsize="small")
    for row in groups.model:
        (x, y), right = place[row[0]], place[row[-1]][0] + width
        ax.add_patch(FancyBboxPatch((x - 0.08, y - 0.08), right - x + 0.16, height + 0.16, boxstyle="round,pad=0.02",
                                    fill=False, edgecolor="#3182bd", linewidth=2))
        ax.text(x - 0.25, y + height / 2, f"model-parallel\ngroup {row}", ha="right", va="center",
                fontsize="small", color="#3182bd")
    for column in groups.data:
        (x, top), bottom = place[column[0]], place[column[-1]][1]
        ax.add_patch(FancyBboxPatch((x - 0.16, bottom - 0.16), width + 0.32, top + height - bottom + 0.32,
                                    boxstyle="round,pad=0.02", fill=False, edgecolor="#de2d26", linewidth=1.6,
                                    linestyle="--"))
        ax.text(x + width / 2, bottom - 0.3, f"data-parallel\ngroup {column}", ha="center", va="top",
                fontsize="small", color="#de2d26")
    ax.set_title(f"A {Grid(data, model)} grid: {data * model} ranks, rank = d × {model} + m", fontsize="medium")
    ax.set_aspect("equal")
    ax.autoscale_view()
    x_low, x_high = ax.get_xlim()
    ax.set_xlim(x_low - 1.6, x_high + 0.2)
    y_low, y_high = ax.get_ylim()
    ax.set_ylim(y_low - 0.7, y_high + 0.1)
    ax.axis("off")
    return fig
