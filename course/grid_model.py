"""A grid of `data` x `model` ranks training a convnet: what each rank sends, how long
a step takes, and Yadan et al.'s Table 1 beside the model's prediction.

Pure functions, no torch. A grid has `data` model-parallel groups (one per data-parallel
replica), each of `model` ranks; rank = d * model + m. Two ways to use it:

scheme "lab" (Krizhevsky 2014, and lab 4): the convolutions are data parallel over every
    rank (batch / ranks images each). At the first dense layer a model-parallel group
    gathers its batch / data images (all-gather), and its ranks split the dense layers,
    column then row, alternately (lab 3); backward, the error of the gathered images is
    summed over the group (all-reduce) and each rank keeps its own images'. Gradients:
    the convolutions' all-reduced over every rank, each dense shard's over its
    data-parallel group (the ranks holding the same shard).
scheme "paper" (Yadan et al. 2013, after Krizhevsky 2012): every layer, convolutions
    too, is split by its outputs over a model-parallel group, which sees the whole
    batch / data; each layer's output is all-gathered forward and its input's error
    all-reduced backward; each rank's 1/model of the weights is all-reduced over its
    data-parallel group.

Time = compute + communication, not overlapped (an upper bound). Compute is the rank's
share of `training_flop` on `timemodel.Processor.pass_seconds` (a pass over fewer than
`full_batch` images costs as much as `full_batch`); communication is each collective
after the other, ring algorithms, on one `timemodel.Link` (`timemodel`'s assumptions).
"""
from __future__ import annotations

from dataclasses import dataclass

from course import timemodel, transfer
from course.sizes import Conv, Dense, nbytes

SCHEMES = ("lab", "paper")


@dataclass(frozen=True)
class Grid:
    """`data` data-parallel replicas, each a model-parallel group of `model` ranks: `data`
    ranks in each data-parallel group, `model` in each model-parallel group, both whole
    numbers of at least 1 (`transfer.check_ranks`)."""
    data: int
    model: int

    def __post_init__(self):
        transfer.check_ranks(self.data, "data")
        transfer.check_ranks(self.model, "model")

    @property
    def ranks(self) -> int:
        """The number of ranks of the grid: data x model."""
        return self.data * self.model

    def __str__(self) -> str:
        return f"{self.data} data x {self.model} model"


@dataclass(frozen=True)
class PaperRow:
    configuration: str
    grid: Grid
    days: float      # for 100 epochs of ImageNet
    speedup: float   # as the paper gives it


#: Yadan et al., Table 1: Krizhevsky's network, batch 256, NVIDIA TITAN 6 GB, one server.
TABLE_1 = (
    PaperRow("1 GPU", Grid(1, 1), 10.5, 1.0),
    PaperRow("2 GPUs, model parallelism", Grid(1, 2), 6.6, 1.6),
    PaperRow("2 GPUs, data parallelism", Grid(2, 1), 7.0, 1.5),
    PaperRow("4 GPUs, data parallelism", Grid(4, 1), 7.2, 1.46),
    PaperRow("4 GPUs, model + data parallelism", Grid(2, 2), 4.8, 2.2),
)
PAPER_BATCH = 256

#: Krizhevsky's 2012 network, as one column (both GPUs' halves together, convolutions ungrouped).
KRIZHEVSKY = (
    Conv("conv1", 3, 96, 11, 55, 55, pool=2),
    Conv("conv2", 96, 256, 5, 27, 27, pool=2),
    Conv("conv3", 256, 384, 3, 13, 13),
    Conv("conv4", 384, 384, 3, 13, 13),
    Conv("conv5", 384, 256, 3, 13, 13, pool=2),
    Dense("fc6", 256 * 6 * 6, 4096),
    Dense("fc7", 4096, 4096),
    Dense("fc8", 4096, 1000),
)


def convnet_layers(channels: tuple[int, int] = (16, 32), dense: int = 128, classes: int = 10,
                   image_size: int = 8) -> tuple:
    """The layers of `course.models.convnet` with the same arguments, as sizes."""
    c1, c2 = channels
    return (Conv("conv1", 1, c1, 3, image_size, image_size),
            Conv("conv2", c1, c2, 3, image_size, image_size, pool=2),
            Dense("dense", c2 * (image_size // 2) ** 2, dense),
            Dense("output", dense, classes))


def _split(layers) -> tuple[list, list]:
    convs = [layer for layer in layers if isinstance(layer, Conv)]
    dense = [layer for layer in layers if isinstance(layer, Dense)]
    if list(layers) != convs + dense or not dense:
        raise ValueError("the model must be convolutions first, then at least one dense layer")
    return convs, dense


def _check_settings(layers, grid: Grid, batch: int, scheme: str, dense: list) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if batch < 1 or batch % grid.ranks:
        raise ValueError(f"the batch of {batch} must split evenly over the {grid.ranks} ranks of a {grid} grid")
    if scheme == "paper":   # every layer split by its outputs
        split = [layer for layer in layers
                 if (layer.out_channels if isinstance(layer, Conv) else layer.outputs) % grid.model]
    else:                   # the dense layers, column then row
        split = [layer for i, layer in enumerate(dense) if (layer.outputs if i % 2 == 0 else layer.inputs) % grid.model]
    if split:
        raise ValueError(f"{split[0].name} cannot be split evenly over {grid.model} model-parallel ranks")


def _transfer(what: str, collective: str, group: str, ranks: int, elements: int, dtype: str) -> dict:
    full = nbytes(elements, dtype)
    ring = transfer.ring_all_gather if collective == "all-gather" else transfer.ring_all_reduce
    return {"what": what, "collective": collective, "group": group, "ranks": ranks,
            "bytes": full, "sent": ring(full, ranks)}


def transfers(layers, grid: Grid, batch: int, scheme: str = "lab", dtype: str = "float32") -> list[dict]:
    """The collectives of one training step, as rows: what, collective, group (all, data or
    model), ranks in it, bytes of the full tensor, bytes one rank sends (ring)."""
    convs, dense = _split(layers)
    _check_settings(layers, grid, batch, scheme, dense)
    per_group, rows = batch // grid.data, []

    def add(what, collective, group, elements):
        ranks = {"all": grid.ranks, "data": grid.data, "model": grid.model}[group]
        if ranks > 1:
            rows.append(_transfer(what, collective, group, ranks, elements, dtype))

    if scheme == "paper":
        everything = convs + dense
        for i, layer in enumerate(everything):
            add(f"{layer.name} outputs", "all-gather", "model", layer.activations(per_group))
            if i:
                add(f"{layer.name} input errors", "all-reduce", "model", everything[i - 1].activations(per_group))
        for layer in everything:
            add(f"{layer.name} gradients", "all-reduce", "data", layer.weights // grid.model)
        return rows

    add("conv gradients", "all-reduce", "all", sum(layer.weights for layer in convs))
    add("hand-over: gather images", "all-gather", "model", per_group * dense[0].inputs)
    add("hand-over: sum their errors", "all-reduce", "model", per_group * dense[0].inputs)
    for i, layer in enumerate(dense):
        column = i % 2 == 0
        if not column:
            add(f"{layer.name} partial outputs", "all-reduce", "model", layer.activations(per_group))
        elif i:
            add(f"{layer.name} input errors", "all-reduce", "model", per_group * layer.inputs)
        if column and i == len(dense) - 1:
            add(f"{layer.name} outputs", "all-gather", "model", layer.activations(per_group))
    for i, layer in enumerate(dense):
        # a row layer's bias is whole on every rank of the group; a column layer's is split
        bias = (layer.outputs if layer.bias else 0) // (grid.model if i % 2 == 0 else 1)
        add(f"{layer.name} shard gradients", "all-reduce", "data", layer.inputs * layer.outputs // grid.model + bias)
    return rows


def step(layers, grid: Grid, batch: int, processor: timemodel.Processor, link: timemodel.Link,
         scheme: str = "lab", dtype: str = "float32") -> dict:
    """One training step on one rank: compute, communication and their sum in seconds,
    and the bytes it sends."""
    convs, dense = _split(layers)
    rows = transfers(layers, grid, batch, scheme, dtype)
    per_group = batch // grid.data
    if scheme == "paper":
        flop = sum(layer.training_flop(1) for layer in convs + dense) / grid.model
        compute = processor.pass_seconds(flop, per_group)
    else:
        compute = (processor.pass_seconds(sum(layer.training_flop(1) for layer in convs), batch // grid.ranks)
                   + processor.pass_seconds(sum(layer.training_flop(1) for layer in dense) / grid.model, per_group))
    seconds = {"all-gather": timemodel.ring_all_gather_seconds, "all-reduce": timemodel.ring_all_reduce_seconds}
    communication = sum(seconds[row["collective"]](row["bytes"], row["ranks"], link) for row in rows)
    return {"compute": compute, "communication": communication, "step": compute + communication,
            "sent": sum(row["sent"] for row in rows)}


def table_1(layers=KRIZHEVSKY, batch: int = PAPER_BATCH, processor: timemodel.Processor = timemodel.TITAN,
            link: timemodel.Link = timemodel.PCIE3_X16, scheme: str = "paper") -> list[dict]:
    """Table 1's five configurations: the paper's days and speed-up beside this model's step
    time, bytes sent per rank and speed-up over one GPU."""
    one = step(layers, Grid(1, 1), batch, processor, link, scheme)["step"]
    rows = []
    for row in TABLE_1:
        predicted = step(layers, row.grid, batch, processor, link, scheme)
        rows.append({"configuration": row.configuration, "grid": row.grid, "paper days": row.days,
                     "paper speed-up": row.speedup, "predicted step (s)": predicted["step"],
                     "predicted compute (s)": predicted["compute"], "predicted sent (bytes)": predicted["sent"],
                     "predicted speed-up": one / predicted["step"]})
    return rows
