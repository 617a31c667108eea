"""Covers: course.widgets.

course.widgets: the sliders keep the run's settings when a browser renders them, and
interactive_figure's promises: a static figure always, live controls only with a front end and
never under nbgrader or when static, and the numbers under the figure following the controls.

A browser's slider (noUiSlider, under ipywidgets) snaps its value to min + k * step as it
renders and sends the snapped value back: lab 3's block ran at a width of 96 and a batch of
12, which a grid of 64 from 64 and of 8 from 8 turned into 128 and 16, so the view showed
"cannot split" and lost the run's measured dots, without anyone moving a thing.
tests/test_views.py holds every view's sliders to this.
"""
from __future__ import annotations

import itertools

import ipywidgets
import matplotlib.pyplot as plt
import pytest

from course import widgets


@pytest.fixture
def shown(monkeypatch):
    """What the helper displays: a list of ("display" | "update", object)."""
    events = []

    class Handle:
        def update(self, obj):
            events.append(("update", obj))

    def fake_display(obj, display_id=False):
        events.append(("display", obj))
        return Handle() if display_id else None

    monkeypatch.setattr(widgets, "display", fake_display)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    return events


def snapped(slider: ipywidgets.IntSlider) -> int:
    """The value a browser shows for `slider`: its value on the grid min + k * step, within min..max."""
    steps = round((slider.value - slider.min) / slider.step)
    return max(slider.min, min(slider.max, slider.min + steps * slider.step))


@pytest.mark.parametrize(("value", "low", "high", "step"),
                         [*itertools.product([1, 3, 12, 96, 130, 9000], [1, 8, 64, 100], [16, 8000], [1, 8, 64, 100])])
def test_a_slider_holds_its_value_on_its_grid_and_keeps_its_step(value, low, high, step):
    slider = widgets.int_slider(value, low=low, high=high, step=step, description="x")
    assert slider.value == value and snapped(slider) == value
    assert slider.step == step
    assert 1 <= slider.min <= value <= slider.max
    assert (slider.max - slider.min) % step == 0
    assert slider.min > low - step or slider.min == value       # below `low` by less than a step, or at the value
    assert slider.max > max(high, value) - step


def test_a_value_already_on_the_grid_keeps_the_asked_range():
    slider = widgets.int_slider(128, low=64, high=8192, step=64, description="width")
    assert (slider.min, slider.max, slider.step) == (64, 8192, 64)


def test_controls_redraw_the_figure_in_place(shown):
    calls = []

    def draw(n):
        calls.append(n)
        return plt.figure()

    slider = ipywidgets.IntSlider(2, min=1, max=8)
    handle, box = widgets.interactive_figure(draw, {"n": slider})
    assert box is not None and calls == [2]
    slider.value = 5
    assert calls == [2, 5]
    assert [kind for kind, _ in shown] == ["display", "display", "update"]  # figure, controls, redraw


def test_a_shown_view_left_as_a_cells_value_displays_nothing_more(shown):
    from IPython.core.formatters import DisplayFormatter

    result = widgets.interactive_figure(lambda n: plt.figure(), {"n": ipywidgets.IntSlider(2)})
    handle, box = result                            # still a pair
    assert isinstance(box, ipywidgets.VBox)
    assert DisplayFormatter().format(result) == ({}, {})   # no "(<DisplayHandle ...>, VBox(...))" under the cell
    plt.close("all")


def test_the_numbers_under_the_figure_follow_the_controls(shown):
    slider = ipywidgets.IntSlider(2, min=1, max=8)
    widgets.interactive_figure(lambda n: plt.figure(), {"n": slider}, describe=lambda n: f"**n** is {n}")
    slider.value = 5
    assert [(kind, type(obj).__name__) for kind, obj in shown] == [
        ("display", "Figure"), ("display", "Markdown"), ("display", "VBox"),
        ("update", "Figure"), ("update", "Markdown")]
    assert [obj.data for _, obj in shown if isinstance(obj, widgets.Markdown)] == ["**n** is 2", "**n** is 5"]
    plt.close("all")


@pytest.mark.parametrize("grading, static", [(True, False), (False, True)])
def test_no_controls_under_nbgrader_or_when_static(shown, monkeypatch, grading, static):
    if grading:
        monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    calls = []
    handle, box = widgets.interactive_figure(lambda n: calls.append(n) or plt.figure(),
                                             {"n": ipywidgets.IntSlider(3)}, static=static)
    assert box is None and calls == [3]
    assert [kind for kind, _ in shown] == ["display"]  # the figure, still shown
    plt.close("all")
