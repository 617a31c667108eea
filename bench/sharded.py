"""Lab 5's ZeRO-3 against PyTorch's fully_shard, and memory per rank against the formula.

1. The reference ZeRO-3 (`sharded_training(stage=3)` of solutions/05_sharded_data_parallel,
   loaded by `grader.common.solution`, with torch.distributed's own collectives,
   `course.sharding.reduce_scatter` and `all_gather`, so that the comparison is of the
   sharding, not of the ring) against FSDP2's `fully_shard` (`pytorch_training("fully_shard")`,
   one unit per layer), on the same MLP, batch and steps:
   - step time: the contenders alternate round by round in one launch, course recording
     off (`bench/_rounds.py`); a step is timed from one optimizer step to the next, so the
     setup and the first step of each run are left out. The goal is 1.1x or better;
   - bytes each rank sends per step, collective by collective: recorded (the backend's
     formula for each call) and, on gloo, written to the sockets; a step's bytes are a run
     of 2 steps less a run of 1. Both call the same library collectives, so gloo's
     reduce-scatter, an all-reduce of the whole input, is an all-reduce for both.
2. What each rank holds after the second step's backward under stages 0-3 with Adam, by
   kind (the lab's `memory_by_kind`), against `course.memory.per_rank` in fp32: the goal is
   within 5 %.

    python bench/sharded.py [--rounds 15] [--json PATH]
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _machine import load_average, load_text, with_a_core_each
from _results import count, emit, headline_row
from _rounds import compare, no_memory_tracker, ratio_text, unrecorded

import course
from course import data, memory, models, sharding
from grader.common.solution import load

LAB = load("05_sharded_data_parallel")
WIDTHS = (64, (512, 512))        # the lab's wide MLP: 301,066 parameters
BATCH = 48                       # global batch, as in the lab
RANKS = (2, 4)
STEPS_PER_ROUND = 5
LEARNING_RATE = 0.05
CONTENDERS = ("ZeRO-3 (lab 5)", "fully_shard")
STAGES = {0: "data parallel", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
KINDS = ("parameters", "gradients", "optimizer state")
MEMORY_GOAL = 0.05               # measured within 5 % of the formula


def make_model(widths):
    return functools.partial(models.mlp, in_features=widths[0], hidden=widths[1])


def momentum_sgd(parameters):
    return torch.optim.SGD(parameters, lr=LEARNING_RATE, momentum=0.9)


def adam(parameters):
    return torch.optim.Adam(parameters, lr=1e-3)


def train(name, make, inputs, targets, *, steps, batch_size, make_optimizer):
    """One contender's whole run on this rank, as the lab's notebook calls it."""
    if name == CONTENDERS[0]:
        return LAB.sharded_training(make, inputs, targets, stage=3, steps=steps, batch_size=batch_size,
                                    make_optimizer=make_optimizer, reduce_scatter=sharding.reduce_scatter,
                                    all_gather=sharding.all_gather)
    return LAB.pytorch_training("fully_shard", make, inputs, targets, steps=steps, batch_size=batch_size,
                                make_optimizer=make_optimizer)


@unrecorded
def time_steps(make, inputs, targets, rounds, steps, batch_size):
    """Runs on every rank: {contender: [[seconds per step] per round]}. Each round runs each contender
    for steps + 1 steps and times the intervals between its optimizer's steps; round 0 warms up."""
    device = course.device()

    def clock():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    times = {name: [] for name in CONTENDERS}
    with no_memory_tracker(LAB.pytorch_training):
        for round_ in range(rounds + 1):
            for name in CONTENDERS:
                stamps = []

                def timed_sgd(parameters, stamps=stamps):
                    optimizer = momentum_sgd(parameters)
                    optimizer.register_step_post_hook(lambda *_: stamps.append(clock()))
                    return optimizer

                dist.barrier()
                train(name, make, inputs, targets, steps=steps + 1, batch_size=batch_size, make_optimizer=timed_sgd)
                if round_:
                    times[name].append([b - a for a, b in zip(stamps, stamps[1:])])
    return times


def collectives(run, rank: int) -> dict:
    """{(op, algorithm): [calls, predicted bytes, measured bytes or None]} that `rank` sent in `run`."""
    totals = {}
    for r in run.comm.rank(rank):
        if r.op == "barrier":
            continue
        row = totals.setdefault((r.op, r.algorithm), [0, 0, 0])
        row[0] += 1
        row[1] += r.predicted
        row[2] = None if r.measured is None or row[2] is None else row[2] + r.measured
    return totals


def sent_per_step(name, ranks, make, inputs, targets, batch_size) -> list[dict]:
    """What each rank sends in one step, by collective: a run of 2 steps less a run of 1 (the lab's
    way), so that neither setup nor the final gathering of the parameters counts."""
    runs = [course.launch(train, ranks, args=(name, make, inputs, targets),
                          kwargs=dict(steps=steps, batch_size=batch_size, make_optimizer=momentum_sgd),
                          timeout=600) for steps in (1, 2)]
    rows = []
    for rank in range(ranks):
        one, two = (collectives(run, rank) for run in runs)
        for key in sorted(set(one) | set(two)):
            none = (0, 0, 0)
            calls, predicted, measured = (_minus(b, a) for b, a in zip(two.get(key, none), one.get(key, none)))
            if calls == 0 and not predicted:   # made as often in both runs: setup (fully_shard's own), no step's
                continue
            rows.append({"contender": name, "ranks": ranks, "rank": rank, "op": key[0], "algorithm": key[1],
                         "calls": calls, "predicted": predicted, "measured": measured})
    return rows


def _minus(b, a):
    return None if a is None or b is None else b - a


def per_contender(rows, ranks) -> dict:
    """{contender: {"predicted", "measured"}}: the most bytes any rank sent per step, in all."""
    totals = {}
    for name in CONTENDERS:
        by_rank = collections.defaultdict(lambda: [0, 0])
        for r in rows:
            if r["contender"] == name and r["ranks"] == ranks:
                by_rank[r["rank"]][0] += r["predicted"]
                by_rank[r["rank"]][1] = None if r["measured"] is None or by_rank[r["rank"]][1] is None \
                    else by_rank[r["rank"]][1] + r["measured"]
        measured = [m for _, m in by_rank.values()]
        totals[name] = {"predicted": max(p for p, _ in by_rank.values()),
                        "measured": None if None in measured else max(measured)}
    return totals


def memory_rows(ranks, make, inputs, targets, batch_size) -> list[dict]:
    """Stages 0-3 with Adam on `ranks` ranks: held by kind on every rank against the formula, and the peak."""
    parameters = sum(p.numel() for p in make().parameters())
    rows = []
    for stage, scheme in STAGES.items():
        run = course.launch(LAB.sharded_training, ranks, args=(make, inputs, targets),
                            kwargs=dict(stage=stage, steps=2, batch_size=batch_size, make_optimizer=adam,
                                        measure=LAB.memory_by_kind), timeout=600)
        predicted = memory.per_rank(parameters, ranks, scheme, optimizer="adam", precision="fp32")
        for kind in KINDS:
            held = [run[rank]["held"][kind] for rank in run.ranks]
            ratios = [h / predicted[kind] for h in held]
            rows.append({"ranks": ranks, "scheme": scheme, "kind": kind, "predicted": predicted[kind],
                         "rank 0": held[0], "least": min(held), "most": max(held),
                         "ratio rank 0": ratios[0], "ratio farthest": max(ratios, key=lambda x: abs(x - 1))})
        rows.append({"ranks": ranks, "scheme": scheme, "kind": "peak of all live tensors", "predicted": None,
                     "rank 0": run[0]["peak"], "least": min(run[r]["peak"] for r in run.ranks),
                     "most": max(run[r]["peak"] for r in run.ranks)})
    return rows


def timed_ranks() -> list[int]:
    """Timing needs a core per rank (one thread each): 4 ranks only where there are 4 cores."""
    return with_a_core_each(RANKS)



def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of the timing")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    make = make_model(WIDTHS)
    inputs, targets = data.synthetic(4 * BATCH, WIDTHS[0])
    parameters = sum(p.numel() for p in make().parameters())

    timing = []
    for n in timed_ranks():
        before = load_average()
        run = course.launch(time_steps, n, args=(make, inputs, targets, args.rounds, STEPS_PER_ROUND, BATCH),
                            timeout=600)
        timing.append({"ranks": n, **compare(run, *CONTENDERS), "load_average": [before, load_average()]})
    sent, totals = [], []
    for n in RANKS:
        rows = [row for name in CONTENDERS for row in sent_per_step(name, n, make, inputs, targets, BATCH)]
        sent += rows
        totals.append({"ranks": n, "ring formula": memory.sent_per_step(parameters, n, "ZeRO-3", dtype="float32"),
                       **per_contender(rows, n)})
    held = [row for n in RANKS for row in memory_rows(n, make, inputs, targets, BATCH)]

    figures = {"rounds": args.rounds, "steps_per_round": STEPS_PER_ROUND, "widths": WIDTHS, "batch": BATCH,
               "parameters": parameters, "timing": timing, "bytes_per_step": totals, "collectives": sent,
               "memory": held}
    emit(args.json, title="Lab 5 against fully_shard, and memory per rank", markdown=markdown(figures),
         headline=headline(figures), figures=figures)


def farthest(held) -> float:
    return max((r["ratio farthest"] for r in held if "ratio farthest" in r), key=lambda x: abs(x - 1))


def headline(figures) -> list[dict]:
    rounds = count(figures["rounds"], "round")
    rows = [headline_row(f"ZeRO-3 (lab 5) / `fully_shard` step, {r['ranks']} ranks",
                         ratio_text(r) + " (goal ≤ 1.1×)", rounds) for r in figures["timing"]]
    for r in figures["bytes_per_step"]:
        ours, theirs = (r[name]["predicted"] for name in CONTENDERS)
        rows.append(headline_row(f"bytes per rank per step, ZeRO-3 (lab 5) / `fully_shard`, {r['ranks']} ranks",
                                 f"{ours:,.0f} / {theirs:,.0f} recorded ({ours / theirs:.3f}×)",
                                 "1 run of 2 steps less 1 of 1"))
    ranks = " and ".join(str(n) for n in sorted({r["ranks"] for r in figures["memory"]}))
    worst = farthest(figures["memory"])
    rows.append(headline_row(f"memory held / formula, stages 0-3, {ranks} ranks, parameters, gradients, "
                             "optimizer state", f"farthest {worst:.5f} (goal within 5 %)", "1 run each"))
    return rows


def markdown(figures) -> str:
    placement = course.placement.choose(max(RANKS))
    widths = figures["widths"]
    lines = [f"{placement.backend}, {', '.join(sorted(set(placement.devices)))}; MLP {widths[0]} → "
             f"{' → '.join(map(str, widths[1]))} → 10 ({figures['parameters']:,} parameters, float32), global batch "
             f"{figures['batch']}, momentum SGD; ZeRO-3 with torch.distributed's collectives, `fully_shard` one "
             "unit per layer.", "",
             f"Step time: medians of {figures['rounds']} alternating rounds of {figures['steps_per_round']} steps, "
             "slowest rank, optimizer step to optimizer step; course recording and memory tracking off"
             + ("" if len(figures["timing"]) == len(RANKS) else
                f"; timed on {' and '.join(str(r['ranks']) for r in figures['timing'])} ranks only "
                f"({os.cpu_count()} cores, one per rank)") + ".", "",
             "| ranks | ZeRO-3 step | `fully_shard` step | ZeRO-3 / `fully_shard`, goal ≤ 1.1× (range) |",
             "|---|---|---|---|"]
    for r in figures["timing"]:
        lines.append(f"| {r['ranks']} | {r['ours_ms']:.2f} ms | {r['theirs_ms']:.2f} ms | {ratio_text(r)} |")
    loads = [f"{r['ranks']} ranks {load_text(r['load_average'])}" for r in figures["timing"]]
    lines += ["", f"(1-minute load average before and after the timing, {os.cpu_count()} cores: {'; '.join(loads)})"]
    lines += ["", "Bytes each rank sends per step (the most of any rank; recorded: the backend's formula for each "
              "call; on sockets: what the rank wrote, gloo on Linux, headers included), against the ring formula "
              "of ZeRO-3 (`course.memory.sent_per_step`: two all-gathers and a reduce-scatter, what NCCL runs):", "",
              "| ranks | ring formula | ZeRO-3 recorded | on sockets | `fully_shard` recorded | on sockets | "
              "ZeRO-3 / `fully_shard`, recorded |", "|---|---|---|---|---|---|---|"]
    for r in figures["bytes_per_step"]:
        ours, theirs = (r[name] for name in CONTENDERS)
        lines.append(f"| {r['ranks']} | {r['ring formula']:,.0f} | {ours['predicted']:,.0f} | "
                     f"{_number(ours['measured'])} | {theirs['predicted']:,.0f} | {_number(theirs['measured'])} | "
                     f"{ours['predicted'] / theirs['predicted']:.3f}× |")
    lines += ["", "By collective, rank 0 (the library's names; the algorithm as the backend runs it):", "",
              "| ranks | contender | collective | algorithm | calls per step | recorded bytes | on sockets |",
              "|---|---|---|---|---|---|---|"]
    for r in figures["collectives"]:
        if r["rank"] == 0:
            lines.append(f"| {r['ranks']} | {r['contender']} | `{r['op']}` | {r['algorithm']} | {r['calls']} | "
                         f"{r['predicted']:,.0f} | {_number(r['measured'])} |")
    lines += ["", "Both make one call a layer: ZeRO-3 gathers and reduce-scatters a layer's parameters flattened "
              "into one tensor, padded to a multiple of N elements; `fully_shard` packs the layer's parameters "
              "into one buffer, each padded on its first dimension to a multiple of N. gloo has no reduce-scatter "
              "of its own: for both, the library's reduce-scatter all-reduces the whole input, twice the bytes of "
              "the ring formula's reduce-scatter; NCCL's does not.", "",
              "Memory each rank holds after the second step's backward, Adam, fp32 (measured by the lab's "
              "`memory_by_kind`; predicted by `course.memory.per_rank`; the peak of all live tensors by "
              "`course.live_memory`, no formula):", "",
              "| ranks | scheme | kind | predicted | rank 0 | least-most over ranks | rank 0 − predicted | "
              "farthest rank / predicted |", "|---|---|---|---|---|---|---|---|"]
    for r in figures["memory"]:
        ratios = (f"{r['rank 0'] - r['predicted']:+,} | {r['ratio farthest']:.5f}" if r["predicted"] else " | ")
        lines.append(f"| {r['ranks']} | {r['scheme']} | {r['kind']} | {_number(r['predicted'])} | {r['rank 0']:,} | "
                     f"{r['least']:,}-{r['most']:,} | {ratios} |")
    lines += ["", "(the formula shards ceil(P/N) parameters a rank; Adam's `step` counters, 4 bytes a parameter "
              "tensor, are state the formula leaves out)"]
    return "\n".join(lines)



def _number(value) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


if __name__ == "__main__":
    main()
