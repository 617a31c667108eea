"""What the side-by-side benchmarks share: timing without the course's recording,
and turning alternating rounds into medians and a round-by-round ratio.

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
        with course.comm.unrecorded():
            return rank_function(*args)
    return run


def per_round(results, key):
    """Seconds of each round: the slowest rank's, each rank's the median of its steps."""
    ranks = [results[rank][key] for rank in results.ranks]
    return [max(statistics.median(steps) for steps in rounds) for rounds in zip(*ranks)]


def compare(results, ours, theirs):
    """Medians of both (ms), and the round-by-round ratio: median, min, max."""
    a, b = per_round(results, ours), per_round(results, theirs)
    ratios = [x / y for x, y in zip(a, b)]
    return {"ours_ms": statistics.median(a) * 1e3, "theirs_ms": statistics.median(b) * 1e3,
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def ratio_text(figures) -> str:
    return f"{figures['ratio']:.2f}× ({figures['ratio_min']:.2f}-{figures['ratio_max']:.2f})"
