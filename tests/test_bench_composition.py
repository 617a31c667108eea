"""Covers: bench.composition.

bench/composition.py measures what it says, at --quick's size: lab 9's grid (the solution notebook's answers)
and PyTorch's parts trained side by side on two layouts of 4 ranks, both with one process's losses, the times
the medians and ratios of the same rounds, the bytes each axis carried by the formula beside what the sockets
wrote; and it refuses to run without the lab's answers. Structure and invariants only, never speed."""
from __future__ import annotations

import types

import composition  # bench/composition.py (the conftest puts bench/ on sys.path)
import pytest


def test_a_notebook_without_the_lab_s_answers_is_refused_naming_what_is_missing():
    half = types.SimpleNamespace(grid_groups=lambda *a: None, vocab_parallel_cross_entropy=lambda *a: None)
    with pytest.raises(RuntimeError, match="defines no micro_batch_loss, reduce_gradients, global_grad_norm"):
        composition.lab_answers(half)
    whole = types.SimpleNamespace(**{name: (lambda *a: None) for name in composition.ANSWERS})
    assert sorted(composition.lab_answers(whole)) == sorted(composition.ANSWERS)
