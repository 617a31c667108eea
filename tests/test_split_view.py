"""Covers: course.split_view.

The view of lab 3: data parallelism against a split weight, for one dense layer.

Bars and curves are checked against course.sizes and course.timemodel; the
sources' figures appear only at the sources' settings; measured bytes only
beside the settings they were measured at; an uneven split is said in words.
The contracts every view keeps (bad settings, nbgrader, sliders) are in tests/test_views.py.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from course import sizes, split_view, timemodel, widgets
from course.sizes import Dense


def _heights(ax):
    return [patch.get_height() for patch in ax.patches]


def test_bars_are_the_bytes_each_rank_sends():
    fig = split_view.draw(inputs=2000, outputs=800, batch=64, gpus=4, dtype="float16")
    layer = Dense("layer", 2000, 800)
    expected = [sizes.data_parallel_total([layer], 4, "float16"),
                sizes.split_weight_sent(layer, 64, 4, "column", "float16"),
                sizes.split_weight_sent(layer, 64, 4, "row", "float16")]
    assert _heights(fig.axes[0]) == pytest.approx([e / 1e6 for e in expected])
    plt.close(fig)


def test_the_blogs_two_numbers_are_the_per_rank_count_on_2_gpus_attached_the_other_way_round():
    layer = Dense("Dettmers' layer", 1000, 500)
    # per rank, ring collectives, 2 GPUs, by hand:
    # column: all-gather of the 128×500 output sends half of it (32,000), all-reduce of the 128×1000 error
    # sends all of it (128,000); row: all-reduce of the output (64,000), all-gather of the error (64,000)
    count = {d: sizes.split_weight_sent(layer, 128, 2, d, "float32") / 4 for d in sizes.DIRECTIONS}
    assert count == {"column": 32_000 + 128_000, "row": 64_000 + 64_000} == {"column": 160_000, "row": 128_000}
    blog = split_view.DETTMERS_BLOG_ELEMENTS
    assert {blog["split by column"], blog["split by row"]} == set(count.values())   # the same two numbers
    assert blog["split by column"] == count["row"] and blog["split by row"] == count["column"]  # swapped


def test_dettmers_settings_show_the_blogs_figures_beside_the_exact_counts():
    fig = split_view.draw()               # the defaults are Dettmers' example
    assert _heights(fig.axes[0]) == pytest.approx([2.002, 0.64, 0.512])
    (blog,) = [ln for ln in fig.axes[0].lines if ln.get_label() == "the blog's figure"]
    assert list(blog.get_ydata()) == pytest.approx([2.0, 0.512, 0.64])   # on the schemes the blog names
    plt.close(fig)
    fig = split_view.draw(batch=256)
    assert not [ln for ln in fig.axes[0].lines if ln.get_label() == "the blog's figure"]
    plt.close(fig)


def test_seconds_are_the_time_model_of_each_schemes_collectives():
    layer, link = Dense("layer", 1000, 500), timemodel.PCIE3_X16
    seconds = split_view.seconds(layer, 128, 2, "float32", link)
    assert seconds["data parallel"] == pytest.approx(timemodel.ring_all_reduce_seconds(4 * 500_500, 2, link))
    # column: the 128×500 output gathered, the 128×1000 error all-reduced
    assert seconds["split by column"] == pytest.approx(
        timemodel.ring_all_gather_seconds(4 * 64_000, 2, link)
        + timemodel.ring_all_reduce_seconds(4 * 128_000, 2, link))
    assert seconds["split by row"] == pytest.approx(
        timemodel.ring_all_reduce_seconds(4 * 64_000, 2, link)
        + timemodel.ring_all_gather_seconds(4 * 128_000, 2, link))


def test_curves_cross_where_the_crossover_says():
    layer = Dense("layer", 1000, 500)
    for direction in sizes.DIRECTIONS:
        batch = sizes.split_weight_crossover(layer, 2, direction)
        assert batch * sizes.split_weight_sent(layer, 1, 2, direction) == pytest.approx(
            sizes.data_parallel_total([layer], 2))
    # 500,500 weights against 1,250 (column) and 1,000 (row) elements per sample
    assert sizes.split_weight_crossover(layer, 2, "column") == pytest.approx(400.4)
    assert sizes.split_weight_crossover(layer, 2, "row") == pytest.approx(500.5)
    with pytest.raises(ValueError, match="the crossover needs at least 2 ranks, got ranks=1"):
        sizes.split_weight_crossover(layer, 1, "row")


def test_an_uneven_split_is_said_in_the_figure():
    fig = split_view.draw(gpus=3)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("divide evenly over 3 ranks" in t for t in texts), texts
    plt.close(fig)


def test_the_views_numbers_are_each_schemes_bytes_time_and_the_crossovers():
    settings = dict(inputs=1000, outputs=500, batch=128, gpus=2, dtype="float32", link=timemodel.PCIE3_X16.name,
                    processor=timemodel.TITAN.name)
    text = split_view.describe(**settings)
    layer = sizes.Dense("layer", 1000, 500)
    sent = split_view.sent(layer, 128, 2, "float32")
    times = split_view.seconds(layer, 128, 2, "float32", timemodel.PCIE3_X16)
    for scheme in split_view.SCHEMES:
        assert f"{scheme} {sent[scheme] / 1e6:.3g} MB ({times[scheme] * 1e3:.3g} ms)" in text
    assert "Cheapest: **split by row**" in text              # Dettmers' shapes: 512 kB against 2 MB
    assert "400 (by column) and 500 (by row)" in text
    assert split_view.describe(**{**settings, "gpus": 3}).startswith("**Cannot split:**")


def test_measured_bytes_only_beside_the_settings_they_were_measured_at(monkeypatch):
    seen, built = [], {}
    monkeypatch.setattr(split_view, "draw", lambda measured=None, **v: seen.append(measured) or plt.figure())

    def fake_interactive_figure(draw, controls, describe):
        built.update(draw=draw, values={k: w.value for k, w in controls.items()})

    monkeypatch.setattr(widgets, "interactive_figure", fake_interactive_figure)
    measured = {"split by row": 512_000}
    split_view.show(measured=measured, gpus=2)
    run = built["values"]
    assert set(run) == {"inputs", "outputs", "batch", "gpus", "dtype", "link", "processor"}
    built["draw"](**run)
    built["draw"](**{**run, "link": timemodel.NVLINK4.name})     # time only: the bytes stand
    built["draw"](**{**run, "batch": 256})                       # other bytes: no dots
    built["draw"](**{**run, "outputs": 1000})
    assert seen == [measured, measured, None, None]
