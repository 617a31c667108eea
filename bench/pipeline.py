"""Lab 6's 1F1B against PyTorch's Schedule1F1B, and the bubble measured against the formula.

1. Step time: the reference `one_f_one_b` (solutions/06_pipeline_parallel, loaded by
   `grader.common.solution`, run by the lab's `pipeline_training`) against torch.distributed.pipelining's
   `Schedule1F1B` (the lab's `pytorch_pipeline`) on the same stages of the lab's timed MLP, the
   same batch and micro-batches. The contenders alternate round by round in one launch, course
   recording off (`bench/_rounds.py`); both time a step the same way, from a barrier to a barrier
   around the schedule, optimizer step left out, and the first step of each run is left out. Every
   round's parameters must equal the first round's, and the last round's one process's (the lab's
   `same_as_one_process`): a wrong fast run fails the benchmark instead of counting. Goal: 1.1x or better.
2. The bubble: the lab's `measured_bubble` (each rank's idle fraction of its own step, waits in
   receives counted idle, the mean over ranks and steps after the first) of GPipe and 1F1B runs,
   against `course.pipeline.bubble_fraction`, (N-1)/(m+N-1), round by round (one launch a round),
   on 2 and 4 stages. With fewer cores than stages the ranks share cores, and what is measured is
   partly time-sharing: the cores and the load average are recorded beside it.

    python bench/pipeline.py [--rounds 15] [--quick] [--json PATH]
"""
from __future__ import annotations

import functools
import os

import _script
import torch
from _machine import load_average, load_text, with_a_core_each
from _results import count, emit, headline_row
from _rounds import compare, per_round, ratio_text, spread, spread_text, unrecorded

import course
from course import check, data, models
from course import pipeline as cost_model
from grader.common.solution import load

LAB = load("06_pipeline_parallel")
FULL = {"widths": (LAB.TIMED_MLP["in_features"], LAB.TIMED_MLP["hidden"]), "batch": LAB.TIMED_BATCH,
        "steps_per_round": 5, "bubble_steps": 4}
# --quick, for the tests: the lab's small MLP (8 layers of 64), 8 micro-batches of 6
QUICK = {"widths": (LAB.PIPE_MLP["in_features"], LAB.PIPE_MLP["hidden"]), "batch": LAB.BATCH_SIZE,
         "steps_per_round": 2, "bubble_steps": 3}
MICRO_BATCHES = LAB.MICRO_BATCHES            # 8
STAGES = (2, 4)
CONTENDERS = ("1F1B (lab 6)", "Schedule1F1B")
SCHEDULES = {"gpipe": LAB.gpipe, "1f1b": LAB.one_f_one_b}


def make_model(widths):
    return functools.partial(models.mlp, in_features=widths[0], hidden=widths[1])


def train(name, make, inputs, targets, *, steps, batch_size):
    """One contender's whole run on this rank, as the lab's notebook calls it."""
    options = dict(steps=steps, batch_size=batch_size, micro_batches=MICRO_BATCHES)
    if name == CONTENDERS[0]:
        return LAB.pipeline_training(LAB.one_f_one_b, make, inputs, targets, **options)
    return LAB.pytorch_pipeline("1f1b", make, inputs, targets, **options)


@unrecorded
def time_steps(make, inputs, targets, rounds, steps, batch_size):
    """Runs on every rank: {contender: [[seconds per step] per round], "parameters": {contender: the last
    round's}}. Each round runs each contender for steps + 1 steps (the first left out); round 0 warms up.
    A round whose parameters differ from the first round's raises here, naming the rank."""
    rank = torch.distributed.get_rank()
    times = {name: [] for name in CONTENDERS}
    first, last = {}, {}
    for round_ in range(rounds + 1):
        for name in CONTENDERS:
            result = train(name, make, inputs, targets, steps=steps + 1, batch_size=batch_size)
            first.setdefault(name, result["parameters"])
            check.assert_close(result["parameters"], first[name], f"{name}, round {round_}'s parameters against "
                               "round 0's", rank=rank)
            last[name] = result["parameters"]
            if round_:
                times[name].append(result["seconds"][1:])
    return {**times, "parameters": last}


class _Run(dict):
    """{rank: {"parameters": [...]}} with `.ranks`: what the lab's same_as_one_process reads of a run."""

    @property
    def ranks(self):
        return sorted(self)


def same_as_one_process(run, model) -> None:
    """Both contenders' parameters (run[rank]["parameters"][contender]) against one process's, by the lab's
    same_as_one_process: an AssertionError names the contender, the stage and the parameter that differ."""
    for name in CONTENDERS:
        LAB.same_as_one_process(_Run({r: {"parameters": run[r]["parameters"][name]} for r in run.ranks}),
                                model, f"{name}, {len(run.ranks)} stages")


def timing(stages, make, sizes, rounds) -> dict:
    """Step times side by side on `stages` ranks, both contenders' parameters checked against one process."""
    steps, batch = sizes["steps_per_round"] + 1, sizes["batch"]
    inputs, targets = data.synthetic(steps * batch, sizes["widths"][0])
    model, _ = LAB.one_process_training(make, inputs, targets, steps=steps, batch_size=batch)
    before = load_average()
    run = course.launch(time_steps, stages, args=(make, inputs, targets, rounds, sizes["steps_per_round"], batch),
                        timeout=600)
    after = load_average()
    same_as_one_process(run, model)
    return {"stages": stages, **compare(run, *CONTENDERS), "parameters_match": True,
            "per_round_ms": {name: [1e3 * s for s in per_round(run, name)] for name in CONTENDERS},
            "load_average": [before, after]}


def bubble(stages, make, sizes, rounds) -> list[dict]:
    """Each schedule's measured bubble on `stages` ranks, one launch a round, the schedules alternating;
    every run's parameters checked against one process."""
    steps, batch = sizes["bubble_steps"], sizes["batch"]
    inputs, targets = data.synthetic(steps * batch, sizes["widths"][0])
    model, _ = LAB.one_process_training(make, inputs, targets, steps=steps, batch_size=batch)
    measured = {name: [] for name in SCHEDULES}
    before = load_average()
    for _ in range(rounds):
        for name, schedule in SCHEDULES.items():
            run = course.launch(LAB.pipeline_training, stages, args=(schedule, make, inputs, targets),
                                kwargs=dict(steps=steps, batch_size=batch, micro_batches=MICRO_BATCHES), timeout=600)
            LAB.same_as_one_process(run, model, f"{name}, {stages} stages")
            measured[name].append(LAB.measured_bubble(run))
    after = load_average()
    formula = cost_model.bubble_fraction(stages, MICRO_BATCHES)
    return [{"stages": stages, "micro_batches": MICRO_BATCHES, "schedule": name, "formula": formula,
             "stages_sleep": make is models.sleeping_mlp,
             "measured": spread(values), "ratio": spread(v / formula for v in values), "parameters_match": True,
             "cores": os.cpu_count(), "load_average": [before, after]} for name, values in measured.items()]


def bubble_model(stages: int, make):
    """The model the bubble is measured on: `make`'s where each stage has a core, else lab 6's sleeping stages,
    so that no stage waits for a core and the bubble is the schedule's."""
    return make if stages <= (os.cpu_count() or 1) else models.sleeping_mlp


def timed_stages() -> list[int]:
    """Timing needs a core per rank (one thread each): 4 stages only where there are 4 cores."""
    return with_a_core_each(STAGES)



def main(argv=None):
    args = _script.options(__doc__, argv, full=FULL, quick=QUICK, default_rounds=15,
                           rounds_help="rounds of the timing and of the bubble",
                           quick_help="the lab's small MLP, 1 round, few steps: for tests")
    sizes, rounds = args.sizes, args.rounds
    make = make_model(sizes["widths"])
    parameters = sum(p.numel() for p in make().parameters())
    figures = {"quick": args.quick, "rounds": rounds, **sizes, "micro_batches": MICRO_BATCHES,
               "parameters": parameters, "cores": os.cpu_count(),
               "timing": [timing(n, make, sizes, rounds) for n in timed_stages()],
               "bubble": [row for n in STAGES for row in bubble(n, bubble_model(n, make), sizes, rounds)]}
    emit(args.json, title="Lab 6's 1F1B against Schedule1F1B, and the bubble against the formula",
         markdown=markdown(figures), headline=headline(figures), figures=figures)


def headline(figures) -> list[dict]:
    rounds = count(figures["rounds"], "round")
    rows = [headline_row(f"1F1B (lab 6) / `Schedule1F1B` step, {r['stages']} stages, {figures['micro_batches']} "
                         "micro-batches", ratio_text(r) + " (goal ≤ 1.1×)", rounds) for r in figures["timing"]]
    for r in figures["bubble"]:
        shared = "" if r["stages"] <= figures["cores"] else f", {figures['cores']} cores shared"
        rows.append(headline_row(f"bubble measured / (N−1)/(m+N−1), {r['schedule']}, {r['stages']} stages, "
                                 f"{r['micro_batches']} micro-batches{shared}",
                                 f"{spread_text(r['ratio'])} ({r['measured']['median']:.1%} / "
                                 f"{r['formula']:.1%})", rounds))
    return rows


def markdown(figures) -> str:
    placement = course.placement.choose(max(STAGES))
    widths, batch, m = figures["widths"], figures["batch"], figures["micro_batches"]
    cores = figures["cores"]
    lines = [f"{placement.backend}, {', '.join(sorted(set(placement.devices)))}; MLP {widths[0]} → "
             f"{' → '.join(map(str, widths[1]))} → 10 ({figures['parameters']:,} parameters, float32, "
             f"{len(widths[1]) + 1} Linear layers cut into stages of whole layers), batch {batch} in {m} "
             f"micro-batches of {batch // m}, SGD" + ("; **--quick**: sizes for the tests, not figures" if
                                                       figures["quick"] else "") + ".", "",
             f"Step time: medians of {count(figures['rounds'], 'alternating round')} of "
             f"{figures['steps_per_round']} steps (each run's first step left out), slowest rank, barrier to "
             "barrier around the schedule (the optimizer step outside); course recording off (the lab's run still "
             "notes its spans, a clock read per forward and backward)"
             + ("" if len(figures["timing"]) == len(STAGES) else
                f"; timed on {' and '.join(str(r['stages']) for r in figures['timing'])} stages only "
                f"({cores} cores, one per rank)") + ". The ratio is taken round by round, so its median need not "
             "be the ratio of the two medians; each round's times are in the .json. Every run's parameters equal "
             "one process's.", "",
             "| stages | 1F1B (lab 6) step | `Schedule1F1B` step | 1F1B (lab 6) / `Schedule1F1B`, goal ≤ 1.1× (range) |"
             " parameters = one process |", "|---|---|---|---|---|"]
    for r in figures["timing"]:
        lines.append(f"| {r['stages']} | {r['ours_ms']:.2f} ms | {r['theirs_ms']:.2f} ms | {ratio_text(r)} | "
                     f"{'yes' if r['parameters_match'] else 'no'} |")
    loads = [f"{r['stages']} stages {load_text(r['load_average'])}" for r in figures["timing"]]
    lines += ["", f"(1-minute load average before and after the timing, {cores} cores: {'; '.join(loads)})", "",
              f"The bubble: the lab's `measured_bubble` (each rank's idle fraction of its own step, time waiting "
              f"in a receive counted idle; the mean over ranks and over the {figures['bubble_steps'] - 1} steps "
              f"after the first) against `course.pipeline.bubble_fraction`, (N−1)/(m+N−1); median and range "
              f"over {count(figures['rounds'], 'round')}, one launch a round, the schedules alternating:", "",
              "| stages | micro-batches | schedule | formula | measured (range) | measured / formula (range) | "
              "cores | load average before, after |", "|---|---|---|---|---|---|---|---|"]
    for r in figures["bubble"]:
        lines.append(f"| {r['stages']} | {r['micro_batches']} | {r['schedule']} | {r['formula']:.1%} | "
                     f"{spread_text(r['measured'], '{:.1%}')} | {spread_text(r['ratio'])} | {r['cores']} | "
                     f"{load_text(r['load_average'])} |")
    lines += ["", "The formula assumes equal stages and free messages: here messages take time, and the last "
              "stage computes the loss too, so the measured bubble sits above it."]
    crowded = sorted({r["stages"] for r in figures["bubble"] if r["stages_sleep"]})
    if crowded:
        lines += ["", f"**{' and '.join(map(str, crowded))} stages on {cores} cores:** ranks that took turns on "
                  "the cores would stretch their compute spans while waiting for a core, and the bubble measured "
                  "would grow with the micro-batches. These rows time **sleeping stages** instead, as lab 6 does "
                  f"(`course.models.sleeping_mlp`: each layer a narrow Linear that sleeps "
                  f"{models.SECONDS_PER_ROW * 1e3:g} ms a row forward and twice that backward, holding no core): "
                  "the bubble is the schedule's, messages and Python included; the compute is modelled by the "
                  "sleep (equal stages, b = 2f)."]
    return "\n".join(lines)



if __name__ == "__main__":
    main()
