"""A saved run, loaded on another grid: lab 9's checkpoints with torch.distributed.checkpoint (DCP).

    with grid_checkpoint.folder("lab9_run") as path:            # in the notebook: ./lab9_run, removed after
        course.launch(save_after_steps, 8, args=(path,))        # on each rank: grid_checkpoint.save(trainer, grid,
        course.launch(resume, 4, args=(path,))                  #   path, checkpoint_state); later, on another
                                                                #   grid: grid_checkpoint.load(...), then train on

A rank holds slices of the model: its stage's layers (pipeline), a part of each split matrix (tensor), and
replicas of what other ranks hold too (data, context, and tensor for the replicated vectors). DCP saves each
tensor under a global name as a DTensor: the local slice, the mesh it is split over (the rank's tensor-parallel
group) and its placement (Shard(dim) or Replicate()) say which part of the whole tensor this rank holds. From
those, DCP writes every piece once (replicas are deduplicated across the world) and, on load, reads for each
rank the part its own DTensors ask for, whatever grid wrote it: a run saved on dp 2 × tp 2 × pp 2 (8 ranks)
resumes on dp 4 × tp 2, or on tp 2 alone (2 ranks).

`checkpoint_state(local, grid)` is the student's (lab 9's exercise 6): {local name: tensor} to {global name:
DTensor}. `save` calls it for the stage's parameters and again for the optimizer's velocities (saved under
"momentum/<global name>"), beside the steps done ("steps_done") and the sizes of the grid that saved it
("grid/sizes"); `load` calls it on the new grid's stage, and DCP copies the saved values into the DTensors'
local tensors in place (so they must be the stage's own tensors, not copies). A checkpoint is a folder
(DCP's ".metadata" and one "__<rank>_0.distcp" a saving rank); `folder` makes one in the notebook's working
directory (under grading, the jail's /home/student/<lab>) and removes it after.

DCP does not notice the classic mistakes (found on torch 2.13, gloo): a stage's layers saved under their local
index (blocks.0 on every stage) collide and DCP keeps one stage's, silently; a split tensor declared Replicate()
is written as one rank's shard, silently; a row-split weight declared Shard(0) saves a tensor of the wrong shape,
which loads back on the same grid and fails only on another. So `save` and `load` check the DTensors first
(`problems`): every global name of the stage there once, each the model's global shape, on this rank's tp group,
holding the stage's own tensor; and `load` checks the checkpoint's names and shapes against the model's. Every
rank learns every rank's problems (one all-gather) and raises the same error: none is left waiting inside DCP.

Torch: DCP's `save`/`load(checkpoint_id=)` are torch 2.2's, DTensor public (torch.distributed.tensor) from 2.5,
torch.distributed._tensor on 2.4. Written and tested on torch 2.13 (CPU, gloo).

Used in: lab 9 (09_composition).
"""
from __future__ import annotations

import contextlib
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from course import gpt_stage

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch 2.4
    from torch.distributed._tensor import DTensor

#: The key prefix of the optimizer's velocities in a checkpoint.
MOMENTUM = "momentum/"
#: The keys of the steps done and the grid's sizes (pp, dp, cp, tp) a checkpoint was saved on.
STEPS, SAVED_ON = "steps_done", "grid/sizes"
AXES = ("pp", "dp", "cp", "tp")


@contextlib.contextmanager
def folder(name: str = "lab9_checkpoint"):
    """A fresh folder `name` in the working directory (the notebook's) for a checkpoint, removed after; one left
    by an earlier run is removed first, a folder holding anything but a checkpoint's files is refused."""
    if not isinstance(name, str) or name in ("", ".", "..") or os.sep in name or (os.altsep or os.sep) in name:
        raise ValueError(f"a checkpoint's folder is a plain folder name in the working directory, got {name!r}")
    path = os.path.abspath(name)
    if os.path.exists(path):
        others = [f for f in sorted(os.listdir(path)) if not _checkpoint_file(os.path.join(path, f))]
        if others or not os.path.isdir(path):
            raise ValueError(f"{path} holds other things than a checkpoint ({', '.join(others) or 'a file'}): "
                             f"choose another folder name, or move them away")
        shutil.rmtree(path)
    os.makedirs(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _checkpoint_file(path: str) -> bool:
    """Whether `path` is a file DCP's file system writer makes (a checkpoint may be a folder of checkpoints)."""
    name = os.path.basename(path)
    if os.path.isdir(path):
        return all(_checkpoint_file(os.path.join(path, f)) for f in os.listdir(path))
    return name == ".metadata" or name.endswith(".distcp")


def problems(state, local: dict, stage, grid, what: str = "parameters") -> list[str]:
    """What is wrong with `state` (checkpoint_state's answer for `local`, {local name: tensor} of this rank's
    `stage`: its parameters or tensors of their shapes) as a checkpoint of the stage: [] when nothing is."""
    where = f"rank {grid.rank} ({grid.describe()})"
    if not isinstance(state, dict):
        return [f"{where}: checkpoint_state must return {{global name: DTensor}}, got {type(state).__name__}"]
    shapes = gpt_stage.global_shapes(stage.config)
    expected = {stage.global_name(name) for name, _ in stage.named_parameters()}
    owner = {t.data_ptr(): name for name, t in local.items()}
    used: dict[str, str] = {}
    found = []
    for key, value in state.items():
        said = f"{where}: the {what}' {key!r}"
        if not isinstance(value, DTensor):
            found.append(f"{said} is a {type(value).__name__}, not a DTensor: wrap the local tensor with "
                         f"DTensor.from_local(tensor, grid.tp_mesh(), [placement])")
            continue
        if key not in shapes:
            found.append(f"{said} is no parameter of the model; its names are embedding.weight (the last stage's "
                         f"head.weight too: one matrix), position.weight, blocks.<layer>.…, ln_f.weight, ln_f.bias")
            continue
        if key not in expected:
            why = (f"a block's global name has its global layer index (the local index + {stage.first_layer})"
                   if key.startswith("blocks.") else "the first stage holds the embeddings, the last ln_f and the "
                   "output layer")
            found.append(f"{said} is not this stage's: it holds layers {_span(stage.layer_range)}; {why}")
            continue
        ranks = [int(r) for r in value.device_mesh.mesh.flatten()]
        if ranks != list(grid.ranks["tp"]):
            found.append(f"{said} is a DTensor over the ranks {ranks}, but this rank's tensor-parallel group is "
                         f"{list(grid.ranks['tp'])}: build it on grid.tp_mesh()")
            continue
        if tuple(value.shape) != shapes[key]:
            placements = ", ".join(str(p) for p in value.placements)
            found.append(f"{said} has the global shape {tuple(value.shape)} (a local {tuple(value.to_local().shape)} "
                         f"placed {placements} over {len(ranks)} tensor-parallel ranks), but the model's {key} is "
                         f"{shapes[key]}: its placement must name the dimension the tp ranks split it along "
                         f"(Shard(dim)), or Replicate() where every tp rank holds the whole")
            continue
        name = owner.get(value.to_local().data_ptr())
        if name is None or tuple(local[name].shape) != tuple(value.to_local().shape):
            found.append(f"{said} holds a tensor that is not one of this stage's {what} (a copy?): DCP loads into "
                         f"the DTensor's local tensor in place, so give DTensor.from_local the tensor itself")
            continue
        if name in used:
            found.append(f"{said} and {used[name]!r} both hold the local {name!r}")
            continue
        used[name] = key
    if not found:
        for name in sorted(set(local) - set(used)):
            found.append(f"{where}: the local {what}' {name!r} is in no DTensor of checkpoint_state's answer")
        for key in sorted(expected - set(state)):
            found.append(f"{where}: the {what}' {key!r} is missing: every parameter of this stage needs its global "
                         f"name")
    return found


def saved_problems(path: str, config) -> list[str]:
    """What is wrong with the checkpoint in `path` as one of the model `config`: [] when nothing is."""
    try:
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    except FileNotFoundError:
        return [f"there is no checkpoint in {path}: save one there first (grid_checkpoint.save)"]
    found = []
    for prefix in ("", MOMENTUM):
        for name, shape in gpt_stage.global_shapes(config).items():
            entry = saved.get(prefix + name)
            if entry is None:
                found.append(f"the checkpoint in {path} holds no {prefix + name!r}: it was saved without it, or "
                             f"under another name")
            elif tuple(entry.size) != shape:
                found.append(f"the checkpoint's {prefix + name!r} has the shape {tuple(entry.size)}, the model's "
                             f"{shape}: it was saved with a wrong placement, or from another model")
    return found


def save(trainer, grid, path: str, checkpoint_state) -> None:
    """Save the trainer's parameters, velocities and steps done in `path`, on every rank of the world (DCP's
    save is collective), each tensor as checkpoint_state(local, grid) places it."""
    parameters, velocities = _locals(trainer)
    state = _checked(checkpoint_state, parameters, velocities, trainer.stage, grid)
    sizes = torch.tensor([grid.sizes[axis] for axis in AXES])
    state.update({STEPS: torch.tensor(trainer.steps_done), SAVED_ON: sizes})
    dcp.save(state, checkpoint_id=path)


def load(trainer, grid, path: str, checkpoint_state) -> dict:
    """Load the checkpoint in `path` into the trainer (parameters, velocities, steps done), whatever grid saved
    it; every rank of the world calls it. Returns {"saved_on": {axis: size}, "steps_done": n}."""
    found = saved_problems(path, trainer.stage.config)
    if found:
        raise ValueError(_report(found))
    parameters, velocities = _locals(trainer)
    state = _checked(checkpoint_state, parameters, velocities, trainer.stage, grid)
    state.update({STEPS: torch.tensor(0), SAVED_ON: torch.zeros(len(AXES), dtype=torch.int64)})
    dcp.load(state, checkpoint_id=path)
    trainer.load_velocities(velocities)
    trainer.steps_done = int(state[STEPS])
    return {"saved_on": dict(zip(AXES, state[SAVED_ON].tolist())), "steps_done": trainer.steps_done}


def _locals(trainer) -> tuple[dict, dict]:
    parameters = {name: p.detach() for name, p in trainer.stage.named_parameters()}
    velocities = {name: v.detach() for name, v in trainer.velocities_whole().items()}
    return parameters, velocities


def _checked(checkpoint_state, parameters: dict, velocities: dict, stage, grid) -> dict:
    """checkpoint_state's DTensors for the parameters and the velocities (prefixed), or the same ValueError on
    every rank of the world listing what is wrong on each."""
    found, state, raised = [], {}, None
    for what, local, prefix in (("parameters", parameters, ""), ("velocities", velocities, MOMENTUM)):
        doing = "checkpoint_state raised"
        try:
            answer = checkpoint_state(local, grid)
            doing = "checking checkpoint_state's answer raised"
            mine = problems(answer, local, stage, grid, what)
        except Exception as error:  # the other ranks must not wait for this one inside DCP
            raised = error
            found.append(f"rank {grid.rank} ({grid.describe()}): {doing} {type(error).__name__} on the {what}: "
                         f"{error}")
            break
        found += mine
        if not mine:
            state.update({prefix + key: value for key, value in answer.items()})
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, found)
    if raised is not None:
        raise raised
    found = [line for rank_found in everyone for line in rank_found]
    if found:
        raise ValueError(_report(found))
    return state


def _report(found: list[str]) -> str:
    shown = found[:6]
    more = f"\n(and {len(found) - len(shown)} more)" if len(found) > len(shown) else ""
    return "the checkpoint cannot be used:\n" + "\n".join(shown) + more


def _span(layers: range) -> str:
    return f"{layers.start} to {layers.stop - 1}" if len(layers) > 1 else str(layers.start)
