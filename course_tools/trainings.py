"""Each lab's training as `python -m course_tools run LAB` runs it: the table `LABS`.

A lab's row (`Lab`) names the solution notebook's training function, the options it adds to
the command line, how it is called (the arguments its notebook gives it, from the options and
the number of ranks: options that cannot run raise `UsageError`, which the command says as an
argparse error), and where the parameters and losses are in what it returns. The runner
(course_tools.run) reads the table and nothing lab by lab; tests/test_torchrun.py runs every lab
in it against the notebook's own run. A new lab that trains adds its row here.
"""
from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

import course
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


def positive(kind):
    """An argparse type: `kind` of the text, refused unless above 0."""
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


def _check_batch(batch_size, samples, world_size=1):
    """Batches split into equal shards (unequal ones would weigh samples unequally), and
    at least one batch in the data."""
    if batch_size % world_size:
        raise UsageError(f"a batch of {batch_size} samples does not split evenly over {world_size} "
                         f"ranks: use a --batch-size that is a multiple of {world_size}")
    if batch_size > samples:
        raise UsageError(f"a batch of {batch_size} is more than the {samples} training samples: "
                         f"use a --batch-size of at most {samples}")


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
    parser.add_argument("--micro-batches", type=positive(int), default=None,
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


# --- lab 7: long sequences --------------------------------------------------------------

def _long_sequence_options(parser):
    parser.add_argument("--sequence", type=positive(int), default=None,
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
    parser.add_argument("--experts", type=positive(int), default=None,
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


# --- lab 9: composition --------------------------------------------------------------------

#: The notebook's layouts by number of ranks, when --layout is not given.
DEFAULT_LAYOUTS = {1: {}, 2: {"tp": 2}, 4: {"dp": 2, "tp": 2}, 8: {"pp": 2, "dp": 2, "tp": 2}}


def layout(text: str) -> dict:
    """'pp=2,dp=2,tp=2' -> {"pp": 2, "dp": 2, "tp": 2}, for --layout."""
    from course import mesh

    sizes = {}
    for part in text.replace(" ", "").split(","):
        axis, _, size = part.partition("=")
        if axis not in mesh.AXES or not size.isdigit() or int(size) < 1 or axis in sizes:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a layout: write AXIS=SIZE pairs, each axis once, among {', '.join(mesh.AXES)}, "
                "such as pp=2,dp=2,tp=2")
        sizes[axis] = int(size)
    return sizes


def _composition_options(parser):
    defaults = "; ".join(f"{n} rank{'s' * (n > 1)} {','.join(f'{a}={k}' for a, k in d.items()) or 'alone'}"
                         for n, d in DEFAULT_LAYOUTS.items())
    parser.add_argument("--layout", type=layout, default=None, metavar="AXIS=SIZE,...",
                        help="the grid, such as pp=2,dp=2,tp=2 (its sizes' product is the number of ranks; "
                             f"default: {defaults})")
    parser.add_argument("--micro-batches", type=positive(int), default=None,
                        help="micro-batches a step, run by 1F1B where pp > 1 (default: the notebook's MICRO_BATCHES)")


def _composition_arguments(lab, options, world_size):
    from course import gpt_stage

    if options.layout is None and world_size not in DEFAULT_LAYOUTS:
        raise UsageError(f"no default layout for {world_size} ranks: pass --layout, such as "
                         f"dp={world_size}, whose sizes multiply to {world_size}")
    sizes = DEFAULT_LAYOUTS[world_size] if options.layout is None else options.layout
    if math.prod(sizes.values()) != world_size:
        raise UsageError(f"the layout {options.layout} makes a grid of {math.prod(sizes.values())} ranks, but "
                         f"{world_size} are running: pass a --layout whose sizes multiply to {world_size}")
    try:
        gpt_stage.check_layout(lab.CONFIG, sizes)
    except ValueError as error:
        raise UsageError(str(error)) from None
    micro_batches = options.micro_batches or lab.MICRO_BATCHES
    replicas = sizes.get("dp", 1) * micro_batches
    if options.batch_size % replicas:
        raise UsageError(f"a batch of {options.batch_size} sequences does not split into dp {sizes.get('dp', 1)} × "
                         f"{micro_batches} micro-batches: use a --batch-size that is a multiple of {replicas}")
    options.layout = sizes          # what ran, in the saved options
    batches = lab.training_batches(steps=options.steps, batch=options.batch_size)
    return (sizes, batches), dict(micro_batches=micro_batches, learning_rate=options.lr)


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
    "09_composition": Lab("grid_training", "lab 9's GPT on a grid of data, tensor (with sequence), pipeline and "
                          "context ranks, from the lab's answers", _composition_options, _composition_arguments,
                          lambda r: (r["parameters"], r["losses"])),
}

