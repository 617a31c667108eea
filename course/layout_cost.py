"""What one parallel layout costs, by formula: memory per rank, bytes per rank per step, step time.

    option = evaluate(MODELS["GPT-3 6.7B"], CLUSTERS[H100_CLUSTER], 1024, Layout(dp=8, zero=1, tp=8, pp=1, m=1))

A `Layout` is course.choosing's (dp, zero, tp, pp, m, cp, ep): its docstring says what each means and
where the ranks sit; `why_not` says why a model cannot run one.

Memory per rank (`evaluate`): the training state of ceil(P/(tp·pp)) parameters under ZeRO over dp
(`course.memory.per_rank`), plus activations on the first stage, which keeps the most: L/pp layers × the
micro-batches alive (1F1B: min(pp, m); GPipe: m) × one layer's activations for one micro-batch of b samples:
- a transformer layer, `course.activations.layer_bytes` (Korthikanti et al. 2022, Table 2) for the
  `recompute` chosen, "selective" by default (attention's scores recomputed, as FlashAttention does),
  and `sequence_parallel` (off by default), scaled from its 16 bits to the parameters' dtype (fp32: twice);
  dropout's masks counted where the model trains with dropout (`Model.dropout`: GPT-3 does, LLaMA-2 and
  Mixtral do not);
  with cp, each rank's s/cp tokens (`layer_bytes(context=cp)`);
- the labs' MLP, each Linear's input, as `course.memory.mlp_activation_bytes` counts it; tp splits
  the inputs of the row-split layers (every second one, lab 3's pairing); "full" keeps each stage's input
  and rebuilds one micro-batch's; "selective" and sequence parallelism change nothing (no attention).
Left out: embeddings and logits (their parameters are in P, spread evenly over the stages), buffers,
fragmentation.

Bytes each rank sends per step (the busiest rank): dp, `memory.sent_per_step` of its ceil(P/(tp·pp))
gradients over dp ranks (ring all-reduce 2(dp−1)/dp; ZeRO-1, -2 the same; ZeRO-3 1.5×) with one micro-batch;
with m, plain data parallelism and ZeRO-1 still send once a step (gradients accumulate whole), but ZeRO-2
reduce-scatters each micro-batch's gradients (it keeps only its shard) and ZeRO-3 also gathers the
parameters again for each micro-batch's forward and backward: m·RS + AG and m·(2·AG + RS); tp,
a transformer layer all-reduces b·s·h activations twice forward and twice backward (Megatron), per
micro-batch, and the MLP sends lab 3's split-weight collectives (`memory.sent_per_step`); pp, a middle
stage sends each micro-batch's boundary activations (b·s·h) forward and their gradients back, each tp rank
the whole tensor (with SP its 1/tp slice of the sequence); cp, ring attention's K and V blocks of each
layer, `activations.ring_attention_sent` per micro-batch, each tp rank its K/V heads' (`Model.kv_width`/tp:
h/tp, or fewer under grouped-query attention; tp divides the K/V heads, as Megatron-LM asks). With cp every
activation tp and pp send is its s/cp tokens'. Sequence parallelism sends what tp sends: each
all-reduce becomes a reduce-scatter and an all-gather, the same bytes in the same ring steps (Korthikanti
et al.). Gradients travel in their dtype, parameters and activations in the parameters' (bf16 with fp32
gradients: a gradient reduced in 4 bytes, a parameter gathered in 2).

Step time: compute FLOPs / (GPUs · peak · efficiency), the peak and the efficiency of the cluster's
`timemodel.Processor` (half of the peak, assumed), stretched by the pipeline bubble: 1/(1 − (pp−1)/(m+pp−1)).
FLOPs: `course.activations.training_flop`, 6·P a token plus attention's, and the forward that recomputation
runs again ("full": 4/3 of the FLOPs); cp's ranks share them evenly (the zig-zag split). Then communication
by the alpha-beta model (`course.timemodel`): tp over the node's link; dp, cp and pp over the node's link, or
the network's when their group crosses nodes; ring attention's messages, one a block a step.
Nothing overlaps: the parts add up (real runs hide much of dp behind backward, and pay for tp inside it).
An upper bound to compare layouts by, not a forecast.

A mixture of experts (`Model.experts` E in every layer, `top_k` k a token; course.experts): every rank holds
the dense part, ceil((P − P_e)/(tp·pp)), its state sharded by ZeRO over dp·cp as above, and, with ep > 1,
E/ep of each layer's experts, ceil(P_e/(tp·pp·ep)), their state sharded over the dp·cp/ep ranks that hold
the same experts (`Layout.expert_replicas`), whose gradients they average (Megatron-LM's expert data
parallelism); ep ranks are ep of the dp copies, side by side (ep divides dp and E). The experts are split
by tp as the MLP is (Megatron's default). A token's k experts each keep the MLP block's activations
(`activations.mlp_block_bytes`: k − 1 more than a dense layer's), and its FLOPs are the
`active_parameters`' (6 a token each). Bytes: ep, `experts.sent_per_layer` per layer and micro-batch,
the dispatch and the combine forward and backward of this rank's b·s/(cp·tp) tokens, routed evenly (with
tp, sequence parallelism has split the sequence over the tp ranks: Megatron-LM requires it beside ep, and
`why_not` refuses ep with tp without it); tp, the MLP's two all-reduces carry k rows a token.
Time: each all-to-all (ep − 1) messages and its bytes over the link its group spans (tp·cp·ep ranks).
Left out: the router, uneven routing (the busiest expert's rank sets the pace) and capacity limits.

Used by: course.choosing, course.grid_costs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from course import activations, experts, memory, pipeline, sizes, timemodel, transfer
from course.presets import Cluster, Model
from course.timemodel import Link

SCHEDULES = ("1f1b", "gpipe")
RECOMPUTE = activations.RECOMPUTE
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, order=True)
class Layout:
    dp: int
    zero: int
    tp: int
    pp: int
    m: int
    cp: int = 1        # context parallelism: ranks that split each sequence
    ep: int = 1        # expert parallelism: ranks of the dp copies that split a layer's experts

    @property
    def replicas(self) -> int:
        """The ranks that hold the same weights: their gradients are averaged, ZeRO shards over them."""
        return self.dp * self.cp

    @property
    def expert_replicas(self) -> int:
        """The ranks that hold the same experts (dp·cp/ep): the experts' gradients are averaged over them."""
        return self.replicas // self.ep

    @property
    def scheme(self) -> str:
        """course.memory's name for what dp does with the state."""
        return "data parallel" if self.zero == 0 else f"ZeRO-{self.zero}"

    @property
    def uses(self) -> str:
        """The parallelisms it uses: "dp+zero+tp+pp+cp+ep", ..., "none" on one GPU."""
        used = [name for name, on in (("dp", self.dp > 1 and not self.zero), ("dp+zero", self.zero > 0),
                                      ("tp", self.tp > 1), ("pp", self.pp > 1), ("cp", self.cp > 1),
                                      ("ep", self.ep > 1)) if on]
        return "+".join(used) or "none"


@dataclass(frozen=True)
class Option:
    layout: Layout
    micro_batch: int
    memory: dict[str, float]   # bytes per rank by kind, and "total"
    sent: dict[str, float]     # bytes per rank per step: "dp", "tp", "pp", "cp", "ep", "total"
    seconds: dict[str, float]  # "compute", "bubble", "tp", "dp", "pp", "cp", "ep", "total"
    fits: bool


def whole(value, name: str) -> int:
    transfer.check_ranks(value, name, counting=name.replace("_", " "))
    return value


def why_not(model: Model, batch: int, layout: Layout, *, sequence_parallel: bool = False) -> str | None:
    """Why `model` cannot run `layout` with a global batch of `batch` samples (and sequence
    parallelism on or off), or None."""
    if batch % (layout.dp * layout.m):
        return f"the batch of {batch} does not split into {layout.dp} × {layout.m} micro-batches"
    if model.layers % layout.pp:
        return f"{model.layers} layers do not split into {layout.pp} stages"
    split = model.widths if model.is_mlp else (model.heads,)
    if any(width % layout.tp for width in split):
        return f"{'widths' if model.is_mlp else 'heads'} {split} do not split over {layout.tp} tp ranks"
    if not model.is_mlp and model.key_value_heads % layout.tp:
        return (f"its {model.key_value_heads} key/value heads do not split over {layout.tp} tp ranks "
                "(Megatron-LM asks tp to divide them)")
    if layout.cp > 1 and model.is_mlp:
        return "the MLP has no sequence for context parallelism to split"
    if layout.ep > 1 and not model.is_moe:
        return f"{model.name} has no experts for expert parallelism to split"
    if layout.ep > 1 and model.experts % layout.ep:
        return f"{model.experts} experts do not split over {layout.ep} ep ranks"
    if layout.dp % layout.ep:
        return f"the {layout.dp} dp copies do not split into groups of {layout.ep} ep ranks"
    if layout.ep > 1 and layout.tp > 1 and not sequence_parallel:
        return ("expert parallelism beside tensor parallelism needs sequence parallelism (Megatron-LM "
                "requires it): turn it on, or take tp = 1")
    if layout.cp > 1 and model.sequence % (2 * layout.cp):
        return (f"the sequence of {model.sequence} tokens does not split into 2 × {layout.cp} chunks "
                "(the zig-zag split of context parallelism)")
    return None


def _stage_dense(model: Model, layout: Layout) -> list[sizes.Dense]:
    per_stage = model.layers // layout.pp
    w = model.widths[:per_stage + 1]
    return [sizes.Dense(f"layer{i + 1}", a, b) for i, (a, b) in enumerate(zip(w, w[1:]))]


def activation_bytes(model: Model, layout: Layout, micro_batch: int, *, precision: str,
                     schedule: str = "1f1b", recompute: str = "selective", sequence_parallel: bool = False) -> float:
    """Activations the first stage keeps at its peak (see the module docstring)."""
    alive = pipeline.peak_micro_batches(schedule, 0, layout.pp, layout.m)
    per_stage, tp = model.layers // layout.pp, layout.tp
    scale = sizes.DTYPE_BYTES[memory.PRECISIONS[precision].parameters] / 2     # the paper counts 16 bits
    if model.is_mlp:
        inputs = [w / tp if i % 2 else w for i, w in enumerate(model.widths[:per_stage])]   # row layers split
        if recompute == "full":                    # each micro-batch's stage input, one micro-batch rebuilt
            return 2 * scale * micro_batch * (alive * model.widths[0] + sum(inputs))
        return 2 * scale * alive * micro_batch * sum(inputs)
    shape = (model.sequence, micro_batch, model.hidden, model.heads, tp)
    common = dict(sequence_parallel=sequence_parallel, context=layout.cp, dropout=model.dropout)
    # a mixture of experts keeps its MLP block's activations once for each of a token's k experts
    experts_extra = (model.top_k - 1) * activations.mlp_block_bytes(
        model.sequence, micro_batch, model.hidden, tp, **common) if model.is_moe else 0.0
    stored = 0.0 if recompute == "full" else experts_extra
    kept = alive * per_stage * (activations.layer_bytes(*shape, recompute=recompute, **common) + stored)
    if recompute == "full":                        # and one layer at a time rebuilds all it keeps
        kept += activations.layer_bytes(*shape, recompute="none", **common) + experts_extra
    return scale * kept


def evaluate(model: Model, cluster: Cluster, batch: int, layout: Layout, *, precision: str = "mixed",
             optimizer: str = "adam", schedule: str = "1f1b", recompute: str = "selective",
             sequence_parallel: bool = False) -> Option:
    """One layout's memory per rank, bytes per rank per step and step time (the module docstring's model)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    activations.check(recompute, sequence_parallel)
    if precision not in memory.PRECISIONS:
        raise ValueError(f"precision must be one of {list(memory.PRECISIONS)}, got {precision!r}")
    if layout.tp > cluster.gpus_per_node:
        raise ValueError(f"tp={layout.tp} would cross nodes of {cluster.gpus_per_node} GPUs: tensor parallelism "
                         f"stays within a node; pick tp <= {cluster.gpus_per_node}")
    if not isinstance(layout, Layout) or layout.zero not in ZERO_STAGES or (layout.zero and layout.replicas == 1):
        raise ValueError(f"layout must be a choosing.Layout(dp, zero, tp, pp, m, cp=1, ep=1) with zero in "
                         f"{ZERO_STAGES} (0 when dp·cp = 1: one rank has nothing to shard), got {layout!r}")
    for name in ("dp", "tp", "pp", "m", "cp", "ep"):
        whole(getattr(layout, name), name)
    reason = why_not(model, whole(batch, "batch"), layout, sequence_parallel=sequence_parallel)
    if reason:
        raise ValueError(f"{model.name} cannot run {layout}: {reason}")
    dp, tp, pp, m, cp, ep = layout.dp, layout.tp, layout.pp, layout.m, layout.cp, layout.ep
    gpus, b = dp * cp * tp * pp, batch // (dp * m)
    dtype = memory.PRECISIONS[precision].parameters
    held = math.ceil((model.parameters - model.expert_parameters) / (tp * pp))
    held_experts = math.ceil(model.expert_parameters / (tp * pp * ep))        # 0 for a dense model
    kept = activation_bytes(model, layout, b, precision=precision, schedule=schedule, recompute=recompute,
                            sequence_parallel=sequence_parallel)
    state = memory.per_rank(held, layout.replicas, layout.scheme, optimizer=optimizer, precision=precision,
                            activations=kept)
    if held_experts:        # the experts' state, sharded by ZeRO over the ranks that hold the same experts
        experts_state = memory.per_rank(held_experts, layout.expert_replicas, layout.scheme if
                                        layout.expert_replicas > 1 else "data parallel",
                                        optimizer=optimizer, precision=precision)
        state = {kind: value + experts_state.get(kind, 0) for kind, value in state.items()}

    per_node = cluster.gpus_per_node
    dp_link = cluster.inside if tp * cp * dp <= per_node else cluster.between  # dp spans tp·cp·dp ranks
    cp_link = cluster.inside if tp * cp <= per_node else cluster.between       # cp spans tp·cp
    pp_link = cluster.inside if gpus <= per_node else cluster.between          # pp spans them all
    ep_link = cluster.inside if tp * cp * ep <= per_node else cluster.between  # ep spans tp·cp·ep
    dtypes = memory.PRECISIONS[precision]              # gradients reduced in theirs, parameters gathered in theirs
    sent = dict.fromkeys(("dp", "tp", "pp", "cp", "ep"), 0.0)
    seconds = dict.fromkeys(("dp", "tp", "pp", "cp", "ep"), 0.0)
    # the dense part's gradients averaged over the dp·cp copies, the experts' over those that hold them
    for count, ranks in ((held, layout.replicas), (held_experts, layout.expert_replicas)):
        if count and ranks > 1:
            sent["dp"] += memory.sent_per_step(count, ranks, layout.scheme, dtype=dtypes.gradients,
                                               gather_dtype=dtype, micro_batches=m)
            seconds["dp"] += _dp_seconds(count, ranks, layout, dtypes, dp_link)
    tokens = model.sequence // cp                      # of each sample, on this rank
    layers_m = (model.layers // pp) * m                # the layers of a stage, once a micro-batch
    if tp > 1 and model.is_mlp:
        stage = _stage_dense(model, layout)
        per_micro = memory.sent_per_step(sum(d.weights for d in stage), tp, "split weights", dtype=dtype,
                                         layers=stage, batch=b)
        sent["tp"] = m * per_micro
        # a ring collective's time is alpha per message plus its bytes over beta: messages counted as lab 3 pairs
        # (every layer but the first all-reduces once; a last column layer all-gathers its output)
        messages = 2 * (tp - 1) * (len(stage) - 1) + (tp - 1) * (len(stage) % 2)
        seconds["tp"] = m * (messages * cluster.inside.alpha + per_micro / cluster.inside.beta)
    elif tp > 1:
        # Megatron: attention and the MLP each all-reduce once forward and once backward; a mixture of
        # experts' MLP carries each token k times
        for rows in (1, model.top_k if model.is_moe else 1):
            activation = sizes.nbytes(b * tokens * model.hidden * rows, dtype)
            sent["tp"] += 2 * layers_m * transfer.ring_all_reduce(activation, tp)
            seconds["tp"] += 2 * layers_m * timemodel.ring_all_reduce_seconds(activation, tp, cluster.inside)
    if pp > 1:
        boundary = sizes.nbytes(b * tokens * model.hidden, dtype) / (tp if sequence_parallel else 1)
        sends = m * (2 if pp > 2 else 1)         # a middle stage sends forward and back; with 2, each one way
        sent["pp"] = sends * boundary
        seconds["pp"] = sends * pp_link.seconds(boundary)
    if cp > 1:
        # each layer, each micro-batch: a K and V block of this rank's K/V heads passed on cp − 1 times forward,
        # again in backward, with the blocks' gradient accumulators, which travel cp steps back to their owners
        per_layer = activations.ring_attention_sent(model.sequence, b, model.hidden // tp, cp,
                                                    element_bytes=sizes.DTYPE_BYTES[dtype],
                                                    kv_width=model.kv_width // tp)
        sent["cp"] = layers_m * per_layer
        messages = (cp - 1) + (cp - 1) + cp
        seconds["cp"] = layers_m * (messages * cp_link.alpha + per_layer / cp_link.beta)
    if ep > 1:
        # each layer, each micro-batch: the dispatch and the combine, forward and backward, of this rank's
        # tokens (1/tp of them: with tp, sequence parallelism is on, why_not says)
        per_layer = experts.sent_per_layer(b * tokens / tp, model.hidden, model.top_k, ep,
                                           element_bytes=sizes.DTYPE_BYTES[dtype])
        sent["ep"] = layers_m * per_layer
        seconds["ep"] = layers_m * (4 * (ep - 1) * ep_link.alpha + per_layer / ep_link.beta)
    flop = activations.training_flop(model.active_parameters, layers=model.layers, sequence=model.sequence,
                                     hidden=0 if model.is_mlp else model.hidden, tokens=batch * model.sequence,
                                     recompute=recompute)
    compute = cluster.processor_for(precision).seconds(flop / gpus)
    bubble = pipeline.bubble_fraction(pp, m)
    seconds = {"compute": compute, "bubble": compute / (1 - bubble) - compute, **seconds}
    return Option(layout, b, state, {**sent, "total": sum(sent.values())},
                  {**seconds, "total": sum(seconds.values())}, state["total"] <= cluster.memory.nbytes)


def _dp_collectives(layout: Layout) -> tuple[int, int]:
    """How many all-gathers of the parameters and reduce-scatters of the gradients ZeRO runs a step."""
    return {1: (1, 1), 2: (1, layout.m), 3: (2 * layout.m, layout.m)}[layout.zero]


def _dp_seconds(held: int, ranks: int, layout: Layout, dtypes: memory.Precision, link: Link) -> float:
    if ranks == 1:
        return 0.0
    if layout.zero == 0:
        return timemodel.ring_all_reduce_seconds(sizes.nbytes(held, dtypes.gradients), ranks, link)
    padded = ranks * memory.shard(held, ranks)
    gathers, reduces = _dp_collectives(layout)
    # a reduce-scatter takes an all-gather's N-1 steps of the same chunks
    return sum(count * timemodel.ring_all_gather_seconds(sizes.nbytes(padded, dtype), ranks, link)
               for count, dtype in ((gathers, dtypes.parameters), (reduces, dtypes.gradients)))
