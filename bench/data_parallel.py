"""Lab 2's reference solution against torch.distributed's own, measured side by side.

1. The hand-written ring all-reduce (built from isend/recv) against gloo's
   all_reduce, on 1 MB and 16 MB of float32, on 2 and 4 ranks.
2. Bucketed data parallelism with all-reduces started during backward (the
   lab's BucketedGradients) against DistributedDataParallel, at the same
   bucket size, training the lab's wide MLP: step time (the goal is 1.05x
   DDP's or better).

Every comparison runs in one launch, the contenders alternating round by
round, so that both see the same machine, with the course's recording of
torch.distributed calls turned off (`course.recorder.unrecorded`). A round's time
is the slowest rank's, each rank's the median of its calls (or training
steps) in that round; the ratio is taken round by round and reported as its
median and range. Prints markdown tables; --json writes them with the figures
(bench/_results.py).

    python bench/data_parallel.py [--rounds 15] [--json bench/results/data_parallel.json]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _results import count, emit, headline_row
from _rounds import compare, ratio_text, unrecorded

import course
from grader.common.solution import load

LAB = load("02_data_parallel")
SIZES_MB = (1, 16)
RANKS = (2, 4)
CALLS_PER_ROUND = 5


@unrecorded
def time_all_reduces(sizes_mb, rounds):
    """Runs on every rank: {(method, MB): [[seconds per call] per round]}, the methods alternating."""
    times = {}
    tensors = {mb: torch.ones(mb * 250_000) for mb in sizes_mb}  # 250,000 float32 = 1 MB
    methods = {"ring (lab 2)": LAB.ring_all_reduce, "gloo all_reduce": dist.all_reduce}
    for method in methods.values():  # warm up: connections, allocations
        for t in tensors.values():
            method(t)
    for _ in range(rounds):
        for mb, t in tensors.items():
            for name, method in methods.items():
                calls = []
                for _ in range(CALLS_PER_ROUND):
                    dist.barrier()
                    started = time.perf_counter()
                    method(t)
                    calls.append(time.perf_counter() - started)
                times.setdefault((name, mb), []).append(calls)
    return times


@unrecorded
def time_training(bucket_bytes, rounds, steps, batch_size):
    """Runs on every rank: {contender: [[seconds per step] per round]}, the lab's buckets and DDP."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = course.device()
    x, y = course.data.synthetic(batch_size, LAB.WIDE_MLP["in_features"])
    x, y = (t.to(device) for t in LAB.shard(x, y, rank, world_size))
    contenders = {}
    for name in ("buckets (lab 2)", "DDP"):
        model = course.models.mlp(**LAB.WIDE_MLP, seed=0).to(device)
        if name == "DDP":
            net = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device] if device.type == "cuda" else None, bucket_cap_mb=bucket_bytes / 2**20)
            wait = None
        else:
            LAB.broadcast_parameters(model)
            net, wait = model, LAB.BucketedGradients(model, bucket_bytes).wait
        contenders[name] = (model, net, wait, torch.optim.SGD(model.parameters(), lr=0.01))
    times = {name: [] for name in contenders}
    for round_ in range(rounds + 1):  # round 0 warms up
        for name, (_model, net, wait, optimizer) in contenders.items():
            if round_:
                times[name].append([])
            for _ in range(steps):
                started = time.perf_counter()
                optimizer.zero_grad()
                F.cross_entropy(net(x), y).backward()
                if wait is not None:
                    wait()
                optimizer.step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if round_:
                    times[name][-1].append(time.perf_counter() - started)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds per comparison")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    report = {"all_reduce": [], "training": []}

    for n in RANKS:
        run = course.launch(time_all_reduces, n, args=(SIZES_MB, args.rounds), timeout=600)
        for mb in SIZES_MB:
            figures = compare(run, ("ring (lab 2)", mb), ("gloo all_reduce", mb))
            report["all_reduce"].append({"ranks": n, "MB": mb, **figures})

    batch_size = 2 * LAB.BATCH_SIZE
    for n in RANKS:
        for bucket_bytes in (2**20, LAB.DDP_BUCKET_BYTES):
            run = course.launch(time_training, n, args=(bucket_bytes, args.rounds, 4, batch_size), timeout=600)
            figures = compare(run, "buckets (lab 2)", "DDP")
            report["training"].append({"ranks": n, "bucket_MiB": bucket_bytes / 2**20, **figures})

    emit(args.json, title="Lab 2 against torch.distributed", markdown=markdown(report, args.rounds, batch_size),
         headline=headline(report, args.rounds), figures={"rounds": args.rounds, **report})


def markdown(report, rounds, batch_size) -> str:
    device = course.placement.choose(max(RANKS))
    lines = [f"{device.backend}, {', '.join(sorted(set(device.devices)))}; medians of {rounds} alternating "
             f"rounds, slowest rank; course recording off.", "",
             "| ranks | tensor | ring (lab 2) | gloo all_reduce | ring / gloo (range) |", "|---|---|---|---|---|"]
    for r in report["all_reduce"]:
        lines.append(f"| {r['ranks']} | {r['MB']} MB | {r['ours_ms']:.2f} ms | {r['theirs_ms']:.2f} ms | "
                     f"{ratio_text(r)} |")
    lines += ["", "| ranks | buckets | lab 2 step | DDP step | lab 2 / DDP, goal ≤ 1.05× (range) |",
              "|---|---|---|---|---|"]
    for r in report["training"]:
        lines.append(f"| {r['ranks']} | {r['bucket_MiB']:g} MiB | {r['ours_ms']:.2f} ms | {r['theirs_ms']:.2f} ms | "
                     f"{ratio_text(r)} |")
    lines += ["", f"(wide MLP {LAB.WIDE_MLP}, global batch {batch_size})"]
    return "\n".join(lines)


def headline(report, rounds) -> list[dict]:
    over = count(rounds, "round")
    rows = [headline_row(f"ring all-reduce (lab 2) / gloo `all_reduce`, {r['ranks']} ranks, {r['MB']} MB",
                         ratio_text(r), over) for r in report["all_reduce"] if r["MB"] == max(SIZES_MB)]
    rows += [headline_row(f"bucketed overlap (lab 2) / DDP step, {r['ranks']} ranks, {r['bucket_MiB']:g} MiB buckets",
                          ratio_text(r) + " (goal ≤ 1.05×)", over)
             for r in report["training"] if r["bucket_MiB"] * 2**20 == LAB.DDP_BUCKET_BYTES]
    return rows


if __name__ == "__main__":
    main()
