"""Covers: bench.long_sequences.

bench/long_sequences.py measures what it says, at --quick's size: each scheme's activation memory
against the formula, ring attention against one process (time and memory per rank), and says why
PyTorch's context_parallel was not compared where it cannot run. Structure and invariants only, never
speed."""
from __future__ import annotations

import json

import long_sequences  # bench/long_sequences.py (the conftest puts bench/ on sys.path)
import pytest
import torch


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The whole benchmark, once, --quick: 1 round, small sizes."""
    path = tmp_path_factory.mktemp("bench") / "long_sequences.json"
    long_sequences.main(["--quick", "--json", str(path)])
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_scheme_s_activation_memory_is_measured_against_the_formula(report):
    rows = report["figures"]["memory"]
    schemes = {row["scheme"] for row in rows}
    assert schemes == {"none", "selective", "full", "context parallel, 2 ranks (ring attention)"}, schemes
    for row in rows:
        assert row["measured"] > 0 and row["formula"] > 0
        assert abs(row["ratio"] - 1) <= long_sequences.GOAL, row      # the formula holds within 5 %
    assert "| scheme | sequence | measured bytes | formula bytes | measured / formula |" in report["markdown"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ring_attention_is_timed_beside_one_process_and_holds_less_a_rank(report):
    (row,) = report["figures"]["ring"]
    assert row["sequence"] == 256 and row["time_ratio"]["n"] == 1
    assert row["one_process_ms"]["median"] > 0 and row["ring_ms"]["median"] > 0
    assert row["ring_peak"] < row["one_process_peak"]        # each rank holds its share, not the whole
    compared = report["figures"]["context_parallel"]
    if torch.cuda.device_count() < 2:
        assert compared["ran"] is False and "CUDA" in compared["why"]
    else:                                    # the lab's ring beside PyTorch's on 2 GPUs
        assert compared["ran"], compared["why"]
        assert compared["ring_ms"]["median"] > 0 and compared["context_parallel_ms"]["median"] > 0
    assert any("context_parallel" in line["figure"] for line in report["headline"])
