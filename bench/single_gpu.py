"""Lab 1 on the device at hand: throughput against batch size, and where a step's time goes.

Runs lab 1's reference training step (its PhaseTimer, MomentumSGD and train_step,
loaded from solutions/01_single_gpu with grader.solution.load) on course.device():

1. Throughput against batch size, for lab 1's sweep MLP (256 -> 512 -> 512 -> 10) and,
   on a GPU, a wide one (1024 -> 4096 -> 4096 -> 10) that can keep a large GPU busy.
   Each step is timed by the phase timer (CUDA events on a GPU); the median of --steps
   steps after a warm-up, with the slowest and fastest. `course.throughput.lesson` says
   what the curve shows: the sources' claim is that per-GPU batches under 64, or not a
   multiple of 32, waste a GPU.
2. The phases of one step (read, to device, forward, loss, backward, optimizer step,
   weight update) at a small and a large batch: medians over --steps steps.

Prints markdown; --json writes the figures, with the machine they came from, for the report
(bench/_results.py).

    python bench/single_gpu.py [--steps 8] [--json bench/results/single_gpu.json]
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from _machine import describe, text
from _results import emit, headline_row

import course
from course import data, models, throughput
from grader.solution import load

LAB = load("01_single_gpu")
#: name -> models.mlp arguments, and whether it runs on a CPU too (the wide one would take minutes there)
MODELS = {
    "lab 1's sweep MLP (256 -> 512 -> 512 -> 10)": (dict(in_features=256, hidden=(512, 512)), True),
    "wide MLP (1024 -> 4096 -> 4096 -> 10)": (dict(in_features=1024, hidden=(4096, 4096)), False),
}
CPU_BATCHES = (8, 16, 32, 48, 64, 80, 96, 128, 256, 512, 1024)
GPU_BATCHES = CPU_BATCHES + (2048, 4096, 8192, 16384)
PHASE_BATCHES = (32, 1024)
GROUPS = ("read", "to device", "forward", "loss", "backward", "optimizer step", "weight update")


def make_step_factory(device, shape, x, y):
    """`make_step(batch_size)` for throughput.sweep: lab 1's train_step, returning the step's seconds."""
    def make_step(batch_size):
        model = models.mlp(**shape).to(device)
        optimizer = LAB.MomentumSGD(model.parameters(), LAB.LEARNING_RATE, LAB.MOMENTUM)
        batches = data.forever(data.batches(x, y, batch_size, pin_memory=device.type == "cuda"))
        timer = LAB.PhaseTimer(device)
        return lambda: sum(LAB.train_step(model, batches, F.cross_entropy, optimizer, device, timer)[1].values())
    return make_step


def phase_medians(device, shape, x, y, batch_size, steps, warmup=3) -> dict[str, float]:
    """Median milliseconds per group of phases (GROUPS) of one step, over `steps` steps."""
    model = models.mlp(**shape).to(device)
    optimizer = LAB.MomentumSGD(model.parameters(), LAB.LEARNING_RATE, LAB.MOMENTUM)
    batches = data.forever(data.batches(x, y, batch_size, pin_memory=device.type == "cuda"))
    timer = LAB.PhaseTimer(device)
    runs = [LAB.train_step(model, batches, F.cross_entropy, optimizer, device, timer)[1]
            for _ in range(warmup + steps)][warmup:]
    grouped = [{g: sum(s for phase, s in run.items() if phase.startswith(g)) for g in GROUPS} for run in runs]
    return {g: statistics.median(r[g] for r in grouped) * 1e3 for g in GROUPS}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"the CPU ({torch.get_num_threads()} threads)"


def run(steps: int) -> dict:
    device = course.device()
    batches = GPU_BATCHES if device.type == "cuda" else CPU_BATCHES
    report = {"machine": describe(), "device": device_name(device), "steps": steps, "models": {}}
    for name, (shape, on_cpu) in MODELS.items():
        if device.type != "cuda" and not on_cpu:
            continue
        x, y = data.synthetic(max(batches), shape["in_features"])
        curve = throughput.sweep(make_step_factory(device, shape, x, y), batches, steps=steps, progress=False)
        report["models"][name] = {
            "sweep": curve.round(2).to_dict(orient="records"),
            "lesson": throughput.lesson(curve, report["device"]),
            "phases_ms": {b: phase_medians(device, shape, x, y, b, steps) for b in PHASE_BATCHES},
        }
    return report


def markdown(report: dict) -> str:
    lines = [f"Lab 1's reference step on {report['device']} ({text(report['machine'])}); medians of "
             f"{report['steps']} steps.", ""]
    for name, figures in report["models"].items():
        lines += [f"**{name}**", "", "| batch | ms per step | samples/s (min-max) |", "|---|---|---|"]
        lines += [f"| {r['batch_size']} | {r['ms_per_step']:.2f} | {r['samples_per_s']:,.0f} "
                  f"({r['samples_per_s_min']:,.0f}-{r['samples_per_s_max']:,.0f}) |" for r in figures["sweep"]]
        lines += ["", figures["lesson"], "", "| batch | " + " | ".join(GROUPS) + " | total ms |",
                  "|---|" + "---|" * (len(GROUPS) + 1)]
        for batch, phases in figures["phases_ms"].items():
            total = sum(phases.values())
            lines.append(f"| {batch} | " + " | ".join(f"{phases[g] / total:.0%}" for g in GROUPS) + f" | {total:.2f} |")
        lines.append("")
    return "\n".join(lines)


def headline(report: dict) -> list[dict]:
    """Per network: its best throughput, and what a batch of 32 reaches of it."""
    rows = []
    for name, figures in report["models"].items():
        sweep = {r["batch_size"]: r["samples_per_s"] for r in figures["sweep"]}
        best = max(sweep, key=sweep.get)
        rows.append(headline_row(f"lab 1's step on {report['device']}, {name.split(' (')[0]}",
                                 f"best {sweep[best]:,.0f} samples/s at batch {best}; batch 32 reaches "
                                 f"{sweep[32] / sweep[best]:.0%} of it", f"{report['steps']} steps a batch size"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per batch size (default 8)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    report = run(args.steps)
    emit(args.json, title="Lab 1: throughput against batch size, and a step's phases", markdown=markdown(report),
         headline=headline(report), figures=report)


if __name__ == "__main__":
    main()
