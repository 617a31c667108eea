"""Lab 9's training step on a grid: 1F1B over the pipeline, the students' reductions, clipping, ZeRO-1.

    trainer = grid_step.Trainer(config, grid, micro_batches=2, cross_entropy=..., micro_batch_loss=...,
                                reduce_gradients=..., grad_norm=..., seed=0)
    loss, norm = trainer.step(inputs, targets)        # one step on the whole batch; every rank gets the same
    run = grid_step.train(config, batches, grid, ...)   # a loop of steps: GridRun(losses, norms, parameters, ...)

Each rank builds `gpt_stage.Stage(gpt.GPT(config, seed), grid)` and, at each step:
1. takes its slice of the batch: data rank d the rows d·B/dp .., context rank c the c-th contiguous chunk of
   the sequence, cut into `micro_batches` micro-batches of rows;
2. runs course.pipeline's 1F1B order for its stage: a forward receives the previous stage's activations
   (b, t/cp/tp, w) and sends its own on; a backward receives the next stage's gradient and sends the one
   of its input back; sends are isend (never waited for before the step ends), receives wait, so two
   neighbours sending to each other at once cannot deadlock. On the last stage each micro-batch's loss is
   `micro_batch_loss(cross_entropy(logits, targets, tp group), targets, step_targets, grid)`;
3. `reduce_gradients(stage, grid)`, then `grad_norm(stage, grid)`; every rank scales its gradients by the
   same factor where the norm exceeds `clip` (as gpt.clip_);
4. ZeRO-1 over the ranks that hold the same parameters (`grid.groups["dp_cp"]`): the stage's parameters,
   flattened into one vector, are cut as course.sharding cuts them; this rank updates its chunk (SGD with
   momentum, `gpt.sgd_step_`, the velocities of that chunk only) and one all-gather makes the whole again.
The step's loss (every micro-batch's, summed over the stage's dp_cp replicas, from the last stage) and norm
reach every rank through calls left out of the records (`course.recorder.unrecorded`): they report, they are
not the algorithm's bytes. Everything else is recorded, each call on its axis's group (course.mesh.axis_of).

The students' four functions are arguments, so that the lab's tests can run the step with their answers or
with stand-ins (one mistake costs one exercise). `step_gradients` is steps 1-3 without the update.

Used in: lab 9 (09_composition).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from course import gpt, gpt_stage, pipeline, placement, recorder, sharding


@dataclass
class GridRun:
    losses: list[float]                   # each step's loss, before its update (every rank the same)
    norms: list[float]                    # each step's gradient norm, before clipping
    parameters: dict[str, torch.Tensor]   # the whole model after the last step, by GPT's names
    seconds: list[float] = field(default_factory=list)   # each step's wall time on this rank

    @property
    def median_seconds(self) -> float:
        """The median step time (the lab's measure: the first step pays for warming up)."""
        return statistics.median(self.seconds)


def local_batch(inputs: torch.Tensor, targets: torch.Tensor, grid, micro_batches: int):
    """This rank's (inputs, targets, positions) of a global batch (B, T): data rank d's rows d·B/dp ..,
    context rank c's contiguous chunk c of the sequence; refuses a B that dp·micro_batches does not divide."""
    dp, cp, d, c = grid.sizes["dp"], grid.sizes["cp"], grid.coords["dp"], grid.coords["cp"]
    rows, length = inputs.shape
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive whole number, got {micro_batches!r}")
    if rows % (dp * micro_batches):
        raise ValueError(f"a batch of {rows} sequences does not split into dp × micro_batches = {dp} × "
                         f"{micro_batches} = {dp * micro_batches} equal parts: choose a batch that "
                         f"{dp * micro_batches} divides, or fewer micro-batches")
    if length % cp:
        raise ValueError(f"a sequence of {length} tokens does not split into cp = {cp} equal chunks")
    mine, chunk = slice(d * rows // dp, (d + 1) * rows // dp), slice(c * length // cp, (c + 1) * length // cp)
    return inputs[mine, chunk], targets[mine, chunk], torch.arange(length)[chunk]


def step_gradients(stage, grid, inputs, targets, *, micro_batches: int, cross_entropy, micro_batch_loss,
                   reduce_gradients) -> float:
    """One step's forward and backward on the grid (1F1B) and `reduce_gradients`, no update: the gradients are
    left in the stage's parameters. Returns the step's loss, the same on every rank."""
    device = next(stage.parameters()).device
    tokens, step_targets, positions = (t.to(device) for t in local_batch(inputs, targets, grid, micro_batches))
    token_parts, target_parts = tokens.chunk(micro_batches), step_targets.chunk(micro_batches)
    pp, p = grid.sizes["pp"], grid.coords["pp"]
    group = grid.groups["pp"]
    shard = (token_parts[0].shape[0], positions.numel() // grid.sizes["tp"], stage.config.width)
    held: dict[int, tuple] = {}                  # micro-batch -> (its input, its output or loss)
    sends, loss = [], torch.zeros((), dtype=torch.float64)
    for action, i in pipeline.actions("1f1b", p, pp, micro_batches):
        if action == "F":
            if grid.first_stage:
                x = token_parts[i]
            else:
                x = torch.empty(shard, device=placement.message_device())
                dist.recv(x, grid.previous_rank, group=group)
                x = x.to(device).requires_grad_()
            out = stage(x, positions)
            if grid.last_stage:
                out = _checked_loss(grid, i, cross_entropy, micro_batch_loss, out, target_parts[i], step_targets)
                loss += out.detach().double().cpu()
            else:
                sends.append(dist.isend(_to_send(out), grid.next_rank, group=group))
            held[i] = (x, out)
        else:
            x, out = held.pop(i)
            if grid.last_stage:
                out.backward()
            else:
                grad = torch.empty(out.shape, device=placement.message_device())
                dist.recv(grad, grid.next_rank, group=group)
                out.backward(grad.to(out.device))
            if not grid.first_stage:
                sends.append(dist.isend(_to_send(x.grad), grid.previous_rank, group=group))
    for work in sends:
        work.wait()
    reduce_gradients(stage, grid)
    with recorder.unrecorded():               # reporting, not the step's traffic
        dist.all_reduce(loss, group=grid.groups["dp_cp"])
        if pp > 1:
            dist.broadcast(loss, grid.ranks["pp"][-1], group=group)
    return float(loss)


def _checked_loss(grid, i, cross_entropy, micro_batch_loss, logits, targets, step_targets) -> torch.Tensor:
    """Micro-batch i's loss from the students' two functions, refused in words where it cannot be backpropagated."""
    token_losses = cross_entropy(logits, targets, grid.groups["tp"])
    where = f"rank {grid.rank} ({grid.describe()}), micro-batch {i}"
    if not isinstance(token_losses, torch.Tensor) or tuple(token_losses.shape) != tuple(targets.shape):
        got = tuple(token_losses.shape) if isinstance(token_losses, torch.Tensor) else type(token_losses).__name__
        raise ValueError(f"{where}: cross_entropy returned {got}, expected one loss per token, the targets' shape "
                         f"{tuple(targets.shape)}")
    loss = micro_batch_loss(token_losses, targets, step_targets, grid)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
        got = f"shape {tuple(loss.shape)}, requires_grad={loss.requires_grad}" if isinstance(loss, torch.Tensor) \
            else type(loss).__name__
        raise ValueError(f"{where}: micro_batch_loss returned {got}; it must return one number, a tensor of "
                         f"shape () computed from token_losses (not detached), for backward")
    return loss


def _to_send(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(placement.message_device()).contiguous()


class Trainer:
    """One rank's training on the grid, a step at a time (`step`), so that a run can be saved and resumed:
    its `stage`, its `velocities` ({local name: tensor of the parameter's shape}, up to date on this rank's
    ZeRO-1 chunk only) and `steps_done`."""

    def __init__(self, config: gpt.Config, grid, *, micro_batches: int, cross_entropy, micro_batch_loss,
                 reduce_gradients, grad_norm, seed: int = 0, learning_rate: float = gpt.LEARNING_RATE,
                 momentum: float = gpt.MOMENTUM, clip: float = gpt.CLIP):
        self.config, self.grid, self.micro_batches = config, grid, micro_batches
        self.cross_entropy, self.micro_batch_loss = cross_entropy, micro_batch_loss
        self.reduce_gradients, self.grad_norm = reduce_gradients, grad_norm
        self.learning_rate, self.momentum, self.clip = learning_rate, momentum, clip
        self.stage = gpt_stage.Stage(gpt.GPT(config, seed), grid).to(placement.device())
        self._names = [name for name, _ in self.stage.named_parameters()]
        self._parameters = [p for _, p in self.stage.named_parameters()]
        self._length = sum(p.numel() for p in self._parameters)
        self._replicas = grid.sizes["dp"] * grid.sizes["cp"]
        self._replica = grid.ranks["dp_cp"].index(grid.rank)
        self._velocity = torch.zeros(self._length, device=placement.device())
        self.velocities = dict(zip(self._names, self._unflat(self._velocity)))
        self.steps_done = 0
        self.seconds: list[float] = []

    def _unflat(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of `flat` shaped as the stage's parameters, in order."""
        return [piece.view(p.shape) for piece, p in zip(flat.split([p.numel() for p in self._parameters]),
                                                        self._parameters)]

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
        """One training step on the global batch (inputs, targets), both (B, T); returns (loss, norm)."""
        _synchronize()
        start = time.perf_counter()
        for p in self._parameters:
            p.grad = None
        loss = step_gradients(self.stage, self.grid, inputs, targets, micro_batches=self.micro_batches,
                              cross_entropy=self.cross_entropy, micro_batch_loss=self.micro_batch_loss,
                              reduce_gradients=self.reduce_gradients)
        norm = float(self.grad_norm(self.stage, self.grid))
        if not math.isfinite(norm):
            raise ValueError(f"rank {self.grid.rank} ({self.grid.describe()}): the gradient norm is {norm} at "
                             f"step {self.steps_done}: a loss or a gradient is not a number")
        self._update(self.clip / (norm + 1e-6) if norm > self.clip else 1.0)      # as gpt.clip_ scales
        self.steps_done += 1
        _synchronize()
        self.seconds.append(time.perf_counter() - start)
        return loss, norm

    @torch.no_grad()
    def _update(self, scale: float) -> None:
        """Clip (scale every gradient alike), then SGD with momentum on this rank's chunk, then all-gather."""
        flat = sharding.flat(self._parameters)
        grads = sharding.flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self._parameters])
        if scale != 1.0:
            grads.mul_(scale)
        r, n = self._replica, self._replicas
        chunk = sharding.chunk_of(flat, r, n)
        gpt.sgd_step_(chunk, sharding.chunk_of(grads, r, n), sharding.chunk_of(self._velocity, r, n),
                      learning_rate=self.learning_rate, momentum=self.momentum)
        if n > 1:
            flat = sharding.all_gather(chunk, self._length, self.grid.groups["dp_cp"])
        for p, piece in zip(self._parameters, self._unflat(flat)):
            p.copy_(piece)

    def velocities_whole(self) -> dict[str, torch.Tensor]:
        """{local name: the whole velocity}, every replica's chunk all-gathered over dp_cp (a collective)."""
        r, n = self._replica, self._replicas
        whole = self._velocity.clone() if n == 1 else sharding.all_gather(
            sharding.chunk_of(self._velocity, r, n), self._length, self.grid.groups["dp_cp"])
        return {name: v.clone() for name, v in zip(self._names, self._unflat(whole))}

    @torch.no_grad()
    def load_velocities(self, whole: dict[str, torch.Tensor]) -> None:
        """Take {local name: whole velocity} (as velocities_whole gives): this rank keeps what it updates."""
        for name, v in self.velocities.items():
            if name not in whole or tuple(whole[name].shape) != tuple(v.shape):
                got = "none" if name not in whole else f"shape {tuple(whole[name].shape)}"
                raise ValueError(f"rank {self.grid.rank}: the velocity of {name!r} must have shape "
                                 f"{tuple(v.shape)}, got {got}")
            v.copy_(whole[name])

    def run(self) -> GridRun:
        """What train returns, from this trainer's state (the parameters gathered: a collective)."""
        return GridRun([], [], gpt_stage.full_parameters(self.stage, self.grid), list(self.seconds))


def train(config: gpt.Config, batches, grid, *, micro_batches: int, cross_entropy, micro_batch_loss,
          reduce_gradients, grad_norm, seed: int = 0, learning_rate: float = gpt.LEARNING_RATE,
          momentum: float = gpt.MOMENTUM, clip: float = gpt.CLIP) -> GridRun:
    """Train GPT(config, seed) on `batches` on the grid, one step a batch: what gpt.one_process_training
    computes, up to the order of the sums."""
    trainer = Trainer(config, grid, micro_batches=micro_batches, cross_entropy=cross_entropy,
                      micro_batch_loss=micro_batch_loss, reduce_gradients=reduce_gradients, grad_norm=grad_norm,
                      seed=seed, learning_rate=learning_rate, momentum=momentum, clip=clip)
    losses, norms = [], []
    for inputs, targets in batches:
        loss, norm = trainer.step(inputs, targets)
        losses.append(loss)
        norms.append(norm)
    run = trainer.run()
    run.losses, run.norms = losses, norms
    return run


def _synchronize() -> None:
    if torch.cuda.is_available() and placement.device().type == "cuda":
        torch.cuda.synchronize()
