"""The course's recurring pictures, drawn on a matplotlib Axes you pass in.

    phase_bars(ax, {"batch 32": phases32, "batch 256": phases256})
    throughput_curve(ax, sweep_frame)
    mfu_curve(ax, mfu.with_utilisation(sweep_frame, flops_per_sample, measured_peak=peak))
    projector()                         # big type and thick lines from here on, for a classroom
    overlapping_text(fig)               # the texts that a figure draws over each other, as words

Colours group the phases of a training step the same way in every lab: data
(greys), forward (blues), loss (purple), backward (oranges), the optimizer
(greens), communication (reds).

Used in: lab 1 (01_single_gpu), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.text import Text

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


#: What `projector` changes: type readable from the back of a room, lines visible on a washed-out
#: screen, figures that fill a wide output area, and enough pixels for them where they are saved.
PROJECTOR = {"font.size": 17, "axes.titlesize": 19, "axes.labelsize": 17, "xtick.labelsize": 15,
             "ytick.labelsize": 15, "legend.fontsize": 15, "figure.titlesize": 19,
             "lines.linewidth": 3.0, "lines.markersize": 9.0, "axes.linewidth": 1.4,
             "figure.figsize": (12.0, 6.0), "figure.dpi": 110.0, "savefig.dpi": "figure"}
#: The width, in CSS pixels, of a notebook's output area in the demo's instructor mode (`make demo`:
#: the file browser folded away) on a 1024×768 projector, measured in Chromium (tests/test_demo.py).
#: `projector` shows every figure drawn at this width, so the browser shows it pixel for pixel: a wider
#: picture would be shrunk, its type with it, and blurred.
PROJECTOR_WIDTH_PX = 840


def _png_at_width(width_px: int):
    """IPython's PNG formatter for a figure: drawn at the dpi that makes it width_px wide."""
    def png(fig) -> bytes:
        import io
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=width_px / fig.get_figwidth())
        return buffer.getvalue()
    return png


def _load_backend() -> None:
    """Import matplotlib's backend module now (pyplot does so at the first figure): the inline
    backend chooses IPython's figure formats as it is imported."""
    import importlib

    backend = str(mpl.rcParams["backend"])
    module = {"inline": "matplotlib_inline.backend_inline"}.get(backend, backend.removeprefix("module://"))
    if backend == "inline" or backend.startswith("module://"):
        importlib.import_module(module)


class projector:
    """Set matplotlib up for a projector (`PROJECTOR`, then `rc`: more rcParams) now, and in IPython
    show each figure drawn `width_px` wide (`PROJECTOR_WIDTH_PX`: the demo's output area).

    Called on its own (`plots.projector()`, the live demo's first cell), the settings stay
    for the session; as a context manager (`with plots.projector(): ...`), the previous
    values come back at the end of the block.
    """

    def __init__(self, rc: Mapping | None = None, width_px: int = PROJECTOR_WIDTH_PX):
        settings = {**PROJECTOR, **(rc or {})}
        self.saved = {name: mpl.rcParams[name] for name in settings}   # KeyError for a name matplotlib lacks
        mpl.rcParams.update(settings)
        self.formatter = self.shown_before = None
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is not None:
            from matplotlib.figure import Figure
            _load_backend()      # it sets its own formatter as it loads: before ours, not over it
            self.formatter = shell.display_formatter.formatters["image/png"]
            self.shown_before = self.formatter.for_type(Figure, _png_at_width(width_px))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        mpl.rcParams.update(self.saved)
        if self.formatter is not None:
            from matplotlib.figure import Figure
            if self.shown_before is None:
                self.formatter.pop(Figure, None)
            else:
                self.formatter.for_type(Figure, self.shown_before)
        return False


def _drawn_texts(canvas) -> list[Text]:
    """The texts a draw of the canvas puts on it: visible, not empty, and drawn (a tick label
    beyond an axis' limits, or a text of a hidden artist, is not)."""
    drawn, draw = [], Text.draw

    def recording(text, renderer):
        draw(text, renderer)
        if text.get_visible() and text.get_text().strip():
            drawn.append(text)

    Text.draw = recording
    try:
        canvas.draw()
    finally:
        Text.draw = draw
    return drawn


def _corners(text: Text, renderer) -> np.ndarray:
    """The four corners, in pixels, of the box a text's letters fill, turned as the text is turned.
    (Its window extent is the upright box around a turned text: too big to compare.)"""
    box = text.get_window_extent(renderer)
    angle = text.get_rotation()
    if angle % 90 == 0:
        return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])
    text.set_rotation(0)
    try:
        width, height = text.get_window_extent(renderer).size
    finally:
        text.set_rotation(angle)
    a = math.radians(angle)
    along, across = np.array([math.cos(a), math.sin(a)]), np.array([-math.sin(a), math.cos(a)])
    centre = np.array([(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2])
    return np.array([centre + sx * width / 2 * along + sy * height / 2 * across
                     for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1))])


def _overlap(a: np.ndarray, b: np.ndarray, slack: float) -> bool:
    """Whether two convex quadrilaterals overlap by more than `slack` pixels along every edge's normal."""
    for quad in (a, b):
        for i in range(4):
            edge = quad[(i + 1) % 4] - quad[i]
            normal = np.array([-edge[1], edge[0]]) / (np.hypot(*edge) or 1.0)
            pa, pb = a @ normal, b @ normal
            if min(pa.max(), pb.max()) - max(pa.min(), pb.min()) <= slack:
                return False   # a gap (or less than slack of overlap) along this axis: apart
    return True


@contextlib.contextmanager
def _drawn_with_agg(fig):
    """fig's canvas, Agg (as the inline backend and savefig render it), also once fig is closed (a closed
    figure's canvas draws nothing); fig keeps its own canvas afterwards."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    shown = fig.canvas
    try:
        yield shown if isinstance(shown, FigureCanvasAgg) else FigureCanvasAgg(fig)
    finally:
        fig.set_canvas(shown)


def overlapping_text(fig, slack_px: float = 1.0) -> list[str]:
    """Each pair of texts that fig draws over each other (their boxes overlap by more than
    `slack_px` pixels each way), as "'one' over 'other'": what large type does to a crowded
    figure, and what no one at the back of a room can read. Draws fig at its dpi, with Agg (as the
    inline backend and savefig render it), also once it is closed."""
    with _drawn_with_agg(fig) as canvas:
        texts = _drawn_texts(canvas)
        renderer = canvas.get_renderer()
        quads = [_corners(t, renderer) for t in texts]
    return [f"{texts[i].get_text()!r} over {texts[j].get_text()!r}"
            for i in range(len(texts)) for j in range(i + 1, len(texts))
            if _overlap(quads[i], quads[j], slack_px)]


def legends_over_axes(fig) -> list[str]:
    """Each legend of the figure's own (fig.legend) drawn over a panel, as "legend over panel 'title'":
    a figure's legend belongs beside its panels, where no bar or line can be under it (a panel's own
    legend, placed inside it, is matplotlib's to keep clear). Draws fig as overlapping_text does."""
    with _drawn_with_agg(fig) as canvas:
        canvas.draw()
        renderer = canvas.get_renderer()
        return [f"legend over panel {ax.get_title()!r}" for legend in fig.legends for ax in fig.axes
                if ax.get_visible() and ax.axison and legend.get_window_extent(renderer).overlaps(ax.bbox)]


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
