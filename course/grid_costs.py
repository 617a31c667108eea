"""Lab 9's grid, predicted and measured: what lab 6's chooser says a layout costs, beside what a run cost.

    cluster = grid_costs.this_machine(4, config=CONFIG)         # the link measured (2 ranks), the matmul timed
    guess = grid_costs.predicted(CONFIG, {"dp": 2, "tp": 2}, batch=8, micro_batches=2, cluster=cluster)
    seen = grid_costs.measure_steps(trainer, batches)           # in each rank, on a grid_step.Trainer
    rows = grid_costs.table(guess, grid_costs.busiest(every_ranks_seen), formula=grid_costs.busiest_lab_bytes(
        CONFIG, {"dp": 2, "tp": 2}, batch=8, micro_batches=2))  # in the notebook's process
    grid_costs.largest_gap(rows)

Predicted (`predicted`): course.layout_cost.evaluate, lab 6's chooser, asked about the same layout: the model
is lab 9's GPT (`model_of`: its parameters counted from its shapes, no dropout), fp32, SGD with momentum (one
fp32 buffer a parameter), 1F1B over the micro-batches, nothing recomputed, sequence parallelism on, and ZeRO-1
over the dp·cp replicas (`layout_of`), as the lab trains. The cluster is this machine (`this_machine`): every
rank on one node, so every group uses one link, measured by course.link_probe (a ping-pong of 2 ranks, alpha
and beta); the compute rate measured by timing the model's largest matmul on the ranks' device, on one
thread as each CPU rank runs (`matmul_rate`, efficiency 1: a measured rate, not a peak), shared evenly where
ranks outnumber the cores or GPUs (assumed); the memory a quarter of this machine's (presets.LOCAL_MEMORY,
assumed). The chooser models cp as ring attention (K and V passed around the ring); the lab all-gathers K and
V instead (lab 7's simple form): `lab_bytes` says what that sends.

The lab's own formula (`lab_bytes`): the bytes one rank sends a step, by axis and part, as the lab's code
sends them on gloo (course.transfer.predict's formulas: gloo has no reduce-scatter, so a reduce-scatter
all-reduces the whole tensor and keeps its slice, twice the bytes of NCCL's):
- tp, per micro-batch: each layer all-gathers its input over the sequence twice and reduce-scatters twice
  forward, the adjoints backward (4 all-gathers, 4 reduce-scatters of the (b, s/cp, w) activation); the first
  stage's vocabulary-parallel embedding reduce-scatters its partial sums (its gradient all-gathered back), the
  last stage's ln_f output is all-gathered (its gradient reduce-scattered); the vocabulary-parallel
  cross-entropy all-reduces three (b, s/cp) tensors (max, sum of exponentials, target logit); once a step the
  replicated parameters' gradients (layer norms, row layers' biases, the position embedding) all-reduced;
- pp, per micro-batch: the boundary activation (b, s/cp/tp, w) sent forward by every stage but the last, its
  gradient back by every stage but the first;
- cp, per layer and micro-batch: K and V (b, s/cp, w/tp each) all-gathered forward, their gradients
  reduce-scattered backward;
- dp (the dp·cp replicas, the chooser's "dp"): the stage's gradients all-reduced once a step, then ZeRO-1's
  updated chunks of the stage's flattened parameters all-gathered (course.sharding pads them to one size);
- embedding, pp > 1: the tied embedding's gradient all-reduced between the first and the last stage.
Left out: scalars (counted tokens, the loss, the gradient norm's sums: a few bytes each).

Measured (`measure_steps`, in a rank, on a course.grid_step.Trainer): the bytes its records of the timed
steps sent, binned by the group each record names (the grid's `axis_of`, course.mesh), a step: on the wire
where gloo's are read (course.comm), and by each call's formula, and how many calls (each pays the link's
alpha at least once); its median step seconds, timed without
memory tracking; the peak bytes of its tensors over one more step (course.live_memory: what the chooser
counts, and also the step's temporary copies and messages). `busiest` takes each figure's largest over the
ranks, the chooser's "busiest rank".

Used in: lab 9 (09_composition).
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from dataclasses import dataclass, field

from course import choosing, layout_cost, presets, timemodel, transfer

AXES = ("dp", "tp", "pp", "cp")              # the chooser's axes, in its words ("dp": the dp·cp replicas)
GRID_AXES = ("pp", "dp", "cp", "tp")         # course.mesh's, outermost first
FLOAT = 4                                    # the lab trains in float32


def parameter_count(config) -> int:
    """The parameters of gpt.GPT(config): embeddings, blocks (12w² + 13w each), the final layer norm."""
    w = config.width
    return config.vocab * w + config.sequence * w + config.layers * (12 * w * w + 13 * w) + 2 * w


def model_of(config, batch: int) -> presets.Model:
    """Lab 9's GPT as the chooser sees a model (course.presets.Model): no dropout, multi-head attention."""
    return presets.Model(f"lab 9's GPT (vocabulary {config.vocab}, width {config.width}, {config.layers} layers)",
                         parameter_count(config), config.layers, config.width, config.heads, config.sequence,
                         batch, "course.gpt.Config, parameters counted from its shapes", dropout=False)


def _sizes(sizes: dict) -> dict[str, int]:
    unknown = set(sizes) - set(GRID_AXES)
    if unknown:
        raise ValueError(f"a layout of lab 9 has the axes {GRID_AXES}; {sorted(unknown)} is not one of them "
                         "(lab 9's grid has no expert parallelism)")
    for axis, size in sizes.items():
        transfer.check_ranks(size, axis)
    return {axis: sizes.get(axis, 1) for axis in GRID_AXES}


def layout_of(sizes: dict, micro_batches: int) -> choosing.Layout:
    """The chooser's Layout for a lab 9 layout: ZeRO-1 over the dp·cp replicas where there are several."""
    s = _sizes(sizes)
    replicas = s["dp"] * s["cp"]
    return choosing.Layout(dp=s["dp"], zero=1 if replicas > 1 else 0, tp=s["tp"], pp=s["pp"],
                           m=layout_cost.whole(micro_batches, "micro_batches"), cp=s["cp"])


def matmul_rate(config, *, rows: int = 256, repeats: int = 20, device: str = "cpu") -> timemodel.Processor:
    """One rank's compute rate, measured: the median time of the model's largest matmul, (rows, w) @ (w, 4w),
    on `device`, on one thread as course.launch runs each CPU rank. A measured rate: efficiency 1."""
    import torch
    a, b = (torch.randn(shape, device=device) for shape in ((rows, config.width), (config.width, 4 * config.width)))
    threads, times = torch.get_num_threads(), []
    wait = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    torch.set_num_threads(1)
    try:
        for _ in range(repeats + 1):
            wait()
            started = time.perf_counter()
            a @ b
            wait()
            times.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    rate = 2 * rows * config.width * 4 * config.width / statistics.median(times[1:])
    where = "one thread" if device == "cpu" else device
    return timemodel.Processor(f"this machine, {where} (measured)", rate, 1.0,
                               f"course.grid_costs.matmul_rate: median of {repeats} matmuls ({rows}, {config.width}) "
                               f"@ ({config.width}, {4 * config.width}) on {where}, {rate / 1e9:.1f} GFLOP/s")


def this_machine(ranks: int, *, link: timemodel.Link | None = None, processor: timemodel.Processor | None = None,
                 config=None, cores: int | None = None) -> presets.Cluster:
    """This machine as the chooser's Cluster: `ranks` ranks on one node, placed as course.launch places them;
    the link measured by course.link_probe (2 ranks, about a second) unless given, the processor `matmul_rate`
    on the ranks' device unless given. Ranks that outnumber the CPU `cores` (this process's CPUs by default),
    or the GPUs they share, each get their share of its rate (assumed: shared evenly). Memory: a quarter of
    this machine's (presets.LOCAL_MEMORY), whatever the device: the table compares it, nothing is refused."""
    from course import placement
    transfer.check_ranks(ranks)
    devices = placement.choose(ranks).devices
    if link is None:
        from course import link_probe
        link = link_probe.measure()
    if processor is None:
        if config is None:
            raise ValueError("this_machine needs the model's config to time its matmul, or a processor")
        processor = matmul_rate(config, device=devices[0])
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    units, what = (cores, "cores") if devices[0] == "cpu" else (len(set(devices)), "GPUs")
    if ranks > units:
        processor = dataclasses.replace(processor, flops=processor.flops * units / ranks,
                                        name=f"{processor.name}, {ranks} ranks sharing {units} {what}")
    return presets.Cluster(f"this machine: {ranks} ranks", ranks, processor, None, presets.LOCAL_MEMORY, link, link)


def predicted(config, sizes: dict, *, batch: int, micro_batches: int, cluster: presets.Cluster) -> layout_cost.Option:
    """What lab 6's chooser predicts for this layout (the module docstring says with what)."""
    layout = layout_of(sizes, micro_batches)
    return layout_cost.evaluate(model_of(config, batch), cluster, batch, layout, precision="fp32",
                                optimizer="momentum", schedule="1f1b", recompute="none", sequence_parallel=True)


def stage_parameters(config, sizes: dict, stage: int) -> list[tuple[str, int, bool]]:
    """(local name, elements, split over tp) of each parameter a rank of pipeline stage `stage` holds."""
    s = _sizes(sizes)
    w, tp, pp = config.width, s["tp"], s["pp"]
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is not one of the {pp} stages 0..{pp - 1}")
    found = []
    if stage == 0:
        found += [("embedding.weight", config.vocab // tp * w, True), ("position.weight", config.sequence * w, False)]
    for j in range(config.layers // pp):
        found += [(f"blocks.{j}.{name}", n, split) for name, n, split in (
            ("ln1.weight", w, False), ("ln1.bias", w, False), ("qkv.weight", 3 * w * w // tp, True),
            ("qkv.bias", 3 * w // tp, True), ("out.weight", w * w // tp, True), ("out.bias", w, False),
            ("ln2.weight", w, False), ("ln2.bias", w, False), ("mlp.0.weight", 4 * w * w // tp, True),
            ("mlp.0.bias", 4 * w // tp, True), ("mlp.2.weight", 4 * w * w // tp, True), ("mlp.2.bias", w, False))]
    if stage == pp - 1:
        found += [("ln_f.weight", w, False), ("ln_f.bias", w, False)]
        if pp > 1:
            found.append(("head.weight", config.vocab // tp * w, True))
    return found


def lab_bytes(config, sizes: dict, *, batch: int, micro_batches: int, stage: int) -> dict[str, dict[str, float]]:
    """Bytes a rank of pipeline stage `stage` sends a step, {axis: {part: bytes}}, as the lab's code sends them
    on gloo (the module docstring lists the parts)."""
    s = _sizes(sizes)
    dp, tp, pp, cp, m = s["dp"], s["tp"], s["pp"], s["cp"], micro_batches
    if batch % (dp * m) or config.sequence % (cp * tp):
        raise ValueError(f"a batch of {batch} must split into dp × micro-batches = {dp} × {m} rows, and the "
                         f"sequence of {config.sequence} tokens into cp × tp = {cp} × {tp} shards")
    b, t, w = batch // (dp * m), config.sequence // cp, config.width
    first, last, layers = stage == 0, stage == pp - 1, config.layers // pp
    activation = b * t * w * FLOAT                                  # the (b, s/cp, w) activation, gathered

    def gather(whole, ranks):                                       # all-gather of 1/ranks of `whole` each
        return transfer.predict("all_gather", whole / ranks, ranks, backend="gloo").sent if ranks > 1 else 0

    def reduce_scatter(whole, ranks):
        return transfer.predict("reduce_scatter", whole, ranks, backend="gloo").sent if ranks > 1 else 0

    def all_reduce(nbytes, ranks):
        return transfer.predict("all_reduce", nbytes, ranks, backend="gloo").sent if ranks > 1 else 0

    pair = gather(activation, tp) + reduce_scatter(activation, tp)  # one forward all-gather, its adjoint
    held = stage_parameters(config, sizes, stage)
    out = {axis: {} for axis in (*AXES, "embedding")}
    out["tp"]["blocks"] = m * layers * 4 * pair
    out["tp"]["embedding"] = m * pair if first else 0
    out["tp"]["ln_f"] = m * pair if last else 0
    out["tp"]["cross-entropy"] = m * 3 * all_reduce(b * t * FLOAT, tp) if last else 0
    out["tp"]["replicated gradients"] = all_reduce(sum(n for _, n, split in held if not split) * FLOAT, tp)
    boundary = activation / tp
    out["pp"]["boundaries"] = m * boundary * ((not last) + (not first))
    kv = b * t * (w // tp) * FLOAT                                  # K or V of this rank's heads and tokens
    out["cp"]["K and V"] = m * layers * 2 * (gather(cp * kv, cp) + reduce_scatter(cp * kv, cp))
    replicas = dp * cp
    out["dp"]["gradients"] = sum(all_reduce(n * FLOAT, replicas) for _, n, _ in held)
    flat = sum(n for _, n, _ in held)                               # ZeRO-1 cuts the stage's flat parameters
    out["dp"]["ZeRO-1 gather"] = gather(replicas * math.ceil(flat / replicas) * FLOAT, replicas)
    tied = config.vocab // tp * w * FLOAT
    out["embedding"]["tied gradient"] = all_reduce(tied, 2) if pp > 1 and (first or last) else 0
    return out


def totals(parts: dict[str, dict[str, float]]) -> dict[str, float]:
    """{axis: bytes} from lab_bytes' {axis: {part: bytes}}."""
    return {axis: sum(by_part.values()) for axis, by_part in parts.items()}


def busiest_lab_bytes(config, sizes: dict, *, batch: int, micro_batches: int) -> dict[str, float]:
    """The lab's formula for the busiest rank, as `busiest` measures it: each axis's largest over the stages."""
    stages = [totals(lab_bytes(config, sizes, batch=batch, micro_batches=micro_batches, stage=stage))
              for stage in range(_sizes(sizes)["pp"])]
    return {axis: max(stage[axis] for stage in stages) for axis in stages[0]}


@dataclass
class Measured:
    """One rank's (or the busiest rank's) figures: bytes sent a step by axis (on the wire where gloo's are
    read, `formula`: the same calls by course.transfer's formula), peak tensor bytes, median step seconds."""
    sent: dict[str, float]
    memory: float
    seconds: float
    ranks: list[int] = field(default_factory=list)
    formula: dict[str, float] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)    # collectives and messages a step, by axis


def bytes_per_axis(records, axis_of=None, *, steps: int = 1, formula: bool = False,
                   calls: bool = False) -> dict[str, float]:
    """The bytes the records sent a step (`record.sent`: wire bytes where measured; with `formula`,
    `record.predicted`, each call's bytes by course.transfer's formula), by `axis_of(record)` (course.mesh's
    by default: the group each record names); a record no axis claims goes to "other"; "dp_cp" is the
    chooser's "dp" (the replicas' reduction). With `calls`, the calls a step instead of their bytes."""
    transfer.check_ranks(steps, "steps", counting="steps")
    if axis_of is None:
        from course import mesh
        axis_of = mesh.axis_of
    out = dict.fromkeys((*AXES, "embedding", "other"), 0.0)
    for record in records:
        axis = axis_of(record) or "other"
        axis = "dp" if axis == "dp_cp" else axis
        if axis not in out:
            raise ValueError(f"axis_of named {axis!r} for a record of {record.op} (rank {record.rank}); "
                             f"name one of {list(out)} or None")
        out[axis] += (1 if calls else record.predicted if formula else record.sent) / steps
    return out


def measure_steps(trainer, batches) -> Measured:
    """In a rank: `trainer` (a course.grid_step.Trainer) trains on `batches`, one step each. Every step but
    the last is timed (the median of its seconds; the first pays for warming up where there are three or
    more) and its records binned by axis (bytes a step); the last runs under course.live_memory, which
    slows every op, for the peak bytes of tensors (the stage, its gradients and velocities tracked)."""
    from course import live_memory, recorder

    batches = list(batches)
    if len(batches) < 2:
        raise ValueError(f"measure_steps needs at least 2 batches (steps timed, then one for the memory), "
                         f"got {len(batches)}")
    active = recorder.active()
    if active is None:
        raise ValueError("measure_steps reads the records of course.launch: run it inside a launched function")
    start = len(active.log)
    for inputs, targets in batches[:-1]:
        trainer.step(inputs, targets)
    records = active.log[start:]
    timed = trainer.seconds[-(len(batches) - 1):]
    timed = timed[1:] if len(timed) > 2 else timed
    with live_memory.LiveMemory(next(trainer.stage.parameters()).device) as memory:
        memory.track(trainer.stage, list(trainer.velocities.values()))
        trainer.step(*batches[-1])
    axis_of, steps = trainer.grid.axis_of, len(batches) - 1
    return Measured(bytes_per_axis(records, axis_of, steps=steps), float(memory.peak), statistics.median(timed),
                    [trainer.grid.rank], bytes_per_axis(records, axis_of, steps=steps, formula=True),
                    bytes_per_axis(records, axis_of, steps=steps, calls=True))


def busiest(per_rank: list[Measured]) -> Measured:
    """The chooser's busiest rank: each figure's largest over the ranks (not always one rank's)."""
    if not per_rank:
        raise ValueError("busiest needs the figures of at least one rank")

    def largest(kind):
        return {axis: max(getattr(m, kind).get(axis, 0.0) for m in per_rank)
                for axis in sorted({axis for m in per_rank for axis in getattr(m, kind)})}
    return Measured(largest("sent"), max(m.memory for m in per_rank), max(m.seconds for m in per_rank),
                    sorted(r for m in per_rank for r in m.ranks), largest("formula"), largest("calls"))


def table(guess: layout_cost.Option, seen: Measured, *, formula: dict[str, float] | None = None) -> list[dict]:
    """Rows of (what, predicted, measured, measured / predicted[, the lab's formula]): memory a rank, bytes a
    rank by axis, step seconds. The ratio is None where the chooser predicts nothing."""
    lab = formula or {}
    rows = [("memory a rank (bytes)", guess.memory["total"], seen.memory, None)]
    rows += [(f"bytes a step, {axis}", guess.sent.get(axis, 0.0), seen.sent.get(axis, 0.0), lab.get(axis))
             for axis in (*AXES, "embedding") if guess.sent.get(axis) or seen.sent.get(axis) or lab.get(axis)]
    rows.append(("step (seconds)", guess.seconds["total"], seen.seconds, None))
    return [{"what": what, "predicted": p, "measured": m, "measured / predicted": m / p if p else None,
             **({"lab's formula": f} if formula is not None else {})} for what, p, m, f in rows]


def largest_gap(rows: list[dict]) -> dict:
    """The row whose measurement is furthest from its prediction, by factor (either way; nothing measured
    where something was predicted is the furthest)."""
    rated = [row for row in rows if row["measured / predicted"] is not None]
    if not rated:
        raise ValueError("no row has both a prediction and a measurement to compare")
    return max(rated, key=lambda row: abs(math.log(row["measured / predicted"])) if row["measured / predicted"] > 0
               else math.inf)
