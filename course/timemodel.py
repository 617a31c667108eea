"""How long a transfer takes: the alpha-beta model, with named interconnects.

Pure functions, no torch. A message of `b` bytes over a link takes

    t = alpha + b / beta

alpha: the fixed cost of one message (latency, software overhead), in seconds;
beta: the bandwidth the message gets, in bytes per second, one direction.

Assumptions, stated once for every function here:
- links are full duplex: a rank can send and receive at full rate at once;
- a step of a ring moves one chunk over every link at the same time, and
  lasts as long as its slowest link;
- messages that share a link (one network card for several GPUs) go one
  after the other;
- computing the sums costs nothing (on GPUs it is much faster than the link).

Bandwidths are each link's nominal rate per direction, from the vendor's or the
standard's figures (each preset's `source`); real transfers get less (protocol
overhead, PCIe switches). Latencies are assumed. `LOCAL_GLOO` is one
measurement of local gloo, kept as a record and a fallback: lab 2 measures the
link it runs on (`course.link_probe`), since a constant disagrees with the next
bench on another machine or another day.

A ring all-reduce's time has two terms (`ring_all_reduce_terms`): the bandwidth
term 2(N-1)/N x b/beta, nearly flat in N, and the latency term 2(N-1) alpha,
growing with N.

Compute time is flop / (peak x efficiency), with an efficiency assumed per
processor (`Processor`): enough to compare with communication, not a benchmark.
Peaks are the vendors' dense figures (no structured sparsity): float32 on CUDA
cores for the processors named as before, BF16 on tensor cores for the `_BF16`
presets.

Used in: lab 2 (02_data_parallel), lab 4 (04_hybrid), lab 7 (07_long_sequences), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

from dataclasses import dataclass

from course import transfer


@dataclass(frozen=True)
class Link:
    name: str
    beta: float   # bytes per second, one direction
    alpha: float  # seconds per message
    source: str   # where the numbers come from

    def seconds(self, nbytes: float) -> float:
        """One message of `nbytes` over this link."""
        transfer.check_nbytes(nbytes)
        return self.alpha + nbytes / self.beta


PCIE3_X16 = Link("PCIe 3.0 x16", 15.75e9, 10e-6,
                 "8 GT/s x 16 lanes with 128b/130b coding = 15.75 GB/s per direction; latency assumed 10 us")
NETWORK_40G = Link("40 Gbit/s network", 5e9, 5e-6,
                   "40 Gbit/s = 5 GB/s per direction; latency assumed 5 us")
NVLINK1 = Link("NVLink 1 (P100)", 80e9, 2e-6, "4 links x 20 GB/s per direction per GPU; latency assumed 2 us")
NVLINK2 = Link("NVLink 2 (V100)", 150e9, 2e-6, "6 links x 25 GB/s per direction per GPU; latency assumed 2 us")
NVLINK3 = Link("NVLink 3 (A100)", 300e9, 2e-6, "12 links x 25 GB/s per direction per GPU; latency assumed 2 us")
NVLINK4 = Link("NVLink 4 (H100)", 450e9, 2e-6, "18 links x 25 GB/s per direction per GPU (H100 SXM datasheet: "
                "900 GB/s both directions together); latency assumed 2 us")
NVLINK5 = Link("NVLink 5 (B200)", 900e9, 2e-6, "18 links x 50 GB/s per direction per GPU (B200 / HGX B200 "
                "datasheet: 1.8 TB/s both directions together); latency assumed 2 us")
INFINIBAND_NDR = Link("InfiniBand NDR (400 Gbit/s per GPU)", 50e9, 5e-6,
                      "400 Gbit/s = 50 GB/s per direction, one ConnectX-7 NIC per GPU (DGX H100 datasheet: "
                      "8 GPUs, 8 single-port 400 Gbit/s NDR cards for the compute network); latency assumed 5 us")
#: A record, and the fallback when lab 2 cannot measure: lab 2 measures its own (course.link_probe).
LOCAL_GLOO = Link("local gloo (2-core CPU, measured)", 2.76e9, 0.066e-3,
                  "bench/gloo_link.py, a ping-pong between 2 ranks (course.link_probe), 5 runs on the course's "
                  "2-core CPU machine (torch 2.13): median alpha 0.066 ms (0.057-0.072), "
                  "beta 2.76 GB/s (2.21-3.16)")

PRESETS = {link.name: link for link in (PCIE3_X16, NETWORK_40G, NVLINK1, NVLINK2, NVLINK3, NVLINK4, NVLINK5,
                                        INFINIBAND_NDR, LOCAL_GLOO)}


def ring_all_reduce_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-reduce over `ranks` ranks: 2(N-1) steps (N the number of ranks),
    each one chunk of nbytes/N over every link at once."""
    transfer.check_transfer(nbytes, ranks)
    if ranks == 1:
        return 0.0
    return 2 * (ranks - 1) * link.seconds(nbytes / ranks)


def ring_all_reduce_terms(nbytes: float, ranks: int, link: Link) -> dict[str, float]:
    """The two terms of ring_all_reduce_seconds, in seconds: "latency", 2(N-1) alpha,
    which grows with N, and "bandwidth", 2(N-1)/N x nbytes/beta, which tends to
    2 nbytes/beta: nearly flat in N."""
    transfer.check_transfer(nbytes, ranks)
    steps = 2 * (ranks - 1)
    return {"latency": steps * link.alpha, "bandwidth": steps * nbytes / ranks / link.beta}


def ring_all_gather_seconds(nbytes_out: float, ranks: int, link: Link) -> float:
    """Ring all-gather of an `nbytes_out` result over `ranks` ranks: N-1 steps of
    one chunk (nbytes_out/N), N the number of ranks."""
    transfer.check_transfer(nbytes_out, ranks, "nbytes_out")
    if ranks == 1:
        return 0.0
    return (ranks - 1) * link.seconds(nbytes_out / ranks)


def naive_all_reduce_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """Everything to rank 0, then rank 0 to everyone: rank 0's link carries
    N-1 whole tensors in and, after them, N-1 out, one at a time (N the
    number of ranks)."""
    transfer.check_transfer(nbytes, ranks)
    if ranks == 1:
        return 0.0
    return 2 * (ranks - 1) * link.seconds(nbytes)


def flat_ring_all_reduce_seconds(nbytes: float, nodes: int, ranks_per_node: int,
                                 inside: Link, between: Link) -> float:
    """One ring through all `nodes` x `ranks_per_node` ranks (a GPU each): each
    step lasts as long as its slowest link, which is the network as soon as
    there are two nodes."""
    transfer.check_ranks(nodes, "nodes", counting="nodes")
    transfer.check_ranks(ranks_per_node, "ranks_per_node")
    slowest = between if nodes > 1 else inside
    return ring_all_reduce_seconds(nbytes, nodes * ranks_per_node, slowest)


def hierarchical_ring_all_reduce_seconds(nbytes: float, nodes: int, ranks_per_node: int,
                                         inside: Link, between: Link, nics_per_node: int | None = None) -> float:
    """A two-level all-reduce over `nodes` nodes of `ranks_per_node` (G) GPUs each:

    1. reduce-scatter inside each node, a ring over `inside`: G-1 steps of nbytes/G;
       local rank g then holds shard g of its node's sum;
    2. all-reduce of each shard between the nodes, a ring of the `nodes` ranks of
       the same local rank over `between`: G such rings, one per local rank;
    3. all-gather inside each node over `inside`: G-1 steps of nbytes/G.

    The G rings of step 2 run at once, each through a network card of its own
    when there are `nics_per_node` >= G (the default: one NIC per GPU, as in a DGX).
    With fewer cards, messages that share a card go one after the other: each
    step of the rings takes ceil(G / nics_per_node) messages' time.
    """
    transfer.check_ranks(nodes, "nodes", counting="nodes")
    transfer.check_transfer(nbytes, ranks_per_node, ranks_name="ranks_per_node")
    nics = ranks_per_node if nics_per_node is None else nics_per_node
    transfer.check_ranks(nics, "nics_per_node", counting="network cards")
    shard = nbytes / ranks_per_node
    inside_node = 2 * (ranks_per_node - 1) * inside.seconds(shard) if ranks_per_node > 1 else 0.0
    sharing = -(-ranks_per_node // nics)   # rings per card
    between_nodes = 2 * (nodes - 1) * sharing * between.seconds(shard / nodes) if nodes > 1 else 0.0
    return inside_node + between_nodes


# --- Dettmers, part 1: the blog's figures, its own rule, and this model's ------

#: Dettmers' example: the 1000 x 1000 float32 gradient of one layer.
DETTMERS_GRADIENT_BYTES = 1000 * 1000 * 4
#: the blog's own figures, in seconds
DETTMERS_BLOG = {"one transfer, 40 Gbit/s": 0.75e-3, "one transfer, PCIe 3.0": 0.25e-3,
                 "six GPUs, two nodes": 7.75e-3, "four nodes": 20.25e-3}
#: The matrix product the blog times at about 0.2 ms (twice that backward): the layer's forward
#: pass on a batch of 100, 100x1000 . 1000x1000.
DETTMERS_MATMUL_BATCH, DETTMERS_BLOG_MATMUL_SECONDS = 100, 0.2e-3
#: Speed-ups the blog quotes from Krizhevsky (2014), measured on GPUs; by number of GPUs.
#: Data parallel in the convolutional layers (and model parallel in the fully connected ones).
KRIZHEVSKY_SPEEDUPS = {4: 3.74, 8: 6.25}


def dettmers_transfers_in_a_row(nodes: int, ranks_per_node: int = 3) -> int:
    """The blog's rule, counted: every GPU receives every other GPU's whole gradient;
    transfers inside a node go over PCIe in parallel with the network and add no
    time; a node's one network card carries its GPUs' remote gradients one GPU at
    a time. So G x G(M-1) network transfers in a row (M nodes of G GPUs)."""
    transfer.check_ranks(nodes, "nodes", counting="nodes")
    transfer.check_ranks(ranks_per_node, "ranks_per_node")
    return ranks_per_node * ranks_per_node * (nodes - 1)


def dettmers_rule_seconds(nodes: int, ranks_per_node: int = 3,
                          per_transfer: float = DETTMERS_BLOG["one transfer, 40 Gbit/s"]) -> float:
    """The blog's rule with its own 0.75 ms per transfer: two nodes of 3 GPUs,
    3 x 3 x 0.75 = 6.75 ms; four nodes, 9 x 3 x 0.75 = 20.25 ms, the blog's figure.

    For two nodes the blog says 7.75 ms: 1 ms more than its own rule gives. (Four
    PCIe transfers of 0.25 ms would make up the difference, but the rule runs PCIe in
    parallel, and the four-node figure adds no PCIe time.)
    """
    return dettmers_transfers_in_a_row(nodes, ranks_per_node) * per_transfer


def dettmers_serial_network_seconds(nodes: int, ranks_per_node: int = 3,
                                    nbytes: float = DETTMERS_GRADIENT_BYTES,
                                    network: Link = NETWORK_40G) -> float:
    """The blog's rule with this model's transfer time (alpha + nbytes/beta): with
    NETWORK_40G, 0.805 ms a transfer, 9 x 0.805 = 7.2 ms for two nodes of 3 GPUs
    and 27 x 0.805 = 21.7 ms for four."""
    count = dettmers_transfers_in_a_row(nodes, ranks_per_node)
    return count * network.seconds(nbytes)


# --- compute ----------------------------------------------------------------------

@dataclass(frozen=True)
class Processor:
    name: str
    flops: float       # peak multiply-adds x 2 per second, dense, in `precision`
    efficiency: float  # the fraction of the peak a training step gets (assumed)
    source: str
    full_batch: int = 1  # a pass over fewer images takes as long as one over this many
    precision: str = "float32"  # the number format of the peak ("float32" on CUDA cores, "bfloat16" tensor cores)

    def seconds(self, flop: float) -> float:
        return flop / (self.flops * self.efficiency)

    def pass_seconds(self, flop_per_image: float, images: float) -> float:
        """A pass over `images` images: as long as over `full_batch` when there are fewer."""
        return self.seconds(flop_per_image * max(images, self.full_batch))


TITAN = Processor("NVIDIA GTX TITAN (2013)", 4.5e12, 0.5,
                  "Kepler GK110, 2688 cores x 837 MHz x 2 = 4.5 TFLOPS float32; half of it assumed reached. "
                  "Under 128 images a pass is no faster than with 128: Yadan et al. find per-GPU batches "
                  "of 64 or fewer under-use it (the convolution kernels of 2013 work on 128 images at once)",
                  full_batch=128)
A100 = Processor("NVIDIA A100", 19.5e12, 0.5,
                 "A100 datasheet: 19.5 TFLOPS float32 on CUDA cores, without tensor cores; half assumed reached")
H100 = Processor("NVIDIA H100 SXM", 67e12, 0.5,
                 "H100 SXM datasheet: 67 TFLOPS float32 on CUDA cores, without tensor cores; half assumed reached")
A100_BF16 = Processor("NVIDIA A100 (BF16 tensor cores)", 312e12, 0.5,
                      "A100 datasheet: 312 TFLOPS BF16 on tensor cores, dense (624 is with sparsity); "
                      "half assumed reached", precision="bfloat16")
H100_BF16 = Processor("NVIDIA H100 SXM (BF16 tensor cores)", 989e12, 0.5,
                      "H100 SXM datasheet: 1,979 TFLOPS BF16 with sparsity, so 989 TFLOPS dense; "
                      "half assumed reached", precision="bfloat16")
H200_BF16 = Processor("NVIDIA H200 SXM (BF16 tensor cores)", 989e12, 0.5,
                      "H200 SXM datasheet: 1,979 TFLOPS BF16 with sparsity, so 989 TFLOPS dense (the H100's "
                      "compute, with 141 GB of HBM3e at 4.8 TB/s); half assumed reached", precision="bfloat16")
B200_BF16 = Processor("NVIDIA B200 (BF16 tensor cores)", 2.25e15, 0.5,
                      "HGX B200 datasheet: 36 PFLOPS BF16 with sparsity for 8 GPUs, so 2.25 PFLOPS dense "
                      "per GPU; half assumed reached", precision="bfloat16")
PROCESSORS = {p.name: p for p in (TITAN, A100, H100, A100_BF16, H100_BF16, H200_BF16, B200_BF16)}


def dettmers_part_1(processor: Processor = TITAN, network: Link = NETWORK_40G) -> list[dict]:
    """Dettmers' part 1, figure by figure: what the blog says, what its own rule
    gives, and what this model gives on `processor` and `network` (None where
    one of them has no figure). Times in ms; Krizhevsky's speed-ups are measured
    ones the blog quotes, which this model does not predict."""
    ms = 1e3
    layer_flop = 2 * DETTMERS_MATMUL_BATCH * DETTMERS_GRADIENT_BYTES / 4
    rows = [("one transfer of 4,000,000 bytes (ms)", DETTMERS_BLOG["one transfer, 40 Gbit/s"] * ms,
             DETTMERS_BLOG["one transfer, 40 Gbit/s"] * ms, network.seconds(DETTMERS_GRADIENT_BYTES) * ms)]
    for nodes, blog in ((2, DETTMERS_BLOG["six GPUs, two nodes"]), (4, DETTMERS_BLOG["four nodes"])):
        rows.append((f"{3 * nodes} GPUs in {nodes} nodes (ms)", blog * ms, dettmers_rule_seconds(nodes) * ms,
                     dettmers_serial_network_seconds(nodes, network=network) * ms))
    rows.append((f"forward of the layer, {DETTMERS_MATMUL_BATCH}x1000 . 1000x1000 (ms)",
                 DETTMERS_BLOG_MATMUL_SECONDS * ms, None, processor.seconds(layer_flop) * ms))
    for gpus, speedup in KRIZHEVSKY_SPEEDUPS.items():
        rows.append((f"Krizhevsky, speed-up on {gpus} GPUs (measured)", speedup, None, None))
    return [{"figure": what, "the blog": blog, "the blog's rule": rule, "this model": model}
            for what, blog, rule, model in rows]


def link_named(name: str) -> Link:
    """The preset interconnect called `name` (a key of PRESETS)."""
    if name not in PRESETS:
        raise ValueError(f"link must be one of {list(PRESETS)}, got {name!r}")
    return PRESETS[name]


def processor_named(name: str) -> Processor:
    """The preset processor called `name` (a key of PROCESSORS)."""
    if name not in PROCESSORS:
        raise ValueError(f"processor must be one of {list(PROCESSORS)}, got {name!r}")
    return PROCESSORS[name]
