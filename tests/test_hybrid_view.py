"""Covers: course.hybrid_view.

The view of lab 4: every data x model grid of the GPUs, its step time and its bytes.

Bars are read back from the figure and checked against course.grid_model; a grid
the model cannot run is said in words; measured dots sit on their grid's row; the
paper's crosses appear only at the paper's settings; measured numbers only beside
the settings they were measured at.
The contracts every view keeps (bad settings, nbgrader, sliders) are in tests/test_views.py.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from course import grid_model, hybrid_view, timemodel, widgets
from course.grid_model import Grid

PAPER = {"model": hybrid_view.KRIZHEVSKY_2012, "batch": grid_model.PAPER_BATCH, "scheme": "paper",
         "processor": timemodel.TITAN.name}


def _rows(ax) -> dict[int, list]:
    """Row -> its bars' (left, width), left to right."""
    rows = {}
    for patch in ax.patches:
        y = round(patch.get_y() + patch.get_height() / 2)
        rows.setdefault(y, []).append((patch.get_x(), patch.get_width()))
    return {y: sorted(bars) for y, bars in rows.items()}


def _line(ax, label):
    return [line for line in ax.lines if line.get_label() == label]


def _notes(ax) -> dict[int, str]:
    return {round(t.get_position()[1]): t.get_text() for t in ax.texts if "cannot run" in t.get_text()}


def test_configurations_are_every_grid_by_ranks_then_data():
    def grids(gpus):
        return [(g.data, g.model) for g in hybrid_view.configurations(gpus)]
    assert grids(1) == [(1, 1)]
    assert grids(2) == [(1, 1), (2, 1), (1, 2)]
    assert grids(4) == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4)]
    assert grids(8) == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4), (8, 1), (4, 2), (2, 4), (1, 8)]
    assert len(hybrid_view.configurations(16)) == 15


@pytest.mark.parametrize("gpus", [0, 3, 6, 32, -4])
def test_gpus_must_be_a_power_of_two_up_to_16(gpus):
    with pytest.raises(ValueError, match="power of two from 1 to 16"):
        hybrid_view.configurations(gpus)


def test_bars_are_the_time_models_step_and_bytes():
    fig = hybrid_view.draw(batch=128, gpus=4, dtype="float16", link=timemodel.NVLINK2.name)
    assert len(fig.axes) == 2
    time_ax, sent_ax = fig.axes
    layers, grids = grid_model.convnet_layers(), hybrid_view.configurations(4)
    times, sent = _rows(time_ax), _rows(sent_ax)
    assert sorted(times) == sorted(sent) == list(range(len(grids)))
    one = grid_model.step(layers, Grid(1, 1), 128, timemodel.TITAN, timemodel.NVLINK2, "lab", "float16")["step"]
    for y, grid in enumerate(grids):       # NVLink: NCCL's reduce-scatter for the hand-over's backward
        step = grid_model.step(layers, grid, 128, timemodel.TITAN, timemodel.NVLINK2, "lab", "float16", "nccl")
        (c_left, compute), (m_left, communication) = times[y]          # two bars per grid: stacked
        assert (c_left, compute) == pytest.approx((0, step["compute"] * 1e3))
        assert (m_left, communication) == pytest.approx((step["compute"] * 1e3, step["communication"] * 1e3))
        assert sent[y] == [(0, pytest.approx(step["sent"] / 1e6))]    # one bar per grid
        (step_column,) = time_ax.child_axes       # the step times, right of the bars
        (label,) = [t.get_text() for t, at in zip(step_column.get_yticklabels(), step_column.get_yticks()) if at == y]
        assert label.endswith(f"×{one / step['step']:.2f}")
    assert [t.get_text() for t in time_ax.get_yticklabels()] == [str(g) for g in grids]
    title = fig._suptitle.get_text()
    for words in (hybrid_view.LAB_CONVNET, "batch 128", timemodel.TITAN.name, timemodel.NVLINK2.name, "lab"):
        assert words in title
    assert "as nccl runs them" in sent_ax.get_title()
    plt.close(fig)


def test_on_local_gloo_the_hand_over_backward_is_an_all_reduce():
    fig = hybrid_view.draw(batch=256, gpus=4, link=timemodel.LOCAL_GLOO.name)
    layers, grids = grid_model.convnet_layers(), hybrid_view.configurations(4)
    sent = _rows(fig.axes[1])
    y = grids.index(Grid(2, 2))
    gloo = grid_model.step(layers, Grid(2, 2), 256, timemodel.TITAN, timemodel.LOCAL_GLOO, backend="gloo")
    assert gloo["sent"] == 561_064                  # tests/test_grid_model.py counts it by hand
    assert sent[y] == [(0, pytest.approx(gloo["sent"] / 1e6))]
    assert "as gloo runs them" in fig.axes[1].get_title()
    assert hybrid_view.backend_of(timemodel.LOCAL_GLOO.name) == "gloo"
    assert hybrid_view.backend_of(timemodel.PCIE3_X16.name) == "nccl"
    plt.close(fig)


def test_the_titan_without_its_full_batch_is_a_processor_of_the_menu():
    eager = grid_model.TITAN_NO_FULL_BATCH
    settings = {**PAPER, "processor": eager.name}
    fig = hybrid_view.draw(gpus=4, **settings)
    grids = hybrid_view.configurations(4)
    times = _rows(fig.axes[0])
    for grid in (Grid(4, 1), Grid(2, 1)):
        step = grid_model.step(grid_model.KRIZHEVSKY, grid, 256, eager, timemodel.PCIE3_X16, "paper")
        assert times[grids.index(grid)][0][1] == pytest.approx(step["compute"] * 1e3)
    # 4 data-parallel TITANs: half of 2's compute without the assumption, the same with it
    dp2, dp4 = times[grids.index(Grid(2, 1))][0][1], times[grids.index(Grid(4, 1))][0][1]
    assert dp4 == pytest.approx(dp2 / 2)
    assumed = _rows(hybrid_view.draw(gpus=4, **PAPER).axes[0])
    assert assumed[grids.index(Grid(4, 1))][0][1] == pytest.approx(assumed[grids.index(Grid(2, 1))][0][1])
    assert _line(fig.axes[0], hybrid_view.PAPER_LABEL)           # the paper's crosses: both TITANs
    assert "no full batch" in hybrid_view.describe(gpus=4, dtype="float32", link=timemodel.PCIE3_X16.name,
                                                  **settings)
    plt.close("all")


def test_a_grid_the_model_cannot_run_is_a_note_in_its_row():
    fig = hybrid_view.draw(batch=6, gpus=4)      # 6 images split over 1 and 2 ranks, not over 4
    time_ax, sent_ax = fig.axes
    notes = _notes(time_ax)
    assert sorted(notes) == [3, 4, 5] and all("split evenly" in n for n in notes.values()), notes
    assert sorted(_rows(time_ax)) == sorted(_rows(sent_ax)) == [0, 1, 2]
    plt.close(fig)
    fig = hybrid_view.draw(model=hybrid_view.KRIZHEVSKY_2012, scheme="paper", gpus=16)
    notes = _notes(fig.axes[0])                  # fc8's 1000 outputs do not split over 16
    assert [str(g) for g in hybrid_view.configurations(16) if g.model == 16] == \
           [fig.axes[0].get_yticklabels()[y].get_text() for y in notes]
    assert all("fc8" in n for n in notes.values())
    plt.close(fig)


def test_measured_dots_sit_on_their_grids_row():
    measured = {Grid(2, 2): {"step": 0.5e-3, "sent": 600_000}, Grid(1, 2): {"step": 0.25e-3, "sent": 800_000},
                Grid(8, 1): {"step": 1.0, "sent": 1}}                   # not on a 4-GPU chart: left out
    fig = hybrid_view.draw(gpus=4, measured=measured)
    (time_dots,), (sent_dots,) = _line(fig.axes[0], "measured"), _line(fig.axes[1], "measured")
    assert list(time_dots.get_ydata()) == list(sent_dots.get_ydata()) == [4, 2]
    assert list(time_dots.get_xdata()) == pytest.approx([0.5, 0.25])
    assert list(sent_dots.get_xdata()) == pytest.approx([0.6, 0.8])
    plt.close(fig)
    fig = hybrid_view.draw(gpus=1, measured=measured)
    assert not _line(fig.axes[0], "measured") and not _line(fig.axes[1], "measured")
    plt.close(fig)


def test_the_papers_speedups_only_at_the_papers_settings():
    fig = hybrid_view.draw(gpus=4, **PAPER)
    (crosses,) = _line(fig.axes[0], hybrid_view.PAPER_LABEL)
    grids = hybrid_view.configurations(4)
    one = grid_model.step(grid_model.KRIZHEVSKY, Grid(1, 1), 256, timemodel.TITAN, timemodel.PCIE3_X16,
                          "paper")["step"]
    assert list(crosses.get_ydata()) == [grids.index(row.grid) for row in grid_model.TABLE_1]
    assert list(crosses.get_xdata()) == pytest.approx([one * 1e3 / row.speedup for row in grid_model.TABLE_1])
    plt.close(fig)
    fig = hybrid_view.draw(gpus=2, **PAPER)      # only the 1- and 2-GPU rows of Table 1
    (crosses,) = _line(fig.axes[0], hybrid_view.PAPER_LABEL)
    assert len(crosses.get_xdata()) == 3
    plt.close(fig)
    for other in ({"batch": 128}, {"scheme": "lab"}, {"processor": timemodel.H100.name},
                  {"model": hybrid_view.LAB_CONVNET}):
        fig = hybrid_view.draw(gpus=4, **{**PAPER, **other})
        assert not _line(fig.axes[0], hybrid_view.PAPER_LABEL), other
        plt.close(fig)


def test_extra_processors_are_looked_up_first():
    cpu = timemodel.Processor("this CPU (measured)", 50e9, 1.0, "a test")
    fig = hybrid_view.draw(gpus=2, processor=cpu.name, processors={cpu.name: cpu})
    step = grid_model.step(grid_model.convnet_layers(), Grid(1, 1), 256, cpu, timemodel.PCIE3_X16)
    assert _rows(fig.axes[0])[0][0][1] == pytest.approx(step["compute"] * 1e3)
    assert cpu.name in fig._suptitle.get_text()
    plt.close(fig)


def test_the_views_numbers_are_one_gpus_step_and_the_fastest_grids():
    text = hybrid_view.describe(model=hybrid_view.KRIZHEVSKY_2012, batch=256, gpus=4, dtype="float32",
                                link=timemodel.PCIE3_X16.name, processor=timemodel.TITAN.name, scheme="paper")
    steps = {grid: grid_model.step(grid_model.KRIZHEVSKY, grid, 256, timemodel.TITAN, timemodel.PCIE3_X16, "paper")
             for grid in hybrid_view.configurations(4)}
    fastest = min(steps, key=lambda grid: steps[grid]["step"])
    assert fastest == Grid(2, 2)                          # the paper's order: the hybrid wins
    assert f"**{fastest}**" in text and f"×{steps[Grid(1, 1)]['step'] / steps[fastest]['step']:.2f}" in text
    assert f"{steps[fastest]['sent'] / 1e6:.3g} MB" in text
    cpu = timemodel.Processor("this CPU (measured)", 50e9, 1.0, "a test")
    assert cpu.name in hybrid_view.describe(model=hybrid_view.LAB_CONVNET, batch=64, gpus=2, dtype="float64",
                                            link=timemodel.LOCAL_GLOO.name, processor=cpu.name, scheme="lab",
                                            processors={cpu.name: cpu})


def test_measured_only_beside_the_settings_they_were_measured_at(monkeypatch):
    seen, built = [], {}
    monkeypatch.setattr(hybrid_view, "draw", lambda measured=None, **v: seen.append((measured, v)) or plt.figure())
    monkeypatch.setattr(widgets, "interactive_figure",
                        lambda draw, controls, describe: built.update(draw=draw, controls=controls))
    cpu = timemodel.Processor("this CPU (measured)", 50e9, 1.0, "a test")
    measured = {Grid(2, 1): {"step": 1e-3, "sent": 1}}
    hybrid_view.show(measured=measured, processors={cpu.name: cpu}, processor=cpu.name, batch=64, gpus=2)
    controls = built["controls"]
    assert list(controls) == ["model", "scheme", "batch", "gpus", "dtype", "link", "processor"]
    assert list(controls["gpus"].options) == [1, 2, 4, 8, 16]
    assert cpu.name in controls["processor"].options and timemodel.TITAN.name in controls["processor"].options
    assert grid_model.TITAN_NO_FULL_BATCH.name in controls["processor"].options
    run = {k: c.value for k, c in controls.items()}
    assert run["processor"] == cpu.name and run["batch"] == 64 and run["gpus"] == 2
    built["draw"](**run)
    built["draw"](**{**run, "gpus": 8})                          # measured per grid: still the run's
    built["draw"](**{**run, "link": timemodel.NVLINK4.name})     # another link: other times
    built["draw"](**{**run, "scheme": "paper"})
    built["draw"](**{**run, "batch": 128})
    assert [m for m, _ in seen] == [measured, measured, None, None, None]
    assert all(v["processors"] == {**hybrid_view.EXTRA_PROCESSORS, cpu.name: cpu} for _, v in seen)
    plt.close("all")
