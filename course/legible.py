"""Figures legible from the back of a room: the projector's settings (large type, thick lines,
figures as wide as the demo's output area), and the checks that a figure draws no text over text
and no legend over a panel, which large type is the first to break.

    with projector():                   # or projector() alone: for the session
        fig = view.draw(...)
    assert overlapping_text(fig) == [] and legends_over_axes(fig) == []

course.plots re-exports every name here: the demo says `plots.projector()`.

Used by: course.plots.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

import matplotlib as mpl
import numpy as np
from matplotlib.text import Text

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
