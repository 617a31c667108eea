"""Covers: bench.long_sequences.

bench/long_sequences.py measures what it says, at --quick's size: each scheme's activation memory
against the formula, the three forms of context parallelism against one process (time, memory a rank,
bytes against their formulas), and says why PyTorch's context_parallel was not compared where it cannot
run (and what torch says on CPU ranks). Structure and invariants only, never
speed."""
from __future__ import annotations

import json

import long_sequences  # bench/long_sequences.py (the conftest puts bench/ on sys.path)
import pytest
import torch

import course


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
def test_the_three_forms_are_timed_beside_one_process_and_their_bytes_held_to_their_formulas(report):
    rows = {row["form"]: row for row in report["figures"]["forms"]}
    assert set(rows) == {"one process", "all-gather", "ring", "Ulysses"}, rows.keys()
    for row in rows.values():
        assert row["sequence"] == 256 and row["time_ratio"]["n"] == 1 and row["ms"]["median"] > 0
        assert 0 < row["kept"] <= row["peak"]
    # Each rank keeps its share; on one blockwise kernel the all-gather and the ring keep the same (out and lse).
    assert rows["ring"]["kept"] == rows["all-gather"]["kept"] < rows["one process"]["kept"] / 10
    assert rows["ring"]["peak"] < rows["one process"]["peak"]
    # Bytes: the ring's and Ulysses' as their formulas; gloo all-reduces the all-gather's reduce-scatter, so more.
    assert rows["one process"]["sent"] == rows["one process"]["formula"] == 0
    for form in ("ring", "Ulysses"):
        assert rows[form]["sent"] == rows[form]["formula"] > 0, rows[form]
    assert rows["all-gather"]["sent"] > rows["all-gather"]["formula"] > 0
    assert rows["Ulysses"]["sent"] < rows["all-gather"]["formula"] < rows["ring"]["sent"]
    compared = report["figures"]["context_parallel"]
    if torch.cuda.device_count() < 2:     # tried on CPU ranks: torch says why, and the report says it
        assert compared["ran"] is False and "CUDA" in compared["why"] and "CPU ranks" in compared["why"]
    else:                                    # the lab's ring beside PyTorch's on 2 GPUs, both rotate methods
        assert compared["ran"], compared["why"]
        assert all(compared["ms"][way]["median"] > 0 for way in ("ring", "allgather", "alltoall"))
    assert any("context_parallel" in line["figure"] for line in report["headline"])
    assert "| tokens | form | ms |" in report["markdown"]


@pytest.mark.timeout(120)
def test_ulysses_refuses_heads_the_ranks_do_not_divide_naming_both():
    # The lab's 4 heads over 3 ranks: each rank would get 4/3 of a head.
    with pytest.raises(Exception, match=r"4 heads do not divide by 3 ranks"):
        course.launch(long_sequences.LAB.attention_step, 3, args=("Ulysses", 12), kwargs=dict(repeats=1))
