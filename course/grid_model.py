"""A grid of `data` x `model` ranks training a convnet: what each rank sends, how long
a step takes, and Yadan et al.'s Table 1 beside the model's prediction.

Pure functions, no torch. A grid has `data` model-parallel groups (one per data-parallel
replica), each of `model` ranks; rank = d * model + m. Two ways to use it:

scheme "lab" (Krizhevsky 2014, and lab 4): the convolutions are data parallel over every
    rank (batch / ranks images each). At the first dense layer a model-parallel group
    gathers its batch / data images (all-gather), and its ranks split the dense layers,
    column then row, alternately (lab 3); backward, the error of the gathered images is
    summed over the group and each rank keeps its own images' rows. Gradients: the
    convolutions' all-reduced over every rank, each dense shard's over its data-parallel
    group (the ranks holding the same shard).
scheme "paper" (Yadan et al. 2013, after Krizhevsky 2012): every layer, convolutions
    too, is split by its outputs over a model-parallel group, which sees the whole
    batch / data; each layer's output is all-gathered forward and its error summed
    backward, each rank keeping its own part; each rank's 1/model of the weights is
    all-reduced over its data-parallel group. Every layer exchanges: Krizhevsky's own two
    columns exchanged only into the layers of `KRIZHEVSKY_CROSS_GPU` (`columns_sent`).

Summing an error over the group and keeping one's own part is a reduce-scatter, the
adjoint of the forward all-gather. `backend` says how it is counted: "nccl" runs a ring
reduce-scatter, (N-1)/N of the tensor per rank; "gloo" has no reduce-scatter of its own
(`course.transfer`): it all-reduces the whole tensor, 2(N-1)/N, twice as much, and keeps
its part. The other collectives are the same rings on both.

Time = compute + communication, not overlapped (an upper bound). Compute is the rank's
share of `training_flop` on `timemodel.Processor.pass_seconds` (a pass over fewer than
`full_batch` images costs as much as `full_batch`: an assumption, see `table_1`);
communication is each collective after the other, ring algorithms, on one
`timemodel.Link` (`timemodel`'s assumptions).

`data` and `model` are what `course.choosing` calls dp and tp; the m of rank = d * model + m is a
position, not a count of micro-batches (CONTRIBUTING.md, "Words", says why).

Used in: lab 4 (04_hybrid), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from course import timemodel, transfer
from course.sizes import Conv, Dense, nbytes

SCHEMES = ("lab", "paper")
BACKENDS = transfer.BACKENDS   # how the backward of a gather is counted (module docstring)


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


#: Yadan et al., Table 1: Krizhevsky's network, batch 256, NVIDIA GTX TITAN (6 GiB), one server.
TABLE_1 = (
    PaperRow("1 GPU", Grid(1, 1), 10.5, 1.0),
    PaperRow("2 GPUs, model parallelism", Grid(1, 2), 6.6, 1.6),
    PaperRow("2 GPUs, data parallelism", Grid(2, 1), 7.0, 1.5),
    PaperRow("4 GPUs, data parallelism", Grid(4, 1), 7.2, 1.46),
    PaperRow("4 GPUs, model + data parallelism", Grid(2, 2), 4.8, 2.2),
)
PAPER_BATCH = 256
#: The TITAN without the full-batch assumption: a pass costs in proportion to its images.
TITAN_NO_FULL_BATCH = replace(timemodel.TITAN, name=f"{timemodel.TITAN.name}, no full batch", full_batch=1,
                              source=timemodel.TITAN.source.split(". ")[0] + ". A pass costs in proportion to "
                              "its images, however few (timemodel.TITAN without its full_batch of 128)")

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
#: The layers of Krizhevsky et al. 2012 (section 3.5, figure 2) whose kernels take input from both GPUs:
#: "the kernels of layer 3 take input from all kernel maps in layer 2", and the fully connected layers;
#: conv2, conv4 and conv5 take input only from the kernel maps on their own GPU.
KRIZHEVSKY_CROSS_GPU = ("conv3", "fc6", "fc7", "fc8")


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


#: bytes one rank sends in each collective, ring algorithms (`course.transfer`)
SENT = {"all-gather": transfer.ring_all_gather, "all-reduce": transfer.ring_all_reduce,
        "reduce-scatter": transfer.ring_reduce_scatter}
#: seconds of each collective; a ring reduce-scatter takes the N-1 steps of one chunk of an all-gather
SECONDS = {"all-gather": timemodel.ring_all_gather_seconds, "all-reduce": timemodel.ring_all_reduce_seconds,
           "reduce-scatter": timemodel.ring_all_gather_seconds}


def _transfer(what: str, collective: str, group: str, ranks: int, elements: int, dtype: str) -> dict:
    full = nbytes(elements, dtype)
    return {"what": what, "collective": collective, "group": group, "ranks": ranks,
            "bytes": full, "sent": SENT[collective](full, ranks)}


def gather_backward(backend: str) -> str:
    """The collective that sums the error of a gathered tensor and keeps one's own part, as
    `backend` runs it: NCCL's reduce-scatter, or gloo's all-reduce of the whole tensor."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return "reduce-scatter" if backend == "nccl" else "all-reduce"


def transfers(layers, grid: Grid, batch: int, scheme: str = "lab", dtype: str = "float32",
              backend: str = "nccl") -> list[dict]:
    """The collectives of one training step, as rows: what, collective, group (all, data or
    model), ranks in it, bytes of the full tensor, bytes one rank sends (ring). The backward
    of each gather is `gather_backward(backend)`."""
    convs, dense = _split(layers)
    _check_settings(layers, grid, batch, scheme, dense)
    per_group, rows, adjoint = batch // grid.data, [], gather_backward(backend)

    def add(what, collective, group, elements):
        ranks = {"all": grid.ranks, "data": grid.data, "model": grid.model}[group]
        if ranks > 1:
            rows.append(_transfer(what, collective, group, ranks, elements, dtype))

    if scheme == "paper":
        everything = convs + dense
        for i, layer in enumerate(everything):
            add(f"{layer.name} outputs", "all-gather", "model", layer.activations(per_group))
            if i:
                add(f"{layer.name} input errors", adjoint, "model", everything[i - 1].activations(per_group))
        for layer in everything:
            add(f"{layer.name} gradients", "all-reduce", "data", layer.weights // grid.model)
        return rows

    add("conv gradients", "all-reduce", "all", sum(layer.weights for layer in convs))
    add("hand-over: gather images", "all-gather", "model", per_group * dense[0].inputs)
    add("hand-over: sum their errors", adjoint, "model", per_group * dense[0].inputs)
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
         scheme: str = "lab", dtype: str = "float32", backend: str = "nccl") -> dict:
    """One training step on one rank: compute, communication and their sum in seconds,
    and the bytes it sends."""
    convs, dense = _split(layers)
    rows = transfers(layers, grid, batch, scheme, dtype, backend)
    per_group = batch // grid.data
    if scheme == "paper":
        flop = sum(layer.training_flop(1) for layer in convs + dense) / grid.model
        compute = processor.pass_seconds(flop, per_group)
    else:
        compute = (processor.pass_seconds(sum(layer.training_flop(1) for layer in convs), batch // grid.ranks)
                   + processor.pass_seconds(sum(layer.training_flop(1) for layer in dense) / grid.model, per_group))
    communication = sum(SECONDS[row["collective"]](row["bytes"], row["ranks"], link) for row in rows)
    return {"compute": compute, "communication": communication, "step": compute + communication,
            "sent": sum(row["sent"] for row in rows)}


def table_1(layers=KRIZHEVSKY, batch: int = PAPER_BATCH, processor: timemodel.Processor = timemodel.TITAN,
            link: timemodel.Link = timemodel.PCIE3_X16, scheme: str = "paper", backend: str = "nccl") -> list[dict]:
    """Table 1's five configurations: the paper's days and speed-up beside this model's step
    time, bytes sent per rank and speed-up over one GPU.

    What is predicted and what is assumed: the TITAN preset's `full_batch` of 128 (a pass over
    fewer images costs as much) is an assumption, chosen after the paper's remark that 64
    images per GPU under-use it. Of the paper's split it touches only the 4 data-parallel GPUs
    (64 images each); the other rows follow from the flop and byte counts alone. Pass
    `TITAN_NO_FULL_BATCH` for the prediction without it."""
    one = step(layers, Grid(1, 1), batch, processor, link, scheme, backend=backend)["step"]
    rows = []
    for row in TABLE_1:
        predicted = step(layers, row.grid, batch, processor, link, scheme, backend=backend)
        rows.append({"configuration": row.configuration, "grid": row.grid, "paper days": row.days,
                     "paper speed-up": row.speedup, "predicted step (s)": predicted["step"],
                     "predicted compute (s)": predicted["compute"], "predicted sent (bytes)": predicted["sent"],
                     "predicted speed-up": one / predicted["step"]})
    return rows


def full_batch_bound(grid: Grid, processor: timemodel.Processor, batch: int = PAPER_BATCH,
                     scheme: str = "paper") -> bool:
    """Whether `processor.full_batch` sets a pass's cost on `grid`: some pass of the step runs
    on fewer images than the full batch (the convolutions' share under the lab's split)."""
    smallest = batch // grid.ranks if scheme == "lab" else batch // grid.data
    return smallest < processor.full_batch


def columns_sent(grid: Grid, batch: int = PAPER_BATCH, layers=KRIZHEVSKY, crossing=KRIZHEVSKY_CROSS_GPU,
                 dtype: str = "float32", backend: str = "nccl") -> dict:
    """Bytes one rank sends per step in the paper's split's activation exchanges: at every layer,
    and only into the `crossing` layers (their input gathered forward, its error summed
    backward) and out of the last one (the softmax needs every output), the exchanges
    Krizhevsky's two columns made. Gradients are left out (the same in both)."""
    rows = [row for row in transfers(layers, grid, batch, "paper", dtype, backend)
            if not row["what"].endswith("gradients")]
    names = [layer.name for layer in layers]
    unknown = sorted(set(crossing) - set(names))
    if unknown:
        raise ValueError(f"no layer named {', '.join(unknown)} in this network; its layers: {', '.join(names)}")
    feeding = {names[names.index(name) - 1] for name in crossing if names.index(name)} | {names[-1]}
    kept = [row for row in rows
            if (row["what"].endswith(" outputs") and row["what"].removesuffix(" outputs") in feeding)
            or (row["what"].endswith(" input errors") and row["what"].removesuffix(" input errors") in crossing)]
    return {"every layer": sum(row["sent"] for row in rows), "crossing layers": sum(row["sent"] for row in kept)}
