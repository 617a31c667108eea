"""When the Megatron split pays: a transformer block split over GPUs against data parallelism.

    block_view.show(measured={"Megatron split": 1_048_576})   # in a notebook
    fig = block_view.draw(batch=8, sequence=128, width=512, heads=8, gpus=2)

Left: the bytes one rank sends per step at the chosen sizes
(`course.transformer`'s formulas, ring collectives): data parallelism
all-reduces the block's gradients once (about 12 width² values); the split
(qkv by column, so each rank owns whole heads, then the output projection
by row; the MLP column-then-row) all-reduces an activation of batch ×
sequence × width four times, two forward and two backward. Each bar is
labelled with the time model's estimate of those all-reduces over the
chosen link (`course.timemodel`, whose docstring states the assumptions).
Dots: bytes measured in a real run.
Right: the same bytes against the tokens per step (batch × sequence). The
gradient does not grow with the tokens: a flat line. The activations do.
Left of the dot, at `transformer.crossover_tokens` (about 3 × width), the
split sends less.

Fewer bytes are not less time. The split's four all-reduces block: the next
operation waits for each, so all of their time is on the critical path. Data
parallelism's all-reduce runs once a step and overlaps backward.
`critical_path_seconds` models what each scheme adds to a step (assumed: data
parallelism's all-reduce starts with backward and hides behind as much of it
as lasts; the split's overlaps nothing); the line under the figure says it.

Used in: lab 3 (03_model_parallel).
"""
from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np

from course import plots, sizes, timemodel, transformer
from course.widgets import STYLE, int_slider, run_controls, show_view

SCHEMES = ("data parallel", "Megatron split")
COLOURS = {"data parallel": "#de2d26", "Megatron split": "#3182bd"}
BYTES_DEPEND_ON = ("batch", "sequence", "width", "gpus", "dtype")
#: The head counts the view offers; one that does not divide the width, or that the GPUs do not divide, is
#: said in words.
HEAD_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
START = {"batch": 8, "sequence": 128, "width": 512, "heads": 8, "gpus": 2, "dtype": "float32",
         "link": timemodel.PCIE3_X16.name, "processor": timemodel.TITAN.name}


def sent(batch: int, sequence: int, width: int, gpus: int, dtype: str) -> dict[str, float]:
    """Bytes one rank sends per training step, by scheme (ring all-reduces)."""
    return {"data parallel": transformer.data_parallel_block_sent(width, gpus, dtype),
            "Megatron split": transformer.split_block_sent(batch, sequence, width, gpus, dtype)}


def seconds(batch: int, sequence: int, width: int, gpus: int, dtype: str, link: timemodel.Link) -> dict[str, float]:
    """The time model's seconds per step of each scheme's all-reduces: one of the gradients, or four of an
    activation."""
    gradients = sizes.nbytes(transformer.block_parameters(width), dtype)
    activation = sizes.nbytes(batch * sequence * width, dtype)
    return {"data parallel": timemodel.ring_all_reduce_seconds(gradients, gpus, link),
            "Megatron split": 4 * timemodel.ring_all_reduce_seconds(activation, gpus, link)}


def critical_path_seconds(batch: int, sequence: int, width: int, gpus: int, dtype: str, link: timemodel.Link,
                          processor: timemodel.Processor) -> dict[str, float]:
    """The time model's seconds each scheme's all-reduces add to a step (modelled, see the module docstring):
    the split, all of its four blocking all-reduces; data parallelism, what of its one all-reduce outlasts
    the backward of one rank's share (two thirds of `transformer.training_flop`)."""
    times = seconds(batch, sequence, width, gpus, dtype, link)
    backward = processor.seconds(2 / 3 * transformer.training_flop(batch, sequence, width) / gpus)
    return {"data parallel": max(0.0, times["data parallel"] - backward), "Megatron split": times["Megatron split"]}


def _refuse_one_gpu(gpus: int) -> None:
    if gpus < 2:
        raise ValueError(f"with {gpus} GPU nothing is split or sent: choose at least 2 GPUs")


def _owners(width: int, heads: int, gpus: int) -> list[range]:
    """The heads each rank owns; ValueError, in words, when the heads do not divide the width or the GPUs
    do not divide the heads."""
    if width % heads:
        raise ValueError(f"a width of {width} does not split into {heads} heads: "
                         "pick a number of heads that divides the width")
    return transformer.head_owners(heads, gpus)


def draw(*, batch: int = 8, sequence: int = 128, width: int = 512, heads: int = 8, gpus: int = 2,
         dtype: str = "float32", link: str = timemodel.PCIE3_X16.name, processor: str = timemodel.TITAN.name,
         measured: Mapping[str, float] | None = None):
    """The view as a matplotlib Figure (see the module docstring)."""
    interconnect, gpu = timemodel.link_named(link), timemodel.processor_named(processor)
    _refuse_one_gpu(gpus)
    try:
        _owners(width, heads, gpus)
    except ValueError as error:   # heads that do not divide: say so in the figure
        return plots.message_figure(error)
    now = sent(batch, sequence, width, gpus, dtype)
    times = seconds(batch, sequence, width, gpus, dtype, interconnect)
    compute = gpu.seconds(transformer.training_flop(batch, sequence, width) / gpus)
    fig, (bytes_ax, tokens_ax) = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")

    plots.bytes_bars(bytes_ax, SCHEMES, now, times, COLOURS, measured)
    fig.suptitle(f"one block of width {width}, {heads} heads ({heads // gpus} per rank), sequence {sequence}, "
                 f"batch {batch}, {gpus} GPUs; ms over {link}; compute {compute * 1e3:.3g} ms per rank on "
                 f"{processor}", fontsize="medium", wrap=True)
    bytes_ax.set_title("one step, per rank", fontsize="medium")
    bytes_ax.margins(y=0.25)
    if bytes_ax.get_legend_handles_labels()[0]:
        bytes_ax.legend(fontsize="small", frameon=False, loc="upper right")

    tokens = batch * sequence
    crossing = transformer.crossover_tokens(width)
    lowest = max(1, min(tokens, crossing) / 100)    # two decades left of whichever comes first
    counts = np.unique(np.geomspace(lowest, max(4 * crossing, 2 * tokens), 200).round().astype(int))
    for scheme in SCHEMES:
        curve = [sent(1, int(t), width, gpus, dtype)[scheme] / 1e6 for t in counts]
        tokens_ax.plot(counts, curve, color=COLOURS[scheme], label=scheme)
    height = now["data parallel"] / 1e6
    tokens_ax.plot([crossing], [height], "o", color=COLOURS["Megatron split"], zorder=3)
    tokens_ax.annotate(f"{crossing:,.0f} tokens", (crossing, height), textcoords="offset points", xytext=(4, 6),
                       fontsize="small")
    plots.bytes_against(tokens_ax, tokens, f"{tokens:,} tokens", "tokens per step (batch × sequence)",
                        "the split sends less left of its dot")
    return fig


def _heads(owned: range) -> str:
    return f"head {owned.start}" if len(owned) == 1 else f"heads {owned.start}-{owned.stop - 1}"


def describe(*, batch: int, sequence: int, width: int, heads: int, gpus: int, dtype: str, link: str,
             processor: str) -> str:
    """The figure's headline numbers, in a line of markdown: each scheme's bytes and ms, the cheaper one,
    the crossover and the heads each rank owns."""
    _refuse_one_gpu(gpus)
    try:
        owners = _owners(width, heads, gpus)
    except ValueError as error:
        return f"**Cannot split:** {error}"
    now = sent(batch, sequence, width, gpus, dtype)
    times = seconds(batch, sequence, width, gpus, dtype, timemodel.link_named(link))
    compute = timemodel.processor_named(processor).seconds(transformer.training_flop(batch, sequence, width) / gpus)
    cheaper = min(SCHEMES, key=now.get)
    schemes = "; ".join(f"{scheme} {now[scheme] / 1e6:.3g} MB ({times[scheme] * 1e3:.3g} ms)" for scheme in SCHEMES)
    owned = ", ".join(f"rank {rank} owns {_heads(owned)}" for rank, owned in enumerate(owners))
    waited = critical_path_seconds(batch, sequence, width, gpus, dtype, timemodel.link_named(link),
                                   timemodel.processor_named(processor))
    return (f"**Block of width {width}, {heads} heads, {batch} × {sequence} = {batch * sequence:,} tokens, "
            f"{gpus} GPUs, over {link}:** {schemes} per rank per step. Cheaper: **{cheaper}**; compute "
            f"{compute * 1e3:.3g} ms per rank on {processor}. The split sends less below "
            f"{transformer.crossover_tokens(width):,.0f} tokens per step. On the critical path (modelled): the "
            f"split's 4 blocking all-reduces, {waited['Megatron split'] * 1e3:.3g} ms; data parallelism's one, "
            f"{waited['data parallel'] * 1e3:.3g} ms left after overlapping backward. Heads by rank: {owned}.")


def show(measured: Mapping[str, float] | None = None, **start):
    """The view with sliders and menus (a static figure under grading or headless).

    measured: bytes a real run sent per rank, by scheme; `start` gives that
    run's settings (batch, sequence, width, heads, gpus, dtype), which the
    controls start at. Measured dots show while the bytes' settings are unchanged.
    """
    import ipywidgets as w

    values = {**START, **start}
    controls = {
        "sequence": int_slider(values["sequence"], low=16, high=4096, step=16, description="sequence length"),
        "width": int_slider(values["width"], low=64, high=8192, step=64, description="width"),
        "heads": w.Dropdown(options=sorted({*HEAD_CHOICES, values["heads"]}), value=values["heads"],
                            description="heads", style=STYLE),
        **run_controls(values, min_gpus=2),
    }
    return show_view(draw, describe, controls, measured, {k: values[k] for k in BYTES_DEPEND_ON})
