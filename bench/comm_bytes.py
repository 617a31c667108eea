"""Bytes each rank sends per collective: the formula against gloo's sockets.

Runs every collective once on a ROWS x COLS float32 tensor (default 1000 x 500,
2,000,000 bytes) on 2 and 4 ranks and prints, per operation and rank, the
bytes predicted by the algorithm's formula and the bytes the process wrote
(the wchar line of /proc/self/io), with the difference (gloo's headers).

    python bench/comm_bytes.py [--rows 1000] [--cols 500]
"""
import argparse
import warnings

import torch
import torch.distributed as dist

import course


def every_collective(rows, cols):
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 renamed the *_tensor forms
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(rows, cols)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.all_gather([torch.empty_like(t) for _ in range(n)], t)
    dist.all_gather_into_tensor(torch.empty(n * rows, cols), t)
    dist.reduce_scatter(t, [torch.ones_like(t) for _ in range(n)])
    dist.reduce_scatter_tensor(t, torch.ones(n * rows, cols))
    dist.all_to_all_single(torch.empty(n * rows, cols), torch.ones(n * rows, cols))
    dist.gather(t, [torch.empty_like(t) for _ in range(n)] if rank == 0 else None, dst=0)
    dist.scatter(t, [torch.ones_like(t) for _ in range(n)] if rank == 0 else None, src=0)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    dist.barrier()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--cols", type=int, default=500)
    options = parser.parse_args()
    for world_size in (2, 4):
        results = course.launch(every_collective, world_size, args=(options.rows, options.cols))
        print(f"\n{world_size} ranks, backend {results.backend}, tensor "
              f"{options.rows}x{options.cols} float32 ({options.rows * options.cols * 4:,} bytes)")
        print(f"{'operation':<24}{'rank':>5}{'predicted':>14}{'measured':>14}{'headers':>9}  algorithm")
        for r in sorted(results.comm, key=lambda r: (r.op, r.rank)):
            measured = "n/a" if r.measured is None else f"{r.measured:,}"
            extra = "" if r.measured is None else f"{r.measured - r.predicted:,}"
            print(f"{r.op:<24}{r.rank:>5}{r.predicted:>14,}{measured:>14}{extra:>9}  {r.algorithm}")


if __name__ == "__main__":
    main()
