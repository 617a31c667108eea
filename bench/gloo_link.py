"""The alpha-beta figures of local gloo on this machine (course.timemodel.LOCAL_GLOO).

Times all_reduce on 2 ranks for a small and a large tensor (medians of
repeated calls, every rank's slowest) and solves the model of a 2-rank ring,
t = 2 (alpha + (b/2) / beta), for alpha (from the small one) and beta (from
the large one). Prints them beside the preset the course uses.

    python bench/gloo_link.py [--small 1024] [--large 16000000] [--ranks 2]
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1024, help="bytes of the small all_reduce")
    parser.add_argument("--large", type=int, default=16_000_000, help="bytes of the large all_reduce")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    n = args.ranks
    small = max(course.launch(median_all_reduce, n, args=(args.small, 200)))
    large = max(course.launch(median_all_reduce, n, args=(args.large, 20)))
    steps = 2 * (n - 1)
    alpha = small / steps  # the small message's bytes take next to no time
    beta = (args.large / n) / (large / steps - alpha)
    print(f"all_reduce on {n} gloo ranks: {args.small:,} B in {small * 1e3:.2f} ms, "
          f"{args.large:,} B in {large * 1e3:.1f} ms (medians, slowest rank)")
    print(f"measured: alpha = {alpha * 1e3:.3f} ms, beta = {beta / 1e9:.2f} GB/s")
    print(f"preset {LOCAL_GLOO.name!r}: alpha = {LOCAL_GLOO.alpha * 1e3:.3f} ms, "
          f"beta = {LOCAL_GLOO.beta / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
