"""Covers: bench.experts.

bench/experts.py measures what it says, at --quick's size: lab 8's all-to-all timed beside all_to_all_single
with the same bytes of rows (the sockets' bytes apart by its counts and their headers only), and the expert-parallel
step timed beside one process and the tensor-parallel experts, all three computing the same layer and each parallel
scheme sending what its formula says; the dropless layer timed beside capacity in the dispatch, which sends its fixed
buffers and exchanges no counts. Structure and invariants only, never speed."""
from __future__ import annotations

import json

import experts  # bench/experts.py (the conftest puts bench/ on sys.path)
import pytest

HEADER_BYTES = 1024      # far above gloo's header for one message (144 bytes on Linux)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The whole benchmark, once, --quick: 1 round, small sizes."""
    path = tmp_path_factory.mktemp("bench") / "experts.json"
    experts.main(["--quick", "--json", str(path)])
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_lab_s_all_to_all_sends_all_to_all_single_s_rows_and_is_timed_beside_it(report):
    figures = report["figures"]
    assert figures["quick"] and figures["rounds"] == 1 and figures["ranks"] == experts.RANKS
    (row,) = figures["exchange"]
    assert (row["rows"], row["width"]) == (experts.QUICK["exchange_rows"][0], experts.QUICK["width"])
    assert row["yours_ms"]["median"] > 0 and row["all_to_all_single_ms"]["median"] > 0
    assert row["time_ratio"]["n"] == 1 and row["goal_met"] == (row["time_ratio"]["median"] <= experts.GOAL)
    assert [b["rank"] for b in row["bytes"]] == list(range(experts.RANKS))
    for b in row["bytes"]:
        assert b["formula"] > 0 and b["yours_rows"] == b["all_to_all_single"] == b["formula"], b
        assert b["yours_counts"] == 8 * (experts.RANKS - 1), b        # one int64 count to each other rank
        assert b["yours_messages"] == 2 * (experts.RANKS - 1), b      # its counts, then its rows
        if figures["backend"] == "gloo" and b["yours_measured"] is not None:   # the sockets: headers and counts
            assert b["theirs_measured"] - b["all_to_all_single"] in range(0, HEADER_BYTES), b
            assert b["yours_counts"] <= b["yours_measured"] - b["theirs_measured"] < HEADER_BYTES, b
    assert "| rows a rank | lab's all_to_all | all_to_all_single |" in report["markdown"]
    assert any("all_to_all_single" in line["figure"] and f"goal ≤ {experts.GOAL}×" in line["value"]
               for line in report["headline"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_expert_parallel_step_is_timed_beside_one_process_and_tensor_parallelism_on_the_same_layer(report):
    (row,) = report["figures"]["layer"]
    hidden, ffn, tokens = experts.QUICK["layers"][0]
    assert (row["hidden"], row["ffn"], row["tokens"]) == (hidden, ffn, tokens)
    assert set(row["ms"]) == set(experts.SCHEMES)
    assert all(row["ms"][scheme]["median"] > 0 and row["ms"][scheme]["n"] == 1 for scheme in experts.SCHEMES)
    assert row["over_one_process"]["median"] > 0 and row["over_tensor_parallel"]["median"] > 0
    assert set(row["difference"]) == set(row["sent"]) == {"expert parallel", "tensor parallel"}
    for scheme, difference in row["difference"].items():
        assert difference <= 1e-5, (scheme, difference)       # the same layer, to float32's rounding
    for b in row["sent"]["expert parallel"]:                   # each row out and back, forward and backward
        assert b["counted"] == b["by the routing"] > 0, b
    for b in row["sent"]["tensor parallel"]:                   # two ring all-reduces of the N·T tokens
        assert b["counted"] == b["formula"] > 0, b
    assert "| hidden | ffn | T | one process | expert parallel | tensor parallel |" in report["markdown"]
    figures = [line["figure"] for line in report["headline"]]
    assert any("one process" in f for f in figures) and any("tensor-parallel" in f for f in figures)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_capacity_in_the_dispatch_sends_its_fixed_buffers_and_no_counts_beside_the_dropless_layer(report):
    (row,) = report["figures"]["dispatch"]
    hidden, ffn, tokens = experts.QUICK["layers"][0]
    assert (row["hidden"], row["ffn"], row["tokens"]) == (hidden, ffn, tokens)
    assert set(row["ms"]) == set(row["sent"]) == set(row["dropped"]) == set(experts.DISPATCHES)
    assert all(row["ms"][scheme]["median"] > 0 for scheme in experts.DISPATCHES)
    for scheme, sent in row["sent"].items():          # dropless: the routing's rows; capacity: the fixed buffers'
        for b in sent:
            assert b["counted"] == b["expected"] > 0, (scheme, b)
    for scheme in experts.DISPATCHES[1:]:             # no exchange of counts: one collective fewer a step
        assert row["collectives"][scheme] < row["collectives"]["expert parallel"], row["collectives"]
    assert row["dropped"]["expert parallel"] == 0
    assert 0 <= row["dropped"]["capacity 1.25"] <= row["dropped"]["capacity 1.0"] < 1, row["dropped"]
    assert "| hidden | T | dispatch | step | / dropless (range) |" in report["markdown"]
    assert any("in the dispatch / dropless" in line["figure"] for line in report["headline"])


def test_no_rounds_is_refused():
    with pytest.raises(SystemExit):
        experts.main(["--rounds", "0"])
