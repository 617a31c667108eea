"""The transfer-size view of data parallelism: what each rank sends, and how long it takes.

    transfer_view.show(measured={"ring": 6_001_234})     # in a notebook
    fig = transfer_view.draw(width=1000, gpus=4)          # the figure alone

Left: bytes one rank sends per step to average an MLP's gradients, by layer,
for a ring all-reduce (every rank alike) and the naive one (rank 0 against
the others), with the measured bytes of a real run as dots. Middle: the time
model's estimate of that communication over the chosen interconnect, against
the compute time of one rank's share of the batch (course.timemodel, whose
docstring states the assumptions). Right: the ring's time against the number
of GPUs, in its two terms: the bandwidth term, 2(N-1)/N of the gradients over
beta, nearly flat in N; the latency term, 2(N-1) alpha per all-reduce, growing.

The model's GPU computes while the gradients move, at no cost to either: on
real GPUs, NCCL's collectives are kernels that take SMs and memory bandwidth
from the computation they overlap, so overlap is never quite free.

    transfer_view.show(links={"here": link_probe.measure()})   # a measured link in the menu

Used in: lab 2 (02_data_parallel), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from course import sizes, timemodel
from course.plots import phase_colours
from course.sizes import Dense
from course.widgets import int_slider, run_controls, show_view

SCHEMES = ("ring", "naive, rank 0", "naive, other ranks")
#: The GPU counts of the ring's-terms panel (and the chosen count, if not among them).
TERM_GPUS = (2, 4, 8, 16, 32, 64)
BYTES_DEPEND_ON = ("width", "depth", "gpus", "dtype")


def mlp_layers(width: int, depth: int, inputs: int | None = None, classes: int = 10) -> list[Dense]:
    """`depth` hidden layers of `width` features, then the output layer."""
    if width < 1 or depth < 1 or classes < 1:
        raise ValueError(f"width, depth and classes must be positive, got {width}, {depth}, {classes}")
    widths = [inputs or width] + [width] * depth + [classes]
    names = [f"layer{i}" for i in range(1, depth + 1)] + ["output"]
    return [Dense(name, a, b) for name, a, b in zip(names, widths, widths[1:])]


def sent_by_scheme(layers, gpus: int, dtype: str) -> dict[str, list]:
    """Bytes one rank sends per step, per layer, for each scheme of SCHEMES."""
    return {
        "ring": [r["sent"] for r in sizes.data_parallel(layers, gpus, dtype, "ring")],
        "naive, rank 0": [r["sent"] for r in sizes.data_parallel(layers, gpus, dtype, "naive", rank=0)],
        "naive, other ranks": [r["sent"] for r in sizes.data_parallel(layers, gpus, dtype, "naive",
                                                                      rank=min(1, gpus - 1))],
    }


def estimate(layers, batch: int, gpus: int, dtype: str, link: timemodel.Link,
             processor: timemodel.Processor) -> dict[str, float]:
    """Seconds per step: one rank's compute, and each all-reduce of every layer's gradient."""
    share = batch / gpus
    gradient = [sizes.nbytes(layer.weights, dtype) for layer in layers]
    return {
        "compute (one rank)": processor.pass_seconds(sum(layer.training_flop(1) for layer in layers), share),
        "ring all-reduce": sum(timemodel.ring_all_reduce_seconds(b, gpus, link) for b in gradient),
        "naive all-reduce": sum(timemodel.naive_all_reduce_seconds(b, gpus, link) for b in gradient),
    }


def ring_terms(layers, gpus: int, dtype: str, link: timemodel.Link) -> dict[str, float]:
    """Seconds per step of the ring all-reduces of every layer's gradient, in the two
    terms of timemodel.ring_all_reduce_terms, summed over the layers."""
    terms = [timemodel.ring_all_reduce_terms(sizes.nbytes(layer.weights, dtype), gpus, link) for layer in layers]
    return {term: sum(t[term] for t in terms) for term in ("bandwidth", "latency")}


def _link(name: str, links: Mapping[str, timemodel.Link] | None) -> timemodel.Link:
    """A preset, or one of `links` (a measured link, say)."""
    if links and name in links:
        return links[name]
    if name not in timemodel.PRESETS:
        raise ValueError(f"link must be one of {[*timemodel.PRESETS, *(links or {})]}, got {name!r}")
    return timemodel.PRESETS[name]


def _duration(seconds: float) -> str:
    """Seconds as a bar's label: 3 digits, in ms below a second, else in s (never 4.91e+04 ms)."""
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _draw_ring_terms(ax, layers, gpus: int, dtype: str, link: timemodel.Link) -> None:
    counts = sorted({*TERM_GPUS, gpus})
    terms = [ring_terms(layers, n, dtype, link) for n in counts]
    x = range(len(counts))
    bandwidth = [t["bandwidth"] * 1e3 for t in terms]
    ax.bar(x, bandwidth, color="#3182bd", label="bandwidth: 2(N-1)/N · bytes / β")
    ax.bar(x, [t["latency"] * 1e3 for t in terms], bottom=bandwidth, color="#fdae6b",
           label=f"latency: 2(N-1) α × {len(layers)} all-reduces")
    ax.set_xticks(x, [f"[{n}]" if n == gpus else str(n) for n in counts])   # [N]: the chosen number of GPUs
    ax.tick_params(axis="x", labelsize="small")
    ax.set_xlabel("GPUs (N)")
    ax.set_ylabel("ms per step, ring (time model)")
    # the interconnect is named once, over the middle panel
    ax.set_title("the ring's two terms", fontsize="medium")
    ax.margins(y=0.45)   # the legend above the bars, not over them
    ax.legend(fontsize="small", frameon=False, loc="upper left")


def draw(*, width: int = 1000, depth: int = 2, batch: int = 128, gpus: int = 4, dtype: str = "float32",
         link: str = timemodel.NETWORK_40G.name, processor: str = timemodel.TITAN.name,
         measured: Mapping[str, float] | None = None, links: Mapping[str, timemodel.Link] | None = None):
    """The view as a matplotlib Figure (see the module docstring); `links` adds
    interconnects (a measured one) to the presets `link` may name."""
    interconnect, gpu = _link(link, links), timemodel.processor_named(processor)
    layers = mlp_layers(width, depth)
    sent = sent_by_scheme(layers, gpus, dtype)
    colours = phase_colours([f"all-reduce {layer.name}" for layer in layers])
    # the bytes get more room: three labelled bars and the legend beside them
    fig, (bytes_ax, time_ax, terms_ax) = plt.subplots(1, 3, figsize=(17, 4.2), width_ratios=(1.4, 1, 1.3),
                                                      layout="constrained")   # room for the legend outside

    bottoms = [0.0] * len(SCHEMES)
    for i, layer in enumerate(layers):
        heights = [sent[s][i] / 1e6 for s in SCHEMES]
        bytes_ax.bar(SCHEMES, heights, bottom=bottoms, color=colours[f"all-reduce {layer.name}"],
                     label=f"{layer.name} ({layer.weights:,} weights)", edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for scheme, value in (measured or {}).items():
        if scheme not in SCHEMES:
            raise ValueError(f"measured bytes for {scheme!r}: schemes are {SCHEMES}")
        bytes_ax.plot([SCHEMES.index(scheme)], [value / 1e6], "o", color="black", zorder=3,
                      label="measured" if scheme == next(iter(measured)) else None)
    bytes_ax.set_xticks(range(len(SCHEMES)), [s.replace(", ", ",\n") for s in SCHEMES])
    bytes_ax.tick_params(axis="x", labelsize="small")
    bytes_ax.set_ylabel("MB sent per rank per step")
    bytes_ax.set_title(f"{gpus} GPUs, {dtype} gradients")
    # beside the bars, not over them: they fill the axes
    bytes_ax.legend(fontsize="small", frameon=False, loc="upper left", bbox_to_anchor=(1, 1))

    seconds = estimate(layers, batch, gpus, dtype, interconnect, gpu)
    labels = list(seconds)
    time_ax.barh(labels, [seconds[k] * 1e3 for k in labels], color=["#6baed6", "#de2d26", "#fc9272"])
    for y, key in enumerate(labels):
        time_ax.text(seconds[key] * 1e3, y, f" {_duration(seconds[key])}", va="center", fontsize="small")
    time_ax.invert_yaxis()
    time_ax.set_xlabel("ms per step (time model)", loc="right")
    # right-aligned: a long title reaches left over the free space, not off the figure
    time_ax.set_title(f"batch {batch} over {gpus} GPUs:\n{processor},\n{link}", fontsize="medium", loc="right")
    time_ax.margins(x=0.6)                                   # room for the longest bar's label
    time_ax.xaxis.set_major_locator(MaxNLocator(nbins=3))   # 5-digit ticks side by side, readable
    _draw_ring_terms(terms_ax, layers, gpus, dtype, interconnect)
    return fig


def describe(*, width: int, depth: int, batch: int, gpus: int, dtype: str, link: str, processor: str,
             links: Mapping[str, timemodel.Link] | None = None) -> str:
    """The figure's headline numbers, in a line of markdown: bytes per rank and the time model's ms."""
    layers = mlp_layers(width, depth)
    interconnect = _link(link, links)
    sent = {scheme: sum(per_layer) / 1e6 for scheme, per_layer in sent_by_scheme(layers, gpus, dtype).items()}
    ms = {what: s * 1e3 for what, s in estimate(layers, batch, gpus, dtype, interconnect,
                                                  timemodel.processor_named(processor)).items()}
    terms = {term: s * 1e3 for term, s in ring_terms(layers, gpus, dtype, interconnect).items()}
    return (f"**{gpus} GPUs, {dtype}:** per step each rank sends **{sent['ring']:.3g} MB** with a ring all-reduce; "
            f"with the naive one rank 0 sends {sent['naive, rank 0']:.3g} MB and every other rank "
            f"{sent['naive, other ranks']:.3g} MB. Over {link}: ring {ms['ring all-reduce']:.3g} ms "
            f"({terms['bandwidth']:.3g} ms bandwidth term, {terms['latency']:.3g} ms latency term), naive "
            f"{ms['naive all-reduce']:.3g} ms, against {ms['compute (one rank)']:.3g} ms of compute per rank.")


def show(measured: Mapping[str, float] | None = None, links: Mapping[str, timemodel.Link] | None = None, **start):
    """The view with sliders and menus (a static figure under grading or headless).

    measured: bytes a real run sent per rank, by scheme; `start` gives that
    run's settings (width, depth, gpus, dtype), which the sliders start at.
    links: interconnects to offer beside the presets (a link measured here).
    """
    values = {"width": 1000, "depth": 2, "batch": 128, "gpus": 4, "dtype": "float32",
              "link": timemodel.NETWORK_40G.name, "processor": timemodel.TITAN.name, **start}
    controls = {
        "width": int_slider(values["width"], low=100, high=8000, step=100, description="layer width"),
        "depth": int_slider(values["depth"], low=1, high=6, description="hidden layers"),
        # a measured link is not a preset yet: the menu gets it below
        **run_controls({**values, "link": values["link"] if values["link"] in timemodel.PRESETS
                        else timemodel.NETWORK_40G.name}),
    }
    if links:
        controls["link"].options = [*timemodel.PRESETS, *links]
        controls["link"].value = values["link"]
    # Measured bytes belong to the run's settings: shown only while the
    # settings that decide the bytes are the run's.
    return show_view(functools.partial(draw, links=links), functools.partial(describe, links=links), controls,
                     measured, {k: values[k] for k in BYTES_DEPEND_ON})
