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
