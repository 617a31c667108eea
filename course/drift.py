"""Replicas that drift apart: data-parallel training with one planted drift, checked after every step.

    results = course.launch(drift.run, 4, args=(replica_check, [drift.Drift("buffer", rank=2, step=3)]))
    results[0]        # [the first report replica_check gave in that training, or None]

Every rank builds the same small model (a Linear, a BatchNorm with its running statistics as buffers, a
Linear), broadcasts its state from rank 0 (as DistributedDataParallel does when it wraps a model), and trains
on its shard of each batch: gradients averaged by all-reduce, SGD with momentum, and the BatchNorm's floating
buffers averaged after each step (so that the replicas stay equal, as SyncBatchNorm would keep them). After each
step `check(model, step)` runs on every rank; the training stops at the first step any rank reports. One drift
is planted (`Drift`):

- "buffer": at step k, rank r runs a validation batch through the model still in train mode (no gradient):
  its BatchNorm's running statistics and count of batches move, its parameters do not;
- "initialisation": a layer replaced after the broadcast, each rank drawing it from its own seed (a head
  re-initialised after the wrap): every rank's differs from step 1 on;
- "permutation": at step k, rank r re-orders a parameter's rows outside the optimizer (its sum unchanged);
- "none": no drift.

Any of them may carry legal noise first (`noise_step`): rank r's parameters moved by one ulp (what another
order of summation gives), which a check must not report. Compare under RTOL and ATOL (the course's float32
tolerance): |c_a - c_b| <= RTOL * scale + ATOL, for a tensor's checksums c on two ranks and its scale.

`draw(seed, world_size, kind)` draws a drift's rank, step and tensor from a seed, inside the ranks when `run`
is given (seed, kind) pairs: a test cell hands the ranks seeds, never the drift itself. `spreads` measures
each tensor's spread across ranks (for a picture).

Used in: lab 10 (10_debugging).
"""
from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from course import placement

#: The lab's tolerance between two replicas' checksums of one tensor (course.check's float32 tolerance).
RTOL, ATOL = 1e-5, 1e-6
STEPS, BATCH, FEATURES, WIDTH, OUTPUTS = 6, 8, 4, 8, 2
LEARNING_RATE, MOMENTUM = 0.1, 0.9
KINDS = ("buffer", "initialisation", "permutation", "none")
#: The parameters a "permutation" may re-order: rows of distinct values (the BatchNorm's start as ones, zeros).
PERMUTED = ("inp.weight", "inp.bias", "out.weight", "out.bias")
REINITIALISED = ("inp", "out")


@dataclass(frozen=True)
class Drift:
    """One planted drift: its kind (KINDS), the rank and step it happens at, the tensor it touches, and the
    step (0: none) at which `rank`'s parameters first move by one ulp (legal noise)."""
    kind: str
    rank: int = 0
    step: int = 1
    tensor: str = ""
    noise_step: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Drift kind {self.kind!r}: choose one of {KINDS}")
        if self.kind == "permutation" and self.tensor not in PERMUTED:
            raise ValueError(f"a permutation re-orders one of {PERMUTED}, not {self.tensor!r}")
        if self.kind == "initialisation" and self.tensor not in [f"{layer}.weight" for layer in REINITIALISED]:
            raise ValueError(f"an initialisation drift replaces inp or out: tensor 'inp.weight' or 'out.weight', "
                             f"not {self.tensor!r}")
        if not 1 <= self.step <= STEPS or not 0 <= self.noise_step <= STEPS:
            raise ValueError(f"step {self.step}, noise_step {self.noise_step}: steps run 1 to {STEPS} (0: no noise)")

    def describe(self) -> str:
        """The drift in words."""
        said = {"buffer": f"rank {self.rank} runs a validation batch in train mode at step {self.step}",
                "initialisation": f"{self.tensor.split('.')[0]} replaced after the broadcast, each rank its own "
                                  "seed",
                "permutation": f"rank {self.rank} re-orders {self.tensor}'s rows at step {self.step}",
                "none": "no drift"}[self.kind]
        return said + (f"; rank {self.rank}'s parameters one ulp off from step {self.noise_step}"
                       if self.noise_step else "")


def draw(seed: int, world_size: int, kind: str) -> Drift:
    """A drift of `kind` drawn from `seed`: its rank, step and tensor, with legal noise at an earlier step."""
    if kind not in KINDS:
        raise ValueError(f"draw: kind {kind!r}; choose one of {KINDS}")
    rng = random.Random(seed)
    rank, step = rng.randrange(world_size), rng.randint(3, STEPS)
    tensor = {"permutation": rng.choice(PERMUTED),
              "initialisation": f"{rng.choice(REINITIALISED)}.weight"}.get(kind, "")
    return Drift(kind, rank=rank, step=1 if kind == "initialisation" else step, tensor=tensor,
                 noise_step=rng.randint(1, step - 1))


def make_model(seed: int = 0) -> nn.Sequential:
    """The model every replica trains: inp (Linear), norm (BatchNorm1d: buffers), act, out (Linear)."""
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(inp=nn.Linear(FEATURES, WIDTH), norm=nn.BatchNorm1d(WIDTH), act=nn.ReLU(),
                                     out=nn.Linear(WIDTH, OUTPUTS)))


def batches(seed: int, steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every step's whole batch, (inputs, targets), the same on every rank; the last is the validation batch."""
    generator = torch.Generator().manual_seed(seed + 1)
    return [(3 * torch.randn(BATCH, FEATURES, generator=generator) + 1, torch.randn(BATCH, OUTPUTS,
                                                                                    generator=generator))
            for _ in range(steps + 1)]


def _all_reduce_mean(tensor: torch.Tensor) -> None:
    moved = tensor.detach().to(placement.message_device())
    dist.all_reduce(moved)
    tensor.copy_(moved.to(tensor.device) / dist.get_world_size())


@torch.no_grad()
def _plant(model: nn.Module, drift: Drift, step: int, rank: int, validation: torch.Tensor) -> None:
    if drift.noise_step == step and drift.rank == rank:          # legal noise: one ulp, as a reduction reordered
        for parameter in model.parameters():
            parameter.copy_(torch.nextafter(parameter, torch.full_like(parameter, float("inf"))))
    if drift.step != step or drift.rank != rank:
        return
    if drift.kind == "buffer":
        model(validation)                                        # still in train mode: the running stats move
    elif drift.kind == "permutation":
        tensor = model.state_dict()[drift.tensor]
        tensor.copy_(tensor.roll(1, dims=0))


def train(check, drift: Drift, *, seed: int = 0, steps: int = STEPS, stop: bool = True, watch: bool = False):
    """Runs on every rank: the data-parallel training with `drift` planted, `check(model, step)` after each
    step. Returns {"report": the first report (None if none), "step": the last step run, "spreads": {step:
    spreads(model)} where watch}; stops at the first report unless stop is False."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    where = placement.device()
    model = make_model(seed).to(where)
    with torch.no_grad():
        for tensor in model.state_dict().values():               # as DistributedDataParallel does when it wraps
            moved = tensor.to(placement.message_device())
            dist.broadcast(moved, 0)
            tensor.copy_(moved.to(where))
        if drift.kind == "initialisation":                       # replaced after the wrap: each rank's own seed
            layer = getattr(model, drift.tensor.split(".")[0])
            generator = torch.Generator().manual_seed(seed + 100 + rank)
            layer.weight.copy_(torch.rand(layer.weight.shape, generator=generator).to(where) - 0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    data = batches(seed, steps)
    validation = data[-1][0].to(where)
    report, watched, step = None, {}, 0
    for step in range(1, steps + 1):
        inputs, targets = (whole[rank::world_size].to(where) for whole in data[step - 1])
        model.train()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                _all_reduce_mean(parameter.grad)
        optimizer.step()
        with torch.no_grad():
            for buffer in model.buffers():
                if buffer.is_floating_point():
                    _all_reduce_mean(buffer)
        _plant(model, drift, step, rank, validation)
        if watch:
            watched[step] = spreads(model)
        found = check(model, step)
        if report is None:
            report = found
        if stop and _any_rank(found is not None):                # together: a rank alone stopping would hang
            break
    return {"report": report, "step": step, "spreads": watched}


def _any_rank(flag: bool) -> bool:
    said = torch.tensor([int(flag)], device=placement.message_device())
    dist.all_reduce(said, op=dist.ReduceOp.MAX)
    return bool(said.item())


def run(check, cases, *, seed: int = 0) -> list:
    """Runs on every rank: for each case (a Drift, or (seed, kind) to `draw` here, in the ranks), the first
    report `check` gave in its training (None if none)."""
    found = []
    for case in cases:
        drift = case if isinstance(case, Drift) else draw(int(case[0]), dist.get_world_size(), case[1])
        found.append(train(check, drift, seed=seed)["report"])
    return found


@torch.no_grad()
def spreads(model: nn.Module) -> dict[str, float]:
    """Runs on every rank: each tensor of model.state_dict() (in its order), its largest difference between two
    ranks over its largest magnitude (0: the same on every rank); all its values gathered (a small model)."""
    found = {}
    for name, tensor in model.state_dict().items():
        mine = tensor.detach().to(placement.message_device(), torch.float64).reshape(-1)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        stacked = torch.stack(every).cpu()
        width = (stacked.max(0).values - stacked.min(0).values).max().item() if mine.numel() else 0.0
        found[name] = width / max(stacked.abs().max().item(), 1e-30) if width else 0.0
    return found
