"""Each lab's reference training as a script: under torchrun, on one node or many.

    torchrun --nproc-per-node=2 -m course_tools run 02_data_parallel --steps 30 --out result.pt
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \\
             --rdzv-endpoint=HOST:29500 -m course_tools run 04_hybrid --grid 4x2
    python -m course_tools run 03_model_parallel --ranks 2      # no torchrun: 2 ranks on this machine
    torchrun --nproc-per-node=4 -m course_tools run 05_sharded_data_parallel --stage 2
    torchrun --nproc-per-node=4 -m course_tools run 06_pipeline_parallel --schedule gpipe --micro-batches 4
    torchrun --nproc-per-node=4 -m course_tools run 07_long_sequences --sequence 4096
    torchrun --nproc-per-node=4 -m course_tools run 08_experts --experts 8
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \\
             --rdzv-endpoint=HOST:29500 -m course_tools run 09_composition --layout pp=2,dp=2,tp=2

It belongs with the instructor's tools, not in `course/`: it runs the answers.
The training is the solution notebook's own function (loaded with
`grader.common.solution.load`: the answers live only in the notebook), called with the
arguments the notebook gives it, through `course.launch`, as the notebook does; which
function and which arguments, lab by lab, is course_tools.trainings's table (`LABS`).
Under torchrun each process runs it as its own rank; without torchrun, --ranks
starts that many ranks here. Each rank prints a line; rank 0 gathers every
rank's result, prints a summary, and with --out saves it all with `torch.save`
(plain tensors, lists and numbers: `torch.load` reads it with weights_only=True).
A rank's parameters are the whole model's, except in a pipeline (lab 6): there
rank r holds stage r's, and only the last stage has a loss.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist

import course
from course import placement
from course.grid_model import Grid

from .trainings import LABS, UsageError, positive

# --- the command line --------------------------------------------------------------

def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line's parser, and each lab's (for errors that show the lab's usage)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--steps", type=positive(int), help="training steps (default: the notebook's STEPS)")
    common.add_argument("--batch-size", type=positive(int),
                        help="the global mini-batch, over all ranks (default: the notebook's BATCH_SIZE)")
    common.add_argument("--lr", type=positive(float), help="learning rate (default: the notebook's LEARNING_RATE)")
    common.add_argument("--out", help="rank 0 saves every rank's parameters and losses, and what ran, here")
    common.add_argument("--ranks", type=positive(int),
                        help="without torchrun: how many ranks to start on this machine")
    common.add_argument("--timeout", type=positive(float), default=600.0,
                        help="without torchrun: seconds before the ranks are stopped (default: 600)")
    main_parser = argparse.ArgumentParser(
        prog="python -m course_tools run", description=__doc__.split("\n\n")[0],
        epilog="Under torchrun: torchrun --nproc-per-node=N -m course_tools run LAB [options]")
    labs = main_parser.add_subparsers(dest="lab", metavar="LAB", required=True,
                                      help="which lab's training to run")
    lab_parsers = {name: labs.add_parser(name, parents=[common], help=lab.about, description=lab.about)
                   for name, lab in LABS.items()}
    for name, lab in LABS.items():
        lab.add_options(lab_parsers[name])
    return main_parser, lab_parsers


def main(argv: list[str] | None = None) -> dict | None:
    """Run a lab's training; return what rank 0 saves (None on the other ranks)."""
    cli, lab_parsers = parsers()
    options = cli.parse_args(argv)
    try:
        return _run(options)
    except UsageError as error:
        lab_parsers[options.lab].error(str(error))  # exits, with the lab's usage line


def _run(options) -> dict | None:
    lab = LABS[options.lab]
    torchrun = placement.under_torchrun()
    if torchrun:
        world_size = int(os.environ["WORLD_SIZE"])
        if options.ranks not in (None, world_size):
            raise UsageError(f"--ranks {options.ranks}, but torchrun started {world_size} ranks: "
                             "leave --ranks out under torchrun (it counts them)")
    elif options.ranks is None:
        raise UsageError("how many ranks? Run it under torchrun (torchrun --nproc-per-node=2 "
                         "-m course_tools run ...), or pass --ranks N to start N ranks on this machine")
    else:
        world_size = options.ranks

    notebook = _solution(options.lab)
    options.steps = options.steps or notebook.STEPS
    options.batch_size = options.batch_size or notebook.BATCH_SIZE
    options.lr = options.lr or notebook.LEARNING_RATE
    args, kwargs = lab.arguments(notebook, options, world_size)

    results = course.launch(getattr(notebook, lab.function), None if torchrun else world_size,
                            args, kwargs, timeout=options.timeout)
    reports = {rank: _report(lab, results, rank) for rank in results.ranks}
    for report in reports.values():
        print(_rank_line(report, results.world_size, results.backend, options.steps), flush=True)
    if torchrun:  # rank 0 collects the others' reports; across nodes, only it writes
        everyone = [None] * results.world_size if dist.get_rank() == 0 else None
        dist.gather_object(reports, everyone, dst=0)
        if everyone is None:
            return None
        reports = {rank: report for part in everyone for rank, report in part.items()}

    saved = {"lab": options.lab, "function": lab.function, "world_size": results.world_size,
             "backend": results.backend, "torchrun": torchrun, "torch": str(torch.__version__),
             "options": _plain(options), "ranks": reports}
    print(_summary(saved, lab), flush=True)
    if options.out:
        torch.save(saved, options.out)
        print(f"wrote {options.out}", flush=True)
    return saved


def _solution(name):
    from grader.common.solution import load  # the answers: only in the solution notebook

    return load(name)


def add_subcommand(subparsers) -> None:
    """`python -m course_tools run` in the command list (for -h). The ranks' own start goes
    through `main` directly (course_tools.__main__): only what the training needs, on every rank."""
    parser = subparsers.add_parser("run", help="a lab's reference training as a script, under torchrun or not",
                                   add_help=False)
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="LAB [options]; see python -m course_tools run -h")
    parser.set_defaults(func=lambda args: main(args.arguments) and 0)


def _report(lab, results, rank) -> dict:
    returned = results[rank]
    params, losses = lab.params_and_losses(returned)
    return {"rank": rank, "host": socket.gethostname(), "device": results.devices[results.ranks.index(rank)],
            "stage": rank if lab.stage_per_rank else None,
            "params": [p.detach().cpu() for p in params], "losses": [float(x) for x in losses],
            "seconds": results.seconds[rank], "messages": len(results.comm.rank(rank)),
            "returned": returned}


def _rank_line(report, world_size, backend, steps) -> str:
    losses, stage = report["losses"], report["stage"]
    trained = (f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps" if losses
               else f"{steps} steps (the loss is on the last stage)")   # a pipeline's earlier stages
    held = "" if stage is None else f", stage {stage} of {world_size}"
    return (f"[rank {report['rank']}/{world_size}] {report['host']} {report['device']} ({backend}): "
            f"{trained}{held}, {report['messages']} collectives and messages, {report['seconds']:.2f} s")


def _summary(saved, lab) -> str:
    reports = saved["ranks"]
    hosts = sorted({r["host"] for r in reports.values()})
    options = saved["options"]
    return (f"{saved['lab']}: {saved['function']} on {saved['world_size']} ranks "
            f"({saved['backend']}, {len(hosts)} host{'s' * (len(hosts) > 1)}: {', '.join(hosts)}), "
            f"{options['steps']} steps of batch {options['batch_size']}, lr {options['lr']:g}; "
            + (_stages_held(reports, options) if lab.stage_per_rank else _replicas_apart(reports)))


def _replicas_apart(reports) -> str:
    """Every rank holds the whole model: how far apart the copies ended."""
    first = reports[min(reports)]["params"]
    apart = max((a - b).abs().max().item() for r in reports.values() for a, b in zip(r["params"], first))
    return f"the ranks' final parameters differ by at most {apart:.2g}"


def _stages_held(reports, options) -> str:
    """Each rank holds one stage: what each holds, and the loss, which only the last stage computes."""
    held = ", ".join(f"stage {r['stage']} {sum(p.numel() for p in r['params']):,}"
                     for r in sorted(reports.values(), key=lambda r: r["stage"]))
    losses = reports[max(reports)]["losses"]
    return (f"{options['schedule']}, {options['micro_batches']} micro-batches, one stage a rank holding "
            f"({held} parameters); the last stage's loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def _plain(options) -> dict:
    """The options as plain values (a grid as '2x2'), for torch.load's weights_only."""
    plain = {}
    for key, value in vars(options).items():
        plain[key] = f"{value.data}x{value.model}" if isinstance(value, Grid) else value
    return plain


if __name__ == "__main__":
    main(sys.argv[1:])
