"""The course's recurring pictures, drawn on a matplotlib Axes you pass in.

    phase_bars(ax, {"batch 32": phases32, "batch 256": phases256})
    throughput_curve(ax, sweep_frame)
    mfu_curve(ax, mfu.with_utilisation(sweep_frame, flops_per_sample, measured_peak=peak))
    projector()                         # big type and thick lines from here on, for a classroom
    overlapping_text(fig)               # the texts that a figure draws over each other, as words
                                        # (these two are course.legible's, re-exported)

Colours group the phases of a training step the same way in every lab: data
(greys), forward (blues), loss (purple), backward (oranges), the optimizer
(greens), communication (reds).

Used in: lab 1 (01_single_gpu), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt

# The projector and the checks of legibility, re-exported: the demo says plots.projector().
from course.legible import (  # noqa: F401
    PROJECTOR,
    PROJECTOR_WIDTH_PX,
    legends_over_axes,
    overlapping_text,
    projector,
)

# Phase-name prefix -> colour map; the first prefix that matches wins.
_GROUPS = (("read", "Greys"), ("to device", "Greys"), ("forward", "Blues"), ("loss", "Purples"),
           ("backward", "Oranges"), ("optimizer", "Greens"), ("weight", "Greens"),
           ("all", "Reds"), ("comm", "Reds"))
_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}


def phase_colours(phases: list[str]) -> dict[str, tuple]:
    """A colour per phase: one hue per group, shades within a group."""
    by_group: dict[str, list[str]] = {}
    for phase in phases:
        cmap = next((c for prefix, c in _GROUPS if phase.startswith(prefix)), "Greys")
        by_group.setdefault(cmap, []).append(phase)
    colours = {}
    for cmap, members in by_group.items():
        shades = plt.get_cmap(cmap)
        for i, phase in enumerate(members):
            colours[phase] = shades(0.75 - 0.45 * i / max(len(members) - 1, 1))
    return colours


def phase_bars(ax, steps: Mapping[str, Mapping[str, float]], *, unit: str = "ms",
               title: str | None = None, legend: bool = True):
    """One stacked bar per step: how its time (in seconds) splits into phases.

    steps: bar label -> {phase: seconds}. Phases stack in the order they first
    appear, bottom to top: the order in which a step runs them.
    """
    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {list(_UNITS)}, got {unit!r}")
    phases = list(dict.fromkeys(p for step in steps.values() for p in step))
    colours = phase_colours(phases)
    labels = list(steps)
    bottoms = [0.0] * len(labels)
    for phase in phases:
        heights = [steps[label].get(phase, 0.0) * _UNITS[unit] for label in labels]
        ax.bar(labels, heights, bottom=bottoms, color=colours[phase], label=phase,
               edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel(f"time per step ({unit})")
    if title:
        ax.set_title(title)
    if legend:
        # Reversed, so the legend reads top to bottom like the stack.
        handles, names = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.01, 1),
                  fontsize="small", frameon=False)
    return ax


def _batch_size_axes(ax, batch_sizes, small: int, ylabel: str, title: str | None):
    """The axes of a curve against batch size: log2 x ticked at each batch, `small` dotted, y from 0."""
    ax.axvline(small, linestyle=":", color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(batch_sizes), [str(b) for b in batch_sizes], fontsize="small")
    ax.minorticks_off()
    ax.set_xlabel("batch size (samples per step)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title)
    ax.legend(fontsize="small", frameon=False)
    return ax


def throughput_curve(ax, frame, *, title: str | None = None, tile: int = 32, small: int = 64):
    """Samples per second against batch size, with its min-max band.

    Filled markers are multiples of `tile`, hollow ones are not, so that the
    sources' tile rule (batches off the multiples of 32 waste a GPU) can be
    read off the curve, held or not; the dotted line marks `small`, below
    which the sources say a GPU is wasted.
    """
    frame = frame.sort_values("batch_size")
    x = frame["batch_size"]
    ax.fill_between(x, frame["samples_per_s_min"], frame["samples_per_s_max"], color="#9ecae1", alpha=0.5,
                    label="min-max over steps")
    ax.plot(x, frame["samples_per_s"], "-", color="#08519c")
    aligned = frame[frame["batch_size"] % tile == 0]
    other = frame[frame["batch_size"] % tile != 0]
    ax.plot(aligned["batch_size"], aligned["samples_per_s"], "o", color="#08519c",
            label=f"multiple of {tile}")
    if len(other):
        ax.plot(other["batch_size"], other["samples_per_s"], "o", mfc="white", color="#08519c",
                label=f"not a multiple of {tile}")
    return _batch_size_axes(ax, x, small, "samples per second", title)


def mfu_curve(ax, frame, *, title: str | None = None, peak_label: str = "the measured peak", small: int = 64,
              measured_label: str = "of the measured matmul peak", colour: str = "#a63603"):
    """Utilisation against batch size, in percent of a peak. `frame` is a sweep with an `mfu` column,
    drawn solid and labelled MFU against `peak_label`, an `of_measured_peak` column, drawn dashed and
    labelled `measured_label`, or both (course.mfu.with_utilisation). Call it once a sweep, each in its
    own colour, to draw several on one axes."""
    ratios = [(column, style, label) for column, style, label in
              (("mfu", "o-", f"MFU against {peak_label}"), ("of_measured_peak", "s--", measured_label))
              if column in frame]
    if not ratios:
        raise ValueError(f"frame has no mfu or of_measured_peak column (columns {list(frame.columns)}): add them "
                         "with course.mfu.with_utilisation (course.mfu.with_mfu adds mfu alone)")
    frame = frame.sort_values("batch_size")
    x = frame["batch_size"]
    for column, style, label in ratios:
        ax.plot(x, frame[column] * 100, style, color=colour, mfc=colour if style == "o-" else "white", label=label)
    return _batch_size_axes(ax, x, small, "model FLOPs utilisation (% of peak)", title)


def bytes_bars(ax, schemes, sent: Mapping[str, float], seconds: Mapping[str, float], colours: Mapping[str, str],
               measured: Mapping[str, float] | None = None) -> None:
    """Bars of the bytes one rank sends per step, one per scheme, each labelled in MB and ms;
    `measured` bytes (by scheme) as black dots. Unknown schemes in `measured` are refused."""
    ax.bar(schemes, [sent[s] / 1e6 for s in schemes], color=[colours[s] for s in schemes])
    for x, scheme in enumerate(schemes):
        ax.text(x, sent[scheme] / 1e6, f"{sent[scheme] / 1e6:.3g} MB\n{seconds[scheme] * 1e3:.3g} ms",
                ha="center", va="bottom", fontsize="small")
    for scheme, value in (measured or {}).items():
        if scheme not in schemes:
            raise ValueError(f"measured bytes for {scheme!r}: schemes are {tuple(schemes)}")
        ax.plot([list(schemes).index(scheme)], [value / 1e6], "o", color="black", zorder=3,
                label="measured" if scheme == next(iter(measured)) else None)
    ax.set_ylabel("MB sent per rank per step")


def bytes_against(ax, at: float, at_label: str, xlabel: str, title: str) -> None:
    """The log-log axes of bytes sent against a size (batch, tokens), with this run's size marked by a
    dotted line: what the split views draw beside their bars."""
    ax.axvline(at, color="grey", linestyle=":", linewidth=1, label=at_label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("MB sent per rank per step")
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", frameon=False)


def message_figure(message) -> plt.Figure:
    """A figure that says `message` in words: what a view draws for settings it cannot draw."""
    fig, ax = plt.subplots(figsize=(12, 1.5))
    ax.text(0.5, 0.5, str(message), ha="center", va="center", wrap=True)
    ax.axis("off")
    return fig
