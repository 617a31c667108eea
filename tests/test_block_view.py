"""Covers: course.block_view.

The view of lab 3's transformer block: data parallelism against the Megatron split.

Bars are checked against course.transformer's formulas and a hand count, times
against the ring all-reduce written out, the crossover against the two formulas
agreeing; measured bytes only for known schemes and beside the settings they were
measured at; heads that do not divide are said in words.
The contracts every view keeps (bad settings, nbgrader, sliders) are in tests/test_views.py.
"""
from __future__ import annotations

import ipywidgets
import matplotlib.pyplot as plt
import pytest

from course import block_view, timemodel, transformer, widgets

SMALL = dict(batch=2, sequence=16, width=64, heads=8, gpus=2, dtype="float32")
RUN = {**SMALL, "batch": 8}      # a run's settings within the controls' ranges (the batch slider starts at 8)
LINK = timemodel.PCIE3_X16


def _heights(ax):
    return [patch.get_height() for patch in ax.patches]


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_bars_are_the_bytes_each_rank_sends_counted_by_hand():
    fig = block_view.draw(**SMALL)
    # by hand, 2 GPUs, float32: the activation is 2 × 16 × 64 values × 4 bytes = 8,192 bytes, and a ring
    # all-reduce on 2 ranks sends 2(N-1)/N = 1 times it; four of them: 32,768 bytes.
    # The block's parameters: qkv 64×192 + 192, out 64×64 + 64, MLP 64×256 + 256 and 256×64 + 64, two layer
    # norms 4 × 64: 49,984, so 199,936 bytes, all-reduced once (× 1 on 2 ranks).
    assert _heights(fig.axes[0]) == pytest.approx([199_936 / 1e6, 32_768 / 1e6])
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels[0].startswith("0.2 MB") and labels[1].startswith("0.0328 MB")
    plt.close(fig)


@pytest.mark.parametrize("gpus, dtype", [(4, "float16"), (8, "bfloat16"), (2, "float64")])
def test_bars_are_transformers_formulas(gpus, dtype):
    fig = block_view.draw(batch=16, sequence=256, width=1024, heads=16, gpus=gpus, dtype=dtype)
    expected = [transformer.data_parallel_block_sent(1024, gpus, dtype),
                transformer.split_block_sent(16, 256, 1024, gpus, dtype)]
    assert _heights(fig.axes[0]) == pytest.approx([e / 1e6 for e in expected])
    plt.close(fig)


def test_seconds_are_the_ring_all_reduces_of_each_scheme():
    times = block_view.seconds(2, 16, 64, 2, "float32", LINK)
    # a ring all-reduce on 2 ranks: 2(N-1) = 2 steps, each one message of half the tensor
    assert times["data parallel"] == pytest.approx(2 * (LINK.alpha + 199_936 / 2 / LINK.beta))
    assert times["Megatron split"] == pytest.approx(4 * 2 * (LINK.alpha + 8_192 / 2 / LINK.beta))
    fig = block_view.draw(**SMALL)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert [label.split("\n")[1] for label in labels] == [f"{times[s] * 1e3:.3g} ms" for s in block_view.SCHEMES]
    plt.close(fig)


def test_the_crossover_dot_is_where_both_formulas_agree():
    width, gpus = 64, 2
    crossing = transformer.crossover_tokens(width)
    assert crossing == pytest.approx(49_984 / 256)                    # parameters / (4 × width) = 195.25
    # the split's bytes grow in proportion to the tokens: at `crossing` tokens they equal data parallelism's
    per_token = transformer.split_block_sent(1, 1, width, gpus)
    assert crossing * per_token == pytest.approx(transformer.data_parallel_block_sent(width, gpus))
    assert transformer.split_block_sent(1, 195, width, gpus) < transformer.data_parallel_block_sent(width, gpus)
    assert transformer.split_block_sent(1, 196, width, gpus) > transformer.data_parallel_block_sent(width, gpus)
    fig = block_view.draw(**SMALL)
    tokens_ax = fig.axes[1]
    (dot,) = [ln for ln in tokens_ax.lines if len(ln.get_xdata()) == 1]
    assert dot.get_xdata()[0] == pytest.approx(crossing)
    assert dot.get_ydata()[0] == pytest.approx(199_936 / 1e6)
    assert any(t.get_text() == "195 tokens" for t in tokens_ax.texts)
    (here,) = [ln for ln in tokens_ax.lines if ln.get_linestyle() == ":"]
    assert list(here.get_xdata()) == [32, 32] and here.get_label() == "32 tokens"
    plt.close(fig)


def test_the_curves_are_the_formulas_against_the_tokens():
    fig = block_view.draw(**SMALL)
    curves = {ln.get_label(): ln for ln in fig.axes[1].lines if ln.get_label() in block_view.SCHEMES}
    flat = curves["data parallel"].get_ydata()
    assert list(flat) == pytest.approx([199_936 / 1e6] * len(flat))
    split = curves["Megatron split"]
    for tokens, height in zip(split.get_xdata(), split.get_ydata()):
        assert height == pytest.approx(transformer.split_block_sent(1, int(tokens), 64, 2) / 1e6)
    assert fig.axes[1].get_xscale() == fig.axes[1].get_yscale() == "log"
    plt.close(fig)


def test_the_title_names_the_settings():
    fig = block_view.draw(**SMALL)
    title = fig.get_suptitle()
    for words in ("width 64", "8 heads (4 per rank)", "sequence 16", "batch 2", "2 GPUs"):
        assert words in title, title
    plt.close(fig)


def test_measured_bytes_are_black_dots_on_known_schemes_only():
    fig = block_view.draw(**SMALL, measured={"Megatron split": 32_768})
    (dot,) = [ln for ln in fig.axes[0].lines if ln.get_label() == "measured"]
    assert list(dot.get_xdata()) == [1] and list(dot.get_ydata()) == pytest.approx([0.032768])
    plt.close(fig)
    with pytest.raises(ValueError, match="measured bytes for 'split by row': schemes are"):
        block_view.draw(**SMALL, measured={"split by row": 1})
    plt.close("all")


@pytest.mark.parametrize("settings, words", [
    ({"width": 512, "heads": 12}, "a width of 512 does not split into 12 heads"),
    ({"heads": 8, "gpus": 3}, "8 heads do not split evenly over 3 ranks"),
])
def test_heads_that_do_not_divide_are_said_in_the_figure(settings, words):
    fig = block_view.draw(**settings)
    assert len(fig.axes) == 1 and any(words in t for t in _texts(fig)), _texts(fig)
    plt.close(fig)
    text = block_view.describe(**{**block_view.START, **settings})
    assert text.startswith("**Cannot split:**") and words in text


def test_describe_refuses_one_gpu():
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        block_view.describe(**{**block_view.START, "gpus": 1})


def test_the_views_numbers_name_the_cheaper_scheme_the_crossover_and_the_heads():
    settings = {**block_view.START, "link": LINK.name}
    text = block_view.describe(**settings)                 # 8 × 128 = 1,024 tokens, below 3 × 512 + 3.25
    sent = block_view.sent(8, 128, 512, 2, "float32")
    times = block_view.seconds(8, 128, 512, 2, "float32", LINK)
    for scheme in block_view.SCHEMES:
        assert f"{scheme} {sent[scheme] / 1e6:.3g} MB ({times[scheme] * 1e3:.3g} ms)" in text
    assert "Cheaper: **Megatron split**" in text
    assert "less below 1,539 tokens" in text
    assert "rank 0 owns heads 0-3, rank 1 owns heads 4-7" in text
    assert "Cheaper: **data parallel**" in block_view.describe(**{**settings, "batch": 16})   # 2,048 tokens
    text = block_view.describe(**{**settings, "heads": 4, "gpus": 4})
    assert "rank 0 owns head 0, rank 1 owns head 1, rank 2 owns head 2, rank 3 owns head 3" in text


def test_show_returns_its_controls_and_redraws_when_one_moves(monkeypatch):
    events = []

    class Handle:
        def update(self, obj):
            events.append(("update", type(obj).__name__))

    def fake_display(obj, display_id=False):
        events.append(("display", type(obj).__name__))
        return Handle() if display_id else None

    monkeypatch.setattr(widgets, "display", fake_display)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    handle, box = block_view.show()
    assert isinstance(box, ipywidgets.VBox)
    descriptions = [c.description for c in box.children]
    assert descriptions[:3] == ["sequence length", "width", "heads"] and "GPUs" in descriptions
    width = box.children[1]
    assert (width.value, width.step) == (512, 64)
    width.value = 1024
    assert events == [("display", "Figure"), ("display", "Markdown"), ("display", "VBox"),
                      ("update", "Figure"), ("update", "Markdown")]
    plt.close("all")


def test_measured_bytes_only_beside_the_settings_they_were_measured_at(monkeypatch):
    seen, built = [], {}
    monkeypatch.setattr(block_view, "draw", lambda measured=None, **v: seen.append(measured) or plt.figure())
    monkeypatch.setattr(widgets, "interactive_figure",
                        lambda draw, controls, describe: built.update(draw=draw, controls=controls))
    measured = {"Megatron split": 32_768}
    block_view.show(measured=measured, **RUN)
    run = {k: c.value for k, c in built["controls"].items()}
    assert set(run) == {"sequence", "width", "heads", "batch", "gpus", "dtype", "link", "processor"}
    assert {k: run[k] for k in RUN} == RUN
    built["draw"](**run)
    built["draw"](**{**run, "link": timemodel.NVLINK4.name})     # time only: the bytes stand
    built["draw"](**{**run, "heads": 4})                         # heads do not change the bytes
    built["draw"](**{**run, "sequence": 32})                     # other bytes: no dots
    built["draw"](**{**run, "width": 128})
    built["draw"](**{**run, "gpus": 4})
    assert seen == [measured, measured, measured, None, None, None]
    plt.close("all")


def test_critical_path_holds_all_of_the_splits_all_reduces_and_what_of_data_parallelisms_outlasts_backward():
    gpu = timemodel.TITAN
    times = block_view.seconds(8, 128, 512, 2, "float32", LINK)
    backward = gpu.seconds(2 / 3 * transformer.training_flop(8, 128, 512) / 2)
    waited = block_view.critical_path_seconds(8, 128, 512, 2, "float32", LINK, gpu)
    assert waited["Megatron split"] == times["Megatron split"]          # blocking: nothing hides it
    assert waited["data parallel"] == pytest.approx(max(0.0, times["data parallel"] - backward))
    # a long backward (many tokens) hides all of data parallelism's all-reduce, and none of the split's
    long = block_view.critical_path_seconds(64, 2048, 512, 2, "float32", LINK, gpu)
    assert long["data parallel"] == 0 and long["Megatron split"] > 0
    # a small backward hides less than all of it
    short = block_view.critical_path_seconds(1, 16, 512, 2, "float32", LINK, gpu)
    assert 0 < short["data parallel"] < block_view.seconds(1, 16, 512, 2, "float32", LINK)["data parallel"]
    text = block_view.describe(**{**block_view.START, "link": LINK.name})
    assert f"split's 4 blocking all-reduces, {waited['Megatron split'] * 1e3:.3g} ms" in text
    assert f"data parallelism's one, {waited['data parallel'] * 1e3:.3g} ms left after overlapping backward" in text
