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

Bandwidths are each link's nominal rate per direction; real transfers get
less (protocol overhead, PCIe switches). `LOCAL_GLOO` was measured here.

Compute time is flop / (peak x efficiency), with an efficiency assumed per
processor (`Processor`): enough to compare with communication, not a benchmark.
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
NVLINK4 = Link("NVLink 4 (H100)", 450e9, 2e-6, "18 links x 25 GB/s per direction per GPU; latency assumed 2 us")
LOCAL_GLOO = Link("local gloo (2-core CPU, measured)", 1.38e9, 0.24e-3,
                  "bench/gloo_link.py, 5 runs with 2 ranks on the course's 2-core CPU machine (torch 2.13): "
                  "median alpha 0.24 ms (0.22-0.26), beta 1.38 GB/s (1.23-1.53)")

PRESETS = {link.name: link for link in (PCIE3_X16, NETWORK_40G, NVLINK1, NVLINK2, NVLINK3, NVLINK4, LOCAL_GLOO)}


def ring_all_reduce_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-reduce over `ranks` ranks: 2(N-1) steps (N the number of ranks),
    each one chunk of nbytes/N over every link at once."""
    transfer.check_transfer(nbytes, ranks)
    if ranks == 1:
        return 0.0
    return 2 * (ranks - 1) * link.seconds(nbytes / ranks)


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


def hierarchical_ring_all_reduce_seconds(nbytes: float, nodes: int, ranks_per_node: int,
                                         inside: Link, between: Link) -> float:
    """One ring through all `nodes` x `ranks_per_node` ranks (a GPU each): each
    step lasts as long as its slowest link, which is the network as soon as
    there are two nodes."""
    transfer.check_ranks(nodes, "nodes", counting="nodes")
    transfer.check_ranks(ranks_per_node, "ranks_per_node")
    slowest = between if nodes > 1 else inside
    return ring_all_reduce_seconds(nbytes, nodes * ranks_per_node, slowest)


# --- Dettmers, part 1: the blog's estimates, and this model's ------------------

#: Dettmers' example: the 1000 x 1000 float32 gradient of one layer.
DETTMERS_GRADIENT_BYTES = 1000 * 1000 * 4
#: the blog's own figures, in seconds
DETTMERS_BLOG = {"one transfer, 40 Gbit/s": 0.75e-3, "one transfer, PCIe 3.0": 0.25e-3,
                 "six GPUs, two nodes": 7.75e-3, "four nodes": 20.25e-3}


def dettmers_serial_network_seconds(nodes: int, ranks_per_node: int = 3,
                                    nbytes: float = DETTMERS_GRADIENT_BYTES,
                                    network: Link = NETWORK_40G) -> float:
    """The blog's scheme as we read it: every GPU receives every other GPU's whole
    gradient, and a node's one network card carries its GPUs' remote gradients
    one at a time: ranks_per_node x (ranks on other nodes) transfers in a row,
    one rank per GPU.

    Two nodes of 3: 9 x 0.805 ms = 7.2 ms (the blog, with 0.75 ms each: 6.75 ms,
    plus 4 PCIe transfers of 0.25 ms = 7.75 ms). Four nodes: 27 transfers,
    21.7 ms (the blog: 27 x 0.75 = 20.25 ms, no PCIe term).
    """
    transfer.check_ranks(nodes, "nodes", counting="nodes")
    transfer.check_ranks(ranks_per_node, "ranks_per_node")
    remote = ranks_per_node * (nodes - 1)
    return ranks_per_node * remote * network.seconds(nbytes)


# --- compute ----------------------------------------------------------------------

@dataclass(frozen=True)
class Processor:
    name: str
    flops: float       # peak float32 multiply-adds x 2 per second
    efficiency: float  # the fraction of the peak a training step gets (assumed)
    source: str
    full_batch: int = 1  # a pass over fewer images takes as long as one over this many

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
A100 = Processor("NVIDIA A100", 19.5e12, 0.5, "19.5 TFLOPS float32 without tensor cores; half assumed reached")
H100 = Processor("NVIDIA H100 SXM", 67e12, 0.5, "67 TFLOPS float32 without tensor cores; half assumed reached")
PROCESSORS = {p.name: p for p in (TITAN, A100, H100)}


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
