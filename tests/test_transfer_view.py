"""Covers: course.transfer_view.

The transfer-size view of lab 2: bars checked against course.sizes, times against the time model,
the ring's two terms against their formulas, measured bytes only beside the settings they were
measured at, and a link measured here offered beside the presets.

interactive_figure's own promises are in tests/test_widgets.py; the contracts every view keeps
(bad settings, nbgrader, sliders) in tests/test_views.py.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from test_widgets import shown  # noqa: F401 (fixture: the helper's displays, no front end)

from course import plots, sizes, timemodel, transfer_view


def _bars(ax):
    """Stacked bar tops per x position, in MB."""
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    return [tops[x] for x in sorted(tops)]


def test_bars_are_the_bytes_each_rank_sends():
    fig = transfer_view.draw(width=500, depth=3, gpus=4, dtype="float16")
    bytes_ax = fig.axes[0]
    layers = transfer_view.mlp_layers(500, 3)
    expected = [sizes.data_parallel_total(layers, 4, "float16", "ring") / 1e6,
                sizes.data_parallel_total(layers, 4, "float16", "naive", rank=0) / 1e6,
                sizes.data_parallel_total(layers, 4, "float16", "naive", rank=1) / 1e6]
    assert _bars(bytes_ax) == pytest.approx(expected)
    assert len(bytes_ax.patches) == 3 * len(layers)  # one segment per layer and scheme
    plt.close(fig)


def test_time_panel_is_the_time_model():
    layers = transfer_view.mlp_layers(1000, 2)
    seconds = transfer_view.estimate(layers, 128, 4, "float32", timemodel.NETWORK_40G, timemodel.TITAN)
    # 32 images per rank: a TITAN's pass costs as much as over 128 (timemodel.TITAN.full_batch)
    flop = sum(6 * layer.inputs * layer.outputs * 128 for layer in layers)
    assert seconds["compute (one rank)"] == pytest.approx(flop / (4.5e12 * 0.5))
    at_512 = transfer_view.estimate(layers, 512, 4, "float32", timemodel.NETWORK_40G, timemodel.TITAN)
    assert at_512["compute (one rank)"] == pytest.approx(seconds["compute (one rank)"])
    gradient = [4 * layer.weights for layer in layers]
    assert seconds["ring all-reduce"] == pytest.approx(
        sum(6 * (5e-6 + g / 4 / 5e9) for g in gradient))
    fig = transfer_view.draw(width=1000, depth=2, batch=128, gpus=4)
    widths = [p.get_width() for p in fig.axes[1].patches]
    assert widths == pytest.approx([seconds[k] * 1e3 for k in seconds])
    plt.close(fig)


def test_measured_bytes_are_dots_on_their_scheme():
    fig = transfer_view.draw(measured={"naive, rank 0": 5e6})
    (line,) = [ln for ln in fig.axes[0].lines if ln.get_label() == "measured"]
    assert list(line.get_xdata()) == [1] and list(line.get_ydata()) == [5.0]
    plt.close(fig)


def test_the_views_numbers_are_the_bytes_and_times_of_the_model():
    layers = transfer_view.mlp_layers(500, 3)
    text = transfer_view.describe(width=500, depth=3, batch=64, gpus=4, dtype="float16",
                                  link=timemodel.NVLINK4.name, processor=timemodel.TITAN.name)
    ring = sizes.data_parallel_total(layers, 4, "float16", "ring") / 1e6
    naive = sizes.data_parallel_total(layers, 4, "float16", "naive", rank=0) / 1e6
    ms = transfer_view.estimate(layers, 64, 4, "float16", timemodel.NVLINK4, timemodel.TITAN)
    for number in (ring, naive, *(s * 1e3 for s in ms.values())):
        assert f"{number:.3g}" in text
    assert text.startswith("**4 GPUs, float16:**") and timemodel.NVLINK4.name in text


@pytest.mark.usefixtures("shown")
def test_measured_bytes_only_beside_the_settings_they_were_measured_at(monkeypatch):
    seen = []
    monkeypatch.setattr(transfer_view, "draw", lambda measured=None, **v: seen.append(measured) or plt.figure())
    _, box = transfer_view.show(measured={"ring": 1.0}, gpus=2)
    controls = {c.description: c for c in box.children}
    controls["GPUs"].value = 3        # other settings: the run's bytes no longer apply
    controls["GPUs"].value = 2        # back to the run's
    controls["interconnect"].value = timemodel.NVLINK4.name  # does not change the bytes
    assert seen == [{"ring": 1.0}, None, {"ring": 1.0}, {"ring": 1.0}]


def test_the_ring_panel_shows_a_flat_bandwidth_term_and_a_growing_latency_term():
    layers = transfer_view.mlp_layers(256, 2)
    fig = transfer_view.draw(width=256, depth=2, gpus=4, link=timemodel.NETWORK_40G.name)
    terms_ax = fig.axes[2]
    counts = list(transfer_view.TERM_GPUS)                 # 4 is among them
    bandwidth, latency = terms_ax.containers
    gradients = [4 * layer.weights for layer in layers]
    for n, bw, lat in zip(counts, bandwidth.patches, latency.patches):
        assert bw.get_height() == pytest.approx(sum(2 * (n - 1) / n * g / 5e9 for g in gradients) * 1e3)
        assert lat.get_height() == pytest.approx(len(layers) * 2 * (n - 1) * 5e-6 * 1e3)
        assert lat.get_y() == pytest.approx(bw.get_height())      # stacked on the bandwidth term
    heights = [b.get_height() for b in bandwidth.patches]
    assert heights[-1] / heights[0] == pytest.approx((63 / 64) / (1 / 2))     # flat: at most 2x from 2 GPUs to 64
    lat = [b.get_height() for b in latency.patches]
    assert lat[-1] / lat[0] == pytest.approx(63)
    assert [t.get_text() for t in terms_ax.get_xticklabels()] == ["2", "[4]", "8", "16", "32", "64"]
    plt.close(fig)


def test_the_chosen_gpu_count_joins_the_ring_panel():
    fig = transfer_view.draw(gpus=6)
    assert [t.get_text() for t in fig.axes[2].get_xticklabels()] == ["2", "4", "[6]", "8", "16", "32", "64"]
    plt.close(fig)


@pytest.mark.usefixtures("shown")
def test_a_measured_link_is_offered_beside_the_presets():
    here = timemodel.Link("gloo here, measured now", 2e9, 1e-4, "a ping-pong")
    text = transfer_view.describe(width=256, depth=2, batch=64, gpus=4, dtype="float32", link=here.name,
                                  processor=timemodel.A100.name, links={here.name: here})
    terms = transfer_view.ring_terms(transfer_view.mlp_layers(256, 2), 4, "float32", here)
    assert f"{terms['latency'] * 1e3:.3g} ms latency term" in text and here.name in text
    _, box = transfer_view.show(links={here.name: here}, link=here.name)
    menu = {c.description: c for c in box.children}["interconnect"]
    assert menu.value == here.name and set(timemodel.PRESETS) < set(menu.options)
    menu.value = timemodel.NVLINK5.name                     # the student switches
    with pytest.raises(ValueError, match="gloo here, measured now"):
        transfer_view.draw(link="carrier pigeon", links={here.name: here})
    plt.close("all")


@pytest.mark.parametrize("settings", [
    dict(width=512, depth=2, batch=256, gpus=2),                                   # the demo's run
    dict(width=8192, depth=4, batch=4096, gpus=64, link=timemodel.LOCAL_GLOO.name),
], ids=["demo", "widest and most GPUs"])
def test_no_text_over_text_at_projector_size(settings):
    # the demo's type (plots.projector); at the sliders' far ends the bars' labels are longest
    with plots.projector():
        fig = transfer_view.draw(**settings)
        try:
            assert plots.overlapping_text(fig) == []
        finally:
            plt.close(fig)
