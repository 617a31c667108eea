"""Lab 9's model on a grid built from PyTorch's own parts, to set beside the course's grid.

    run = course.launch(native_grid.training, 4, args=(config, batches, {"dp": 2, "tp": 2}))
    run[0]["losses"]                    # each step's loss, gpt.one_process_training's within course.check's

Tolerance: course.check's for float32 (rtol 1e-5, atol 1e-6), as course.grid_step's. PyTorch's parts sum in
other orders than one process (DTensor's reductions, FSDP's reduce-scatter, the norm by parts); after 8 steps
of the full model on dp2×tp2, pp2×tp2 and pp2×dp2 the largest differences measured were 1.5e-7 relative on the
losses, 4e-8 on the norms and 1.2e-7 absolute on the parameters (one float32 ulp near 1).

The same `gpt.GPT(config, seed)` (every rank builds it whole from the seed, then PyTorch's APIs shard it):
`init_device_mesh` with the dimensions ("pp", "dp", "tp") (lab 9's order, tp fastest; no cp: below),
`parallelize_module` with torchtitan's sequence-parallel plan (SequenceParallel for the layer norms,
ColwiseParallel(input_layouts=Shard(1)) for qkv and mlp.0, RowwiseParallel(output_layouts=Shard(1)) for
out and mlp.2, RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)) for the
vocabulary-split embedding), the tied output layer as a DTensor matmul with the embedding's vocabulary
shard and `loss_parallel()` for the loss, `fully_shard` over dp, and `torch.distributed.pipelining`
(PipelineStage + Schedule1F1B) over pp. The step is `gpt.one_process_training`'s: the loss the mean over
the step's counted tokens (gpt.IGNORE not counted), the gradient clipped to gpt.CLIP, SGD with momentum.

What PyTorch's parts do not do here, and what stands in (each said where it happens below):
- The residual stream between blocks is the local sequence shard, a plain tensor (torchtitan's
  `use_local_output`), so that a pipeline stage sends a plain tensor.
- The learned position embedding has no plan in torch: its weight is made a replicated DTensor
  (`distribute_module`), its output sliced to the rank's sequence shard (`redistribute` to Shard(0)).
- `fully_shard` averages gradients over dp; the step's loss is a global mean (its tokens counted over every
  replica), so each rank's loss is scaled by dp before backward: the average of dp·(local sums / counted)
  is the sum.
- Weights tied across pipeline stages: torch.distributed.pipelining has no tied parameters (torchtitan unties
  them). The last stage holds its own copy of the embedding's shard (as the course's grid does) and the two
  gradients are summed with one `all_reduce` over the group of the first and last stage, by hand.
- The gradient's norm: `clip_grad_norm_` sees one stage's parameters, so it is taken by hand, as its
  DTensor norms take it: each rank's squares summed over the mesh dimensions its parameter is cut along
  (replicated ones counted once), then over pp (the tied copy skipped on the last stage, as torchtitan
  skips nothing only because it unties); the gradients scaled as torch scales them.
- Everything else composes on CPU ranks at torch 2.13: pp × dp × tp = 2 × 2 × 2 on 8 ranks (fully_shard on
  the (dp, tp) sub-mesh of parameters parallelize_module already split, inside pipeline stages) trains as one
  process within the tolerance above (bench/composition.py runs it where the machine has 8 cores).
- Context parallelism: `torch.distributed.tensor.experimental.context_parallel` shards only
  scaled_dot_product_attention's CUDA kernels (flash, efficient, cuDNN); on CPU ranks at torch 2.13 it
  raises, so no layout here has cp (tests/test_native_grid.py holds that it still does).

Used in: lab 9 (09_composition).
"""
from __future__ import annotations

import logging
import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course import gpt, gpt_stage, mesh, placement, timeline

#: The axes of the mesh, outermost first (lab 9's order, without cp).
AXES = ("pp", "dp", "tp")


def check_layout(config: gpt.Config, sizes: dict, world_size: int, *, batch: int, micro_batches: int) -> dict:
    """The sizes of every axis (absent = 1), refused with both numbers when the model or world cannot take them
    (the model's refusals are course.gpt_stage's, the course's grid's)."""
    if "cp" in sizes:
        raise ValueError("native_grid runs the axes pp, dp and tp: context parallelism does not run on CPU ranks "
                         "at torch 2.13 (see the module's docstring)")
    sizes = {axis: size for axis, size in mesh.sizes_of(sizes).items() if axis in AXES}
    if math.prod(sizes.values()) != world_size:
        raise ValueError(f"the layout {sizes} needs {math.prod(sizes.values())} ranks, the world has {world_size}")
    gpt_stage.check_layout(config, sizes)
    rows = sizes["dp"] * (micro_batches if sizes["pp"] > 1 else 1)
    if batch % rows:
        raise ValueError(f"a batch of {batch} does not split into dp={sizes['dp']} × {micro_batches} micro-batches")
    return sizes


def _dtensor(*names):
    """DTensor's names: torch.distributed.tensor from torch 2.5, torch.distributed._tensor in 2.4."""
    from torch.distributed import tensor as api
    if not hasattr(api, "DTensor"):
        from torch.distributed import _tensor as api
    return tuple(getattr(api, name) for name in names)


def _tp_plan(tp_mesh, model: nn.Module) -> None:
    """torchtitan's plan, on this model: sequence parallelism between the split layers."""
    from torch.distributed.tensor import parallel as tp
    Replicate, Shard, distribute_module, distribute_tensor = _dtensor("Replicate", "Shard", "distribute_module",
                                                                      "distribute_tensor")
    plan = {"embedding": tp.RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "ln_f": tp.SequenceParallel()}
    for i in model.blocks:
        plan.update({f"blocks.{i}.{norm}": tp.SequenceParallel(use_local_output=True) for norm in ("ln1", "ln2")})
        plan.update({f"blocks.{i}.{name}": tp.ColwiseParallel(input_layouts=Shard(1)) for name in ("qkv", "mlp.0")})
        plan.update({f"blocks.{i}.{name}": tp.RowwiseParallel(output_layouts=Shard(1)) for name in ("out", "mlp.2")})
    tp.parallelize_module(model, tp_mesh, {name: style for name, style in plan.items()
                                           if getattr(model, name.split(".")[0]) is not None})
    if model.position is not None:
        distribute_module(model.position, tp_mesh)          # replicated: no plan in torch for it
    if model.head is not None:                              # the last stage's copy of the embedding's shard
        model.head.weight = nn.Parameter(distribute_tensor(model.head.weight.detach(), tp_mesh, [Shard(0)]))


class StagePart(nn.Module):
    """A pipeline stage's part of gpt.GPT, by the model's own names (blocks keep their global index as a
    string key): the embeddings on the first stage, ln_f and the output layer (tied) on the last."""

    def __init__(self, model: gpt.GPT, layers: range, first: bool, last: bool):
        super().__init__()
        self.config = model.config
        self.embedding = model.embedding if first else None
        self.position = model.position if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        self.ln_f = model.ln_f if last else None
        self.head = None
        if last and not first:     # the tied copy: pipelining has no weights shared between stages
            self.head = nn.Embedding(model.config.vocab, model.config.width)
            self.head.weight = nn.Parameter(model.embedding.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        DTensor, Replicate, Shard = _dtensor("DTensor", "Replicate", "Shard")
        if self.embedding is not None:
            h = self.embedding(x)              # (b, t/tp, w): the vocabulary-split lookup, reduce-scattered
            positions = torch.arange(x.shape[-1], device=x.device)
            weight = self.position.weight
            if isinstance(weight, DTensor):
                table = F.embedding(DTensor.from_local(positions, weight.device_mesh, [Replicate()]), weight)
                table = table.redistribute(placements=[Shard(0)]).to_local()   # this rank's positions
            else:
                table = F.embedding(positions, weight)
            x = h + table
        for block in self.blocks.values():
            x = block(x)
        if self.ln_f is None:
            return x
        h = self.ln_f(x)
        weight = (self.head if self.head is not None else self.embedding).weight
        if isinstance(h, DTensor):
            h = h.redistribute(placements=[Replicate()])      # the sequence all-gathered for the output layer
        return h @ weight.T                                   # (b, t, vocab/tp) as a DTensor Shard(2)


def _loss(logits, targets, counted: int, scale: float):
    """The sum of the micro-batch's token losses over the step's counted tokens (times `scale`); the logits'
    vocabulary shards never gathered (`loss_parallel` where they are a DTensor)."""
    DTensor, Replicate = _dtensor("DTensor", "Replicate")
    if isinstance(logits, DTensor):
        targets = DTensor.from_local(targets, logits.device_mesh, [Replicate()])
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=gpt.IGNORE, reduction="sum")
    return total * (scale / counted)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor, on every rank. torch 2.13 warns (logging, on stderr) that a parameter
    sharded over dp then tp is gathered in two all-gathers: true, and no fault of the caller's; not shown."""
    if not hasattr(tensor, "full_tensor"):
        return tensor.detach()
    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return tensor.full_tensor().detach()
    finally:
        quiet.setLevel(level)


def training(config: gpt.Config, batches, sizes: dict, *, micro_batches: int = 2, seed: int = 0,
             learning_rate: float = gpt.LEARNING_RATE, momentum: float = gpt.MOMENTUM, clip: float = gpt.CLIP,
             parameters: bool = True) -> dict:
    """Runs on every rank: gpt.one_process_training's run on the layout `sizes` (e.g. {"dp": 2, "tp": 2}) with
    PyTorch's parts, a `Trainer` stepping through `batches`. Returns {"losses", "norms" (each step's, the same
    on every rank), "seconds", "windows" (Trainer's), "parameters" (the whole model's by gpt.GPT's names, on
    every rank; None with parameters=False)}."""
    trainer = Trainer(config, sizes, batch=batches[0][0].shape[0], micro_batches=micro_batches, seed=seed,
                      learning_rate=learning_rate, momentum=momentum, clip=clip)
    losses, norms = zip(*(trainer.step(inputs, targets) for inputs, targets in batches))
    return {"losses": list(losses), "norms": list(norms), "seconds": trainer.seconds, "windows": trainer.windows,
            "parameters": trainer.whole_parameters() if parameters else None}


class Trainer:
    """One rank's part of the model on its mesh, trained a step at a time (`step`), as course.grid_step.Trainer
    is: its `part` (a StagePart, sharded by PyTorch), `seconds` (each step's, from a barrier to the step's loss
    on every rank) and `windows` (each step's (start, end) on course.timeline's clock; None outside a launch)."""

    def __init__(self, config: gpt.Config, sizes: dict, *, batch: int, micro_batches: int = 2, seed: int = 0,
                 learning_rate: float = gpt.LEARNING_RATE, momentum: float = gpt.MOMENTUM, clip: float = gpt.CLIP):
        from torch.distributed.device_mesh import init_device_mesh
        sizes = check_layout(config, sizes, dist.get_world_size(), batch=batch, micro_batches=micro_batches)
        self.sizes, self.batch, self.counted = sizes, batch, 1
        self.learning_rate, self.momentum, self.clip = learning_rate, momentum, clip
        # DTensor gathers on its mesh's device, and gloo gathers CPU tensors only (lab 3): CUDA under NCCL alone.
        self.device = placement.device() if dist.get_backend() == "nccl" else torch.device("cpu")
        self.mesh = init_device_mesh(self.device.type, tuple(sizes[a] for a in AXES), mesh_dim_names=AXES)
        pp, dp, tp = (sizes[a] for a in AXES)
        self.stage, self.replica = self.mesh["pp"].get_local_rank(), self.mesh["dp"].get_local_rank()
        self.first, self.last = self.stage == 0, self.stage == pp - 1
        per_stage = config.layers // pp
        self.part = StagePart(gpt.GPT(config, seed), range(self.stage * per_stage, (self.stage + 1) * per_stage),
                              self.first, self.last).to(self.device)
        if tp > 1:
            _tp_plan(self.mesh["tp"], self.part)
        if dp > 1:
            fully_shard = _fsdp2()
            for block in self.part.blocks.values():
                fully_shard(block, mesh=self.mesh["dp"])
            fully_shard(self.part, mesh=self.mesh["dp"])
        self.velocities = {name: torch.zeros_like(p) for name, p in self.part.named_parameters()}
        self.embedding_group = _embedding_group(self.mesh, pp) if pp > 1 else None
        self.schedule = None
        if pp > 1:
            self.schedule = _schedule(self.part, self.mesh, self.stage, micro_batches, batch // dp, config,
                                      lambda out, target: _loss(out, target, self.counted, dp))
        self.seconds: list[float] = []
        self.windows: list = []

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
        """One training step on the global batch (B, T); returns (loss, norm), the same on every rank."""
        from contextlib import nullcontext

        from torch.distributed.tensor.parallel import loss_parallel
        self.counted = gpt.counted_tokens(targets)
        dist.barrier()
        begin, shown = time.perf_counter(), timeline.now()
        with loss_parallel() if self.sizes["tp"] > 1 else nullcontext():
            mine = self.forward_backward(inputs, targets)
        if self.embedding_group is not None and (self.first or self.last):
            _sum_tied(self.part.embedding.weight if self.first else self.part.head.weight, self.embedding_group)
        norm = _clip(self.part, self.clip, self.mesh, self.sizes["pp"], self.last and not self.first)
        with torch.no_grad():
            for name, p in self.part.named_parameters():
                gpt.sgd_step_(p, p.grad, self.velocities[name], learning_rate=self.learning_rate,
                              momentum=self.momentum)
        self.part.zero_grad(set_to_none=True)
        loss = _full(mine).reshape(1).clone()
        dist.all_reduce(loss)       # the dp replicas' parts; every tp rank holds its group's; 0 off the last stage
        self.seconds.append(time.perf_counter() - begin)
        self.windows.append(None if shown is None else (shown, timeline.now()))
        return float(loss) / self.sizes["tp"], norm

    def forward_backward(self, inputs, targets):
        """This replica's rows, forward and backward; returns its part of the step's loss (0 off the last stage)."""
        dp = self.sizes["dp"]
        rows = slice(self.replica * self.batch // dp, (self.replica + 1) * self.batch // dp)
        x, y = inputs[rows].to(self.device), targets[rows].to(self.device)
        if self.schedule is None:
            loss = _loss(self.part(x), y, self.counted, dp)
            loss.backward()
            return loss.detach() / dp
        micro_losses = []
        self.schedule.step(*((x,) if self.first else ()),
                           **(dict(target=y, losses=micro_losses) if self.last else {}))
        return sum(loss.detach() for loss in micro_losses) / dp if self.last else torch.zeros((), device=self.device)

    def whole_parameters(self) -> dict:
        return whole_parameters(self.part, self.mesh, self.sizes["pp"])


def _sum_tied(weight: nn.Parameter, group) -> None:
    """The tied embedding's gradient summed over its first and last stage's copies, shard by shard: the grad
    made to have its parameter's placements first (the lookup's grad can come back Partial on the first stage)."""
    grad = weight.grad
    if hasattr(grad, "to_local"):
        (DTensor,) = _dtensor("DTensor")
        local = grad.redistribute(placements=weight.placements).to_local().contiguous()
        dist.all_reduce(local, group=group)
        weight.grad = DTensor.from_local(local, weight.device_mesh, weight.placements)
    else:
        dist.all_reduce(grad, group=group)


def _fsdp2():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:                   # torch 2.4 and 2.5
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def _embedding_group(device_mesh, pp: int):
    """The first and last stage of each pp group, a group each (every rank creates every one, in order)."""
    ranks = device_mesh.mesh.reshape(pp, -1)
    mine = None
    for column in range(ranks.shape[1]):
        pair = [int(ranks[0, column]), int(ranks[-1, column])]
        group = dist.new_group(pair, group_desc="embedding")
        if dist.get_rank() in pair:
            mine = group
    return mine


def _schedule(part, device_mesh, p_idx, micro_batches, rows, config, loss_fn):
    import inspect

    from torch.distributed import pipelining
    tp = device_mesh["tp"].size()
    shape = (rows // micro_batches, config.sequence) if p_idx == 0 else \
        (rows // micro_batches, config.sequence // tp, config.width)
    device = torch.device(device_mesh.device_type)
    example = torch.zeros(shape, dtype=torch.int64 if p_idx == 0 else torch.float32, device=device)
    stage = pipelining.PipelineStage(part, p_idx, device_mesh["pp"].size(), device, input_args=example,
                                     group=device_mesh["pp"].get_group())
    unscaled = {"scale_grads": False} if "scale_grads" in inspect.signature(pipelining.Schedule1F1B).parameters else {}
    return pipelining.Schedule1F1B(stage, micro_batches, loss_fn=loss_fn, **unscaled)


def _clip(part, clip, device_mesh, pp, skip_head) -> float:
    """The whole model's gradient norm (each parameter once), then every gradient scaled as clip_grad_norm_
    scales it. Each gradient is first made to have its parameter's placements (a Partial one, as the layer
    norms' under sequence parallelism, summed); then each rank's squares, grouped by the mesh dimensions their
    parameters are sharded over, are summed over those only (replicated ones counted once), and over pp."""
    (DTensor,) = _dtensor("DTensor")
    squares: dict = {}
    grads = []
    for name, p in part.named_parameters():
        if p.grad is None:
            continue
        if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
            p.grad = p.grad.redistribute(placements=p.placements)
        grads.append(p.grad)
        if skip_head and name == "head.weight":         # the tied copy: counted on the first stage
            continue
        key, local = (None, ()), p.grad
        if isinstance(p.grad, DTensor):
            # every dimension the parameter is cut along (Shard, or FSDP's _StridedShard over a tp cut, which
            # is_shard() does not name at torch 2.13): not Replicate
            key = (p.device_mesh, tuple(i for i, placement in enumerate(p.placements) if not placement.is_replicate()))
            local = p.grad.to_local()
        squares[key] = squares.get(key, 0.0) + local.double().square().sum()
    total = torch.zeros((), dtype=torch.float64, device=device_mesh.device_type)
    for (cut_mesh, dims), part_squares in squares.items():
        for dim in dims:
            dist.all_reduce(part_squares, group=cut_mesh.get_group(dim))
        total += part_squares
    if pp > 1:
        dist.all_reduce(total, group=device_mesh["pp"].get_group())
    norm = float(total.sqrt())
    if norm > clip:
        for g in grads:
            g.mul_(clip / (norm + 1e-6))
    return norm


def whole_parameters(part, device_mesh, pp) -> dict:
    """The whole model's parameters by gpt.GPT's names, on every rank (gathered over tp, dp and pp)."""
    mine = {}
    for name, p in part.named_parameters():
        if name == "head.weight":
            continue
        mine[name] = _full(p).cpu().clone()       # to the notebook, and through gather_object, on the CPU
    if pp == 1:
        return mine
    gathered = [None] * pp
    dist.all_gather_object(gathered, mine, group=device_mesh["pp"].get_group())
    return {name: tensor for stage in gathered for name, tensor in stage.items()}


def bytes_per_axis(records, windows, *, formula: bool = False) -> dict[str, float]:
    """Bytes one rank sent a step, by axis (course.mesh.axis_of: init_device_mesh names its groups "mesh_<axis>";
    "embedding" the tied gradient's sum; the default group's barriers and reported loss left out), over the calls
    recorded inside `windows` (training's "windows"), averaged over the steps: as gloo's sockets counted them
    where they were read (CommRecord.sent), else, and with `formula`, by each call's formula. Sockets' bytes
    are shared among the calls in flight together: DTensor's and pipelining's overlap, so per axis the formula
    is the sharper count, the sockets' sum the total's check. An axis as large as the world runs on torch's
    default group (DeviceMesh reuses it): its calls are left out with the barriers."""
    if not windows or any(window is None for window in windows):
        raise ValueError("bytes_per_axis needs the steps' windows of a launched run (training's 'windows'); "
                         "a run outside course.launch records nothing")
    found: dict[str, float] = {}
    for record in records:
        axis = mesh.axis_of(record)
        if axis is not None and any(start <= record.start <= end for start, end in windows):
            found[axis] = found.get(axis, 0.0) + (record.predicted if formula else record.sent) / len(windows)
    return found
