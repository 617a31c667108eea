"""The models and clusters the chooser (course.choosing) compares, each with its source.

    MODELS["GPT-3 6.7B"]          # parameters, layers, width, heads, sequence, the source's batch
    MODELS["LLaMA-2 70B"].kv_width   # K's and V's width a token: 8 KV heads of 128 (grouped-query attention)
    CLUSTERS[H100_CLUSTER]        # GPUs a node, fp32 and bf16 peaks, memory, the links inside and between

Models: GPT-3 (Brown et al. 2020, Table 2.1), LLaMA 2 (Touvron et al. 2023), Mixtral 8x7B (Jiang et al.
2024, a mixture of experts: course.experts), and the labs' MLP.
Clusters: DGX H100 and DGX A100 nodes, the 2013 setting of lab 4's sources, and this machine, whose
processor and memory were measured (`make bench` of 2026-11-24). Links and processors come from
course.timemodel, GPU memories from course.memory, where their sources are given.

Read by course.choosing and course.layout_cost.

Used in: lab 7 (07_long_sequences).
"""
from __future__ import annotations

from dataclasses import dataclass

from course import experts, memory, sizes, timemodel
from course.memory import GpuMemory
from course.timemodel import Link, Processor


@dataclass(frozen=True)
class Model:
    name: str
    parameters: int
    layers: int
    hidden: int        # d_model; the MLP: its hidden width
    heads: int         # attention heads (0: the MLP)
    sequence: int      # tokens per sample (the MLP: 1)
    batch: int         # the source's global batch, in samples
    source: str
    widths: tuple[int, ...] = ()   # the MLP only: (inputs, *hidden, classes)
    experts: int = 0               # a mixture of experts: the experts of each layer (0: dense)
    top_k: int = 0                 # ... the experts each token goes to
    expert_parameters: int = 0     # ... the parameters in all layers' experts (part of `parameters`)
    kv_heads: int = 0              # heads of K and V (grouped-query attention); 0: one a head (multi-head)
    dropout: bool = True           # trained with dropout (its masks kept for backward, course.activations)

    def __post_init__(self):
        if self.kv_heads and (self.kv_heads > self.heads or self.heads % self.kv_heads):
            raise ValueError(f"{self.name}: {self.kv_heads} key/value heads must divide its {self.heads} heads "
                             "(each K/V head serves heads/kv_heads query heads)")
        if self.experts:
            experts.active_parameters(self.parameters, self.expert_parameters, experts=self.experts,
                                      top_k=self.top_k)   # checks them

    @property
    def is_mlp(self) -> bool:
        return bool(self.widths)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def key_value_heads(self) -> int:
        """The heads of K and V: `kv_heads` under grouped-query attention, else every head's own."""
        return self.kv_heads or self.heads

    @property
    def kv_width(self) -> int:
        """The width of K and of V a token: key_value_heads × head size (h/a); h under multi-head attention."""
        return self.hidden // self.heads * self.key_value_heads if self.heads else self.hidden

    @property
    def active_parameters(self) -> float:
        """The parameters one token runs through (all of them, but for a mixture of experts)."""
        if not self.is_moe:
            return self.parameters
        return experts.active_parameters(self.parameters, self.expert_parameters, experts=self.experts,
                                         top_k=self.top_k)


# GPT-3: Brown et al. 2020, Table 2.1 (n_params, n_layers, d_model, n_heads; context 2048; batch in tokens / 2048);
# multi-head attention; dropout as Korthikanti et al. 2022 count it (GPT-2's, which the paper does not change).
# LLaMA 2: Touvron et al. 2023, Table 1 and section 2.2 (context 4096, 4M tokens a batch; grouped-query attention
# for 34B and 70B: 70B's released configuration has 8 KV heads of 64, 7B multi-head); no dropout anywhere in
# the architecture (its configuration's attention_dropout is 0.0).
LAB_MLP = "the labs' MLP (64, 7 × 64, 10)"
MIXTRAL = "Mixtral 8x7B (8 experts, top 2)"
_WIDTHS = (64, *(64,) * 7, 10)       # lab 6's course.models.mlp(64, (64,) * 7, 10)
MODELS = {m.name: m for m in (
    Model("GPT-3 1.3B", 1_300_000_000, 24, 2048, 16, 2048, 512, "GPT-3 paper, Table 2.1: 1M tokens a batch"),
    Model("GPT-3 6.7B", 6_700_000_000, 32, 4096, 32, 2048, 1024, "GPT-3 paper, Table 2.1: 2M tokens a batch"),
    Model("GPT-3 175B", 175_000_000_000, 96, 12288, 96, 2048, 1536, "GPT-3 paper, Table 2.1: 3.2M tokens"),
    Model("LLaMA-2 7B", 7_000_000_000, 32, 4096, 32, 4096, 1024, "LLaMA 2 paper: 4M tokens a batch",
          dropout=False),
    Model("LLaMA-2 70B", 70_000_000_000, 80, 8192, 64, 4096, 1024,
          "LLaMA 2 paper: 4M tokens a batch; 8 KV heads (grouped-query attention)", kv_heads=8, dropout=False),
    # Mixtral 8x7B (Jiang et al. 2024; its released configuration): 32 layers, d 4096, 32 heads (8 for K and
    # V), 8 experts a layer of 3 × 4096 × 14336 weights (SwiGLU), top 2, no dropout (attention_dropout 0.0,
    # none elsewhere). Its training sequences and batch are not published (its context is 32k): LLaMA 2's
    # assumed, 1024 sequences of 4096 tokens.
    Model(MIXTRAL, 46_702_792_704, 32, 4096, 32, 4096, 1024,
          "Mixtral paper and configuration: 46.7B parameters, 12.9B active; sequence and batch assumed (LLaMA 2's)",
          experts=8, top_k=2, expert_parameters=32 * 8 * 3 * 4096 * 14_336, kv_heads=8, dropout=False),
    Model(LAB_MLP, sum(a * b + b for a, b in zip(_WIDTHS, _WIDTHS[1:])), 8, 64, 0, 1, 64,
          "lab 6's model, 8 Linear layers; the labs' batch of 64", widths=_WIDTHS, dropout=False),
)}


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    processor: Processor               # fp32
    tensor_processor: Processor | None  # bf16 (mixed precision); None: none, mixed runs at the fp32 peak
    memory: GpuMemory
    inside: Link                       # between the GPUs of a node
    between: Link                      # between nodes, per GPU

    def processor_for(self, precision: str) -> Processor:
        """The tensor cores' peak where the model computes in 16 bits and the GPU has them."""
        sixteen = sizes.DTYPE_BYTES[memory.PRECISIONS[precision].parameters] == 2
        return self.tensor_processor if sixteen and self.tensor_processor else self.processor


# Presets missing from course.memory and course.timemodel, with their sources.
A100_40GB = GpuMemory("NVIDIA A100 (40 GB)", 40 * 10**9, "A100 40GB datasheet: 40 GB HBM2 (DGX A100 320GB)")
INFINIBAND_HDR = Link("InfiniBand HDR (200 Gbit/s per GPU)", 25e9, 5e-6,
                      "200 Gbit/s = 25 GB/s per direction, one ConnectX-6 per GPU (DGX A100 datasheet: 8 single-"
                      "port HDR cards for the compute network); latency assumed 5 us")
#: one CPU rank of the course's machine; `make bench` of 2026-11-24: lab 1's sweep MLP (399,370 parameters) at
#: batch 1024 reaches 48,725 samples/s on 2 threads: 6 × 399,370 × 48,725 = 117 GFLOP/s, half a thread each.
LOCAL_CPU = Processor("this machine, one CPU rank (measured)", 6 * 399_370 * 48_725 / 2, 1.0,
                      "make bench, 2026-11-24: lab 1's step at batch 1024 on 2 threads, halved for one thread")
LOCAL_MEMORY = GpuMemory("this machine's memory, a quarter per rank", int(25.3e9 / 4),
                         "make bench, 2026-11-24: 25.3 GB, shared by up to 4 ranks")
H100_CLUSTER = "8 × H100 80 GB a node (NVLink 4, InfiniBand NDR)"
LOCAL = "this machine: 2 CPU ranks a node, gloo"
CLUSTERS = {c.name: c for c in (
    # DGX H100: 8 H100 SXM, NVLink 4 inside, one 400 Gbit/s NDR card per GPU
    Cluster(H100_CLUSTER, 8, timemodel.H100, timemodel.H100_BF16, memory.GPUS["NVIDIA H100 SXM (80 GB)"],
            timemodel.NVLINK4, timemodel.INFINIBAND_NDR),
    # DGX A100 320GB: 8 A100 40 GB, NVLink 3 inside, one 200 Gbit/s HDR card per GPU
    Cluster("8 × A100 40 GB a node (NVLink 3, InfiniBand HDR)", 8, timemodel.A100, timemodel.A100_BF16,
            A100_40GB, timemodel.NVLINK3, INFINIBAND_HDR),
    # The sources' 2013 setting (Yadan et al. 2013: 4 TITANs a server; Dettmers: PCIe 3.0, 40 Gbit/s): no bf16
    Cluster("4 × GTX TITAN 6 GB a node, 2013 (PCIe 3.0, 40 Gbit/s)", 4, timemodel.TITAN, None,
            memory.GPUS["NVIDIA GTX TITAN (6 GiB)"], timemodel.PCIE3_X16, timemodel.NETWORK_40G),
    Cluster(LOCAL, 2, LOCAL_CPU, None, LOCAL_MEMORY, timemodel.LOCAL_GLOO, timemodel.LOCAL_GLOO),
)}
