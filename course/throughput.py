"""Throughput against batch size: measure it, and say what the curve shows.

    frame = throughput.sweep(make_step, [16, 32, 64, 128])
    print(throughput.lesson(frame, "cpu"))

`make_step(batch_size)` sets up a training step for that batch size and
returns a function that runs one step and returns how long it took, in
seconds, measured with synchronisation (the phase timer of lab 1 does this).
Steps are timed after a warm-up; the median is reported, with min and max.

Used in: lab 1 (01_single_gpu).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import pandas as pd
from tqdm.auto import tqdm

#: The sources' claim, not a law: Dettmers' 2014 blog, reasoning from the 64×128 tiles in which
#: cuBLAS then computed a matrix product, says per-GPU batches under SMALL_BATCH, or not a
#: multiple of TILE, waste the GPU. Today's libraries pick among many tile shapes; `lesson`
#: says whether the measured curve shows the rule, and never assumes it.
SMALL_BATCH, TILE = 64, 32
#: An off-grid batch counts as slower than its neighbours when its median falls this far below
#: the straight line between them, and its fastest step below the line too: less is noise.
OFF_GRID_TOLERANCE = 0.10


def sweep(make_step: Callable[[int], Callable[[], float]], batch_sizes: Sequence[int], *,
          steps: int = 8, warmup: int = 2, progress: bool = True) -> pd.DataFrame:
    """Time `steps` steps at each batch size; one row per batch size.

    Columns: batch_size, ms_per_step (median), samples_per_s (from the
    median), samples_per_s_min / _max (slowest and fastest step).
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    batch_sizes = [int(b) if int(b) == b else b for b in batch_sizes]  # numpy arrays, ranges too
    if len(batch_sizes) == 0 or any(int(b) != b or b < 1 for b in batch_sizes):
        raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
    rows = []
    for batch_size in tqdm(list(batch_sizes), desc="batch sizes", disable=not progress):
        step = make_step(batch_size)
        for _ in range(warmup):
            step()
        seconds = [float(step()) for _ in range(steps)]
        if min(seconds) <= 0:
            raise ValueError(f"a step at batch size {batch_size} took {min(seconds)} s: "
                             "make_step's function must return the step's duration in seconds")
        median = statistics.median(seconds)
        rows.append({"batch_size": batch_size, "ms_per_step": median * 1e3,
                     "samples_per_s": batch_size / median,
                     "samples_per_s_min": batch_size / max(seconds),
                     "samples_per_s_max": batch_size / min(seconds)})
    return pd.DataFrame(rows)


def _neighbours(frame: pd.DataFrame, batch_size: int):
    """The nearest multiples of TILE measured below and above batch_size, if any."""
    aligned = frame[frame.batch_size % TILE == 0]
    below, above = aligned[aligned.batch_size < batch_size], aligned[aligned.batch_size > batch_size]
    if below.empty or above.empty:
        return None
    return below.iloc[-1], above.iloc[0]


def _listed(numbers: list[int]) -> str:
    """'48', '48 and 80', '16, 48 and 80'."""
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def lesson(frame: pd.DataFrame, device: str) -> str:
    """What the measured curve shows on `device`, in sentences built from its numbers."""
    frame = frame.sort_values("batch_size").reset_index(drop=True)
    best = frame.loc[frame.samples_per_s.idxmax()]
    share = frame.samples_per_s / best.samples_per_s
    lines = [f"On {device}, the best throughput is {best.samples_per_s:,.0f} samples/s, "
             f"at batch size {int(best.batch_size)}."]
    small = frame[frame.batch_size < SMALL_BATCH]
    if not small.empty:
        lo, hi = share[small.index].min(), share[small.index].max()
        lines.append(f"Batches under {SMALL_BATCH} reach {lo:.0%} to {hi:.0%} of that: "
                     f"{1 - hi:.0%} or more of what the device could do is wasted.")
    at_small = frame[frame.batch_size == SMALL_BATCH]
    if not at_small.empty:
        lines.append(f"At {SMALL_BATCH}, throughput is {share[at_small.index[0]]:.0%} of the best.")
    # Batches off the tile grid: compared with the straight line between the
    # multiples of TILE on either side of them.
    compared, slower = [], []
    for _, row in frame[frame.batch_size % TILE != 0].iterrows():
        pair = _neighbours(frame, row.batch_size)
        if pair is None:
            continue
        lo_row, hi_row = pair
        fraction = (row.batch_size - lo_row.batch_size) / (hi_row.batch_size - lo_row.batch_size)
        line = lo_row.samples_per_s + fraction * (hi_row.samples_per_s - lo_row.samples_per_s)
        change = row.samples_per_s / line - 1
        verdict = "below" if change < 0 else "above"
        lines.append(f"Batch {int(row.batch_size)} (not a multiple of {TILE}) is {abs(change):.0%} {verdict} "
                     f"the line between {int(lo_row.batch_size)} and {int(hi_row.batch_size)}.")
        compared.append(int(row.batch_size))
        # Slower only if even its fastest step is under the line: a noisy sweep is not a tile effect.
        if change < -OFF_GRID_TOLERANCE and row.samples_per_s_max < line:
            slower.append(int(row.batch_size))
    if slower:
        one = len(slower) == 1
        lines.append(f"So on {device}, {'batch' if one else 'batches'} {_listed(slower)}, off the multiples of "
                     f"{TILE}, {'is' if one else 'are'} slower than {'its' if one else 'their'} neighbours (more than "
                     f"{OFF_GRID_TOLERANCE:.0%} below the line between them, fastest step included): this curve "
                     "shows the slowdown the sources' tile rule predicts.")
    elif compared:
        lines.append(f"So on {device}, no batch off the multiples of {TILE} is slower than its neighbours (more than "
                     f"{OFF_GRID_TOLERANCE:.0%} below the line between them, fastest step included): this curve "
                     "does not show the sources' tile rule.")
    # Where the curve flattens: the smallest batch within 10 % of the best.
    knee = frame[share >= 0.9].batch_size.min()
    lines.append(f"The curve is within 10% of its best from batch size {int(knee)} on.")
    return "\n".join(lines)
