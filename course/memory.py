"""What a training step holds per rank, and sends, under data parallelism and its sharded forms.

Pure arithmetic, no torch, beside `course.sizes` (bytes of a dtype) and `course.transfer`
(ring collectives), so that a slider can ask it anything.

    per_rank(7_500_000_000, 64, "ZeRO-1")["total"] / 1e9     # 31.4 GB, the ZeRO paper's Figure 1
    sent_per_step(7_500_000_000, 64, "ZeRO-3", dtype="bfloat16")

A rank holds three kinds of state for P parameters (`state_bytes`), counted as Rajbhandari
et al. (2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models") count
them: parameters and gradients in the model's dtype, and the optimizer state, K bytes a
parameter, which in mixed precision includes the fp32 master copy of the weights. Adam in
mixed precision: 2 + 2 + K with K = 12 (master 4, momentum 4, variance 4), 16 bytes a parameter:
the paper's count, for fp16 training ("mixed"). bf16 training as practised keeps its gradients in
fp32 (they are accumulated and reduced in fp32): 2 + 4 + 12 = 18 bytes a parameter, and 6 + 12/d
with the optimizer state sharded over d data-parallel ranks (ZeRO-1 here), as Megatron-LM's table
for its distributed optimizer gives them ("bf16 with fp32 gradients").

The schemes divide some kinds by the number of ranks N (`SHARDED`): data parallelism none,
ZeRO-1 the optimizer state, ZeRO-2 also the gradients, ZeRO-3 (FSDP) everything; "split
weights" (lab 3's tensor parallelism, every layer split) everything too. A divided kind holds
ceil(P/N) parameters' worth on each rank: the flattened parameters padded to a multiple of N,
as ZeRO's partitions and FSDP's flat parameter are (FSDP2 pads each parameter: a little more).
Assumed and left out: activations (they depend on the batch: `mlp_activation_bytes`, and
`per_rank(activations=...)`), temporary buffers (ZeRO-3's gathered layer, communication
buckets), the allocator's fragmentation and the CUDA context.

Used in: lab 5 (05_sharded_data_parallel), lab 6 (06_pipeline_parallel),
the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from course import sizes, transfer

KINDS = ("parameters", "gradients", "optimizer state")
SCHEMES = ("data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3", "split weights")
#: the kinds each scheme divides over the ranks (the rest every rank holds whole)
SHARDED = {"data parallel": (), "ZeRO-1": ("optimizer state",), "ZeRO-2": ("optimizer state", "gradients"),
           "ZeRO-3": KINDS, "split weights": KINDS}
#: the fp32 values per parameter each optimizer keeps: momentum SGD (lab 1's) one buffer, Adam two moments
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2}
STATE_DTYPE = "float32"


@dataclass(frozen=True)
class Precision:
    """The dtypes of a training step: what the model computes with, and the optimizer's master copy."""
    name: str
    parameters: str        # the model's parameters (a key of sizes.DTYPE_BYTES), which all-gathers send
    gradients: str         # their gradients, which all-reduces and reduce-scatters send
    master: str | None     # the copy the optimizer updates, counted as optimizer state; None: none
    words: str = ""        # how a title says it; empty: "<name> precision"

    @property
    def label(self) -> str:
        return self.words or f"{self.name} precision"


PRECISIONS = {"fp32": Precision("fp32", "float32", "float32", None),
              # the ZeRO paper's fp16 count (2 + 2 + 12 with Adam); bf16 has fp16's 2 bytes
              "mixed": Precision("mixed", "bfloat16", "bfloat16", "float32"),
              # as practised in bf16 (Megatron-LM's table: 18 bytes with Adam, 6 + 12/d sharded)
              "bf16 with fp32 gradients": Precision("bf16 with fp32 gradients", "bfloat16", "float32", "float32",
                                                    "bf16 parameters, fp32 gradients")}
#: the stage-1 variants `sent_per_step` knows: the paper's, and DeepSpeed's first stage-1 code
ZERO1_VARIANTS = ("reduce-scatter", "all-reduce")


@dataclass(frozen=True)
class GpuMemory:
    name: str
    nbytes: int
    source: str


# A datasheet's GB is read as 1e9 bytes (the ZeRO paper's unit); what a program can allocate is
# somewhat less (the CUDA context, the allocator's reserve).
GPUS = {gpu.name: gpu for gpu in (
    GpuMemory("NVIDIA GTX TITAN (6 GiB)", 6 * 2**30, "GTX TITAN (2013) specifications: 6144 MB GDDR5; "
              "the GPU of Krizhevsky 2014 and Yadan et al. 2013"),
    GpuMemory("NVIDIA V100 (32 GB)", 32 * 10**9, "V100 SXM2 datasheet: 32 GB HBM2; the ZeRO paper's "
              "GPUs (DGX-2 nodes of V100 32 GB)"),
    GpuMemory("NVIDIA A100 (80 GB)", 80 * 10**9, "A100 80GB datasheet: 80 GB HBM2e"),
    GpuMemory("NVIDIA H100 SXM (80 GB)", 80 * 10**9, "H100 SXM datasheet: 80 GB HBM3"),
    GpuMemory("NVIDIA H200 SXM (141 GB)", 141 * 10**9, "H200 SXM datasheet: 141 GB HBM3e"),
    GpuMemory("NVIDIA B200 (192 GB)", 192 * 10**9, "B200 as announced: 192 GB HBM3e (8 stacks); the DGX B200 "
              "datasheet gives 1,440 GB for 8 GPUs, 180 GB each"),
)}

#: Rajbhandari et al. 2020, Figure 1: memory per GPU for 7.5 B parameters, Adam, mixed precision, 64 GPUs,
#: in GB (1e9 bytes) as the paper rounds them. P_os is ZeRO-1, P_os+g ZeRO-2, P_os+g+p ZeRO-3.
ZERO_FIGURE_1 = {"parameters": 7_500_000_000, "ranks": 64, "optimizer": "adam", "precision": "mixed",
                 "GB": {"data parallel": 120, "ZeRO-1": 31.4, "ZeRO-2": 16.6, "ZeRO-3": 1.9}}


def _choice(what: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def check_parameters(parameters, name: str = "parameters") -> int:
    """A count of parameters as an int: a whole number of at least 0 (7.5e9 passes, as 7,500,000,000)."""
    whole = isinstance(parameters, numbers.Real) and not isinstance(parameters, bool) and float(parameters) >= 0 \
        and float(parameters).is_integer()
    if not whole:
        raise ValueError(f"a number of parameters must be a whole number of at least 0, got {name}={parameters!r}")
    return int(parameters)


def bytes_per_parameter(*, optimizer: str, precision: str) -> dict[str, int]:
    """Bytes of each kind of state for one parameter: Adam in mixed precision 2, 2 and K = 12."""
    _choice("optimizer", optimizer, OPTIMIZER_STATES)
    _choice("precision", precision, PRECISIONS)
    dtypes = PRECISIONS[precision]
    master = sizes.DTYPE_BYTES[dtypes.master] if dtypes.master else 0
    return {"parameters": sizes.DTYPE_BYTES[dtypes.parameters], "gradients": sizes.DTYPE_BYTES[dtypes.gradients],
            "optimizer state": master + OPTIMIZER_STATES[optimizer] * sizes.DTYPE_BYTES[STATE_DTYPE]}


def state_bytes(parameters: int, *, optimizer: str, precision: str) -> dict[str, int]:
    """Bytes of the whole model's parameters, gradients and optimizer state (the master copy included)."""
    count = check_parameters(parameters)
    return {kind: count * b for kind, b in bytes_per_parameter(optimizer=optimizer, precision=precision).items()}


def shard(parameters: int, ranks: int) -> int:
    """Parameters in one rank's shard: ceil(P/N), the flat parameters padded to a multiple of N."""
    transfer.check_ranks(ranks)
    return -(-check_parameters(parameters) // ranks)


def per_rank(parameters: int, ranks: int, scheme: str, *, optimizer: str = "adam", precision: str = "mixed",
             activations: int | float | None = None) -> dict[str, int | float]:
    """Bytes one of `ranks` ranks holds under `scheme`, by kind, and their "total".

    `activations`: the bytes of activations one rank keeps for backward (for its own share of
    the batch; see `mlp_activation_bytes`), added as they are under every scheme, with a key
    "activations"; left out (and no key) when None.
    """
    count = check_parameters(parameters)
    transfer.check_ranks(ranks)
    _choice("scheme", scheme, SCHEMES)
    each = bytes_per_parameter(optimizer=optimizer, precision=precision)
    held = {kind: b * (shard(count, ranks) if kind in SHARDED[scheme] else count) for kind, b in each.items()}
    if activations is not None:
        transfer.check_nbytes(activations, "activations")
        held["activations"] = activations
    return {**held, "total": sum(held.values())}


def largest_model(memory_bytes: int | float, ranks: int, scheme: str, *, optimizer: str = "adam",
                  precision: str = "mixed") -> int:
    """The most parameters whose parameters, gradients and optimizer state fit in `memory_bytes`
    per rank under `scheme`. Activations are excluded: a real run needs room for them too."""
    transfer.check_nbytes(memory_bytes, "memory_bytes")
    transfer.check_ranks(ranks)
    _choice("scheme", scheme, SCHEMES)
    each = bytes_per_parameter(optimizer=optimizer, precision=precision)
    whole = sum(b for kind, b in each.items() if kind not in SHARDED[scheme])
    divided = sum(b for kind, b in each.items() if kind in SHARDED[scheme])
    memory = int(memory_bytes)

    def fits(count: int) -> bool:
        return whole * count + divided * -(-count // ranks) <= memory

    # ceil(P/N) >= P/N, so no P above memory / (whole + divided/N) fits; search below it
    low, high = 0, memory * ranks // (whole * ranks + divided)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def _split_weights_sent(parameters: int, ranks: int, layers, batch, dtype: str) -> int | float:
    """Lab 3's pairing over a whole model of dense layers: column, row, column, ... Between a column
    layer and the row layer after it nothing moves (the row layer takes the column's own outputs,
    and its input errors are the column layer's own columns). So: each row layer all-reduces its
    output forward; each column layer but the first all-reduces the error for the layer below
    backward (the first's input is the data, which needs no gradient; lab 3's block counts that
    all-reduce, its input needing a gradient inside a deeper network); a last column layer
    all-gathers its output forward. No gradients move: each rank updates its own part."""
    if layers is None or batch is None:
        raise ValueError("what 'split weights' sends depends on the layers' activations, not on the parameters "
                         "alone: pass layers= (a list of sizes.Dense) and batch= (the samples per step)")
    layers = list(layers)
    if not layers or not all(isinstance(layer, sizes.Dense) for layer in layers):
        raise ValueError(f"layers must be a non-empty list of sizes.Dense, got {layers!r}")
    held = sum(layer.weights for layer in layers)
    if held != parameters:
        raise ValueError(f"the layers hold {held:,} parameters, not parameters={parameters:,}: "
                         f"pass parameters={held}")
    ring = {"all-gather": transfer.ring_all_gather, "all-reduce": transfer.ring_all_reduce}
    total = 0
    for i, layer in enumerate(layers):
        direction = sizes.DIRECTIONS[i % 2]
        (forward, out_bytes), (backward, error_bytes) = sizes.split_weight_transfers(layer, batch, ranks, direction,
                                                                                     dtype)
        if direction == "row" or i == len(layers) - 1:
            total += ring[forward](out_bytes, ranks)
        if direction == "column" and i > 0:
            total += ring[backward](error_bytes, ranks)
    return total


def sent_per_step(parameters: int, ranks: int, scheme: str, *, dtype: str, layers=None,
                  batch: int | None = None, gather_dtype: str | None = None, micro_batches: int = 1,
                  zero1: str = "reduce-scatter") -> int | float:
    """Bytes each of `ranks` ranks sends per training step under `scheme`, with ring collectives
    (`course.transfer`), the gradients being `dtype` and the parameters `gather_dtype` (default:
    `dtype`; bf16 with fp32 gradients reduces 4 bytes a parameter and gathers 2). N the ranks:

    - data parallel: an all-reduce of the gradients, 2(N-1)/N of them;
    - ZeRO-1 and ZeRO-2: a reduce-scatter of the gradients, (N-1)/N, and an all-gather of the
      updated parameters, (N-1)/N: what data parallelism sends, as the paper says of P_os and
      P_os+g. `zero1="all-reduce"`: DeepSpeed's first stage-1 code, which all-reduced the whole
      gradients and then all-gathered the parameters, 3(N-1)/N, 1.5 times data parallelism;
    - ZeRO-3: an all-gather of the parameters before forward, another before backward, and a
      reduce-scatter of the gradients: 3(N-1)/N, 1.5 times data parallelism;
    - split weights: activations, not parameters: needs `layers` (a list of `sizes.Dense` holding
      the `parameters`) and `batch`, and counts lab 3's column-then-row pairing.

    `micro_batches` k: the step accumulates the gradients of k micro-batches. Data parallelism
    reduces once (DDP's `no_sync` skips the others), and so does ZeRO-1 (whole gradients, summed
    locally); ZeRO-2 and -3 keep only their chunk of a gradient, so they reduce-scatter after each
    micro-batch, and ZeRO-3 gathers each layer twice a micro-batch. Split weights' activations do
    not depend on k (the same samples, in k pieces; each piece's messages are k times smaller).

    The sharded schemes move the padded N·ceil(P/N) parameters (`shard`)."""
    count = check_parameters(parameters)
    transfer.check_ranks(ranks)
    _choice("scheme", scheme, SCHEMES)
    _choice("zero1", zero1, ZERO1_VARIANTS)
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, numbers.Integral) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a whole number of at least 1, got micro_batches={micro_batches!r}")
    gather_dtype = dtype if gather_dtype is None else gather_dtype
    sizes.nbytes(0, dtype)                       # an unknown dtype: ValueError naming the known ones
    sizes.nbytes(0, gather_dtype)
    if scheme == "split weights":
        return _split_weights_sent(count, ranks, layers, batch, dtype)
    if scheme == "data parallel":
        return transfer.ring_all_reduce(sizes.nbytes(count, dtype), ranks)
    padded = ranks * shard(count, ranks)
    gather = transfer.ring_all_gather(sizes.nbytes(padded, gather_dtype), ranks)
    reduce = transfer.ring_reduce_scatter(sizes.nbytes(padded, dtype), ranks)
    if scheme == "ZeRO-1":
        whole = transfer.ring_all_reduce(sizes.nbytes(count, dtype), ranks)
        return gather + (reduce if zero1 == "reduce-scatter" else whole)
    if scheme == "ZeRO-2":
        return gather + micro_batches * reduce
    return micro_batches * (2 * gather + reduce)


def mlp_activation_bytes(widths, batch: int, *, dtype: str) -> int:
    """Bytes autograd keeps for backward in one forward pass of the labs' MLP (`course.models.mlp`):
    widths = (inputs, *hidden, classes), a Linear then a ReLU for each hidden width, then a last Linear.

    Each Linear keeps its input (for its weight's gradient); each ReLU keeps its output (its
    gradient is 0 where the output is 0). A ReLU's output is the next Linear's input: one tensor,
    kept once. The Linears' outputs are not kept (the ReLU after each needs only its own output).
    So: the input batch × widths[0], and batch × each hidden width. Not counted: the weights the
    Linears keep (they are the parameters), the logits and what the loss keeps, and the
    gradients backward makes as it goes."""
    widths = list(widths)
    if len(widths) < 2 or not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= 1
                                  for w in widths):
        raise ValueError(f"widths must be at least two positive whole numbers (inputs, *hidden, classes), "
                         f"got {widths!r}")
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
        raise ValueError(f"batch must be a whole number of at least 1, got batch={batch!r}")
    return sizes.nbytes(batch * sum(widths[:-1]), dtype)
