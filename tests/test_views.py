"""Covers: the views.

The contracts every view keeps, over every course/*_view.py module: found, not listed.

- Bad settings are refused with an error that says what is allowed: each menu of names
  refuses a name it does not offer, naming the setting and listing what it offers; the
  settings in the view's case (numbers, measured runs) are refused in their own words.
- Under nbgrader a view is its figure and its numbers, drawn once at the run's settings
  with the run's measured numbers, and no controls: nobody is there to move them.
- Every slider shows the run's setting unchanged in a browser: a run off the sliders'
  usual grids starts every control at its value, on a grid a browser keeps
  (tests/test_widgets.py says why: lab 3's width of 96 became 128).

A view module with no case in CASES fails here, with a message saying to add one. What only
one view does is tested in its own tests/test_<view>.py.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass

import ipywidgets
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure
from test_widgets import snapped

import course
from course import choosing, pipeline, widgets
from course.grid_model import Grid
from course.sizes import Dense
from course.timeline import Span

VIEWS = sorted(module.name for module in pkgutil.iter_modules(course.__path__) if module.name.endswith("_view"))


@dataclass(frozen=True)
class Case:
    """How to build one view for the contracts."""
    off_grid: dict        # show()'s settings for a run off its sliders' usual grids
    bad: tuple            # (settings, words): draw(**settings) raises a ValueError whose message matches words
    graded: dict          # show()'s arguments for a run under nbgrader: its measured numbers and its settings
    graded_says: str      # words of the numbers shown under the static figure


def _spans(schedule: str, stages: int, micro_batches: int) -> list[Span]:
    """A run's spans, one per slot of the predicted grid, named as the lab names them (a forward: 1 ms)."""
    return [Span(s.stage, f"{'forward' if s.action == 'F' else 'backward'} {s.micro_batch}", s.start / 1e3,
                 s.end / 1e3) for s in pipeline.grid(schedule, stages, micro_batches)]


# Lab 5's MLP, whose 301,066 parameters the static memory view names.
LAB5_LAYERS = [Dense("layer1", 64, 512), Dense("layer2", 512, 512), Dense("output", 512, 10)]

# How to build each view for the contracts, by module name: a new view needs its entry here.
CASES = {
    "block_view": Case(
        off_grid={"batch": 12, "sequence": 24, "width": 96, "heads": 12, "gpus": 3},
        bad=(({"gpus": 1}, "with 1 GPU nothing is split or sent: choose at least 2 GPUs"),),
        graded={"measured": {"Megatron split": 32_768}, "batch": 8, "sequence": 16, "width": 64, "heads": 8,
                "gpus": 2, "dtype": "float32"},
        graded_says="rank 1 owns heads 4-7"),
    "choosing_view": Case(
        off_grid={"model": choosing.LAB_MLP, "cluster": choosing.LOCAL, "nodes": 3, "batch": 100},
        bad=(({"nodes": 0}, "got nodes=0"),
             ({"model": choosing.LAB_MLP, "cluster": choosing.LOCAL, "nodes": 1,
               "measured": [{"lab": 2, "ranks": 2, "sent": 1}]}, "keys lab, scheme, ranks, sent")),
        graded={"measured": [{"lab": 2, "scheme": "ring all-reduce", "ranks": 2, "sent": 119_080, "seconds": 0.002},
                             {"lab": 5, "scheme": "ZeRO-3", "ranks": 2, "sent": 178_620}],
                "model": choosing.LAB_MLP, "cluster": choosing.LOCAL, "nodes": 1},
        graded_says="the labs' MLP"),
    "experts_view": Case(
        off_grid={"experts": 6, "top_k": 3, "ranks": 5},
        bad=(({"ranks": 0}, "ranks must be from 1 to the 8 experts"),
             ({"measured": [{"scheme": "ZeRO-3", "tokens": 64, "bytes": 1}]}, "keys scheme"),
             ({"model": "GPT-3"}, "model must be one of")),
        graded={"measured": [{"scheme": "expert parallel", "tokens": 64, "bytes": 16_512}],
                "experts": 4, "top_k": 2, "ranks": 2},
        graded_says="up to 48 tokens a rank"),
    "hybrid_view": Case(
        off_grid={"batch": 12, "gpus": 2},
        bad=(({"gpus": 3}, "power of two"),),
        graded={"measured": {Grid(2, 1): {"step": 1e-3, "sent": 1}}, "gpus": 2},
        graded_says="fastest grid of up to 2 GPUs"),
    "memory_view": Case(
        off_grid={"parameters": 301_066, "ranks": 3, "precision": "fp32", "optimizer": "adam"},
        bad=(({"measured": [{"scheme": "ZeRO-4", "ranks": 64, "memory": 1, "sent": 1}]}, "scheme must be one of"),
             ({"measured": [{"scheme": "ZeRO-3", "ranks": 64}]}, "keys scheme, ranks, memory"),
             ({"ranks": 0}, "at least 1, got ranks=0")),
        graded={"measured": [{"scheme": "ZeRO-3", "ranks": 2, "memory": 2_000_000, "sent": 1_800_000}],
                "layers": LAB5_LAYERS, "batch": 64, "parameters": sum(layer.weights for layer in LAB5_LAYERS),
                "precision": "fp32", "optimizer": "adam", "ranks": 2, "gpu": "NVIDIA V100 (32 GB)"},
        graded_says="301 thousand parameters"),
    "schedule_view": Case(
        off_grid={"stages": 1, "micro_batches": 80},
        bad=(({"stages": 0}, "at least 1, got stages=0"),
             ({"micro_batches": 0}, "at least 1, got micro_batches=0"),
             ({"measured": []}, "named 'forward i' or 'backward i'")),
        graded={"measured": {"schedule": "gpipe", "stages": 2, "micro_batches": 2, "spans": _spans("gpipe", 2, 2)}},
        graded_says="**gpipe, 2 stages, 2 micro-batches:**"),
    "sequence_view": Case(
        off_grid={"model": "the lab's block (64 wide, 4 heads, float32)", "tp": 3, "context": 5},
        bad=(({"context": 0}, "at least 1, got context=0"),
             ({"measured": {"held": [{"sequence": 64, "bytes": 1}]}}, "keys bytes, scheme, sequence")),
        graded={"measured": {"held": [{"sequence": 64, "scheme": "none", "bytes": 420_864}],
                             "sent": [{"sequence": 1024, "bytes": 1_048_576}]},
                "model": "the lab's block (64 wide, 4 heads, float32)", "tp": 2, "context": 2},
        graded_says="the lab's block"),
    "split_view": Case(
        off_grid={"inputs": 256, "outputs": 130, "batch": 12, "gpus": 3},
        bad=(({"gpus": 1}, "at least 2 GPUs"), ({"measured": {"tree": 1}}, "schemes are")),
        graded={"measured": {"split by row": 512_000}, "gpus": 2},
        graded_says="Cheapest: **split by row**"),
    "transfer_view": Case(
        off_grid={"width": 96, "depth": 2, "batch": 12, "gpus": 3},
        bad=(({"width": 0}, "must be positive"), ({"measured": {"tree": 1}}, "schemes are")),
        graded={"measured": {"ring": 1.0}, "gpus": 2},
        graded_says="**2 GPUs, float32:**"),
}

def case_of(name: str) -> Case:
    if name not in CASES:
        pytest.fail(f"course.{name} is a view with no case: add CASES[{name!r}] in tests/test_views.py "
                    "(how to build it for the contracts every view keeps)")
    return CASES[name]


def _view(name: str):
    return importlib.import_module(f"course.{name}")


def _controls(view, monkeypatch, **start) -> dict:
    """The controls view.show(**start) builds, by keyword, with nothing displayed."""
    built = {}
    monkeypatch.setattr(widgets, "interactive_figure", lambda draw, controls, describe: built.update(controls))
    view.show(**start)
    return built


def _refusal(view, settings) -> str | None:
    """The message of the ValueError view.draw(**settings) raises, or None if it draws."""
    try:
        view.draw(**settings)
    except ValueError as error:
        return str(error)
    finally:
        plt.close("all")
    return None


def test_every_view_found_has_a_case_and_every_case_a_view():
    assert len(VIEWS) >= 7, VIEWS                  # found: the seven views of labs 2 to 6, and any new one
    assert set(VIEWS) - set(CASES) == set(), "add a case in CASES for each of these views"
    assert set(CASES) - set(VIEWS) == set(), "these cases name no course/*_view.py module: delete them"


@pytest.mark.parametrize("name", VIEWS)
def test_bad_settings_say_what_is_allowed(name):
    view, case = _view(name), case_of(name)
    assert case.bad, f"give {name} at least one bad setting in CASES"
    for settings, words in case.bad:
        message = _refusal(view, settings)
        assert message is not None, f"{name}.draw(**{settings}) drew a figure"
        assert re.search(words, message), f"{name}.draw(**{settings}): {message!r} does not say {words!r}"


@pytest.mark.parametrize("name", VIEWS)
def test_every_menu_of_names_refuses_one_it_does_not_offer_and_lists_those_it_does(name, monkeypatch):
    view = _view(name)
    case_of(name)
    menus = {setting: list(control.options) for setting, control in _controls(view, monkeypatch).items()
             if isinstance(control, ipywidgets.Dropdown) and all(isinstance(o, str) for o in control.options)}
    for setting, offered in menus.items():
        message = _refusal(view, {setting: f"no such {setting}"})
        assert message is not None, f"{name}.draw({setting}='no such {setting}') drew a figure"
        assert f"{setting} must be one of" in message, message
        assert [option for option in offered if option not in message] == [], message


@pytest.mark.parametrize("name", VIEWS)
def test_under_nbgrader_a_view_is_its_figure_and_numbers_at_the_run_and_no_controls(name, monkeypatch):
    view, case = _view(name), case_of(name)
    shown, drawn = [], []
    draw = view.draw

    def drawing(**settings):
        drawn.append((settings, draw(**settings)))
        return drawn[-1][1]

    monkeypatch.setattr(view, "draw", drawing)
    monkeypatch.setattr(widgets, "display", lambda obj, display_id=False: shown.append(obj) or "handle")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert view.show(**case.graded) == ("handle", None)            # no box of controls
    figure, numbers = shown                                         # the figure and its numbers, nothing more
    ((settings, drawn_figure),) = drawn                             # drawn once
    assert figure is drawn_figure and isinstance(figure, Figure) and isinstance(numbers, widgets.Markdown)
    assert settings["measured"] is not None, f"{name}: the run's measured numbers are not in its static figure"
    run = {k: v for k, v in case.graded.items() if k in settings and k != "measured"}
    assert {k: settings[k] for k in run} == run
    assert case.graded_says in numbers.data, numbers.data
    plt.close("all")


@pytest.mark.parametrize("name", VIEWS)
def test_every_slider_of_a_view_shows_the_runs_setting_unchanged_in_a_browser(name, monkeypatch):
    case = case_of(name)
    controls = _controls(_view(name), monkeypatch, **case.off_grid)
    assert set(case.off_grid) <= set(controls)
    for setting, control in controls.items():
        if isinstance(control, ipywidgets.IntSlider):
            assert snapped(control) == control.value, f"{name}: the {setting} slider would snap"
    for setting, value in case.off_grid.items():
        assert controls[setting].value == value, f"{name}: {setting} starts at {controls[setting].value}"
