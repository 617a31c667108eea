"""A figure with controls: static everywhere, live where a front end is attached;
and the plumbing the course's views share.

    interactive_figure(draw, {"gpus": IntSlider(4, 1, 16)}, describe=headline)

A view (`course.transfer_view`, `split_view`, `hybrid_view`) is a module with
three functions: `draw(**settings)` -> Figure, `describe(**settings)` -> one
line of markdown, and `show(measured=None, **start)`, which builds its controls
(its own, then `run_controls`) and hands all three to `show_view`.

`draw(**values)` returns a matplotlib Figure; `describe(**values)`, if given,
the figure's headline numbers as a line of markdown (numbers a reader can
copy, search and read aloud, which pixels are not). Both, for the controls'
starting values, are displayed as ordinary outputs, so they show in headless
runs, in exported HTML and in nbgrader's feedback. Below them come the
controls; in JupyterLab, moving one redraws both in place (display updates).
Without a front end the controls are inert, and under nbgrader they are not
created at all (`course.grading.under_grader`): nobody is there to move them.

`gpus` is the views' word for a number of ranks, counted as hardware; the cost models say `ranks`,
the launcher `world_size` (CONTRIBUTING.md, "Words", says why).

Used in: lab 2 (02_data_parallel).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from course import sizes, timemodel
from course.grading import under_grader

#: Widget style of every control: long descriptions shown whole, not cut.
STYLE = {"description_width": "initial"}


def _render(draw: Callable, values: dict):
    fig = draw(**values)
    plt.close(fig)  # shown through the display below, not again by the inline backend
    return fig


class Shown(NamedTuple):
    """What interactive_figure put on screen: the figure's display handle (its .update
    redraws) and the controls' box, or None. Left as a cell's last value (a view's
    `show(...)` without a semicolon) it adds nothing: it is on screen already."""
    handle: object
    controls: object | None

    def _ipython_display_(self):
        pass


def interactive_figure(draw: Callable, controls: Mapping, *, static: bool = False,
                       describe: Callable[..., str] | None = None):
    """Display draw(**current values) and describe(**current values); with controls unless static or grading.

    controls: keyword -> an ipywidgets value widget (slider, dropdown, ...).
    Returns the figure's display handle and the controls' box, or None, as a Shown.
    """
    values = {name: widget.value for name, widget in controls.items()}
    handle = display(_render(draw, values), display_id=True)
    summary = display(Markdown(describe(**values)), display_id=True) if describe else None
    if static or under_grader() or not controls:
        return Shown(handle, None)
    import ipywidgets

    def redraw(_change):
        current = {name: widget.value for name, widget in controls.items()}
        handle.update(_render(draw, current))
        if summary is not None:
            summary.update(Markdown(describe(**current)))

    for widget in controls.values():
        widget.observe(redraw, names="value")
    box = ipywidgets.VBox(list(controls.values()))
    display(box)
    return Shown(handle, box)


def measured_only_at(draw: Callable, measured, run: Mapping) -> Callable:
    """draw(**values), given `measured` only while the values named in `run` are
    still the run's: measured numbers belong to the settings they were measured at."""
    def draw_with_measured(**current):
        same = all(current[name] == value for name, value in run.items())
        return draw(measured=measured if same else None, **current)
    return draw_with_measured


def int_slider(value: int, *, low: int, high: int, step: int = 1, description: str):
    """An IntSlider from about `low` to `high` in steps of `step`, on a grid that holds `value`.

    A browser's slider snaps its value to min + k * step as it renders, and tells the
    kernel: a run's width of 96 on a grid of 64 from 64 would show, and draw, as 128,
    and the run's measured dots would go. So the grid starts where `value` falls on it
    (below `low` by less than a step, or at a `value` below it; never below 1), and the range widens to take `value`.
    """
    import ipywidgets as w

    start = min(low - (low - value) % step, value)
    if start < 1:
        start += step
    end = start + step * ((max(high, value) - start) // step)
    return w.IntSlider(value, min=start, max=end, step=step, description=description, style=STYLE)


def run_controls(values: Mapping, *, min_gpus: int = 1, gpu_counts: list[int] | None = None,
                 processors: Mapping[str, timemodel.Processor] | None = None,
                 processor_label: str = "GPU") -> dict:
    """The controls every view shares, at `values`: batch, GPUs, dtype, interconnect and GPU.

    gpu_counts: the GPU counts to offer (a selection slider) instead of min_gpus..16;
    processors: extra entries (say, this machine's CPU, measured) for the GPU menu, which
    processor_label then names.
    """
    import ipywidgets as w

    gpus = (w.SelectionSlider(options=list(gpu_counts), value=values["gpus"], description="GPUs", style=STYLE)
            if gpu_counts else
            int_slider(values["gpus"], low=min_gpus, high=16, description="GPUs"))
    return {
        "batch": int_slider(values["batch"], low=8, high=2048, step=8, description="global batch"),
        "gpus": gpus,
        "dtype": w.Dropdown(options=list(sizes.DTYPE_BYTES), value=values["dtype"], description="dtype"),
        "link": w.Dropdown(options=list(timemodel.PRESETS), value=values["link"], description="interconnect",
                           style=STYLE),
        "processor": w.Dropdown(options=list({**timemodel.PROCESSORS, **(processors or {})}),
                                value=values["processor"], description=processor_label, style=STYLE),
    }


def show_view(draw: Callable, describe: Callable[..., str], controls: Mapping, measured, run: Mapping):
    """A view on screen: draw and describe at the controls' values, with `measured` drawn
    only while the settings in `run` (the measured run's) are unchanged."""
    return interactive_figure(measured_only_at(draw, measured, run), controls, describe=describe)
