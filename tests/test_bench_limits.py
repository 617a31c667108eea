"""Covers: bench._limits.

bench/_limits.py measures what it says, one round: the loopback link from a stream of messages and a copy in
memory, each a positive rate of bytes a second over the round; gloo's own all-reduce's path from the bytes its
sockets carried, which on Linux is at least the ring formula's with LOCAL_WORLD_SIZE unset and set (the installed
torch's gloo has TCP only: a shared-memory path would carry next to nothing); and the bus bandwidth is nccl-tests'
2(N - 1)/N · S / t. Structure and invariants only, never speed."""
from __future__ import annotations

import sys

import _limits  # bench/_limits.py (the conftest puts bench/ on sys.path)
import pytest


@pytest.fixture(scope="module")
def limits():
    return _limits.measure(rounds=1)


def test_the_link_and_the_copy_are_rates_over_the_rounds(limits):
    assert limits["rounds"] == 1
    for key in ("loopback_GBps", "loopback_both_ways_GBps", "copy_GBps"):
        figure = limits[key]
        assert figure["n"] == 1 and 0 < figure["min"] <= figure["median"] <= figure["max"], (key, figure)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sockets' bytes come from /proc/self/io")
def test_gloo_s_all_reduce_writes_the_ring_s_bytes_to_its_sockets_with_and_without_local_world_size(limits):
    path = limits["gloo_path"]
    formula = 2 * (path["ranks"] - 1) / path["ranks"] * path["tensor_MB"] * 1e6
    assert path["formula_bytes"] == formula
    for key in ("written_LOCAL_WORLD_SIZE_unset", "written_LOCAL_WORLD_SIZE_set"):
        assert len(path[key]) == 2 and all(formula <= w < formula + 64 * 1024 for w in path[key]), (key, path)
    assert path["path"] == "TCP sockets, both ways"
    text = _limits.limits_text(limits)
    assert "LOCAL_WORLD_SIZE unset" in text and "TCP sockets, both ways" in text and "GB/s" in text


def test_bus_bandwidth_is_what_each_rank_s_link_carries():
    assert _limits.bus_bandwidth(16e6, 2, 0.01) == pytest.approx(16e6 / 0.01)       # 2(N-1)/N = 1
    assert _limits.bus_bandwidth(16e6, 4, 0.01) == pytest.approx(1.5 * 16e6 / 0.01)
