"""What the benchmarks share: timing without the course's recording (or a lab's memory tracking), turning
alternating rounds into medians and a round-by-round ratio, and any repeated
measurement into its median and range.

A round's time is the slowest rank's, each rank's the median of its calls (or
training steps) in that round; the ratio of two contenders is taken round by
round, so that both saw the same machine, and reported as median and range.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import types

import course


def unrecorded(rank_function):
    """Time without the course's recording: PyTorch's C++ collectives never pay for it."""
    @functools.wraps(rank_function)
    def run(*args):
        with course.recorder.unrecorded():
            return rank_function(*args)
    return run


class _NoTracker:
    """LiveMemory's interface, measuring nothing."""

    peak = None

    def __init__(self, device):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def track(self, *objects):
        return self


@contextlib.contextmanager
def no_memory_tracker(function):
    """Within the block, a lab's functions measure no live memory: `live_memory` is swapped for a tracker
    of nothing in `function`'s own globals, which the lab's cells share. (Lab 5's `pytorch_training`
    always measures it, on the CPU through a dispatch mode that sees every op; `sharded_training` only
    when asked: timed, neither does.)"""
    names = function.__globals__
    kept = names["live_memory"]
    names["live_memory"] = types.SimpleNamespace(LiveMemory=_NoTracker)
    try:
        yield
    finally:
        names["live_memory"] = kept


def per_round(results, key):
    """Seconds of each round: the slowest rank's, each rank's the median of its steps."""
    ranks = [results[rank][key] for rank in results.ranks]
    return [max(statistics.median(steps) for steps in rounds) for rounds in zip(*ranks)]


def compare(results, ours, theirs):
    """Medians of both (ms), and the round-by-round ratio: median, min, max, over how many rounds."""
    a, b = per_round(results, ours), per_round(results, theirs)
    ratios = [x / y for x, y in zip(a, b)]
    return {"ours_ms": statistics.median(a) * 1e3, "theirs_ms": statistics.median(b) * 1e3,
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "rounds": len(ratios)}


def ratio_text(figures) -> str:
    return f"{figures['ratio']:.2f}× ({figures['ratio_min']:.2f}-{figures['ratio_max']:.2f})"


def spread(values) -> dict:
    """Median, min and max of repeated measurements, and how many there were."""
    values = list(values)
    if not values:
        raise ValueError("spread() of no measurements: run at least one round")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def spread_text(figures: dict, number: str = "{:.2f}", unit: str = "") -> str:
    """'0.10 s (0.09-0.12)'; one measurement alone has no range to show."""
    median = number.format(figures["median"]) + unit
    if figures["n"] == 1:
        return median
    return f"{median} ({number.format(figures['min'])}-{number.format(figures['max'])})"
