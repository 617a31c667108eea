"""The alpha-beta figures of local gloo on this machine (course.timemodel.LOCAL_GLOO).

Times all_reduce on 2 ranks for a small and a large tensor (medians of
repeated calls, every rank's slowest) and solves the model of a 2-rank ring,
t = 2 (alpha + (b/2) / beta), for alpha (from the small one) and beta (from
the large one). Repeats that --runs times (median and range) and prints them
beside the preset the course uses.

    python bench/gloo_link.py [--small 1024] [--large 16000000] [--ranks 2] [--runs 3] [--json PATH]
"""
import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _results import count, emit, headline_row
from _rounds import spread, spread_text

import course
from course.timemodel import LOCAL_GLOO


def median_all_reduce(nbytes, repeats):
    t = torch.ones(nbytes // 4)
    dist.all_reduce(t)  # warm up the connections
    dist.barrier()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def alpha_beta(n: int, small_bytes: int, large_bytes: int) -> tuple[float, float]:
    """One run: (alpha in s, beta in bytes/s) on n ranks."""
    small = max(course.launch(median_all_reduce, n, args=(small_bytes, 200)))
    large = max(course.launch(median_all_reduce, n, args=(large_bytes, 20)))
    steps = 2 * (n - 1)
    alpha = small / steps  # the small message's bytes take next to no time
    return alpha, (large_bytes / n) / (large / steps - alpha)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1024, help="bytes of the small all_reduce")
    parser.add_argument("--large", type=int, default=16_000_000, help="bytes of the large all_reduce")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    runs = [alpha_beta(args.ranks, args.small, args.large) for _ in range(args.runs)]
    alpha_ms = spread(a * 1e3 for a, _ in runs)
    beta_gbs = spread(b / 1e9 for _, b in runs)
    measured = f"alpha {spread_text(alpha_ms, '{:.3f}', ' ms')}, beta {spread_text(beta_gbs, '{:.2f}', ' GB/s')}"
    markdown = (f"all_reduce on {args.ranks} gloo ranks, {args.small:,} B and {args.large:,} B (each a median of "
                f"repeated calls, slowest rank), solved for the alpha-beta model; {args.runs} runs, "
                f"median (min-max).\n\n"
                f"- measured: {measured}\n- the course's preset {LOCAL_GLOO.name!r}: alpha "
                f"{LOCAL_GLOO.alpha * 1e3:.3f} ms, beta {LOCAL_GLOO.beta / 1e9:.2f} GB/s")
    emit(args.json, title="Local gloo as the time model sees it", markdown=markdown,
         headline=[headline_row(f"local gloo, {args.ranks} ranks", measured, count(args.runs, "run"))],
         figures={"ranks": args.ranks, "alpha_ms": alpha_ms, "beta_GB_per_s": beta_gbs,
                  "preset": {"alpha_ms": LOCAL_GLOO.alpha * 1e3, "beta_GB_per_s": LOCAL_GLOO.beta / 1e9}})


if __name__ == "__main__":
    main()
