"""When each scheme wins: data parallelism against a split weight, for one dense layer.

    split_view.show(measured={"split by row": 512_345})   # in a notebook
    fig = split_view.draw(inputs=1000, outputs=500, batch=128, gpus=2)

Left: the bytes one rank sends per step at the chosen batch, for data
parallelism (ring all-reduce of the gradient) and for the layer split by
column and by row (`course.sizes.split_weight_transfers`), each labelled
with the time model's estimate of that transfer over the chosen link
(`course.timemodel`, whose docstring states the assumptions). Dots: bytes
measured in a real run; crosses: the blog's figures, where the settings
are the sources' (1000×500 weight, batch 128, 2 GPUs, float32), on the
schemes the blog gives them to: its two split figures sit on the other
split's bar.
Right: the same bytes against the batch size. Data parallelism sends the
gradient, whatever the batch: a flat line. A split sends activations, which
grow with the batch. Where the lines cross, the schemes swap places.

Used in: lab 3 (03_model_parallel), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np

from course import plots, sizes, timemodel
from course.sizes import Dense
from course.widgets import int_slider, run_controls, show_view

SCHEMES = ("data parallel", "split by column", "split by row")
COLOURS = {"data parallel": "#de2d26", "split by column": "#3182bd", "split by row": "#31a354"}
BYTES_DEPEND_ON = ("inputs", "outputs", "batch", "gpus", "dtype")

#: Dettmers' example (part 2), and the elements per step the blog gives for each scheme, attached to the
#: schemes as the blog attaches them: 128,000 and 160,000 are what one rank sends on 2 GPUs with ring
#: collectives, but the per-rank count (`sent`) gives 128,000 to the row split and 160,000 to the column split.
DETTMERS = {"inputs": 1000, "outputs": 500, "batch": 128, "gpus": 2, "dtype": "float32"}
DETTMERS_BLOG_ELEMENTS = {"data parallel": 500_000, "split by column": 128_000, "split by row": 160_000}

_RING_SECONDS = {"all-gather": timemodel.ring_all_gather_seconds,
                 "all-reduce": timemodel.ring_all_reduce_seconds}


def sent(layer: Dense, batch: int, gpus: int, dtype: str) -> dict[str, float]:
    """Bytes one rank sends per training step, by scheme (ring collectives)."""
    return {"data parallel": sizes.data_parallel_total([layer], gpus, dtype),
            **{f"split by {d}": sizes.split_weight_sent(layer, batch, gpus, d, dtype) for d in sizes.DIRECTIONS}}


def seconds(layer: Dense, batch: int, gpus: int, dtype: str, link: timemodel.Link) -> dict[str, float]:
    """The time model's seconds per step for each scheme's communication."""
    times = {"data parallel": timemodel.ring_all_reduce_seconds(sizes.nbytes(layer.weights, dtype), gpus, link)}
    for direction in sizes.DIRECTIONS:
        transfers = sizes.split_weight_transfers(layer, batch, gpus, direction, dtype)
        times[f"split by {direction}"] = sum(_RING_SECONDS[c](size, gpus, link) for c, size in transfers)
    return times


def _batches(upto: int) -> np.ndarray:
    return np.unique(np.geomspace(1, upto, 200).round().astype(int))


def draw(*, inputs: int = 1000, outputs: int = 500, batch: int = 128, gpus: int = 2, dtype: str = "float32",
         link: str = timemodel.PCIE3_X16.name, processor: str = timemodel.TITAN.name,
         measured: Mapping[str, float] | None = None):
    """The view as a matplotlib Figure (see the module docstring)."""
    interconnect, gpu = timemodel.link_named(link), timemodel.processor_named(processor)
    if gpus < 2:
        raise ValueError(f"with {gpus} GPU nothing is split or sent: choose at least 2 GPUs")
    sizes.nbytes(1, dtype)   # an unknown dtype is refused, not drawn as a split that cannot be made
    layer = Dense("layer", inputs, outputs)
    try:
        now = sent(layer, batch, gpus, dtype)
    except ValueError as error:   # a split that does not divide evenly: say so in the figure
        return plots.message_figure(error)
    times = seconds(layer, batch, gpus, dtype, interconnect)
    compute = gpu.seconds(layer.training_flop(batch) / gpus)
    fig, (bytes_ax, batch_ax) = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")

    plots.bytes_bars(bytes_ax, SCHEMES, now, times, COLOURS, measured)
    settings = {"inputs": inputs, "outputs": outputs, "batch": batch, "gpus": gpus, "dtype": dtype}
    if settings == DETTMERS:
        blog = [DETTMERS_BLOG_ELEMENTS[s] * sizes.DTYPE_BYTES[dtype] / 1e6 for s in SCHEMES]
        bytes_ax.plot(range(len(SCHEMES)), blog, "x", color="black", markersize=9, zorder=3,
                      label="the blog's figure")
    # the settings above both panels, wrapped to the figure's width (long at a projector's type size)
    fig.suptitle(f"{inputs}×{outputs} weight, batch {batch}, {gpus} GPUs; ms over {link}; "
                 f"compute {compute * 1e3:.3g} ms per rank on {processor}", fontsize="medium", wrap=True)
    bytes_ax.set_title("one step, per rank", fontsize="medium")
    bytes_ax.margins(y=0.25)
    if bytes_ax.get_legend_handles_labels()[0]:
        bytes_ax.legend(fontsize="small", frameon=False, loc="upper right")

    batches = _batches(max(4096, 2 * batch))
    for scheme in SCHEMES:
        curve = [sent(layer, int(b), gpus, dtype)[scheme] / 1e6 for b in batches]
        batch_ax.plot(batches, curve, color=COLOURS[scheme], label=scheme)
    for direction in sizes.DIRECTIONS:
        crossing = sizes.split_weight_crossover(layer, gpus, direction)
        height = now["data parallel"] / 1e6
        batch_ax.plot([crossing], [height], "o", color=COLOURS[f"split by {direction}"], zorder=3)
        batch_ax.annotate(f"{crossing:,.0f}", (crossing, height), textcoords="offset points",
                          xytext=(4, 6 if direction == "row" else -14), fontsize="small")
    plots.bytes_against(batch_ax, batch, f"batch {batch}", "global batch (samples per step)",
                        "a split sends less left of its dot")
    return fig


def describe(*, inputs: int, outputs: int, batch: int, gpus: int, dtype: str, link: str, processor: str) -> str:
    """The figure's headline numbers, in a line of markdown: each scheme's bytes and ms, and the crossovers."""
    sizes.nbytes(1, dtype)   # an unknown dtype is refused (draw's reason)
    layer = Dense("layer", inputs, outputs)
    try:
        now = sent(layer, batch, gpus, dtype)
    except ValueError as error:
        return f"**Cannot split:** {error}"
    times = seconds(layer, batch, gpus, dtype, timemodel.link_named(link))
    compute = timemodel.processor_named(processor).seconds(layer.training_flop(batch) / gpus)
    cheapest = min(SCHEMES, key=now.get)
    schemes = "; ".join(f"{scheme} {now[scheme] / 1e6:.3g} MB ({times[scheme] * 1e3:.3g} ms)" for scheme in SCHEMES)
    crossings = " and ".join(f"{sizes.split_weight_crossover(layer, gpus, d):,.0f} (by {d})" for d in sizes.DIRECTIONS)
    return (f"**{inputs}×{outputs} weight, batch {batch}, {gpus} GPUs, over {link}:** {schemes} per rank per step. "
            f"Cheapest: **{cheapest}**; compute {compute * 1e3:.3g} ms per rank on {processor}. "
            f"A split sends less than data parallelism below a batch of {crossings}.")


def show(measured: Mapping[str, float] | None = None, **start):
    """The view with sliders and menus (a static figure under grading or headless).

    measured: bytes a real run sent per rank, by scheme; `start` gives that
    run's settings (inputs, outputs, batch, gpus, dtype), which the controls
    start at. Measured dots show while those settings are unchanged.
    """
    values = {**DETTMERS, "link": timemodel.PCIE3_X16.name, "processor": timemodel.TITAN.name, **start}
    controls = {
        "inputs": int_slider(values["inputs"], low=100, high=8000, step=100, description="input features"),
        "outputs": int_slider(values["outputs"], low=100, high=8000, step=100, description="output features"),
        **run_controls(values, min_gpus=2),
    }
    return show_view(draw, describe, controls, measured, {k: values[k] for k in BYTES_DEPEND_ON})
