"""course.widgets: the sliders a view builds keep the run's settings when a browser renders them.

A browser's slider (noUiSlider, under ipywidgets) snaps its value to min + k * step as it
renders and sends the snapped value back: lab 3's block ran at a width of 96 and a batch of
12, which a grid of 64 from 64 and of 8 from 8 turned into 128 and 16, so the view showed
"cannot split" and lost the run's measured dots, without anyone moving a thing.
"""
from __future__ import annotations

import itertools

import ipywidgets
import pytest

from course import block_view, schedule_view, split_view, transfer_view, widgets


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


def _controls_of(view, monkeypatch, **start) -> dict:
    built = {}
    monkeypatch.setattr(widgets, "interactive_figure",
                        lambda draw, controls, describe: built.update(controls))
    view.show(**start)
    return built


# Each view at settings off its sliders' usual grids: lab 3's block (width 96, batch 12), and others like it.
OFF_GRID = [
    (block_view, {"batch": 12, "sequence": 24, "width": 96, "heads": 12, "gpus": 3}),
    (split_view, {"inputs": 256, "outputs": 130, "batch": 12, "gpus": 3}),
    (transfer_view, {"width": 96, "depth": 2, "batch": 12, "gpus": 3}),
    (schedule_view, {"stages": 1, "micro_batches": 80}),
]


@pytest.mark.parametrize(("view", "start"), OFF_GRID, ids=[view.__name__ for view, _ in OFF_GRID])
def test_every_slider_of_a_view_shows_the_runs_setting_unchanged_in_a_browser(view, start, monkeypatch):
    controls = _controls_of(view, monkeypatch, **start)
    sliders = {name: c for name, c in controls.items() if isinstance(c, ipywidgets.IntSlider)}
    assert set(start) <= set(controls)
    for name, slider in sliders.items():
        assert snapped(slider) == slider.value, f"{view.__name__}: the {name} slider would snap"
    for name, value in start.items():
        assert controls[name].value == value, f"{view.__name__}: {name} starts at {controls[name].value}"
