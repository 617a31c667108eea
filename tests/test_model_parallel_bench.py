"""Covers: bench.model_parallel.

bench/model_parallel.py measures what it says: lab 3's block and PyTorch's
tensor parallelism train side by side, and write the same bytes to their sockets."""
from __future__ import annotations

import model_parallel  # bench/model_parallel.py (the conftest puts bench/ on sys.path)
import pytest

import course


@pytest.mark.timeout(300)
def test_the_block_and_pytorchs_write_the_same_bytes_per_step():
    rounds, steps = 2, 3
    run = course.launch(model_parallel.time_blocks, 2, args=(rounds, steps, 32, 64, 8))
    for rank in run.ranks:
        for name in model_parallel.CONTENDERS:
            assert len(run[rank][name]) == rounds and all(len(r) == steps for r in run[rank][name])
        written = run[rank]["bytes"]
        if None in written.values():
            pytest.skip("no /proc/self/io here: bytes on sockets are not measured")
        ours, theirs = (written[name] for name in model_parallel.CONTENDERS)
        # two all-reduces of 8×32 float32 per step; a ring on 2 ranks sends each once, plus headers
        assert ours == theirs >= 2 * 8 * 32 * 4, written
