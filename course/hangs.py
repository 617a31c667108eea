"""Broken programs that hang (or silently disagree) on some ranks, drawn from a seed, and their Flight Recorder.

    program = hangs.draw(seed, 4)        # which ranks branch, at which call, how (skip, reorder, shape)
    entries = hangs.run(program)         # {rank: [FlightEntry, ...]} of the default group, hang or not
    entries = hangs.records(seed, 4)     # the same, without holding the program (a hidden test's way)
    course.launch(hangs.under_detail, 2, args=(program,), collective_timeout=2)   # TORCH_DISTRIBUTED_DEBUG=DETAIL

A program is a list of collectives every rank makes in order (`calls`), each op differing from the next.
Each rank holds a shard of rows drawn from the seed; the ranks in `empty` hold none, and a data-dependent
branch (`if len(shard) == 0`) sends them another way at call `at`:

- "skip": they leave that collective out and go on to the next;
- "reorder": they make the next collective first, then this one;
- "shape": they pass a tensor of the same elements in another shape (a (3, 5) as a (5, 3)).

What gloo does with each, measured on torch 2.13 (tests/test_hangs.py): a skip or a reorder puts two different
ops at one sequence number, and every rank times out after `collective_timeout` (each rank's records come back
with the error); a shape with as many elements completes (gloo moves bytes, not shapes), silently wrong. A
different number of elements under one op is not drawn: gloo aborts a rank (SIGABRT, "Received data size
doesn't match expected size") and that rank's records are lost.

Under TORCH_DISTRIBUTED_DEBUG=DETAIL (`under_detail`), measured: where the branching rank makes another call,
the ranks raise "Detected mismatch between collectives" at the first call where they disagree, whatever the
kind; where it skips its last collective and returns, rank 0 raises "Ranks 2 failed to pass monitoredBarrier"
(DETAIL's check begins with a barrier): the rank, not the call it left out.

`shard_rows` and `regression_shard` give exercise 2's data: rows of a regression, 0 on some ranks.
`broken_average_gradients` is the gradient average that hangs when a rank's shard is empty.

Used in: lab 10 (10_debugging), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course import flight_records
from course.launch import launch

KINDS = ("skip", "reorder", "shape")
OPS = ("all_reduce", "broadcast", "all_gather", "barrier")
#: The process group whose entries `run` keeps (the launch's world group).
GROUP = "default_pg"


@dataclass(frozen=True)
class Program:
    """A drawn broken program: what every rank calls, and where the ranks with an empty shard branch."""
    world_size: int
    calls: tuple[tuple[str, tuple[int, ...]], ...]   # (op, shape) in order; a barrier's shape is ()
    kind: str                                       # one of KINDS
    at: int                                         # the index in `calls` where the empty ranks branch
    empty: tuple[int, ...]                          # the ranks whose shard is empty
    seed: int


def draw(seed: int, world_size: int, kind: str | None = None, empty: tuple[int, ...] | None = None) -> Program:
    """A program of 4 to 7 collectives on `world_size` ranks; kind and empty ranks drawn unless given.

    The empty ranks are fewer than half of the world where world_size > 2 (so most ranks make one call), one
    rank on 2 ranks."""
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"a hang needs at least 2 ranks, got world_size={world_size!r}")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rng = random.Random(seed)
    kind = kind or rng.choice(KINDS)
    calls, last = [], None
    for _ in range(rng.randint(4, 7)):
        op = rng.choice([o for o in OPS if o != last])   # neighbours differ: a skip never meets its own op
        rows, cols = rng.sample(range(2, 7), 2)          # two different sides: the shape's transpose differs
        calls.append((op, () if op == "barrier" else (rows, cols)))
        last = op
    if kind == "shape":
        places = [i for i, (op, _) in enumerate(calls) if op != "barrier"]
    elif kind == "reorder":
        places = list(range(len(calls) - 1))
    else:
        places = list(range(len(calls)))
    at = rng.choice(places)
    if empty is None:
        empty = tuple(sorted(rng.sample(range(world_size), rng.randint(1, max(1, (world_size - 1) // 2)))))
    empty = tuple(sorted(int(r) for r in empty))
    if not empty or any(not 0 <= r < world_size for r in empty) or len(set(empty)) < len(empty):
        raise ValueError(f"empty must name distinct ranks of 0 to {world_size - 1}, at least one; got {empty!r}")
    return Program(world_size, tuple(calls), kind, at, empty, seed)


def shard_rows(seed: int, world_size: int, empty: tuple[int, ...] = ()) -> list[int]:
    """Rows of each rank's shard, drawn from `seed`: 0 on the ranks in `empty`, 1 to 6 on the others."""
    rng = random.Random(seed)
    return [0 if rank in empty else rng.randint(1, 6) for rank in range(world_size)]


def _collective(op: str, shape: tuple[int, ...], group) -> None:
    if op == "barrier":
        dist.barrier(group=group)
        return
    tensor = torch.ones(shape)
    if op == "all_reduce":
        dist.all_reduce(tensor, group=group)
    elif op == "broadcast":
        dist.broadcast(tensor, dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    else:
        dist.all_gather([torch.empty(shape) for _ in range(dist.get_world_size(group))], tensor, group=group)


def broken_step(program: Program, group=None) -> str:
    """One rank's step of the drawn program: its collectives (on `group`, default the world) in order, another way
    where its shard is empty."""
    shard = torch.randn(shard_rows(program.seed, program.world_size, program.empty)[dist.get_rank()], 4)
    calls = list(program.calls)
    for i, (op, shape) in enumerate(calls):
        if i == program.at and len(shard) == 0:              # the data-dependent branch
            if program.kind == "skip":
                continue
            if program.kind == "reorder":
                calls[i], calls[i + 1] = calls[i + 1], calls[i]
                op, shape = calls[i]
            else:
                shape = shape[::-1]
        _collective(op, shape, group)
    return "finished"


def under_detail(program: Program, collective_timeout: float = 2.0) -> str:
    """In a rank: `broken_step` on a new group of every rank made under TORCH_DISTRIBUTED_DEBUG=DETAIL, which
    checks each collective's op and shapes on every rank before it runs (torch reads the variable when a group is
    made: bench/_debug_ranks.py); the variable is restored after."""
    before = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level_from_env()
    try:
        group = dist.new_group(timeout=datetime.timedelta(seconds=collective_timeout))
        return broken_step(program, group)
    finally:
        if before is None:
            os.environ.pop("TORCH_DISTRIBUTED_DEBUG")
        else:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = before
        dist.set_debug_level_from_env()


def _step_and_read(program: Program):
    broken_step(program)
    return flight_records.read()


def run(program: Program, collective_timeout: float = 2.0) -> dict[int, list[flight_records.FlightEntry]]:
    """Launch `program` on its ranks; return each rank's Flight Recorder entries of the world group.

    A hang ends after `collective_timeout` seconds (each waiting rank's own error), and the entries come from
    the exception; a program that completes returns them itself. Either way every rank's are there."""
    if not isinstance(program, Program):
        raise TypeError(f"run takes a hangs.Program (from hangs.draw), got {type(program).__name__}")
    try:
        results = launch(_step_and_read, program.world_size, args=(program,),
                         collective_timeout=collective_timeout)
        found = dict(zip(results.ranks, results))
    except Exception as error:   # noqa: BLE001 - a hang is the expected failure; anything else is re-raised
        found = getattr(error, "flight_records", None) or {}
        missing = [rank for rank in range(program.world_size) if found.get(rank) is None]
        if missing:
            raise RuntimeError(f"the drawn program (seed {program.seed}, {program.kind} on ranks "
                               f"{list(program.empty)}) failed without the Flight Recorder entries of ranks "
                               f"{missing}: see the error above; this torch may keep none for gloo "
                               "(torch 2.6 and later do)") from error
    if any(entries is None for entries in found.values()):
        raise RuntimeError(f"torch {torch.__version__} keeps no Flight Recorder entries for gloo "
                           "(torch 2.6 and later do): there are no records to read")
    return {rank: [entry for entry in found[rank] if entry.group == GROUP] for rank in sorted(found)}


def records(seed: int, world_size: int, collective_timeout: float = 2.0, kind: str | None = None) -> dict[int, list]:
    """The entries of the program drawn from `seed` on `world_size` ranks (`run(draw(seed, world_size, kind))`),
    without handing the program to the caller."""
    return run(draw(seed, world_size, kind), collective_timeout)


# --- exercise 2: a gradient average over shards, some empty ------------------------------------

FEATURES, OUTPUTS = 4, 2


def regression_model(seed: int) -> torch.nn.Linear:
    """The model every rank starts from: Linear(4, 2), its weights from `seed`."""
    with torch.random.fork_rng():               # the caller's random state stays as it was
        torch.manual_seed(seed)
        return torch.nn.Linear(FEATURES, OUTPUTS)


def regression_shard(seed: int, rows: list[int], rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s (inputs (rows[rank], 4), targets (rows[rank], 2)): its slice of the whole batch."""
    inputs, targets = regression_batch(seed, rows)
    first = sum(rows[:rank])
    return inputs[first:first + rows[rank]], targets[first:first + rows[rank]]


def regression_batch(seed: int, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch (every rank's rows, rank 0's first), as one process holds it."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(sum(rows), FEATURES, generator=generator)
    return inputs, inputs @ torch.randn(FEATURES, OUTPUTS, generator=generator) + 0.1


def broken_average_gradients(model, inputs, targets):
    """The broken average: a rank with no rows leaves early, and the others wait in their all_reduce."""
    if len(inputs) == 0:
        return                      # "nothing to contribute": this rank never calls all_reduce
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= dist.get_world_size()
