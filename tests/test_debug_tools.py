"""Covers: bench.debug_tools, bench._debug_ranks.

What docs/course-package.md's "Debugging tools on gloo" says lab 10 can rely on, held against the installed torch
on real gloo ranks, so that a torch whose answer changes fails here and the page is brought up to date: the
Flight Recorder records gloo's collectives (op, sequence number, sizes, the Python caller) but not send/recv,
nor any state past "scheduled", nor its groups' config under their names; a rank that skips an all_reduce shows
as the other rank's buffer one call longer; a timeout dumps nothing by itself; the analyzer fails on gloo's
dumps as written and names the missing rank once the group's config carries its entries' name;
TORCH_DISTRIBUTED_DEBUG=DETAIL names a mismatch on gloo. And the launcher the probes use kills and reaps a rank
that never returns. Never timing."""
from __future__ import annotations

import shutil

import _debug_ranks as ranks  # bench/_debug_ranks.py (the conftest puts bench/ on sys.path)
import debug_tools  # bench/debug_tools.py
import pytest
import torch

needs_fr_dump = pytest.mark.skipif(
    not hasattr(torch._C._distributed_c10d, "_dump_fr_trace"),
    reason=f"torch {torch.__version__} has no torch._C._distributed_c10d._dump_fr_trace, the Flight Recorder's "
           "dump for every backend (torch 2.13 has it; the page's findings are for that torch)")


def verdicts(rows: list[dict]) -> dict:
    return {row["tool"]: row["verdict"] for row in rows}


@needs_fr_dump
def test_the_flight_recorder_records_gloo_s_collectives_but_not_send_recv_nor_their_state():
    rows = {row["tool"]: row for row in debug_tools.flight_recorder()}
    assert verdicts(rows.values()) == {
        "Flight Recorder: records collectives": "works", "Flight Recorder: send/recv": "not",
        "Flight Recorder: each call's state": "not", "Flight Recorder: each group's config (pg_config)": "not",
        "Flight Recorder: TORCH_FR_BUFFER_SIZE": "works"}
    for rank, found in rows["Flight Recorder: records collectives"]["figures"]["ranks"].items():
        assert [(e["profiling_name"], e["collective_seq_id"], e["input_sizes"]) for e in found["entries"]] == [
            ("gloo:all_reduce", 1, [[4]]), ("gloo:broadcast", 2, [[4]]), ("gloo:all_gather", 3, [[4]]),
            ("gloo:barrier", 4, [])], rank
        assert all(e["caller"].startswith("_debug_ranks.py:") for e in found["entries"]), found["entries"]
        assert found["json_entries"] == len(found["entries"])      # the JSON dump holds the same entries
        # the group's config is filed under "" (the analyzer looks it up by the entries' "0"), and a new_group's
        # entries come with that config's ranks emptied
        assert found["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
        assert found["with_new_group"] == {"groups": [["0", "default_pg"], ["1", "undefined"]],
                                           "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    assert rows["Flight Recorder: TORCH_FR_BUFFER_SIZE"]["figures"] == {"TORCH_FR_BUFFER_SIZE": 0,
                                                                        "TORCH_NCCL_TRACE_BUFFER_SIZE": 0}


@needs_fr_dump
def test_a_skipped_all_reduce_shows_in_the_buffers_and_the_analyzer_needs_the_group_s_name():
    rows = {row["tool"]: row for row in debug_tools.hang()}
    assert verdicts(rows.values()) == {
        "Flight Recorder: a hang": "works", "Flight Recorder: dump on timeout (TORCH_FR_DUMP_TEMP_FILE)": "not",
        "Flight Recorder: the analyzer (fr_trace)": "partly"}
    run = rows["Flight Recorder: a hang"]["figures"]
    waited, skipped = run["ranks"][0], run["ranks"][1]
    assert "Timed out waiting 2000ms" in waited["raised"] and skipped["raised"] is None
    assert [e["collective_seq_id"] for e in waited["entries"]] == [1, 2]
    assert [e["collective_seq_id"] for e in skipped["entries"]] == [1]
    assert waited["entries"][-1]["state"] == "scheduled"          # the call that timed out, as any other
    analyzer = rows["Flight Recorder: the analyzer (fr_trace)"]["figures"]
    assert analyzer["as_dumped"]["raised"].startswith("KeyError"), analyzer["as_dumped"]
    assert analyzer["named"]["raised"] is None and "missing ranks: {1}" in analyzer["named"]["output"]
    assert "collective: gloo:all_reduce" in analyzer["named"]["output"]


@pytest.mark.parametrize("kind, differs", [("shape", "TensorShape=[5]"), ("op", "OpType=BROADCAST")])
def test_detail_names_a_mismatched_collective_on_gloo_on_both_ranks(kind, differs):
    run = ranks.start(ranks.mismatch, 2, args=(kind,), env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    shutil.rmtree(run["folder"])
    for rank, found in run["ranks"].items():
        assert "Detected mismatch between collectives on ranks" in found["raised"], (rank, found)
        assert differs in found["raised"]
        assert found["result"] == [float(rank + 1)] * len(found["result"])     # checked before any data moved


def test_a_rank_that_never_returns_is_killed_and_reaped_at_the_launcher_s_timeout():
    # every rank absent from the barrier: each waits WAIT_S for a rank 0 that never comes
    run = ranks.start(ranks.monitored, 2, args=({0, 1},), timeout_s=1.0)
    try:
        assert ranks.WAIT_S > 1.0
        assert run["ranks"] == {0: None, 1: None}
        assert run["exit_codes"] == {0: -9, 1: -9}
        assert not list(run["folder"].glob("rank*.json"))
    finally:
        shutil.rmtree(run["folder"])
