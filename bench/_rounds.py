"""What the benchmarks share: timing without the course's recording, turning
alternating rounds into medians and a round-by-round ratio, and any repeated
measurement into its median and range.

A round's time is the slowest rank's, each rank's the median of its calls (or
training steps) in that round; the ratio of two contenders is taken round by
round, so that both saw the same machine, and reported as median and range.
"""
from __future__ import annotations

import functools
import statistics

import course


def unrecorded(rank_function):
    """Time without the course's recording: PyTorch's C++ collectives never pay for it."""
    @functools.wraps(rank_function)
    def run(*args):
        with course.recorder.unrecorded():
            return rank_function(*args)
    return run


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
