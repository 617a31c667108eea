"""How much data a parallel scheme moves: elements and bytes, by layer and by model.

Pure functions, no torch: a model is a list of layers described by their
shapes, so the same numbers serve a notebook, a widget and a test.

    layers = [Dense("fc1", 1000, 1000), Dense("fc2", 1000, 10)]
    data_parallel(layers, gpus=4, dtype="float32")       # one row per layer

Data parallelism exchanges every weight's gradient once per step, whatever
the batch size; each rank sends what its all-reduce algorithm sends
(`course.transfer`): a ring 2(n-1)/n of the gradient from every rank; the
naive scheme (all to rank 0, then rank 0 to all) n-1 whole gradients from
rank 0 and one from each other rank.
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
    """A 2-D convolution producing `out_channels` maps of `height` × `width`."""
    name: str
    in_channels: int
    out_channels: int
    kernel: int
    height: int
    width: int
    bias: bool = True

    @property
    def weights(self) -> int:
        return (self.in_channels * self.out_channels * self.kernel ** 2
                + (self.out_channels if self.bias else 0))

    def activations(self, batch: int) -> int:
        return batch * self.out_channels * self.height * self.width

    def training_flop(self, batch: int) -> int:
        """As for Dense, with every weight used once per output position."""
        return 6 * self.in_channels * self.out_channels * self.kernel ** 2 * self.height * self.width * batch


def nbytes(elements: int | float, dtype: str = "float32") -> int | float:
    """Bytes of `elements` values of `dtype`."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    return elements * DTYPE_BYTES[dtype]


def all_reduce_sent(tensor_bytes: int, gpus: int, algorithm: str = "ring", rank: int = 0) -> int | float:
    """Bytes `rank` sends to all-reduce a tensor of `tensor_bytes` over `gpus` ranks."""
    if algorithm == "ring":
        return transfer.ring_all_reduce(tensor_bytes, gpus)
    if algorithm == "naive":
        return transfer.naive_all_reduce_sends(tensor_bytes, gpus, rank)
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def data_parallel(layers, gpus: int, dtype: str = "float32", algorithm: str = "ring",
                  rank: int = 0) -> list[dict]:
    """One row per layer: its gradient's elements and bytes, and the bytes `rank` sends per step."""
    rows = []
    for layer in layers:
        gradient = nbytes(layer.weights, dtype)
        rows.append({"layer": layer.name, "elements": layer.weights, "bytes": gradient,
                     "sent": all_reduce_sent(gradient, gpus, algorithm, rank)})
    return rows


def data_parallel_total(layers, gpus: int, dtype: str = "float32", algorithm: str = "ring",
                        rank: int = 0) -> int | float:
    """Bytes `rank` sends per step to average the gradients of the whole model, layer by layer."""
    return sum(row["sent"] for row in data_parallel(layers, gpus, dtype, algorithm, rank))
