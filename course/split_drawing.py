"""Lab 3's picture: the two ways to split a dense layer's weight over the GPUs (by column, by row),
forward and backward, which block each GPU holds and what is stacked or added; and `split_blocks`,
the arithmetic it draws (the blocks of `course.sizes.split_weight`).

course.drawings re-exports `draw_split`, `split_blocks` and `Block`: lab 3 says `drawings.draw_split`.

Used by: course.drawings.
"""
from __future__ import annotations

from typing import NamedTuple

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from course import sizes
from course._drawing import WHOLE, _check_drawable, _colour


class Block(NamedTuple):
    """Rows [row_start, row_stop) and columns [column_start, column_stop) of W (inputs x outputs)."""
    row_start: int
    row_stop: int
    column_start: int
    column_stop: int


def split_blocks(direction: str, ranks: int, inputs: int, outputs: int) -> list[Block]:
    """The block of W (inputs x outputs, as lab 3's exercise 1 writes it) that each of `ranks` GPUs
    holds, in GPU order: "column" cuts the outputs (W's second dimension), "row" the inputs; the
    shapes are `course.sizes.split_weight`'s, which refuses a split that does not divide evenly."""
    rows, columns = sizes.split_weight(sizes.Dense("W", inputs, outputs), 1, ranks, direction)["weight"]
    if direction == "column":
        return [Block(0, rows, k * columns, (k + 1) * columns) for k in range(ranks)]
    return [Block(k * rows, (k + 1) * rows, 0, columns) for k in range(ranks)]


def _stripes(ax, x, y, width, height, cuts, vertical: bool, label_ranks: bool = False) -> None:
    """A matrix at (x, y) cut into one stripe per GPU at fractions `cuts` (pairs), along its width
    if `vertical` else along its height (from the top)."""
    for k, (start, stop) in enumerate(cuts):
        if vertical:
            box = (x + start * width, y), (stop - start) * width, height
        else:
            box = (x, y + height * (1 - stop)), width, (stop - start) * height
        ax.add_patch(Rectangle(*box, facecolor=_colour(k), edgecolor="white", linewidth=1, alpha=0.85))
        if label_ranks:
            (bx, by), bw, bh = box
            ax.text(bx + bw / 2, by + bh / 2, str(k), ha="center", va="center", fontsize="small", color="white")


def _partials(ax, x, y, width, height, ranks) -> float:
    """N full-shape partial results, stacked like cards: they are added. Returns the right edge."""
    shift = min(0.12, 0.6 / ranks)
    for k in range(ranks):
        ax.add_patch(Rectangle((x + k * shift, y - k * shift), width, height, facecolor=_colour(k),
                               edgecolor="black", linewidth=0.6))
    return x + (ranks - 1) * shift + width


def _shape(shape) -> str:
    return "×".join(map(str, shape))


def draw_split(direction: str, ranks: int, *, inputs: int | None = None, outputs: int | None = None,
               batch: int | None = None, ax=None):
    """Lab 3's split of a dense layer's W (inputs x outputs) over `ranks` GPUs, by "column" or "row":
    top, forward X · W = Y; bottom, backward δY · Wᵀ = δX. Each GPU's block has its colour;
    grey is held whole by every GPU; side by side is stacked (all-gather), cards are added
    (all-reduce). With `inputs`, `outputs` and `batch` the labels give the shapes
    (`course.sizes.split_weight`); without, their names. Returns the Figure."""
    if direction not in sizes.DIRECTIONS:
        raise ValueError(f"direction must be one of {sizes.DIRECTIONS} (lab 3's two splits), got {direction!r}")
    _check_drawable(ranks, "ranks", "GPUs")
    given = [inputs, outputs, batch]
    if any(v is None for v in given) and any(v is not None for v in given):
        raise ValueError("give inputs, outputs and batch together (the layer's shapes), or none of them")
    named = inputs is None
    n_in, n_out = (ranks, ranks) if named else (inputs, outputs)
    blocks = split_blocks(direction, ranks, n_in, n_out)
    if named:
        names = {"X": "batch×inputs", "W": "inputs×outputs", "Y": "batch×outputs"}
        part = {"column": ("batch×outputs/N", "batch×inputs"), "row": ("batch×outputs", "batch×inputs/N")}[direction]
    else:
        shapes = sizes.split_weight(sizes.Dense("W", inputs, outputs), batch, ranks, direction)
        names = {"X": _shape((batch, inputs)), "W": _shape((inputs, outputs)), "Y": _shape((batch, outputs))}
        part = (_shape(shapes["forward"]), _shape(shapes["backward"]))
    column = direction == "column"
    output_cuts = [(b.column_start / n_out, b.column_stop / n_out) for b in blocks]
    input_cuts = [(b.row_start / n_in, b.row_stop / n_in) for b in blocks]
    scale = max(n_in, n_out)
    wide_in, wide_out, tall = 1 + 1.5 * n_in / scale, 1 + 1.5 * n_out / scale, 1.0

    fig, ax = plt.subplots(figsize=(11, 5.4)) if ax is None else (ax.figure, ax)
    for top, (a, b, c) in ((0.0, ("X", "W", "Y")), (-(wide_in + 1.6), ("δY", "Wᵀ", "δX"))):
        forward = a == "X"
        left_w = wide_in if forward else wide_out
        mid_w, mid_h = (wide_out, wide_in) if forward else (wide_in, wide_out)
        y_mid = top - max(wide_in, wide_out) / 2
        # the left matrix: X (whole, or cut by inputs) / δY (cut by outputs, or whole)
        x0, y0 = 0.0, y_mid - tall / 2
        if forward == column:
            ax.add_patch(Rectangle((x0, y0), left_w, tall, facecolor=WHOLE, edgecolor="black", linewidth=0.8))
        else:
            _stripes(ax, x0, y0, left_w, tall, input_cuts if forward else output_cuts, vertical=True)
        ax.text(x0 + left_w / 2, y0 - 0.15, f"{a}  {names['X'] if forward else names['Y']}", ha="center", va="top",
                fontsize="small")
        ax.text(x0 + left_w + 0.25, y_mid, "·", ha="center", va="center", fontsize="x-large")
        # the weight: W cut by its columns (outputs) or rows (inputs); Wᵀ the transpose
        x1, y1 = x0 + left_w + 0.5, y_mid - mid_h / 2
        cut_columns = column == forward
        _stripes(ax, x1, y1, mid_w, mid_h, output_cuts if column else input_cuts, vertical=cut_columns,
                 label_ranks=True)
        ax.text(x1 + mid_w / 2, y1 - 0.15, f"{b}  {names['W'] if forward else _shape(names['W'].split('×')[::-1])}",
                ha="center", va="top", fontsize="small")
        ax.text(x1 + mid_w + 0.25, y_mid, "=", ha="center", va="center", fontsize="x-large")
        # the result: stacked stripes (all-gather) or added cards (all-reduce)
        x2, right_w = x1 + mid_w + 0.5, wide_out if forward else wide_in
        stacked = forward == column
        if stacked:
            _stripes(ax, x2, y_mid - tall / 2, right_w, tall, output_cuts if forward else input_cuts, vertical=True)
            edge = x2 + right_w
        else:
            edge = _partials(ax, x2, y_mid - tall / 2, right_w, tall, ranks)
        how = (f"{ranks} parts of {part[0 if forward else 1]},\nstacked side by side (all-gather)" if stacked
               else f"{ranks} partial sums of {part[0 if forward else 1]},\nadded (all-reduce)")
        ax.text(x2 + right_w / 2, y_mid - tall / 2 - 0.15 - (0 if stacked else (ranks - 1) * min(0.12, 0.6 / ranks)),
                f"{c}  {names['Y'] if forward else names['X']}", ha="center", va="top", fontsize="small")
        ax.text(edge + 0.3, y_mid, how, ha="left", va="center", fontsize="small")
        ax.text(-0.3, y_mid, "forward" if forward else "backward", ha="right", va="center", fontweight="bold")
    held = "its outputs' columns" if column else "its inputs' rows"
    ax.set_title(f"Split by {direction}: GPU k of {ranks} holds block k of W, {held}; grey: every GPU holds it whole",
                 fontsize="medium")
    ax.set_aspect("equal")
    ax.autoscale_view()
    ax.set_xlim(-1.6, ax.get_xlim()[1] + 3.2)
    ax.axis("off")
    return fig
