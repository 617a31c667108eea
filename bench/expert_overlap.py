"""Lab 8's time on the critical path: expert parallelism's all-to-alls waited for, against overlapped.

The step's shape by `course.expert_overlap` (the lab's cell and the demo's): M micro-batches, each rank
sending tokens·k rows of h float32 features in equal splits to every rank (expert parallelism's sizes
under even routing; the rows are not routed), its experts' MLP forward and backward on what it receives,
four all-to-alls a micro-batch. `blocking` waits for each all-to-all before the compute that needs it;
`overlapped` issues micro-batch i+1's (`async_op=True`) before micro-batch i's experts compute. Both
alternate in one launch, round by round (a round: one step of each, their order swapped every round),
course recording off; each round's time is the slowest rank's. Reported: the median step of each and
its range, blocking − overlapped round by round, overlapped / blocking; from one recorded run, the time
the blocking step's slowest rank spent inside its all-to-alls (the most overlapping could hide), and
the bytes each rank's all-to-alls sent, counted, against tokens·k·h·4·(N − 1)/N each.

    python bench/expert_overlap.py [--rounds 9] [--quick] [--json PATH]

On CPU ranks gloo runs an asynchronous all-to-all on a thread that shares the cores with the compute:
with as many ranks as cores little is left to hide it (say so beside the figures; on GPUs NCCL runs it
on a stream of its own).
"""
from __future__ import annotations

import os

import _script
from _results import count, emit, headline_row
from _rounds import spread, spread_text, unrecorded

import course
from course import expert_overlap

RANKS = 2
MICRO_BATCHES = 4
# Each setting: a micro-batch's sizes on each rank (course.expert_overlap.SIZES's keys).
FULL = {"settings": (dict(expert_overlap.SIZES),                                     # the lab's
                     dict(expert_overlap.SIZES, hidden=512, ffn=128))}              # wider rows, thinner experts
QUICK = {"settings": (dict(tokens=16, hidden=16, ffn=16, experts=4, top_k=2),)}     # --quick: for the tests


@unrecorded
def timed(micro_batches, rounds, sizes):
    """Runs on every rank, unrecorded: expert_overlap.timed_steps's seconds, round by round."""
    return expert_overlap.timed_steps(micro_batches, rounds, 0, **sizes)["seconds"]


def setting_row(sizes: dict, rounds: int) -> dict:
    expert_overlap.check_sizes(RANKS, micro_batches=MICRO_BATCHES, repeats=rounds, **sizes)
    run = course.launch(timed, RANKS, args=(MICRO_BATCHES, rounds, sizes), timeout=300)
    seconds = {s: [max(run[r][s][i] for r in run.ranks) for i in range(rounds)] for s in expert_overlap.SCHEDULES}
    recorded = expert_overlap.run(RANKS, micro_batches=MICRO_BATCHES, repeats=1, **sizes)
    formula = sizes["tokens"] * sizes["top_k"] * sizes["hidden"] * 4 * (RANKS - 1) // RANKS
    per_rank = []
    for rank in recorded.ranks:
        for schedule, (start, end) in recorded[rank]["shown"].items():   # the timed step of each schedule
            calls = [r for r in recorded.comm.rank(rank) if r.op == "all_to_all_single" and start <= r.start <= end]
            per_rank.append({"rank": rank, "schedule": schedule, "calls": len(calls),
                             "counted": sorted({int(r.predicted) for r in calls})})
    return {"sizes": sizes, "micro_batches": MICRO_BATCHES,
            "ms": {s: spread(1e3 * t for t in seconds[s]) for s in expert_overlap.SCHEDULES},
            "hidden_ms": spread(1e3 * (b - o) for b, o in zip(seconds["blocking"], seconds["overlapped"])),
            "overlapped_over_blocking": spread(o / b for b, o in zip(seconds["blocking"], seconds["overlapped"])),
            "waited_ms": 1e3 * expert_overlap.summary(recorded)["waited"],
            "bytes": {"formula": formula, "per_rank": per_rank}}


def main(argv=None):
    args = _script.options(__doc__, argv, full=FULL, quick=QUICK, default_rounds=9,
                           rounds_help="rounds (one step of each schedule a round)", quick_help="small sizes, 1 round: "
                           "for tests")
    placement = course.placement.choose(RANKS)
    figures = {"quick": args.quick, "rounds": args.rounds, "cores": os.cpu_count(), "ranks": RANKS,
               "backend": placement.backend, "devices": sorted(set(placement.devices)),
               "settings": [setting_row(sizes, args.rounds) for sizes in args.sizes["settings"]]}
    emit(args.json, title="Lab 8's expert-parallel step: all-to-alls waited for against overlapped",
         markdown=markdown(figures), headline=headline(figures), figures=figures)


def signed_text(figures: dict) -> str:
    """'+3.1 ms (-0.5 to +6.0)': a difference that can be either sign, its range written out."""
    median = f"{figures['median']:+.1f} ms"
    return median if figures["n"] == 1 else f"{median} ({figures['min']:+.1f} to {figures['max']:+.1f})"


def setting_text(row) -> str:
    s = row["sizes"]
    return (f"{row['micro_batches']} × {s['tokens']} tokens, k = {s['top_k']}, h = {s['hidden']}, "
            f"{s['experts']} experts of {s['ffn']}")


def headline(figures) -> list[dict]:
    over = count(figures["rounds"], "round")
    return [headline_row(f"expert-parallel step, overlapped / blocking all-to-alls, {setting_text(row)}",
                         f"{spread_text(row['overlapped_over_blocking'], unit='×')} (blocking − overlapped "
                         f"{signed_text(row['hidden_ms'])}; blocking waited "
                         f"{row['waited_ms']:.1f} ms in its all-to-alls)", over) for row in figures["settings"]]


def markdown(figures) -> str:
    quick = "; **--quick**: sizes for the tests, not figures" if figures["quick"] else ""
    rounds = count(figures["rounds"], "round")
    lines = [f"{figures['backend']}, {', '.join(figures['devices'])}, {figures['ranks']} ranks, {figures['cores']} "
             f"cores{quick}. Medians and ranges over {rounds}, each round one step of each schedule, their order "
             "swapped round by round, the slowest rank's time; course recording off. The rows are not routed: equal "
             "splits of expert parallelism's sizes (`course.expert_overlap`).", "",
             "| setting | blocking | overlapped | blocking − overlapped | overlapped / blocking | blocking step inside "
             "its all-to-alls (1 run) |", "|---|---|---|---|---|---|"]
    for row in figures["settings"]:
        ms = row["ms"]
        lines.append(f"| {setting_text(row)} | {spread_text(ms['blocking'], '{:.1f}', ' ms')} | "
                     f"{spread_text(ms['overlapped'], '{:.1f}', ' ms')} | "
                     f"{signed_text(row['hidden_ms'])} | "
                     f"{spread_text(row['overlapped_over_blocking'])} | {row['waited_ms']:.1f} ms |")
    lines += ["", "Bytes each rank's all-to-alls sent (a recorded run, one step of each schedule): the calls a "
              "step (4 a micro-batch) and the bytes of each, counted, against tokens·k·h·4·(N − 1)/N.", "",
              "| setting | rank | schedule | all-to-alls | bytes each, counted | formula |",
              "|---|---|---|---|---|---|"]
    for row in figures["settings"]:
        for b in row["bytes"]["per_rank"]:
            lines.append(f"| {setting_text(row)} | {b['rank']} | {b['schedule']} | {b['calls']} | "
                         f"{', '.join(f'{n:,}' for n in b['counted'])} | {row['bytes']['formula']:,} |")
    lines += ["", "On CPU ranks gloo runs an asynchronous all-to-all on a thread that shares the cores with the "
              "ranks' compute: with as many ranks as cores, little is left to hide it under, and blocking − "
              "overlapped can be near zero or below. On GPUs NCCL runs it on a stream of its own, beside the "
              "matmuls."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
