"""Pipeline parallelism: the order each stage runs its micro-batches in, the stage × time grid
that order predicts, its bubble, the activations it keeps alive and the bytes it sends.

Pure arithmetic, no torch, beside `course.sizes` (bytes of a dtype) and `course.transfer`
(argument checks), so that a slider can ask it anything.

    actions("1f1b", 0, 4, 8)[:5]          # [('F', 0), ('F', 1), ('F', 2), ('F', 3), ('B', 0)]
    grid_bubble(grid("gpipe", 4, 8))      # 3/11, the formula's (N-1)/(m+N-1)
    bubble_over_compute(4, 8)             # 3/8, the same bubble over the compute time, not the step

A model is cut by its layers into N stages, stage s on rank s (0-based); the batch into m
micro-batches. A stage runs F(i), the forward of micro-batch i, after the stage before it
sent it F(i)'s input; and B(i), the backward, after the stage after it sent B(i)'s gradient
(the last stage: after its own F(i)). Two schedules (`SCHEDULES`), as torch's
ScheduleGPipe and Schedule1F1B order them (`actions`):

- "gpipe": every forward, then every backward: F0 .. F(m-1), B0 .. B(m-1);
- "1f1b": w = min(N-s-1, m) warm-up forwards, then one forward and one backward in turn,
  then the remaining backwards. Same step time, but at most min(N-s, m) micro-batches'
  activations alive on stage s, against GPipe's m (`peak_micro_batches`).

Assumed: equal stages (every stage takes `forward` seconds for a micro-batch's forward and
`backward` for its backward), sends that cost `transfer` seconds and overlap nothing else,
and nothing else in the step (no optimizer, no loss). With transfer 0 both schedules take
(m+N-1)(f+b) and leave the bubble (N-1)/(m+N-1) of the stages × time area idle.

`stages` and `micro_batches` (N and m) are `pp` and `m` in `course.choosing`
(CONTRIBUTING.md, "Words", says why).

Used in: lab 6 (06_pipeline_parallel), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from course import sizes, transfer

SCHEDULES = ("gpipe", "1f1b")
ACTIONS = ("F", "B")


def _check_schedule(schedule) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {schedule!r}")


def _check_counts(stages, micro_batches) -> None:
    transfer.check_ranks(stages, "stages", counting="stages")
    transfer.check_ranks(micro_batches, "micro_batches", counting="micro-batches")


def _check_stage(stage, stages) -> None:
    transfer.check_ranks(stages, "stages", counting="stages")
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or not 0 <= stage < stages:
        raise ValueError(f"stage {stage!r} must lie in 0..{stages - 1}: stages count from 0 (stage s runs on "
                         f"rank s), among stages={stages}")


def _check_seconds(value, name: str, *, positive: bool) -> None:
    floor = "more than 0" if positive else "at least 0"
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value < 0 or (positive and value == 0)):
        raise ValueError(f"{name} must be a number of seconds, {floor}, got {name}={value!r}")


def _check_whole(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {name}={value!r}")


def actions(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The order in which `stage` of `stages` runs ("F", i) and ("B", i), i the micro-batch."""
    _check_schedule(schedule)
    _check_counts(stages, micro_batches)
    _check_stage(stage, stages)
    m = micro_batches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm_up = min(stages - stage - 1, m)
    steady = [action for i in range(m - warm_up) for action in (("F", warm_up + i), ("B", i))]
    return [("F", i) for i in range(warm_up)] + steady + [("B", i) for i in range(m - warm_up, m)]


@dataclass(frozen=True)
class Slot:
    """One action on the grid: `stage` runs `action` ("F" or "B") of `micro_batch` from `start` to `end` (s)."""
    stage: int
    action: str
    micro_batch: int
    start: float
    end: float


def grid(schedule: str, stages: int, micro_batches: int, *, forward: float = 1.0, backward: float = 2.0,
         transfer: float = 0.0) -> list[Slot]:
    """The predicted stage × time grid, by stage then time: each stage runs its `actions` in order,
    each as soon as its input has arrived (`transfer` seconds after the neighbour's action ended)
    and the stage's previous action has ended. forward, backward: seconds of one micro-batch on
    one stage, the same on every stage (equal stages assumed)."""
    _check_schedule(schedule)
    _check_counts(stages, micro_batches)
    _check_seconds(forward, "forward", positive=True)
    _check_seconds(backward, "backward", positive=True)
    _check_seconds(transfer, "transfer", positive=False)
    orders = [actions(schedule, s, stages, micro_batches) for s in range(stages)]
    took = {"F": forward, "B": backward}
    ended: dict[tuple[int, str, int], float] = {}
    done, free = [0] * stages, [0.0] * stages      # actions run, and when the stage is next free
    slots = []
    while any(done[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            while done[s] < len(orders[s]):
                action, i = orders[s][done[s]]
                if action == "F":
                    needs, sent = ((s - 1, "F", i), True) if s > 0 else (None, False)
                else:
                    needs, sent = ((s + 1, "B", i), True) if s < stages - 1 else ((s, "F", i), False)
                if needs is not None and needs not in ended:
                    break                           # waits for a neighbour: try the other stages
                ready = 0.0 if needs is None else ended[needs] + (transfer if sent else 0.0)
                start = max(ready, free[s])
                free[s] = ended[(s, action, i)] = start + took[action]
                slots.append(Slot(s, action, i, start, free[s]))
                done[s] += 1
                moved = True
        if not moved:   # cannot happen for SCHEDULES; a guard against an order that deadlocks
            raise RuntimeError(f"the {schedule} order deadlocks: every stage waits for another")
    return sorted(slots, key=lambda slot: (slot.stage, slot.start))


def step_time(schedule: str, stages: int, micro_batches: int, *, forward: float = 1.0, backward: float = 2.0,
              transfer: float = 0.0) -> float:
    """Seconds from the first forward to the last backward (the grid's makespan)."""
    slots = grid(schedule, stages, micro_batches, forward=forward, backward=backward, transfer=transfer)
    return max(slot.end for slot in slots)


def grid_bubble(slots, stages: int | None = None) -> float:
    """The idle fraction of the stages × time area of a grid (predicted or measured): 1 - busy / area,
    the time running from the earliest start to the latest end. stages: the rows (None: one more
    than the highest stage among the slots)."""
    slots = list(slots)
    if not slots:
        raise ValueError("a grid with no slots has no bubble: pass the slots of grid() or of a measured run")
    rows = max(slot.stage for slot in slots) + 1 if stages is None else stages
    transfer.check_ranks(rows, "stages", counting="stages")
    length = max(slot.end for slot in slots) - min(slot.start for slot in slots)
    if length <= 0:
        raise ValueError("the slots take no time: a bubble needs a grid whose last end comes after its first start")
    return 1.0 - sum(slot.end - slot.start for slot in slots) / (rows * length)


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The formula: (N-1)/(m+N-1), N stages and m micro-batches (GPipe's paper; 1F1B's too)."""
    _check_counts(stages, micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


def bubble_over_compute(stages: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The other definition: the bubble's time over the time a stage computes, (N-1)/(v·m), as Megatron-LM
    (Narayanan et al., 2021) and the Ultra-Scale Playbook quote it; v model chunks per rank for the
    interleaved schedule (1: GPipe, 1F1B). For v = 1 it is f/(1-f), f the idle share `bubble_fraction`."""
    _check_counts(stages, micro_batches)
    _check_whole(virtual_stages, "virtual_stages")
    return (stages - 1) / (virtual_stages * micro_batches)


def peak_micro_batches(schedule: str, stage: int, stages: int, micro_batches: int) -> int:
    """The most micro-batches whose activations `stage` keeps at once (forward run, backward not yet):
    m under GPipe, min(N-s, m) under 1F1B."""
    _check_schedule(schedule)
    _check_counts(stages, micro_batches)
    _check_stage(stage, stages)
    return micro_batches if schedule == "gpipe" else min(stages - stage, micro_batches)


def boundary_elements(batch: int, width: int) -> int:
    """Elements crossing one stage boundary per step, one way: the (batch, width) activations
    (all micro-batches together), or their gradients on the way back."""
    _check_whole(batch, "batch")
    _check_whole(width, "width")
    return batch * width


def sent_per_step(stage: int, stages: int, *, batch: int, width: int, dtype: str = "float32") -> int | float:
    """Bytes `stage` sends per step: its output activations forward (every stage but the last) and
    its input's gradients backward (every stage but the first), each `boundary_elements`. What a
    stage receives is what its neighbours send it. The micro-batches split the batch, not the bytes."""
    _check_stage(stage, stages)
    ways = (stage < stages - 1) + (stage > 0)
    return sizes.nbytes(ways * boundary_elements(batch, width), dtype)


def busiest_sent_per_step(stages: int, *, batch: int, width: int, dtype: str = "float32") -> int | float:
    """The most bytes any stage sends per step: a middle stage's, both ways, from 3 stages on."""
    return max(sent_per_step(s, stages, batch=batch, width=width, dtype=dtype) for s in range(stages))


def stage_seconds(layer_seconds: float, layers: int, stages: int, micro_batches: int) -> float:
    """Seconds one micro-batch takes on the slowest stage: `layers` layers of `layer_seconds` each
    (for the whole batch), cut into stages of whole layers, ceil(layers/stages) on the slowest.
    Assumed: a layer's time is proportional to its batch (small micro-batches are slower than that
    on a GPU: less work per launch)."""
    _check_seconds(layer_seconds, "layer_seconds", positive=True)
    _check_counts(stages, micro_batches)
    _check_whole(layers, "layers")
    if stages > layers:
        raise ValueError(f"{layers} layers cannot be cut into {stages} stages of whole layers: "
                         f"choose at most {layers} stages")
    return -(-layers // stages) * layer_seconds / micro_batches


def model_step_time(schedule: str, stages: int, micro_batches: int, *, layers: int, layer_forward: float,
                    layer_backward: float, transfer: float = 0.0) -> float:
    """Predicted seconds of a step of a model of `layers` equal layers, each taking `layer_forward` and
    `layer_backward` seconds for the whole batch, every stage paced by the slowest (`stage_seconds`)."""
    return step_time(schedule, stages, micro_batches, transfer=transfer,
                     forward=stage_seconds(layer_forward, layers, stages, micro_batches),
                     backward=stage_seconds(layer_backward, layers, stages, micro_batches))
