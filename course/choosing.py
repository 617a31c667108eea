"""Choosing a parallel layout: every mix of data, sharded data, tensor, pipeline and (asked for)
context parallelism for a model, a batch and a cluster, with its memory, bytes and step time, by formula.

    opts = options(MODELS["GPT-3 6.7B"], CLUSTERS[H100_CLUSTER], batch=1024, nodes=8)
    best = fastest(opts)        # the fastest layout that fits in memory, or None

A layout is (dp, zero, tp, pp, m) with dp·tp·pp = the GPUs (`layouts`): tp ranks split each weight
(Megatron), within a node; pp stages of whole layers (pp divides the layers), 1F1B over m micro-batches
(pp, 2pp, 4pp, 8pp, and `options` adds micro-batches of one sample);
dp data-parallel copies, their state sharded by ZeRO stage `zero` (0: plain data parallelism). With
`context=True`, cp ranks also split each sequence (ring attention, lab 7, passing K and V `Model.kv_width`
wide: grouped-query attention sends less; the zig-zag split, 2·cp chunks, balances the causal mask):
dp·cp·tp·pp = the GPUs, and the dp·cp ranks that hold the same weights
(`Layout.replicas`) average their gradients and share ZeRO's shards, as Megatron-LM's distributed optimizer
does. Ranks are placed tp innermost, then cp, then dp, then pp (Megatron's order): a group leaves its
node when its span does. For a mixture of experts (`Model.experts`), ep of the dp copies, side by side,
also split each layer's experts (expert parallelism; ep divides dp and the experts), offered by `options`.

What a layout costs (memory per rank, bytes per rank per step, step time) is course.layout_cost's, whose
docstring gives every formula; its `Layout`, `evaluate` and `why_not` are also this module's.

dp and tp are lab 4's `data` and `model`; pp and m are `course.pipeline`'s `stages` and `micro_batches`
(CONTRIBUTING.md, "Words", says why).

Used in: lab 3 (03_model_parallel), lab 6 (06_pipeline_parallel).
"""
from __future__ import annotations

from course.layout_cost import (  # noqa: F401
    RECOMPUTE,
    SCHEDULES,
    ZERO_STAGES,
    Layout,
    Option,
    activation_bytes,
    evaluate,
    whole,
    why_not,
)

# The models and clusters it compares, as choosing.MODELS, choosing.CLUSTERS, ... (course.presets).
from course.presets import CLUSTERS, H100_CLUSTER, LAB_MLP, LOCAL, LOCAL_CPU, MIXTRAL, MODELS, Cluster, Model  # noqa: F401

#: micro-batches offered per layout: pp times these (pp = 1: gradient accumulation)
MICRO_BATCH_FACTORS = (1, 2, 4, 8)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(gpus: int, gpus_per_node: int, layers: int, *, context: bool = False, experts: int = 0) -> list[Layout]:
    """Every (dp, zero, tp, pp, m) with dp·tp·pp = gpus: tp divides gpus_per_node (a tp group stays
    in its node), pp divides `layers`, zero 0-3 only when dp > 1, m = pp × MICRO_BATCH_FACTORS; with
    `context`, also every cp > 1 that divides them (dp·cp·tp·pp = gpus; zero when dp·cp > 1); with
    `experts` (a mixture of experts), also every ep > 1 that divides both dp and the experts."""
    gpus, per_node, layers = whole(gpus, "gpus"), whole(gpus_per_node, "gpus_per_node"), whole(layers, "layers")
    found = []
    for tp in (t for t in _divisors(gpus) if per_node % t == 0):
        for cp in _divisors(gpus // tp) if context else (1,):
            for pp in (p for p in _divisors(gpus // (tp * cp)) if layers % p == 0):
                dp = gpus // (tp * cp * pp)
                found += [Layout(dp, zero, tp, pp, pp * k, cp, ep) for zero in (ZERO_STAGES if dp * cp > 1 else (0,))
                          for k in MICRO_BATCH_FACTORS
                          for ep in (e for e in _divisors(dp) if e == 1 or (experts and experts % e == 0))]
    return sorted(found)


def options(model: Model, cluster: Cluster, batch: int, *, nodes: int = 1, precision: str = "mixed",
            optimizer: str = "adam", schedule: str = "1f1b", recompute: str = "selective",
            sequence_parallel: bool = False, context: bool = False) -> list[Option]:
    """Every layout of `nodes` nodes (`layouts`, and each with micro-batches of one sample) that `model`
    can run with `batch` samples a step, fastest first; with `context`, context-parallel ones too."""
    if not isinstance(model, Model) or not isinstance(cluster, Cluster):
        raise ValueError(f"model and cluster must be a choosing.Model and a choosing.Cluster (MODELS[name], "
                         f"CLUSTERS[name]), got {model!r} and {cluster!r}")
    gpus, batch = whole(nodes, "nodes") * cluster.gpus_per_node, whole(batch, "batch")
    offered = layouts(gpus, cluster.gpus_per_node, model.layers, context=context, experts=model.experts)
    # and micro-batches of one sample (m = batch/dp), as Narayanan et al. 2021 train GPT-3 175B
    offered += sorted({Layout(x.dp, x.zero, x.tp, x.pp, batch // x.dp, x.cp, x.ep) for x in offered
                       if batch % x.dp == 0}
                      - set(offered))
    runnable = [layout for layout in offered if not why_not(model, batch, layout, sequence_parallel=sequence_parallel)]
    found = [evaluate(model, cluster, batch, layout, precision=precision, optimizer=optimizer, schedule=schedule,
                      recompute=recompute, sequence_parallel=sequence_parallel) for layout in runnable]
    # ties (to 9 digits: ZeRO-1's ring takes data parallelism's time) go to fewer bytes, then less memory
    return sorted(found, key=lambda o: (_digits(o.seconds["total"]), o.sent["total"], o.memory["total"], o.layout))


def _digits(seconds: float) -> float:
    return float(f"{seconds:.9g}")


def fastest(found: list[Option]) -> Option | None:
    """The fastest option that fits in memory; None when none fits."""
    fitting = [option for option in found if option.fits]
    return min(fitting, key=lambda o: (_digits(o.seconds["total"]), o.sent["total"], o.memory["total"],
                                       o.layout)) if fitting else None
