"""Bytes each rank sends per collective: the formula against gloo's sockets.

Runs every collective once on a ROWS x COLS float32 tensor (default 1000 x 500,
2,000,000 bytes) on 2 and 4 ranks and prints, per operation and rank, the
bytes predicted by the algorithm's formula and the bytes the process wrote
(the wchar line of /proc/self/io), with the difference (gloo's headers).

    python bench/comm_bytes.py [--rows 1000] [--cols 500]
"""
import argparse

import course
from course import comm


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--cols", type=int, default=500)
    options = parser.parse_args()
    for world_size in (2, 4):
        results = course.launch(comm.every_collective, world_size, args=(options.rows, options.cols))
        print(f"\n{world_size} ranks, backend {results.backend}, tensor "
              f"{options.rows}x{options.cols} float32 ({options.rows * options.cols * 4:,} bytes)")
        print(f"{'operation':<24}{'rank':>5}{'predicted':>14}{'measured':>14}{'headers':>9}  algorithm")
        for r in sorted(results.comm, key=lambda r: (r.op, r.rank)):
            measured = "n/a" if r.measured is None else f"{r.measured:,}"
            extra = "" if r.measured is None else f"{r.measured - r.predicted:,}"
            print(f"{r.op:<24}{r.rank:>5}{r.predicted:>14,}{measured:>14}{extra:>9}  {r.algorithm}")


if __name__ == "__main__":
    main()
