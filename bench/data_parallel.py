"""Lab 2's reference solution against torch.distributed's own, measured side by side.

1. The hand-written ring all-reduce (built from isend/recv) against gloo's
   all_reduce, on 1 MB and 16 MB of float32, on 2 and 4 ranks (goal: within
   1.3x), each with its bus bandwidth, 2(N-1)/N * S / t, beside this machine's
   loopback link and memory copy, measured in the same run (bench/_limits.py),
   and the path gloo's own all-reduce takes.
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

    python bench/data_parallel.py [--rounds 15] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import _limits
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
CALLS_PER_ROUND = 15
GOAL = 1.3          # the ring's time over gloo's all_reduce's


def ring_messages_alone(tensor):
    """The ring's 2(N - 1) messages as the reference posts them (every receive first, each step's send when the
    step before has landed) without its sums: the least a ring from isend/irecv can take here."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).tensor_split(world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    landing = [torch.empty_like(chunks[(rank - step - 1) % world_size]) for step in range(2 * (world_size - 1))]
    receiving = [dist.irecv(buffer, src=left) for buffer in landing]
    sending = [dist.isend(chunks[rank], dst=right)]
    for step in range(2 * world_size - 3):
        receiving[step].wait()
        sending.append(dist.isend(landing[step], dst=right))
    receiving[-1].wait()
    for request in sending:
        request.wait()
    return tensor


@unrecorded
def time_all_reduces(sizes_mb, rounds):
    """Runs on every rank: {(method, MB): [[seconds per call] per round]}, the methods alternating."""
    times = {}
    tensors = {mb: torch.ones(mb * 250_000) for mb in sizes_mb}  # 250,000 float32 = 1 MB
    methods = {"ring (lab 2)": LAB.ring_all_reduce, "its messages alone": ring_messages_alone,
               "gloo all_reduce": dist.all_reduce}
    for method in methods.values():  # warm up: connections, allocations
        for t in tensors.values():
            method(t)
    for _ in range(rounds):
        for mb, t in tensors.items():
            for method in methods.values():     # untimed: the first calls after another size pay for the switch
                method(t)                       # (measured: whichever method came first took 1.6x at 1 MB)
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
    report = {"all_reduce": [], "training": [], "limits": _limits.measure(args.rounds)}

    for n in RANKS:
        run = course.launch(time_all_reduces, n, args=(SIZES_MB, args.rounds), timeout=600)
        for mb in SIZES_MB:
            figures = compare(run, ("ring (lab 2)", mb), ("gloo all_reduce", mb))
            messages = compare(run, ("its messages alone", mb), ("gloo all_reduce", mb))
            figures.update(messages_ms=messages["ours_ms"], messages_ratio=messages["ratio"])
            bus = {f"{who}_bus_GBps": _limits.bus_bandwidth(mb * 1e6, n, figures[f"{who}_ms"] / 1e3) / 1e9
                   for who in ("ours", "theirs")}
            report["all_reduce"].append({"ranks": n, "MB": mb, **figures, **bus, "goal_met": figures["ratio"] <= GOAL})

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
    link = report["limits"]["loopback_both_ways_GBps"]["median"]
    lines = [f"{device.backend}, {', '.join(sorted(set(device.devices)))}, {os.cpu_count()} cores; medians of {rounds} "
             f"alternating rounds, slowest rank; course recording off.", "", _limits.limits_text(report["limits"]), "",
             "Bus bandwidth: 2(N−1)/N · S / t, what each rank's link carried; after it, its share of the loopback "
             "link both ways.",
             "The ring's messages alone: its 2(N−1) isend/irecv as the ring posts them, without its sums (the "
             "least a ring from messages takes here), against gloo's all_reduce in the same rounds.",
             "", f"| ranks | tensor | ring (lab 2) | gloo all_reduce | ring / gloo (range) | goal ≤ {GOAL}× | "
             "its messages alone / gloo | ring's bus bandwidth | gloo's |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["all_reduce"]:
        lines.append(f"| {r['ranks']} | {r['MB']} MB | {r['ours_ms']:.2f} ms | {r['theirs_ms']:.2f} ms | "
                     f"{ratio_text(r)} | {'met' if r['goal_met'] else '**missed**'} | "
                     f"{r['messages_ms']:.2f} ms, {r['messages_ratio']:.2f}× | "
                     f"{r['ours_bus_GBps']:.2f} GB/s ({r['ours_bus_GBps'] / link:.0%}) | "
                     f"{r['theirs_bus_GBps']:.2f} GB/s ({r['theirs_bus_GBps'] / link:.0%}) |")
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
                         f"{ratio_text(r)} (goal ≤ {GOAL}×: {'met' if r['goal_met'] else 'missed'})", over)
            for r in report["all_reduce"]]
    limits = report["limits"]
    rows.append(headline_row(f"loopback link through gloo's isend/irecv ({_limits.MESSAGE_MB} MB messages): one way; "
                             "each way, both at once; one copy in memory",
                             f"{limits['loopback_GBps']['median']:.2f} GB/s; "
                             f"{limits['loopback_both_ways_GBps']['median']:.2f} GB/s; "
                             f"{limits['copy_GBps']['median']:.2f} GB/s", count(limits["rounds"], "round")))
    rows.append(headline_row("gloo's own all_reduce: its path", limits["gloo_path"]["path"], "1 run"))
    rows += [headline_row(f"bucketed overlap (lab 2) / DDP step, {r['ranks']} ranks, {r['bucket_MiB']:g} MiB buckets",
                          ratio_text(r) + " (goal ≤ 1.05×)", over)
             for r in report["training"] if r["bucket_MiB"] * 2**20 == LAB.DDP_BUCKET_BYTES]
    return rows


if __name__ == "__main__":
    main()
