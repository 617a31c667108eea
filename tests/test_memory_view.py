"""Covers: course.memory_view.

The memory view of lab 5: what each scheme holds per rank, sends, and the largest model that fits.

Bars and lines are read back from the figure and checked against course.memory; the ZeRO
paper's crosses appear only at its settings; measured dots only at the run's settings and
its number of ranks; split weights' bytes only with layers and a batch.
The contracts every view keeps (bad settings, nbgrader, sliders) are in tests/test_views.py.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from course import memory, memory_view, plots, widgets
from course.sizes import Dense

V100 = "NVIDIA V100 (32 GB)"
LAYERS = [Dense("layer1", 64, 512), Dense("layer2", 512, 512), Dense("output", 512, 10)]
LAB = {"parameters": sum(layer.weights for layer in LAYERS), "precision": "fp32", "optimizer": "adam", "ranks": 2,
       "gpu": V100}


def _stacks(ax) -> dict[str, list[float]]:
    return {container.get_label(): [patch.get_height() for patch in container.patches] for container in ax.containers}


def _line(ax, label):
    return [line for line in ax.lines if line.get_label() == label]


def test_bars_are_memory_per_rank_by_kind():
    fig = memory_view.draw(parameters=10**9, precision="fp32", optimizer="momentum", ranks=4, gpu=V100)
    held_ax = fig.axes[0]
    assert held_ax.get_ylabel() == "GB held per rank"
    stacks = _stacks(held_ax)
    assert list(stacks) == list(memory.KINDS)
    for i, scheme in enumerate(memory.SCHEMES):
        expected = memory.per_rank(10**9, 4, scheme, optimizer="momentum", precision="fp32")
        for kind in memory.KINDS:
            assert stacks[kind][i] * 1e9 == pytest.approx(expected[kind])
    # by hand: 4 + 4 + 4 bytes a parameter; ZeRO-1 divides the 4 GB of momentum by 4
    assert [sum(column) for column in zip(*stacks.values())] == pytest.approx([12, 9, 6, 3, 3])
    plt.close(fig)


def test_activations_are_stacked_on_every_scheme_when_given():
    fig = memory_view.draw(**LAB, activations=300_000)
    stacks = _stacks(fig.axes[0])
    assert fig.axes[0].get_ylabel() == "MB held per rank"
    assert stacks["activations"] == pytest.approx([0.3] * 5)
    assert [sum(column) * 1e6 for column in zip(*stacks.values())] == pytest.approx(
        [memory.per_rank(LAB["parameters"], 2, s, precision="fp32", activations=300_000)["total"]
         for s in memory.SCHEMES])
    plt.close(fig)


def test_the_zero_papers_figure_1_only_at_its_settings():
    fig = memory_view.draw()                         # the defaults are the paper's
    (paper,) = _line(fig.axes[0], memory_view.PAPER_LABEL)
    assert list(paper.get_ydata()) == [120, 31.4, 16.6, 1.9]
    assert _stacks(fig.axes[0])["optimizer state"][0] == pytest.approx(90)    # K = 12 bytes × 7.5 B
    (gpu_line,) = _line(fig.axes[0], f"{V100}: 32 GB")
    assert list(gpu_line.get_ydata()) == [32, 32]
    plt.close(fig)
    fig = memory_view.draw(ranks=32)
    assert not _line(fig.axes[0], memory_view.PAPER_LABEL)
    plt.close(fig)


def test_sent_bars_and_split_weights_only_with_layers_and_a_batch():
    fig = memory_view.draw(parameters=64 * 10**6, ranks=8)
    sent_ax = fig.axes[1]
    heights = [patch.get_height() for patch in sent_ax.patches]
    expected = [memory.sent_per_step(64 * 10**6, 8, s, dtype="bfloat16") for s in memory.SCHEMES[:4]]
    assert [h * 1e6 for h in heights] == pytest.approx(expected)
    assert heights[3] == pytest.approx(1.5 * heights[0])                      # ZeRO-3: 3(N-1)/N against 2(N-1)/N
    assert sent_ax.get_xlabel() == "split weights: needs the model's layers and a batch"
    plt.close(fig)
    fig = memory_view.draw(**LAB, layers=LAYERS, batch=64)
    heights = [patch.get_height() for patch in fig.axes[1].patches]
    split = memory.sent_per_step(LAB["parameters"], 2, "split weights", dtype="float32", layers=LAYERS, batch=64)
    assert len(heights) == 5 and heights[4] * 1e6 == pytest.approx(split)
    plt.close(fig)


def test_the_largest_model_lines_are_memorys():
    fig = memory_view.draw(gpu="NVIDIA H100 SXM (80 GB)", ranks=6)
    fit_ax = fig.axes[2]
    for scheme in memory.SCHEMES:
        (line,) = _line(fit_ax, scheme)
        counts = list(line.get_xdata())
        assert 6 in counts and counts[0] == 1 and counts[-1] == 1024
        assert list(line.get_ydata()) == [memory.largest_model(80e9, n, scheme) for n in counts]
    (data_parallel,) = _line(fit_ax, "data parallel")
    assert set(data_parallel.get_ydata()) == {5 * 10**9}                    # 80 GB / 16 bytes, whatever N
    plt.close(fig)


def test_measured_dots_only_at_the_runs_number_of_ranks():
    measured = [{"scheme": "ZeRO-3", "ranks": 2, "memory": 2_000_000, "sent": 1_800_000},
                {"scheme": "data parallel", "ranks": 4, "memory": 5_000_000, "sent": 1_000_000}]
    fig = memory_view.draw(**LAB, measured=measured)
    (held_dots,) = _line(fig.axes[0], "measured")
    (sent_dots,) = _line(fig.axes[1], "measured")
    assert list(held_dots.get_xdata()) == [3] and list(held_dots.get_ydata()) == pytest.approx([2.0])
    assert list(sent_dots.get_xdata()) == [3] and list(sent_dots.get_ydata()) == pytest.approx([1.8])
    plt.close(fig)
    fig = memory_view.draw(**{**LAB, "ranks": 8}, measured=measured)
    assert not _line(fig.axes[0], "measured") and not _line(fig.axes[1], "measured")
    plt.close(fig)


def test_a_run_without_measured_bytes_is_a_dot_of_memory_only():
    measured = [{"scheme": "ZeRO-2", "ranks": 4, "memory": 3_000_000, "sent": None}]
    fig = memory_view.draw(**{**LAB, "ranks": 4}, measured=measured)
    (held_dots,) = _line(fig.axes[0], "measured")
    assert list(held_dots.get_ydata()) == pytest.approx([3.0])
    assert not _line(fig.axes[1], "measured")
    plt.close(fig)


def test_the_views_numbers_are_memorys():
    text = memory_view.describe(parameters=7_500_000_000, precision="mixed", optimizer="adam", ranks=64, gpu=V100)
    assert text.startswith("**7.5 billion parameters, adam, mixed precision, 64 ranks, NVIDIA V100 (32 GB):**")
    for scheme in memory.SCHEMES:
        total = memory.per_rank(7_500_000_000, 64, scheme)["total"]
        assert f"{scheme} {total / 1e9:.3g} GB" in text
    assert "data parallel 120 GB (too big)" in text and "ZeRO-2 16.6 GB;" in text
    assert "ZeRO-1 29.5 GB" in text and "ZeRO-3 44.3 GB" in text                # 2·63/64 and 3·63/64 of 15 GB
    assert "split weights: needs the model's layers and a batch" in text
    assert "data parallel 2 billion" in text and "ZeRO-3 128 billion" in text   # 32 GB / 16 bytes, × 64
    with_layers = memory_view.describe(**LAB, layers=LAYERS, batch=64)
    assert "split weights 263 kB." in with_layers                              # test_memory's hand count


def test_bf16_with_fp32_gradients_holds_18_bytes_reduces_fp32_and_gathers_bf16():
    settings = dict(parameters=7_500_000_000, precision="bf16 with fp32 gradients", optimizer="adam", ranks=64,
                    gpu=V100)
    text = memory_view.describe(**settings)
    assert text.startswith("**7.5 billion parameters, adam, bf16 parameters, fp32 gradients, 64 ranks,")
    assert "data parallel 135 GB (too big)" in text                              # 18 bytes × 7.5 B
    assert "ZeRO-1 46.4 GB" in text                                               # (6 + 12/64) × 7.5 B
    # sent: fp32 gradients reduced (4 bytes), bf16 parameters gathered (2 bytes); 63/64 of 7.5 B each half-ring
    half = 63 / 64 * 7_500_000_000
    assert "data parallel 59.1 GB" in text and "ZeRO-1 44.3 GB" in text and "ZeRO-3 59.1 GB" in text
    sent = memory_view.sent(7_500_000_000, 64, precision="bf16 with fp32 gradients")
    assert sent["ZeRO-2"] == pytest.approx(6 * half)
    fig = memory_view.draw(**settings)
    assert "bf16 parameters, fp32 gradients" in fig.get_suptitle()
    assert _stacks(fig.axes[0])["gradients"][0] == pytest.approx(30)              # 4 bytes × 7.5 B, in GB
    plt.close(fig)


def test_measured_and_activations_only_beside_the_settings_they_belong_to(monkeypatch):
    seen, built = [], {}
    monkeypatch.setattr(memory_view, "draw", lambda measured=None, **v: seen.append(
        (measured, v["activations"])) or plt.figure())
    monkeypatch.setattr(widgets, "interactive_figure",
                        lambda draw, controls, describe: built.update(draw=draw, controls=controls))
    measured = [{"scheme": "ZeRO-3", "ranks": 2, "memory": 2_000_000, "sent": 1_800_000}]
    memory_view.show(measured=measured, activations=300_000, **LAB)
    controls = built["controls"]
    assert list(controls) == ["parameters", "precision", "optimizer", "ranks", "gpu"]
    assert list(controls["precision"].options) == ["fp32", "mixed", "bf16 with fp32 gradients"]
    assert LAB["parameters"] in [value for _, value in controls["parameters"].options]     # the run's model offered
    assert 7_500_000_000 in [value for _, value in controls["parameters"].options]
    assert controls["ranks"].options[0] == 1 and controls["ranks"].options[-1] == 1024
    run = {k: c.value for k, c in controls.items()}
    assert run == LAB
    built["draw"](**run)
    built["draw"](**{**run, "gpu": "NVIDIA H200 SXM (141 GB)"})    # the bytes stand, only the line moves
    built["draw"](**{**run, "ranks": 4})            # dots per rank count; the run's activations no longer
    built["draw"](**{**run, "optimizer": "sgd"})    # other state: no dots; activations unchanged
    built["draw"](**{**run, "parameters": 10**9})
    assert seen == [(measured, 300_000), (measured, 300_000), (measured, None), (None, 300_000), (None, None)]
    plt.close("all")


@pytest.mark.parametrize("settings", [
    dict(parameters=301_066, ranks=2, optimizer="adam", precision="fp32"),      # the demo's run
    dict(parameters=10**6, ranks=1, optimizer="sgd", precision="fp32", gpu="NVIDIA GTX TITAN (6 GiB)"),
    dict(parameters=10**12, ranks=1024, optimizer="adam", precision="bf16 with fp32 gradients",
         gpu="NVIDIA H200 SXM (141 GB)"),
], ids=["demo", "small model, one rank", "a trillion on 1024"])
def test_no_text_over_text_at_projector_size(settings):
    # the demo's type (plots.projector) at the ends of the menus: the GPU's memory above the scale,
    # the longest names and titles
    with plots.projector():
        fig = memory_view.draw(**settings)
        try:
            assert plots.overlapping_text(fig) == []
        finally:
            plt.close(fig)
