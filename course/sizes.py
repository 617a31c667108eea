"""How much data a parallel scheme moves: elements and bytes, by layer and by model.

Pure functions, no torch: a model is a list of layers described by their
shapes, so the same numbers serve a notebook, a widget and a test.

    layers = [Dense("fc1", 1000, 1000), Dense("fc2", 1000, 10)]
    data_parallel(layers, ranks=4, dtype="float32")      # one row per layer

Data parallelism exchanges every weight's gradient once per step, whatever
the batch size; each rank sends what its all-reduce algorithm sends
(`course.transfer`): a ring 2(N-1)/N of the gradient from every rank, N the
number of ranks; the naive scheme (all to rank 0, then rank 0 to all) N-1
whole gradients from rank 0 and one from each other rank. Every function
here calls the number of ranks `ranks`, and checks it with
`transfer.check_ranks` (a whole number of at least 1).

Split-weight model parallelism exchanges activations instead: a dense layer
split by its output features ("column") stacks its partial outputs forward
(all-gather) and adds the errors it passes down (all-reduce); split by its
input features ("row"), it adds its partial outputs (all-reduce) and stacks
the errors (all-gather). What moves grows with the batch, not the weights.

Used in: lab 3 (03_model_parallel), lab 4 (04_hybrid), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

from dataclasses import dataclass

from course import transfer

#: bytes per element of the dtypes the course uses
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
ALGORITHMS = ("ring", "naive")


@dataclass(frozen=True)
class Dense:
    """A fully connected layer: `inputs` -> `outputs` features."""
    name: str
    inputs: int
    outputs: int
    bias: bool = True

    @property
    def weights(self) -> int:
        return self.inputs * self.outputs + (self.outputs if self.bias else 0)

    def activations(self, batch: int) -> int:
        """Output elements for a batch (what the next layer receives)."""
        return batch * self.outputs

    def training_flop(self, batch: int) -> int:
        """Forward (2 per weight and sample) + backward (4: input and weight gradients)."""
        return 6 * self.inputs * self.outputs * batch


@dataclass(frozen=True)
class Conv:
    """A 2-D convolution producing `out_channels` maps of `height` × `width`, then
    max-pooled `pool` × `pool` (1: no pooling) before the next layer."""
    name: str
    in_channels: int
    out_channels: int
    kernel: int
    height: int
    width: int
    bias: bool = True
    pool: int = 1

    @property
    def weights(self) -> int:
        return (self.in_channels * self.out_channels * self.kernel ** 2
                + (self.out_channels if self.bias else 0))

    def activations(self, batch: int) -> int:
        """Output elements for a batch, after pooling (what the next layer receives)."""
        return batch * self.out_channels * (self.height // self.pool) * (self.width // self.pool)

    def training_flop(self, batch: int) -> int:
        """As for Dense, with every weight used once per output position."""
        return 6 * self.in_channels * self.out_channels * self.kernel ** 2 * self.height * self.width * batch


def nbytes(elements: int | float, dtype: str = "float32") -> int | float:
    """Bytes of `elements` values of `dtype`."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return elements * DTYPE_BYTES[dtype]


def all_reduce_sent(tensor_bytes: int, ranks: int, algorithm: str = "ring", rank: int = 0) -> int | float:
    """Bytes `rank` sends to all-reduce a tensor of `tensor_bytes` over `ranks` ranks."""
    transfer.check_transfer(tensor_bytes, ranks, "tensor_bytes")
    if algorithm == "ring":
        return transfer.ring_all_reduce(tensor_bytes, ranks)
    if algorithm == "naive":
        return transfer.naive_all_reduce_sends(tensor_bytes, ranks, rank)
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def data_parallel(layers, ranks: int, dtype: str = "float32", algorithm: str = "ring",
                  rank: int = 0) -> list[dict]:
    """One row per layer: its gradient's elements and bytes, and the bytes `rank` of
    `ranks` sends per step."""
    transfer.check_ranks(ranks)
    rows = []
    for layer in layers:
        gradient = nbytes(layer.weights, dtype)
        rows.append({"layer": layer.name, "elements": layer.weights, "bytes": gradient,
                     "sent": all_reduce_sent(gradient, ranks, algorithm, rank)})
    return rows


def data_parallel_total(layers, ranks: int, dtype: str = "float32", algorithm: str = "ring",
                        rank: int = 0) -> int | float:
    """Bytes `rank` of `ranks` sends per step to average the gradients of the whole model,
    layer by layer."""
    return sum(row["sent"] for row in data_parallel(layers, ranks, dtype, algorithm, rank))


# --- split-weight model parallelism of one dense layer -----------------------------

DIRECTIONS = ("column", "row")


def split_weight(layer: Dense, batch: int, ranks: int, direction: str) -> dict:
    """Shapes of a dense layer split over `ranks` ranks, and how partial results combine.

    column: each rank holds inputs x outputs/ranks of the weight; forward gives
        (batch, outputs/ranks) partial outputs, stacked; backward gives
        (batch, inputs) partial errors for the layer below, added.
    row: each rank holds inputs/ranks x outputs; forward gives (batch, outputs)
        partial outputs, added; backward gives (batch, inputs/ranks) errors, stacked.
    `synchronised` counts the elements of the two full matrices the ranks must
    agree on per step: the output forward and the error backward.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    transfer.check_ranks(ranks)
    split = layer.outputs if direction == "column" else layer.inputs
    if batch < 1 or split % ranks:
        raise ValueError(f"a {direction} split of {layer.name} needs its {split} "
                         f"{'output' if direction == 'column' else 'input'} features to divide "
                         f"evenly over {ranks} ranks, and a positive batch (got {batch})")
    synchronised = batch * layer.outputs + batch * layer.inputs
    if direction == "column":
        return {"weight": (layer.inputs, layer.outputs // ranks),
                "forward": (batch, layer.outputs // ranks), "forward combine": "stack",
                "backward": (batch, layer.inputs), "backward combine": "add",
                "synchronised": synchronised}
    return {"weight": (layer.inputs // ranks, layer.outputs),
            "forward": (batch, layer.outputs), "forward combine": "add",
            "backward": (batch, layer.inputs // ranks), "backward combine": "stack",
            "synchronised": synchronised}


def split_weight_transfers(layer: Dense, batch: int, ranks: int, direction: str,
                           dtype: str = "float32") -> list[tuple[str, int]]:
    """The collectives of one training step of a layer split over `ranks` ranks, as
    (collective, bytes of the full matrix): the matrix a split stacks is all-gathered,
    the one it adds all-reduced."""
    shapes = split_weight(layer, batch, ranks, direction)
    # The full matrices: the layer's output forward, the error for the layer below backward.
    full = {"forward": nbytes(batch * layer.outputs, dtype), "backward": nbytes(batch * layer.inputs, dtype)}
    return [("all-gather" if shapes[f"{phase} combine"] == "stack" else "all-reduce", size)
            for phase, size in full.items()]


def split_weight_sent(layer: Dense, batch: int, ranks: int, direction: str,
                      dtype: str = "float32") -> int | float:
    """Bytes each of `ranks` ranks sends per step with ring collectives: an all-gather
    of the stacked matrix ((N-1)/N of it, N the number of ranks) and an all-reduce of
    the added one (2(N-1)/N of it)."""
    ring = {"all-gather": transfer.ring_all_gather, "all-reduce": transfer.ring_all_reduce}
    return sum(ring[collective](size, ranks)
               for collective, size in split_weight_transfers(layer, batch, ranks, direction, dtype))


def split_weight_crossover(layer: Dense, ranks: int, direction: str) -> float:
    """The batch at which a layer split over `ranks` ranks sends as many bytes per rank
    as data parallelism of the same layer (ring collectives both): below it the split
    sends less. A split sends activations, which grow with the batch; data parallelism
    sends the gradient, which does not."""
    transfer.check_ranks(ranks)
    if ranks < 2:
        raise ValueError(f"with a single rank nothing is sent either way: the crossover needs "
                         f"at least 2 ranks, got ranks={ranks!r}")
    gradient = transfer.ring_all_reduce(nbytes(layer.weights), ranks)
    return gradient / split_weight_sent(layer, 1, ranks, direction)
