"""How long it takes to start N ranks and have them join a process group.

Side by side, in one run: course.launch (forkserver with torch preloaded,
cloudpickle) against multiprocessing's spawn, which starts a fresh Python and
imports torch in every rank. Each figure is the median (and range) of repeated
launches of a function that only joins the group and returns; the first
course.launch, which starts the forkserver, is reported on its own.

    python bench/launch_latency.py [--repeats 20] [--spawn-repeats 3] [--json PATH]
"""
import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from _results import count, emit, headline_row
from _rounds import spread, spread_text

import course

RANKS = (2, 4)


def joined():
    return 0


def _spawned_rank(rank, world_size, store_path):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    # The ranks meet through a file, as course.launch's do.
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size)
    dist.destroy_process_group()


def spawn_once(world_size: int) -> float:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="spawned-ranks-") as meeting:
        context = multiprocessing.get_context("spawn")
        ranks = [context.Process(target=_spawned_rank, args=(r, world_size, os.path.join(meeting, "store")))
                 for r in range(world_size)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join()
    return time.perf_counter() - started


def launch_once(world_size: int) -> float:
    started = time.perf_counter()
    course.launch(joined, world_size)
    return time.perf_counter() - started


def markdown(first: float, by_ranks: list[dict]) -> str:
    lines = [f"First `course.launch` of the run (starts the forkserver, which imports torch once): {first:.2f} s.",
             "", "| ranks | `course.launch` | spawn instead | spawn / launch (medians) |", "|---|---|---|---|"]
    for r in by_ranks:
        lines.append(f"| {r['ranks']} | {spread_text(r['launch_s'], '{:.3f}', ' s')} | "
                     f"{spread_text(r['spawn_s'], '{:.2f}', ' s')} | "
                     f"{r['spawn_s']['median'] / r['launch_s']['median']:.0f}× |")
    launches, spawns = by_ranks[0]["launch_s"]["n"], by_ranks[0]["spawn_s"]["n"]
    lines += ["", f"(medians (min-max) of {launches} launches and {spawns} spawns per rank count; "
              f"gloo, one thread per rank, {os.cpu_count()} CPU cores)"]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--spawn-repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args()

    first = launch_once(2)
    by_ranks = [{"ranks": n,
                 "launch_s": spread(launch_once(n) for _ in range(options.repeats)),
                 "spawn_s": spread(spawn_once(n) for _ in range(options.spawn_repeats))} for n in RANKS]
    headline = [headline_row(f"`course.launch`, {r['ranks']} ranks", spread_text(r["launch_s"], "{:.3f}", " s") +
                             f"; spawn {r['spawn_s']['median']:.2f} s",
                             f"{count(options.repeats, 'launch', 'launches')}, {count(options.spawn_repeats, 'spawn')}")
                for r in by_ranks]
    emit(options.json, title="Launch latency", markdown=markdown(first, by_ranks), headline=headline,
         figures={"first_launch_s": first, "by_ranks": by_ranks})


if __name__ == "__main__":
    main()
