"""Lab 1 on the device at hand: throughput against batch size, and where a step's time goes.

Runs lab 1's reference training step (its PhaseTimer, MomentumSGD and train_step,
loaded from solutions/01_single_gpu with grader.common.solution.load) on course.device():

1. Throughput against batch size, for lab 1's sweep MLP (256 -> 512 -> 512 -> 10) and,
   on a GPU, a wide one (1024 -> 4096 -> 4096 -> 10) that can keep a large GPU busy.
   Each step is timed by the phase timer (CUDA events on a GPU); the median of --steps
   steps after a warm-up, with the slowest and fastest. `course.throughput.lesson` says
   what the curve shows: the sources' claim is that per-GPU batches under 64, or not a
   multiple of 32, waste a GPU.
2. Utilisation along that curve (course.mfu): the model FLOPs of a step (2·in·out per dense
   layer per sample forward, the backward twice that) achieved per second, set against the
   device's matmul peak, measured (one large matmul, FP32, and TF32 and BF16 on a GPU that has
   them): "of the measured peak"; and, where the GPU's datasheet is known (course.mfu.DATASHEETS),
   against its datasheet peak: MFU as PaLM defines it. The sweep runs in FP32; on a GPU with
   BF16 it runs again under torch.autocast(bfloat16), set against the BF16 peaks.
3. The phases of one step (read, to device, forward, loss, backward, optimizer step,
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
from course import data, mfu, models, throughput
from grader.common.solution import load

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


def make_step_factory(device, shape, x, y, autocast: torch.dtype | None = None):
    """`make_step(batch_size)` for throughput.sweep: lab 1's train_step, returning the step's seconds;
    under torch.autocast(`autocast`) if given (the weights and the optimizer stay in FP32)."""
    def make_step(batch_size):
        model = models.mlp(**shape).to(device)
        optimizer = LAB.MomentumSGD(model.parameters(), LAB.LEARNING_RATE, LAB.MOMENTUM)
        batches = data.forever(data.batches(x, y, batch_size, pin_memory=device.type == "cuda"))
        timer = LAB.PhaseTimer(device)

        def step():
            with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                return sum(LAB.train_step(model, batches, F.cross_entropy, optimizer, device, timer)[1].values())
        return step
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
    peaks = mfu.matmul_peaks(device)
    sheet = mfu.device_datasheet(device)
    report = {"machine": describe(), "device": device_name(device), "steps": steps,
              "datasheet": None if sheet is None else sheet.name,
              "peak_flop_per_s": peaks, "peak_matrix_side": mfu.DEFAULT_SIZE.get(device.type, mfu.DEFAULT_SIZE["cpu"]),
              "models": {}}
    # FP32 as lab 1 runs it (TF32 off: PyTorch's default); BF16 through autocast where the device has a BF16 peak.
    precisions = {"fp32": None} | ({"bf16": torch.bfloat16} if "bf16" in peaks else {})
    for name, (shape, on_cpu) in MODELS.items():
        if device.type != "cuda" and not on_cpu:
            continue
        x, y = data.synthetic(max(batches), shape["in_features"])
        flops_per_sample = mfu.training_flops_per_sample(models.mlp(**shape), (shape["in_features"],))
        figures = {"flops_per_sample": flops_per_sample}
        for precision, autocast in precisions.items():
            curve = throughput.sweep(make_step_factory(device, shape, x, y, autocast), batches, steps=steps,
                                     progress=False)
            curve = mfu.with_utilisation(curve, flops_per_sample, measured_peak=peaks[precision],
                                         datasheet_peak=sheet.peaks.get(precision) if sheet else None)
            suffix = "" if precision == "fp32" else f"_{precision}"
            figures[f"sweep{suffix}"] = curve.round({c: 2 for c in curve} | {"mfu": 4, "of_measured_peak": 4}
                                                    ).to_dict(orient="records")
            figures[f"lesson{suffix}"] = throughput.lesson(curve, report["device"] + suffix.replace("_", ", "))
        figures["phases_ms"] = {b: phase_medians(device, shape, x, y, b, steps) for b in PHASE_BATCHES}
        report["models"][name] = figures
    return report


def sweep_table(rows: list[dict], precision: str) -> list[str]:
    """MFU against the datasheet's peak where the device has one; always the share of the measured peak."""
    with_mfu = "mfu" in rows[0]
    header = f"| batch | ms per step | samples/s (min-max) | model GFLOP/s | of the measured {precision} matmul peak |"
    lines = [header + (f" MFU ({precision} datasheet) |" if with_mfu else ""),
             "|---|---|---|---|---|" + ("---|" if with_mfu else "")]
    return lines + [f"| {r['batch_size']} | {r['ms_per_step']:.2f} | {r['samples_per_s']:,.0f} "
                    f"({r['samples_per_s_min']:,.0f}-{r['samples_per_s_max']:,.0f}) | {r['flop_per_s'] / 1e9:,.1f} "
                    f"| {r['of_measured_peak']:.1%} |" + (f" {r['mfu']:.1%} |" if with_mfu else "") for r in rows]


def markdown(report: dict) -> str:
    peaks = ", ".join(f"{p} {flops / 1e9:,.0f} GFLOP/s" for p, flops in report["peak_flop_per_s"].items())
    lines = [f"Lab 1's reference step on {report['device']} ({text(report['machine'])}); medians of "
             f"{report['steps']} steps.", "",
             f"Measured matmul peak (course.mfu.matmul_peak: one {report['peak_matrix_side']}-square matmul, "
             f"median of 5): {peaks}. Model FLOPs per sample of a step: 3 × the forward's "
             "2·in·out per dense layer (biases, activations and the optimizer left out).", ""]
    for name, figures in report["models"].items():
        lines += [f"**{name}**: {figures['flops_per_sample']:,} model FLOPs per sample per step", ""]
        lines += sweep_table(figures["sweep"], "fp32")
        lines += ["", figures["lesson"], ""]
        if "sweep_bf16" in figures:
            lines += ["Under torch.autocast(bfloat16):", ""] + sweep_table(figures["sweep_bf16"], "bf16")
            lines += ["", figures["lesson_bf16"], ""]
        lines += ["| batch | " + " | ".join(GROUPS) + " | total ms |", "|---|" + "---|" * (len(GROUPS) + 1)]
        for batch, phases in figures["phases_ms"].items():
            total = sum(phases.values())
            lines.append(f"| {batch} | " + " | ".join(f"{phases[g] / total:.0%}" for g in GROUPS) + f" | {total:.2f} |")
        lines.append("")
    return "\n".join(lines)


def headline(report: dict) -> list[dict]:
    """Per network: its best throughput, what a batch of 32 reaches of it, and the MFU at both."""
    rows = []
    for name, figures in report["models"].items():
        sweep = {r["batch_size"]: r for r in figures["sweep"]}
        best = max(sweep, key=lambda b: sweep[b]["samples_per_s"])
        def share(row):
            mfu_text = f", MFU {row['mfu']:.1%} of the fp32 datasheet peak" if "mfu" in row else ""
            return f"{row['of_measured_peak']:.1%} of the measured fp32 matmul peak{mfu_text}"
        rows.append(headline_row(f"lab 1's step on {report['device']}, {name.split(' (')[0]}",
                                 f"best {sweep[best]['samples_per_s']:,.0f} samples/s at batch {best} "
                                 f"({share(sweep[best])}); batch 32 reaches "
                                 f"{sweep[32]['samples_per_s'] / sweep[best]['samples_per_s']:.0%} of it "
                                 f"({share(sweep[32])})", f"{report['steps']} steps a batch size"))
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
