"""A figure with controls: static everywhere, live where a front end is attached.

    interactive_figure(draw, {"gpus": IntSlider(4, 1, 16)}, describe=headline)

`draw(**values)` returns a matplotlib Figure; `describe(**values)`, if given,
the figure's headline numbers as a line of markdown (numbers a reader can
copy, search and read aloud, which pixels are not). Both, for the controls'
starting values, are displayed as ordinary outputs, so they show in headless
runs, in exported HTML and in nbgrader's feedback. Below them come the
controls; in JupyterLab, moving one redraws both in place (display updates).
Without a front end the controls are inert, and under nbgrader they are not
created at all (`course.grading.under_grader`): nobody is there to move them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from course.grading import under_grader


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
