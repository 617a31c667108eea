"""Covers: course.choosing_view.

The choosing view: one marker per layout, read back from the figure against course.choosing.options;
hollow where a layout does not fit; the star on the fastest that fits; the measured runs only on the
labs' MLP on this machine; describe's numbers are options()'; the activations menu reaches the chooser;
fastest_table's rows are the chooser's.
The contracts every view keeps (bad settings, nbgrader, sliders) are in tests/test_views.py.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PathCollection

from course import choosing, choosing_view, widgets
from course.memory_view import in_units

RUNS = [{"lab": 2, "scheme": "ring all-reduce", "ranks": 2, "sent": 119_080, "seconds": 0.002},
        {"lab": 5, "scheme": "ZeRO-3", "ranks": 2, "sent": 178_620}]
LOCAL = {"model": choosing.LAB_MLP, "cluster": choosing.LOCAL, "nodes": 1}


def _markers(ax) -> list[tuple[float, float, bool]]:
    """(x, y, filled) of every layout's marker."""
    found = []
    for collection in ax.collections:
        if isinstance(collection, PathCollection) and len(collection.get_offsets()):
            filled = len(collection.get_facecolors()) > 0
            found += [(x, y, filled) for x, y in collection.get_offsets()]
    return found


def _line(ax, label):
    return [line for line in ax.lines if line.get_label() == label]


def test_one_marker_per_layout_at_its_bytes_and_time():
    fig = choosing_view.draw(model="GPT-3 6.7B", cluster=choosing.H100_CLUSTER, nodes=8)
    found = choosing.options(choosing.MODELS["GPT-3 6.7B"], choosing.CLUSTERS[choosing.H100_CLUSTER], 1024, nodes=8)
    markers = _markers(fig.axes[0])
    assert len(markers) == len(found) == 375
    assert sorted(markers) == sorted((o.sent["total"], o.seconds["total"], o.fits) for o in found)
    assert sum(filled for *_, filled in markers) == sum(o.fits for o in found) == 220        # hollow: too big
    assert fig.axes[0].get_xscale() == fig.axes[0].get_yscale() == "log"
    plt.close(fig)


def test_the_star_is_the_fastest_that_fits_and_the_table_its_five():
    fig = choosing_view.draw(model="GPT-3 1.3B", cluster="8 × A100 40 GB a node (NVLink 3, InfiniBand HDR)", nodes=4)
    found = choosing.options(choosing.MODELS["GPT-3 1.3B"],
                             choosing.CLUSTERS["8 × A100 40 GB a node (NVLink 3, InfiniBand HDR)"], 512, nodes=4)
    best = choosing.fastest(found)
    (star,) = _line(fig.axes[0], "the fastest that fits")
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (best.sent["total"], best.seconds["total"])
    assert min(y for _, y, filled in _markers(fig.axes[0]) if filled) == best.seconds["total"]
    assert any(t.get_text() == "dp 8 (ZeRO-1) × tp 1 × pp 4, m 64" for t in fig.axes[0].texts)
    (table,) = fig.axes[1].tables
    cells = table.get_celld()
    rows = [cells[r, 0].get_text().get_text() for r in range(1, 6)]
    assert rows == [choosing_view.layout_words(o.layout) for o in found if o.fits][:5]
    assert cells[1, 3].get_text().get_text() == f"{best.seconds['total']:.3g} s"
    plt.close(fig)


def test_nothing_fits_is_said_and_nothing_is_starred():
    fig = choosing_view.draw(model="GPT-3 175B", nodes=1)
    assert not _line(fig.axes[0], "the fastest that fits")
    assert not any(filled for *_, filled in _markers(fig.axes[0]))
    assert not fig.axes[1].tables and "no layout fits" in fig.axes[1].texts[0].get_text()
    plt.close(fig)


def test_measured_runs_only_on_the_labs_mlp_on_this_machine():
    fig = choosing_view.draw(**LOCAL, measured=RUNS)
    (dots,) = _line(fig.axes[0], "measured (the labs' runs)")
    assert list(dots.get_xdata()) == [119_080] and list(dots.get_ydata()) == [0.002]       # a time: a dot
    ticks = [line for line in fig.axes[0].lines if line.get_label().startswith("_") and
             list(line.get_xdata()) == [178_620, 178_620]]
    assert len(ticks) == 1                                                               # no time: a tick
    assert len(_markers(fig.axes[0])) == len(choosing.options(choosing.MODELS[choosing.LAB_MLP],
                                                              choosing.CLUSTERS[choosing.LOCAL], 64))
    plt.close(fig)
    for elsewhere in ({**LOCAL, "cluster": choosing.H100_CLUSTER}, {**LOCAL, "model": "GPT-3 1.3B", "nodes": 8}):
        fig = choosing_view.draw(**elsewhere, measured=RUNS)
        assert not _line(fig.axes[0], "measured (the labs' runs)")
        assert not [line for line in fig.axes[0].lines if 178_620 in np.asarray(line.get_xdata())]
        plt.close(fig)


def test_describes_numbers_are_options():
    text = choosing_view.describe(model="GPT-3 6.7B", cluster=choosing.H100_CLUSTER, nodes=8)
    found = choosing.options(choosing.MODELS["GPT-3 6.7B"], choosing.CLUSTERS[choosing.H100_CLUSTER], 1024, nodes=8)
    best = choosing.fastest(found)
    assert text.startswith("**GPT-3 6.7B, batch 1024, mixed precision, attention recomputed (FlashAttention), on 8 "
                           f"nodes of {choosing.H100_CLUSTER}: 64 ranks:** 375 layouts run this batch, 220 fit in "
                           "80 GB")
    assert (f"The fastest that fits: {choosing_view.layout_words(best.layout)}, {in_units(best.memory['total'])} "
            f"a rank, {in_units(best.sent['total'])} sent a rank a step, {best.seconds['total']:.3g} s a step") in text
    table = [line for line in text.splitlines() if line.startswith("| dp")]
    assert len(table) == 5 and table[0].startswith(f"| {choosing_view.layout_words(best.layout)} |")
    assert "None fits" in choosing_view.describe(model="GPT-3 175B", nodes=1)
    assert "None runs" in choosing_view.describe(model=choosing.LAB_MLP, nodes=128, batch=8)


def test_show_builds_its_menus_and_keeps_the_runs_to_their_setting(monkeypatch):
    seen, built = [], {}
    monkeypatch.setattr(choosing_view, "draw", lambda measured=None, **v: seen.append(measured) or plt.figure())
    monkeypatch.setattr(widgets, "interactive_figure",
                        lambda draw, controls, describe: built.update(draw=draw, controls=controls))
    choosing_view.show(measured=RUNS, **LOCAL)
    controls = built["controls"]
    assert list(controls) == ["model", "cluster", "nodes", "batch", "precision", "activations", "context"]
    run = {k: c.value for k, c in controls.items()}
    assert run == {**LOCAL, "batch": 64, "precision": "mixed", "activations": "attention recomputed (FlashAttention)",
                   "context": False}
    assert list(controls["activations"].options) == list(choosing_view.ACTIVATIONS)
    assert 1024 in controls["batch"].options and 128 in controls["nodes"].options
    built["draw"](**run)
    built["draw"](**{**run, "nodes": 2})
    built["draw"](**{**run, "cluster": choosing.H100_CLUSTER})
    assert seen == [RUNS, RUNS, None]
    plt.close("all")


def test_the_activations_menu_reaches_the_chooser():
    seen = []
    for name, (recompute, sp) in choosing_view.ACTIVATIONS.items():
        text = choosing_view.describe(model="LLaMA-2 70B", nodes=8, activations=name)
        found = choosing.options(choosing.MODELS["LLaMA-2 70B"], choosing.CLUSTERS[choosing.H100_CLUSTER], 1024,
                                 nodes=8, recompute=recompute, sequence_parallel=sp)
        assert f"{name}, on 8 nodes" in text and f"{sum(o.fits for o in found)} fit in 80 GB" in text
        seen.append((recompute, sp))
    assert seen[0] == ("selective", False) and set(seen) == {("selective", False), ("selective", True),
                                                            ("full", False), ("none", False)}
    # everything stored: GPT-3 175B fits no layout on 64 H100s, LLaMA-2 70B (no dropout) 7 with tp 8;
    # attention recomputed: dp 2 × tp 2 × pp 16
    assert "None fits" in choosing_view.describe(model="GPT-3 175B", nodes=8,
                                                 activations="everything stored (the s² attention scores too)")
    assert "7 fit in 80 GB" in choosing_view.describe(model="LLaMA-2 70B", nodes=8,
                                                      activations="everything stored (the s² attention scores too)")
    assert "The fastest that fits: dp 2 (ZeRO-1) × tp 2 × pp 16, m 512, 75.6 GB a rank" in choosing_view.describe(
        model="LLaMA-2 70B", nodes=8)
    with pytest.raises(ValueError, match="activations must be one of"):
        choosing_view.show(activations="full")


def test_fastest_table_rows_are_the_choosers():
    stored = "everything stored (the s² attention scores too)"
    text = choosing_view.fastest_table(models=["GPT-3 6.7B", "LLaMA-2 70B", "GPT-3 175B"], nodes=[8],
                                       activations=[choosing_view.DEFAULT_ACTIVATIONS, stored])
    header, rule, *rows = text.splitlines()
    assert header.startswith("| model | nodes (GPUs) | activations |") and len(rows) == 6
    found = choosing.options(choosing.MODELS["LLaMA-2 70B"], choosing.CLUSTERS[choosing.H100_CLUSTER], 1024, nodes=8)
    best = choosing.fastest(found)
    assert rows[2] == (f"| LLaMA-2 70B | 8 (64) | {choosing_view.DEFAULT_ACTIVATIONS} | "
                       f"{sum(o.fits for o in found)} of {len(found)} | {choosing_view.layout_words(best.layout)} | "
                       f"dp+zero+tp+pp | {in_units(best.memory['total'])} ({in_units(best.memory['activations'])}) | "
                       f"{best.seconds['total']:.3g} s |")
    assert rows[3].startswith(f"| LLaMA-2 70B | 8 (64) | {stored} | 7 of 350 | dp 2 (ZeRO-1) × tp 8 × pp 4, m 512 |")
    assert rows[5] == f"| GPT-3 175B | 8 (64) | {stored} | 0 of 375 | none fits | | | |"
    assert "| dp+zero+pp |" in rows[0]


def test_the_context_box_offers_context_parallel_layouts_drawn_as_triangles():
    # LLaMA-2 7B's 4096 tokens on 1 node: with the box, the layouts that split each sequence as well
    plain = choosing_view.describe(model="LLaMA-2 7B", nodes=1, batch=8)
    with_cp = choosing_view.describe(model="LLaMA-2 7B", nodes=1, batch=8, context=True)
    cluster = choosing.CLUSTERS[choosing.H100_CLUSTER]
    for text, context in ((plain, False), (with_cp, True)):
        found = choosing.options(choosing.MODELS["LLaMA-2 7B"], cluster, 8, context=context)
        assert f"{len(found)} layouts run this batch, {sum(o.fits for o in found)} fit" in text, text
    assert "context parallelism offered" in with_cp and "context parallelism offered" not in plain
    fig = choosing_view.draw(model="LLaMA-2 7B", nodes=1, batch=8, context=True)
    ax = fig.axes[0]
    assert "triangle: with cp" in ax.get_legend_handles_labels()[1]
    triangles = sum(len(c.get_offsets()) for c in ax.collections   # a triangle's path: 3 corners, closed
                    if isinstance(c, PathCollection) and len(c.get_paths()[0].vertices) == 4)
    assert triangles == sum(o.layout.cp > 1 for o in choosing.options(
        choosing.MODELS["LLaMA-2 7B"], cluster, 8, context=True))
    plt.close(fig)
    assert choosing_view.layout_words(choosing.Layout(2, 1, 1, 2, 4, 2)) == "dp 2 (ZeRO-1) × tp 1 × pp 2 × cp 2, m 4"
    with pytest.raises(ValueError, match="context must be True or False"):
        choosing_view.describe(context="yes")
