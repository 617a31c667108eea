"""Each lab's reference training as a script: under torchrun, on one node or many.

    torchrun --nproc-per-node=2 -m grader run 02_data_parallel --steps 30 --out result.pt
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \\
             --rdzv-endpoint=HOST:29500 -m grader run 04_hybrid --grid 4x2
    python -m grader run 03_model_parallel --ranks 2      # no torchrun: 2 ranks on this machine
    torchrun --nproc-per-node=4 -m grader run 05_sharded_data_parallel --stage 2
    torchrun --nproc-per-node=4 -m grader run 06_pipeline_parallel --schedule gpipe --micro-batches 4
    torchrun --nproc-per-node=4 -m grader run 07_long_sequences --sequence 4096
    torchrun --nproc-per-node=4 -m grader run 08_experts --experts 8

It belongs with the instructor's tools, not in `course/`: it runs the answers.
The training is the solution notebook's own function (loaded with
`grader.common.solution.load`: the answers live only in the notebook), called with the
arguments the notebook gives it, through `course.launch`, as the notebook does.
Under torchrun each process runs it as its own rank; without torchrun, --ranks
starts that many ranks here. Each rank prints a line; rank 0 gathers every
rank's result, prints a summary, and with --out saves it all with `torch.save`
(plain tensors, lists and numbers: `torch.load` reads it with weights_only=True).
A rank's parameters are the whole model's, except in a pipeline (lab 6): there
rank r holds stage r's, and only the last stage has a loss.
"""
from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

import course
from course import placement
from course.grid_model import Grid


class UsageError(Exception):
    """Options that cannot run: said to the user like an argparse error."""


@dataclass(frozen=True)
class Lab:
    """One lab's reference training: the notebook function, how the notebook calls it,
    and where the parameters and losses are in what it returns."""
    function: str                   # its name in the solution notebook
    about: str                      # one line for --help
    add_options: Callable[[argparse.ArgumentParser], None]
    arguments: Callable             # (notebook module, options, world_size) -> (args, kwargs)
    params_and_losses: Callable     # what the function returned -> (params, losses)
    stage_per_rank: bool = False    # a pipeline: rank r returns stage r's parameters, the last rank the losses


# --- lab 2: data parallel --------------------------------------------------------------

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _data_parallel_options(parser):
    parser.add_argument("--sync", choices=("average", "hooks", "buckets", "ddp"), default="average",
                        help="how gradients are averaged (default: average, the notebook's first run)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                        help="the model's and the data's dtype (default: float32)")


def _data_parallel_arguments(lab, options, world_size):
    dtype = DTYPES[options.dtype]
    digits = course.data.digits(dtype=dtype)  # as the notebook's train(ranks, dtype)
    _check_batch(options.batch_size, len(digits.train_x), world_size)
    make_model = functools.partial(course.models.mlp, dtype=dtype)
    return ((make_model, digits.train_x, digits.train_y),
            dict(steps=options.steps, batch_size=options.batch_size, lr=options.lr, sync=options.sync))


# --- lab 3: split weights ----------------------------------------------------------------

def _split_options(parser):
    parser.add_argument("--how", choices=("yours", "PyTorch", "whole"), default="yours",
                        help="the block split by the lab's SplitBlock (default), by PyTorch's "
                             "tensor parallelism, or whole on every rank")


def _split_arguments(lab, options, world_size):
    if options.how != "whole" and lab.HIDDEN % world_size:
        raise UsageError(f"the block's {lab.HIDDEN} hidden features do not split evenly over "
                         f"{world_size} ranks: use a number of ranks that divides {lab.HIDDEN}")
    _check_batch(options.batch_size, len(lab.digits.train_x))
    return ((options.how,), dict(make_block=lab.digits_block, inputs=lab.digits.train_x,
                                 targets=lab.digits.train_y, steps=options.steps,
                                 batch_size=options.batch_size, lr=options.lr))


# --- lab 4: hybrid -------------------------------------------------------------------

def grid(text: str) -> Grid:
    """'2x2' -> Grid(data=2, model=2), for --grid."""
    try:
        data, model = (int(part) for part in text.lower().split("x"))
        return Grid(data, model)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a grid: write DATAxMODEL with whole numbers of at least 1, "
            "such as 2x2 (2 replicas of 2 model-parallel ranks)") from None


def _hybrid_options(parser):
    parser.add_argument("--grid", type=grid, default=None, metavar="DATAxMODEL",
                        help="data-parallel replicas x model-parallel ranks, such as 2x2 (default: "
                             "model 2 as in the notebook, or 1 on an odd number of ranks)")
    parser.add_argument("--seed", type=int, default=0, help="the model's and the batches' seed (default: 0)")


def default_grid(world_size: int) -> Grid:
    """The notebook's grid, model-parallel groups of 2; pure data parallel on odd ranks."""
    return Grid(world_size // 2, 2) if world_size % 2 == 0 else Grid(world_size, 1)


def _hybrid_arguments(lab, options, world_size):
    shape = options.grid or default_grid(world_size)
    if shape.ranks != world_size:
        fits = default_grid(world_size)
        raise UsageError(f"a {shape.data}x{shape.model} grid needs {shape.ranks} ranks, but {world_size} "
                         f"run: use a --grid of {world_size} ranks, such as {fits.data}x{fits.model}, "
                         f"or start {shape.ranks} ranks")
    _check_batch(options.batch_size, len(lab.digits.train_x), shape.ranks)
    if lab.DENSE % shape.model:
        raise UsageError(f"the dense layer's {lab.DENSE} outputs do not split over {shape.model} "
                         "model-parallel ranks: use a MODEL that divides it")
    options.grid = shape
    return ((shape,), dict(steps=options.steps, batch_size=options.batch_size, lr=options.lr,
                           seed=options.seed))


# --- lab 5: sharded data parallel ---------------------------------------------------

ZERO_STAGES = {0: "data parallel", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def _sharded_options(parser):
    parser.add_argument("--stage", type=int, choices=tuple(ZERO_STAGES), default=3,
                        help="0 data parallel, 1 ZeRO-1 (the optimizer state sharded), 2 ZeRO-2 (the "
                             "gradients too), 3 ZeRO-3 (the parameters too; default)")


def _sharded_arguments(lab, options, world_size):
    _check_batch(options.batch_size, len(lab.digits.train_x), world_size)
    # the notebook's wide MLP, with the momentum SGD its training checks use
    make_model = functools.partial(course.models.mlp, **lab.WIDE_MLP)
    make_optimizer = functools.partial(torch.optim.SGD, lr=options.lr, momentum=0.9)
    return ((make_model, lab.digits.train_x, lab.digits.train_y),
            dict(stage=options.stage, steps=options.steps, batch_size=options.batch_size,
                 make_optimizer=make_optimizer))


# --- lab 6: pipeline parallel ---------------------------------------------------------

SCHEDULES = ("gpipe", "1f1b")


def _pipeline_options(parser):
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                        help="gpipe (every forward, then every backward) or 1f1b (a backward as soon as one "
                             "can run; default)")
    parser.add_argument("--micro-batches", type=_positive(int), default=None,
                        help="micro-batches a batch is cut into (default: the notebook's MICRO_BATCHES)")


def _pipeline_arguments(lab, options, world_size):
    layers = len(list(lab.pipe_mlp().children()))
    if not 2 <= world_size <= layers:
        raise UsageError(f"a pipeline of the lab's {layers}-layer MLP runs one stage of whole layers a rank, on "
                         f"2 to {layers} ranks, but {world_size} would run: start 2 to {layers} ranks")
    options.micro_batches = options.micro_batches or lab.MICRO_BATCHES
    if options.batch_size % options.micro_batches:
        raise UsageError(f"a batch of {options.batch_size} samples does not cut into {options.micro_batches} "
                         f"equal micro-batches: use a --micro-batches that divides the --batch-size")
    # as the notebook's training cells: the 8-layer MLP on synthetic data, a batch a step
    inputs, targets = lab.data.synthetic(options.steps * options.batch_size, lab.PIPE_MLP["in_features"])
    schedule = {"gpipe": lab.gpipe, "1f1b": lab.one_f_one_b}[options.schedule]
    return ((schedule, lab.pipe_mlp, inputs, targets),
            dict(steps=options.steps, batch_size=options.batch_size, micro_batches=options.micro_batches,
                 learning_rate=options.lr))


def _check_batch(batch_size, samples, world_size=1):
    """Batches split into equal shards (unequal ones would weigh samples unequally), and
    at least one batch in the data."""
    if batch_size % world_size:
        raise UsageError(f"a batch of {batch_size} samples does not split evenly over {world_size} "
                         f"ranks: use a --batch-size that is a multiple of {world_size}")
    if batch_size > samples:
        raise UsageError(f"a batch of {batch_size} is more than the {samples} training samples: "
                         f"use a --batch-size of at most {samples}")


# --- lab 7: long sequences --------------------------------------------------------------

def _long_sequence_options(parser):
    parser.add_argument("--sequence", type=_positive(int), default=None,
                        help="tokens a sequence, split over the ranks (default: the notebook's TRAINING_SEQUENCE)")
    parser.add_argument("--split", choices=("zig-zag", "contiguous"), default="zig-zag",
                        help="which tokens each rank holds: zig-zag (balanced under the causal mask; default) "
                             "or contiguous")


def _long_sequence_arguments(lab, options, world_size):
    sequence = options.sequence or lab.TRAINING_SEQUENCE
    pieces = 2 * world_size if options.split == "zig-zag" else world_size
    if sequence < pieces:
        raise UsageError(f"a sequence of {sequence} tokens cannot be cut into the {pieces} pieces a {options.split} "
                         f"split of {world_size} ranks needs: use a --sequence of at least {pieces}")
    inputs, targets = lab.training_data(sequence, options.batch_size)    # the notebook's training cell's data
    return ((lab.training_block, inputs, targets),
            dict(steps=options.steps, learning_rate=options.lr, split=options.split))


# --- lab 8: experts -----------------------------------------------------------------------

def _experts_options(parser):
    parser.add_argument("--experts", type=_positive(int), default=None,
                        help="experts in the block, split over the ranks (default: the notebook's EXPERTS)")


def _experts_arguments(lab, options, world_size):
    experts = options.experts or lab.EXPERTS
    if experts < lab.TOP_K:
        raise UsageError(f"each token goes to {lab.TOP_K} experts: use --experts {lab.TOP_K} or more")
    if world_size > experts:
        raise UsageError(f"{experts} experts leave some of the {world_size} ranks none to hold: start at most "
                         f"{experts} ranks, or pass more --experts")
    _check_batch(options.batch_size, len(course.data.digits().train_x), world_size)
    inputs, targets = lab.training_data(options.steps, options.batch_size)    # the notebook's training cell's data
    return (functools.partial(lab.digits_model, experts), inputs, targets), dict(learning_rate=options.lr)


LABS = {
    "02_data_parallel": Lab("data_parallel_training", "data parallel MLP on digits: the weights on "
                            "every rank, the batch split", _data_parallel_options,
                            _data_parallel_arguments, lambda r: (r["params"], r["losses"])),
    "03_model_parallel": Lab("split_training", "a Linear -> ReLU -> Linear block on digits, its "
                             "weights split column then row", _split_options, _split_arguments,
                             lambda r: (r[0], r[1])),
    "04_hybrid": Lab("hybrid_training", "a convnet on digits: convolutions data parallel, dense "
                     "layers split, on a grid", _hybrid_options, _hybrid_arguments,
                     lambda r: (r[0], r[1])),
    "05_sharded_data_parallel": Lab("sharded_training", "the wide MLP on digits, data parallel, its "
                                    "training state sharded by ZeRO stage 1, 2 or 3", _sharded_options,
                                    _sharded_arguments, lambda r: (r["parameters"], r["losses"])),
    "06_pipeline_parallel": Lab("pipeline_training", "the 8-layer MLP cut into one stage of whole layers a rank, "
                                "micro-batches in GPipe's or 1F1B's order", _pipeline_options, _pipeline_arguments,
                                lambda r: (r["parameters"], r["losses"]), stage_per_rank=True),
    "07_long_sequences": Lab("long_sequence_training", "lab 3's transformer block trained on long sequences, "
                             "each rank holding some of the tokens, attention by ring attention",
                             _long_sequence_options, _long_sequence_arguments,
                             lambda r: (r["parameters"], r["losses"])),
    "08_experts": Lab("expert_parallel_training", "a digits model with a block of experts, the experts split over "
                      "the ranks (expert parallelism), its other layers data parallel", _experts_options,
                      _experts_arguments, lambda r: (r["parameters"], r["losses"])),
}


# --- the command line --------------------------------------------------------------

def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be a positive {'whole ' * (kind is int)}number, "
                                             f"got {text!r}")
        return value
    return parse


def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line's parser, and each lab's (for errors that show the lab's usage)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--steps", type=_positive(int), help="training steps (default: the notebook's STEPS)")
    common.add_argument("--batch-size", type=_positive(int),
                        help="the global mini-batch, over all ranks (default: the notebook's BATCH_SIZE)")
    common.add_argument("--lr", type=_positive(float), help="learning rate (default: the notebook's LEARNING_RATE)")
    common.add_argument("--out", help="rank 0 saves every rank's parameters and losses, and what ran, here")
    common.add_argument("--ranks", type=_positive(int),
                        help="without torchrun: how many ranks to start on this machine")
    common.add_argument("--timeout", type=_positive(float), default=600.0,
                        help="without torchrun: seconds before the ranks are stopped (default: 600)")
    main_parser = argparse.ArgumentParser(
        prog="python -m grader run", description=__doc__.split("\n\n")[0],
        epilog="Under torchrun: torchrun --nproc-per-node=N -m grader run LAB [options]")
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
                         "-m grader run ...), or pass --ranks N to start N ranks on this machine")
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
    """`python -m grader run` in the grader's command list (for -h). The ranks' own start
    goes through `main` directly (grader.__main__): no nbgrader to import on every rank."""
    parser = subparsers.add_parser("run", help="a lab's reference training as a script, under torchrun or not",
                                   add_help=False)
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="LAB [options]; see python -m grader run -h")
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
