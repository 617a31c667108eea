"""Covers: course.sequence_view.

The long-sequence view's table (lab 7): what each scheme's longest sequence holds, every layer counted.
The view's contracts (bad settings, nbgrader, sliders) are tests/test_views.py's.
"""
from __future__ import annotations

import pytest

from course import memory, sequence_view

H100 = "NVIDIA H100 SXM (80 GB)"


def test_full_recomputation_counts_the_one_layer_backward_rebuilds_with_its_scores():
    # LLaMA-2 70B at 32,768 tokens: 80 layers' inputs are 42.9 GB, and the layer being rebuilt holds all
    # a "none" layer keeps, 146 GB more: that row fits 16,384 tokens, not 32,768.
    inputs = 80 * sequence_view.layer_bytes("full", 32_768, "LLaMA-2 70B", 8, 8)
    rebuilt = sequence_view.layer_bytes("none", 32_768, "LLaMA-2 70B", 8, 8)
    assert inputs == pytest.approx(42.95e9, rel=1e-3) and rebuilt == pytest.approx(146.03e9, rel=1e-3)
    assert sequence_view.all_layers_bytes("full", 32_768, "LLaMA-2 70B", 8, 8) == pytest.approx(inputs + rebuilt)
    assert sequence_view.longest("full", "LLaMA-2 70B", H100, 8, 8) == 16_384
    assert "| full | 16,384 | 60.1 GB |" in sequence_view.longest_table(model="LLaMA-2 70B", gpu=H100, tp=8,
                                                                       context=8)


@pytest.mark.parametrize("scheme", [s for s in sequence_view.SCHEMES if s != "full"])
def test_the_other_schemes_hold_every_layer_alike(scheme):
    s = sequence_view.longest(scheme, "GPT-3 175B", H100, 8, 4)
    assert sequence_view.all_layers_bytes(scheme, s, "GPT-3 175B", 8, 4) == pytest.approx(
        96 * sequence_view.layer_bytes(scheme, s, "GPT-3 175B", 8, 4))
    budget = memory.GPUS[H100].nbytes
    assert sequence_view.all_layers_bytes(scheme, 2 * s, "GPT-3 175B", 8, 4) > budget or 2 * s > max(
        sequence_view.SEQUENCES)


def test_context_parallel_bytes_use_the_models_key_value_heads():
    # LLaMA-2 70B at 131,072 tokens on 16 context ranks, bf16: the ring's 46 K and V blocks a layer (15 forward,
    # 15 backward, 16 gradients home), each 2 · (s/16) · h_kv · 2 bytes, h_kv = 8 K/V heads × 128 = 1024:
    # 1.54 GB, where h = 8192 would make it 12.35 GB; Mixtral (8 of 32 heads) 4 times less than its width
    ring = sequence_view.sent_bytes("context parallel", 131_072, "LLaMA-2 70B", 8, 16)
    assert ring == 46 * 2 * (131_072 // 16) * 1024 * 2 and round(ring / 1e9, 2) == 1.54
    gathered = sequence_view.sent_bytes("context parallel, K and V all-gathered", 131_072, "LLaMA-2 70B", 8, 16)
    assert gathered == 2 * 15 / 16 * 2 * 131_072 * 1024 * 2
    mixtral, gpt = "Mixtral 8x7B (8 experts, top 2)", "GPT-3 175B"
    assert sequence_view.kv_width(mixtral) == 4096 // 4 and sequence_view.kv_width(gpt) == 12288
    assert sequence_view.kv_width(sequence_view.LAB_BLOCK) == 64
    assert sequence_view.sent_bytes("context parallel", 4096, gpt, 8, 4) == 10 * 2 * 1024 * 12288 * 2
    # and the view draws them
    fig = sequence_view.draw(model="LLaMA-2 70B", tp=8, context=16)
    ring_line = next(line for line in fig.axes[1].get_lines() if line.get_label().startswith("ring attention"))
    assert ring_line.get_ydata()[sequence_view.SEQUENCES.index(131_072)] == ring
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_ulysses_bytes_and_where_its_heads_do_not_split():
    # Ulysses: each rank sends (N − 1)/N of its s/N tokens' q and output (h each) and K and V (h_kv each),
    # forward and again backward: LLaMA-2 70B at 131,072 tokens on 8 ranks, bf16
    got = sequence_view.sent_bytes("context parallel, Ulysses", 131_072, "LLaMA-2 70B", 8, 8)
    assert got == 2 * 7 / 8 * (131_072 / 8) * (2 * 8192 + 2 * 1024) * 2
    # 8 K/V heads do not split over 16 ranks, nor the lab's 4 heads over 8: refused in words, not drawn
    assert "64 heads and 8 K/V heads do not both split over 16 ranks" in sequence_view.why_not_ulysses(
        "LLaMA-2 70B", 16)
    with pytest.raises(ValueError, match="Ulysses cannot run the lab's block .* on 8 context ranks"):
        sequence_view.sent_bytes("context parallel, Ulysses", 1024, sequence_view.LAB_BLOCK, 1, 8)
    import matplotlib.pyplot as plt
    for context, drawn in ((16, 0), (8, len(sequence_view.SEQUENCES))):
        fig = sequence_view.draw(model="LLaMA-2 70B", tp=8, context=context)
        line = next(line for line in fig.axes[1].get_lines() if line.get_label().startswith("Ulysses"))
        assert len(line.get_xdata()) == drawn and ("not drawn" in line.get_label()) == (not drawn)
        plt.close(fig)
