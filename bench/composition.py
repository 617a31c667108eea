"""Lab 9's grid against the same grid built from PyTorch's own parts: step time and bytes per axis.

The course's grid is course.grid_step's Trainer run with the lab's answers (`grader.common.solution.load` of
solutions/09_composition: grid_groups, vocab_parallel_cross_entropy, micro_batch_loss, reduce_gradients,
global_grad_norm); PyTorch's is course.native_grid's Trainer (init_device_mesh, parallelize_module's
sequence-parallel plan with loss_parallel, fully_shard over dp, Schedule1F1B over pp). Both train gpt.GPT from
the same seed on the same batches, in one launch per layout: one warm-up step each, one step each recorded
(bytes each rank sent, binned by axis from the group each call ran on: course.mesh.axis_of; as gloo's sockets
counted them), then rounds unrecorded, a round one step of each after a barrier, their order swapped round
by round; each round's time is the slowest rank's. Every step's loss of both is checked against
gpt.one_process_training on the same batches (course.check's float32 tolerance). Beside them, lab 6's chooser's
prediction for each layout (course.grid_costs.predicted, this machine as its cluster with its link measured
now by course.link_probe, or --quick the stored local gloo link) and the lab's own formula for its bytes.

    python bench/composition.py [--rounds 5] [--quick] [--json PATH]

Layouts on 4 ranks: dp2×tp2, pp2×tp2, pp2×dp2; dp2×tp2×pp2 on 8 ranks where the machine has 8 cores or
more (one core a rank, or every time measured is the machine's sharing). No cp: PyTorch's context_parallel
does not run on CPU ranks at torch 2.13 (course.native_grid's docstring).
"""
from __future__ import annotations

import dataclasses
import os
import time

import _script
import torch
from _results import count, emit, headline_row
from _rounds import compare, ratio_text

import course
from course import check, comm, gpt, grid_costs, grid_step, link_probe, mesh, native_grid, timeline, timemodel

#: The lab's answers the course's grid runs on.
ANSWERS = ("grid_groups", "vocab_parallel_cross_entropy", "micro_batch_loss", "reduce_gradients", "global_grad_norm")
FOUR = ({"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}, {"pp": 2, "dp": 2})
EIGHT = ({"pp": 2, "dp": 2, "tp": 2},)
FULL = {"config": gpt.Config(), "batch": 8, "micro_batches": 2, "layouts": FOUR, "eight": EIGHT}
QUICK = {"config": gpt.Config(vocab=64, width=16, heads=2, layers=2, sequence=8), "batch": 8, "micro_batches": 2,
         "layouts": FOUR[1:2], "eight": ()}          # pp2×tp2: every axis but dp (tests/test_native_grid has dp)
CONTENDERS = ("lab 9's grid", "PyTorch's parts")
SEED = 0


def lab_answers(lab=None) -> dict:
    """The lab's five answers, from the solution notebook's `reused` cells (refused, by name, where one is not)."""
    if lab is None:
        from grader.common.solution import load
        lab = load("09_composition")
    missing = [name for name in ANSWERS if not callable(getattr(lab, name, None))]
    if missing:
        raise RuntimeError(f"solutions/09_composition/09_composition.ipynb defines no {', '.join(missing)} in a "
                           "cell tagged reused: the benchmark runs the course's grid with the lab's own answers")
    return {name: getattr(lab, name) for name in ANSWERS}


def _timed(step, inputs, targets) -> float:
    with course.recorder.unrecorded():
        torch.distributed.barrier()
        begin = time.perf_counter()
        step(inputs, targets)
        return time.perf_counter() - begin


def side_by_side(config, batches, sizes, micro_batches, answers):
    """Runs on every rank: both grids on the layout; batches[0] warms each up, batches[1] is recorded, the rest
    timed a round each. Returns each one's losses, its recorded step's window, and its seconds round by round."""
    world_size = torch.distributed.get_world_size()
    grid = mesh.Grid.from_rank_lists(answers["grid_groups"](world_size, sizes, config))
    ours = grid_step.Trainer(config, grid, micro_batches=micro_batches,
                             cross_entropy=answers["vocab_parallel_cross_entropy"],
                             micro_batch_loss=answers["micro_batch_loss"],
                             reduce_gradients=answers["reduce_gradients"], grad_norm=answers["global_grad_norm"],
                             seed=SEED)
    theirs = native_grid.Trainer(config, sizes, batch=batches[0][0].shape[0], micro_batches=micro_batches,
                                 seed=SEED)
    found = {name: {"losses": [], "seconds": [], "window": None} for name in CONTENDERS}

    def step(name, inputs, targets):
        loss, _ = (ours if name == CONTENDERS[0] else theirs).step(inputs, targets)
        found[name]["losses"].append(loss)

    for name in CONTENDERS:                                     # warm-up, unrecorded: first calls build things
        with course.recorder.unrecorded():
            step(name, *batches[0])
    for name in CONTENDERS:
        torch.distributed.barrier()
        begin, written = timeline.now(), comm.socket_bytes_written()
        step(name, *batches[1])
        found[name]["window"] = (begin, timeline.now())
        found[name]["written"] = None if written is None else comm.socket_bytes_written() - written
    for i, (inputs, targets) in enumerate(batches[2:]):
        for name in (CONTENDERS if i % 2 == 0 else CONTENDERS[::-1]):
            found[name]["seconds"].append([_timed(lambda x, y, n=name: step(n, x, y), inputs, targets)])
    return found


def layout_text(sizes: dict) -> str:
    return "×".join(f"{axis}{sizes[axis]}" for axis in ("dp", "tp", "pp") if sizes.get(axis, 1) > 1)


def layout_row(settings: dict, sizes: dict, rounds: int, answers: dict, link) -> dict:
    config, batch = settings["config"], settings["batch"]
    ranks = int(torch.tensor(list(sizes.values())).prod())
    native_grid.check_layout(config, sizes, ranks, batch=batch, micro_batches=settings["micro_batches"])
    batches = gpt.token_batches(config, batch=batch, steps=rounds + 2, seed=SEED)
    run = course.launch(side_by_side, ranks, args=(config, batches, sizes, settings["micro_batches"], answers),
                        timeout=600)
    want = torch.tensor(gpt.one_process_training(config, batches, seed=SEED).losses)
    for name in CONTENDERS:                # each trains on the batches in order, whichever goes first in a round
        for rank in run.ranks:
            check.assert_close(torch.tensor(run[rank][name]["losses"]), want,
                               f"{name}'s losses on {layout_text(sizes)}", rank=rank)
    sent = {name: {} for name in CONTENDERS}                # by the formula, per axis: the busiest rank's
    sockets = {name: 0 for name in CONTENDERS}              # written to its sockets in the step: the busiest rank's
    for name in CONTENDERS:
        for rank in run.ranks:
            records, window = run.comm.rank(rank), [run[rank][name]["window"]]
            for axis, nbytes in native_grid.bytes_per_axis(records, window, formula=True).items():
                axis = "dp" if axis == "dp_cp" else axis          # the replicas' reduction, as the chooser's dp
                sent[name][axis] = max(sent[name].get(axis, 0.0), nbytes)
            sockets[name] = max(sockets[name], run[rank][name]["written"] or 0)
    rounds_of = {rank: {name: run[rank][name]["seconds"] for name in CONTENDERS} for rank in run.ranks}
    options = dict(batch=batch, micro_batches=settings["micro_batches"])
    guess = grid_costs.predicted(config, sizes, cluster=grid_costs.this_machine(ranks, link=link, config=config),
                                 **options)
    return {"layout": dict(sizes), "ranks": ranks, "micro_batches": settings["micro_batches"],
            "time": compare(_Results(rounds_of), *CONTENDERS), "bytes": sent, "sockets": sockets,
            "predicted": {"sent": {axis: nbytes for axis, nbytes in guess.sent.items() if axis != "total"},
                          "seconds": guess.seconds["total"]},
            "lab_formula": grid_costs.busiest_lab_bytes(config, sizes, **options)}


class _Results(dict):
    """{rank: {contender: rounds}} with `ranks`, as bench/_rounds.compare reads a launch's results."""

    @property
    def ranks(self):
        return sorted(self)


def main(argv=None):
    args = _script.options(__doc__, argv, full=FULL, quick=QUICK, default_rounds=5,
                           rounds_help="rounds (one step of each grid a round)", quick_help="a small model, one layout "
                           "on 4 ranks, 1 round: for tests")
    settings = args.sizes
    answers = lab_answers()
    # The chooser's link: measured now (course.link_probe, about a second), or --quick the stored local gloo one.
    link = timemodel.LOCAL_GLOO if args.quick else link_probe.measure()
    eight = os.cpu_count() >= 8
    layouts = list(settings["layouts"]) + (list(settings["eight"]) if eight else [])
    placement = course.placement.choose(4)
    load = os.getloadavg()[0]
    figures = {"quick": args.quick, "rounds": args.rounds, "cores": os.cpu_count(), "backend": placement.backend,
               "config": dataclasses.asdict(settings["config"]),
               "batch": settings["batch"],
               "skipped": [] if eight else [{"layout": dict(sizes), "why": f"8 ranks on {os.cpu_count()} cores"}
                                            for sizes in settings["eight"]],
               "link": {"name": link.name, "alpha": link.alpha, "beta": link.beta},
               "layouts": [layout_row(settings, sizes, args.rounds, answers, link) for sizes in layouts]}
    figures["load"] = [load, os.getloadavg()[0]]        # the machine's 1-minute load average, before and after
    emit(args.json, title="Lab 9's grid against PyTorch's own parts", markdown=markdown(figures),
         headline=headline(figures), figures=figures)


def total(row, name) -> float:
    return sum(row["bytes"][name].values())


def headline(figures) -> list[dict]:
    over = count(figures["rounds"], "round")
    rows = []
    for row in figures["layouts"]:
        mine, theirs = (total(row, name) for name in CONTENDERS)
        rows.append(headline_row(f"lab 9's grid / PyTorch's parts, step, {layout_text(row['layout'])} on "
                                 f"{row['ranks']} ranks", f"{ratio_text(row['time'])} (goal ≤ 1.2×); bytes a "
                                 f"step {mine / theirs:.2f}×", over))
    return rows


def markdown(figures) -> str:
    c = figures["config"]
    quick = "; **--quick**: a small model, not figures" if figures["quick"] else ""
    lines = [f"{figures['backend']}, {figures['cores']} cores, load average {figures['load'][0]:.1f} before and "
             f"{figures['load'][1]:.1f} after{quick}. gpt.GPT of vocabulary {c['vocab']}, width "
             f"{c['width']}, {c['heads']} heads, {c['layers']} layers, {c['sequence']} tokens, batch "
             f"{figures['batch']}. Medians and ranges over {count(figures['rounds'], 'round')}, a round one step of "
             "each grid after a barrier, their order swapped round by round, the slowest rank's time; course "
             "recording off. Both grids' losses equal one process's at every step (course.check's float32 "
             "tolerance).", "",
             f"| layout | ranks | {CONTENDERS[0]} | {CONTENDERS[1]} | ratio, goal ≤ 1.2× (range) |",
             "|---|---|---|---|---|"]
    for row in figures["layouts"]:
        t = row["time"]
        lines.append(f"| {layout_text(row['layout'])} | {row['ranks']} | {t['ours_ms']:.1f} ms | "
                     f"{t['theirs_ms']:.1f} ms | {ratio_text(t)} |")
    lines += ["", "Bytes the busiest rank sent a step on each axis, one recorded step, each call by its formula "
              "(course.transfer's; gloo's sockets are counted per window of calls in flight together, and "
              "PyTorch's calls overlap: the sockets' sum over every axis is the total's check); \"embedding\": "
              "the tied embedding's gradient summed over the first and last stage:", "",
              "| layout | axis | " + " | ".join(CONTENDERS) + " | ratio |", "|---|---|---|---|---|"]
    for row in figures["layouts"]:
        axes = sorted(axis for axis in set(row["bytes"][CONTENDERS[0]]) | set(row["bytes"][CONTENDERS[1]])
                      if row["bytes"][CONTENDERS[0]].get(axis) or row["bytes"][CONTENDERS[1]].get(axis))
        for axis in axes:
            mine, theirs = (row["bytes"][name].get(axis, 0.0) for name in CONTENDERS)
            ratio = f"{mine / theirs:.2f}×" if theirs else "-"
            lines.append(f"| {layout_text(row['layout'])} | {axis} | {mine:,.0f} | {theirs:,.0f} | {ratio} |")
        mine, theirs = (row["sockets"][name] for name in CONTENDERS)
        lines.append(f"| {layout_text(row['layout'])} | all, on the sockets | {mine:,.0f} | {theirs:,.0f} | "
                     f"{mine / theirs:.2f}× |")
    for skipped in figures["skipped"]:
        lines.append(f"\nNot run: {layout_text(skipped['layout'])} ({skipped['why']}: one core a rank, or the "
                     "times measure the machine's sharing).")
    lines += ["", f"Lab 6's chooser (`course.grid_costs.predicted`: formulas, on this machine as a cluster: its link "
              f"\"{figures['link']['name']}\", one rank's matmul rate measured) against what was measured, the busiest "
              "rank's; the lab's formula is what its code sends by formula where the chooser models something else "
              "(`grid_costs.busiest_lab_bytes`):", "",
              f"| layout | what | chooser | {CONTENDERS[0]} | lab's formula | {CONTENDERS[1]} |",
              "|---|---|---|---|---|---|"]
    for row in figures["layouts"]:
        name, guess = layout_text(row["layout"]), row["predicted"]
        for axis in ("dp", "tp", "pp", "embedding"):
            mine, theirs = (row["bytes"][c].get(axis, 0.0) for c in CONTENDERS)
            if guess["sent"].get(axis) or mine or theirs:
                lines.append(f"| {name} | bytes a step, {axis} | {guess['sent'].get(axis, 0.0):,.0f} | {mine:,.0f} | "
                             f"{row['lab_formula'].get(axis, 0.0):,.0f} | {theirs:,.0f} |")
        t = row["time"]
        lines.append(f"| {name} | step | {guess['seconds'] * 1e3:.1f} ms | {t['ours_ms']:.1f} ms | - | "
                     f"{t['theirs_ms']:.1f} ms |")
    lines += ["", "What differs by construction: on dp, the lab's grid all-reduces the gradients and all-gathers "
              "its ZeRO-1 chunks once; fully_shard (ZeRO-3) all-gathers the parameters in forward and again in "
              "backward and reduce-scatters the gradients, which gloo, having no reduce-scatter, runs as an "
              "all-reduce. With pp and dp, fully_shard has cut the tied embedding's gradient over dp, so its sum "
              "over the first and last stage carries a 1/dp slice where the lab's grid sums it whole. On tp and "
              "pp both send what sequence parallelism and 1F1B send."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
