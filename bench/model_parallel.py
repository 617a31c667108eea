"""Lab 3's column-then-row block against PyTorch's tensor parallelism, side by side.

The reference `SplitBlock` (solutions/03_model_parallel, loaded by
`grader.common.solution`) against `torch.distributed.tensor.parallel`'s
ColwiseParallel + RowwiseParallel on a device mesh of the same ranks, training
a block Linear(F, H) -> ReLU -> Linear(H, F) with SGD. The block's input needs
its gradient, as inside a deeper network, so both all-reduces run: one forward,
one backward. Reported per rank count:

- step time: the contenders alternate round by round in one launch, with the
  course's recording off (`bench/_rounds.py` says how rounds become medians and
  a ratio); the goal is a ratio of 1.1x or better;
- bytes each rank writes to its sockets per step (gloo, from /proc/self/io),
  which must be equal: the same two all-reduces of the same matrices.

    python bench/model_parallel.py [--rounds 15] [--json bench/results/model_parallel.json]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from _results import count, emit, headline_row
from _rounds import compare, ratio_text, unrecorded
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import course
from grader.common.solution import load

LAB = load("03_model_parallel")
FEATURES, HIDDEN, BATCH = 512, 2048, 64
RANKS = (2, 4)
STEPS_PER_ROUND = 5
CONTENDERS = ("SplitBlock (lab 3)", "PyTorch Colwise/Rowwise")


@unrecorded
def time_blocks(rounds, steps, features, hidden, batch):
    """Runs on every rank: {contender: [[seconds per step] per round], "bytes": {contender: socket bytes per step}}."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = course.device()

    def block():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, features)).to(device)

    mesh = init_device_mesh(device.type, (world_size,))
    models = {CONTENDERS[0]: LAB.SplitBlock(block(), rank, world_size),
              CONTENDERS[1]: parallelize_module(block(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})}
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=1e-3) for name, model in models.items()}
    x = torch.randn(batch, features, device=device, requires_grad=True)
    times = {name: [] for name in models}
    written = {name: [] for name in models}
    for round_ in range(rounds + 1):  # round 0 warms up
        for name, model in models.items():
            dist.barrier()  # outside the measured window: its bytes are not the block's
            before = course.comm.socket_bytes_written()
            steps_seconds = []
            for _ in range(steps):
                started = time.perf_counter()
                optimizers[name].zero_grad()
                x.grad = None
                model(x).square().mean().backward()
                optimizers[name].step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                steps_seconds.append(time.perf_counter() - started)
            after = course.comm.socket_bytes_written()
            if round_:
                times[name].append(steps_seconds)
                if before is not None and after is not None:
                    written[name].append((after - before) / steps)
    return {**times, "bytes": {name: (min(w) if w else None) for name, w in written.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds per comparison")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    report = []
    for n in RANKS:
        run = course.launch(time_blocks, n, args=(args.rounds, STEPS_PER_ROUND, FEATURES, HIDDEN, BATCH),
                            timeout=600)
        figures = compare(run, *CONTENDERS)
        sent = {name: max(run[rank]["bytes"][name] or 0 for rank in run.ranks) for name in CONTENDERS}
        report.append({"ranks": n, **figures, "ours_bytes_per_step": sent[CONTENDERS[0]],
                       "theirs_bytes_per_step": sent[CONTENDERS[1]]})

    emit(args.json, title="Lab 3 against PyTorch's tensor parallelism", markdown=markdown(report, args.rounds),
         headline=[headline_row(f"lab 3 block / DTensor Colwise+Rowwise step, {r['ranks']} ranks",
                                ratio_text(r) + " (goal ≤ 1.1×)", count(args.rounds, "round")) for r in report],
         figures={"rounds": args.rounds, "block": [FEATURES, HIDDEN, BATCH], "by_ranks": report})


def markdown(report, rounds) -> str:
    placement = course.placement.choose(max(RANKS))
    lines = [f"{placement.backend}, {', '.join(sorted(set(placement.devices)))}; medians of {rounds} "
             "alternating rounds, slowest rank; course recording off.", "",
             "| ranks | SplitBlock step | PyTorch step | SplitBlock / PyTorch, goal ≤ 1.1× (range) | "
             "bytes per rank per step, SplitBlock | PyTorch |", "|---|---|---|---|---|---|"]
    for r in report:
        lines.append(f"| {r['ranks']} | {r['ours_ms']:.2f} ms | {r['theirs_ms']:.2f} ms | {ratio_text(r)} | "
                     f"{r['ours_bytes_per_step']:,.0f} | {r['theirs_bytes_per_step']:,.0f} |")
    lines += ["", f"(block Linear({FEATURES}, {HIDDEN}) → ReLU → Linear({HIDDEN}, {FEATURES}), batch {BATCH}, "
              "input needing its gradient; bytes: the fewest a rank wrote to its sockets in a round, per step)"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
