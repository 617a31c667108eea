"""How long it takes to start N ranks and have them join a process group.

Side by side, in one run: course.launch (forkserver with torch preloaded,
cloudpickle) against multiprocessing's spawn, which starts a fresh Python and
imports torch in every rank. Each figure is the median of repeated launches of
a function that only joins the group and returns; the first course.launch,
which starts the forkserver, is reported on its own.

    python bench/launch_latency.py [--repeats 20] [--spawn-repeats 3]
"""
import argparse
import datetime
import multiprocessing
import os
import statistics
import time

import course


def joined():
    return 0


def _spawned_rank(rank, world_size, port):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    dist.destroy_process_group()


def spawn_once(world_size: int) -> float:
    import torch.distributed as dist
    started = time.perf_counter()
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_spawned_rank, args=(r, world_size, store.port))
             for r in range(world_size)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
    del store
    return time.perf_counter() - started


def launch_once(world_size: int) -> float:
    started = time.perf_counter()
    course.launch(joined, world_size)
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--spawn-repeats", type=int, default=3)
    options = parser.parse_args()

    first = launch_once(2)
    print(f"first course.launch (starts the forkserver, imports torch once): {first:.2f} s")
    print(f"{'ranks':>5}  {'course.launch (median)':>22}  {'spawn (median)':>14}  {'ratio':>6}")
    for world_size in (2, 4):
        fast = statistics.median(launch_once(world_size) for _ in range(options.repeats))
        slow = statistics.median(spawn_once(world_size) for _ in range(options.spawn_repeats))
        print(f"{world_size:>5}  {fast:>20.3f} s  {slow:>12.2f} s  {slow / fast:>5.0f}x")
    print(f"(medians of {options.repeats} launches and {options.spawn_repeats} spawns; "
          f"gloo, one thread per rank, {os.cpu_count()} CPU cores)")


if __name__ == "__main__":
    main()
