"""Covers: course.grid_checkpoint.

course.grid_checkpoint: lab 9's checkpoints with torch.distributed.checkpoint, a grid_step.Trainer's state saved
on one grid and loaded on another, through a correct `checkpoint_state` written here (exercise 6's answer is the
student's; the step's four functions are test_grid_step's correct stand-ins): 2 steps on pp 2 × tp 2 saved,
every parameter and velocity back bit for bit (copied values) on dp 2 × tp 2 (4 ranks) and on tp 2 (2 ranks),
and 2 more steps there give the losses and norms of the run that did not stop, within course.check's float32
tolerance (another grid sums in another order). The classic mistakes (a block saved under its local layer
index, a row-split weight declared Shard(0), a split one declared Replicate()), which DCP alone saves silently,
losing pieces, are refused by `save` with one error on every rank naming the rank and the tensor, as are a
copy, a plain tensor, a mesh that is not the tp group, a checkpoint_state that raises on one rank only, a
folder without a checkpoint and a checkpoint of another model."""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_grid_step import cross_entropy, grad_norm, micro_batch_loss, reduce_gradients  # correct stand-ins

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # torch 2.4
    from torch.distributed._tensor import DTensor, Replicate, Shard

import course
from course import check, gpt, gpt_stage, grid_checkpoint, grid_step, mesh

SMALL = gpt.Config(vocab=32, width=16, heads=4, layers=2, sequence=8)
SAVED_SEED, FRESH_SEED = 3, 5
SAVED_BEFORE, STEPS = 2, 4
BATCHES = gpt.token_batches(SMALL, batch=4, steps=STEPS, seed=1)
SAVED_ON = {"pp": 2, "tp": 2}
ROW_SPLIT = ("out.weight", "mlp.2.weight")
COLUMN_SPLIT = ("qkv.weight", "qkv.bias", "mlp.0.weight", "mlp.0.bias", "embedding.weight", "head.weight")


def checkpoint_state(local, grid, mistake=None):
    """Exercise 6, answered here for the tests: each local tensor as a DTensor on the tp mesh under its global
    name; the stage's first layer counted from its blocks (no config needed). `mistake` plants one."""
    per_stage = len({name.split(".")[1] for name in local if name.startswith("blocks.")})
    first = 0 if mistake == "local layer index" else grid.coords["pp"] * per_stage
    state = {}
    for name, tensor in local.items():
        tail = name.split(".", 2)[2] if name.startswith("blocks.") else name
        key = f"blocks.{int(name.split('.')[1]) + first}.{tail}" if name.startswith("blocks.") else name
        key = "embedding.weight" if key == "head.weight" else key
        if tail in ROW_SPLIT:
            placement = Shard(0) if mistake == "row-split as Shard(0)" else Shard(1)
        else:
            placement = Shard(0) if tail in COLUMN_SPLIT else Replicate()
        if mistake == "split as Replicate()":
            placement = Replicate()
        value = tensor.clone() if mistake == "a copy" else tensor
        state[key] = DTensor.from_local(value, grid.tp_mesh(), [placement], run_check=False)
    return state


def _trainer(sizes, seed):
    grid = mesh.Grid.from_device_mesh(sizes)
    return grid_step.Trainer(SMALL, grid, micro_batches=2, cross_entropy=cross_entropy,
                             micro_batch_loss=micro_batch_loss, reduce_gradients=reduce_gradients,
                             grad_norm=grad_norm, seed=seed), grid


def _whole(trainer, grid):
    """The whole model's parameters and velocities, on every rank (the velocities gathered as the parameters
    are, through the stage; its parameters put back after)."""
    parameters = gpt_stage.full_parameters(trainer.stage, grid)
    velocities = trainer.velocities_whole()
    kept = {name: p.detach().clone() for name, p in trainer.stage.named_parameters()}
    with torch.no_grad():
        for name, p in trainer.stage.named_parameters():
            p.copy_(velocities[name])
        velocities = gpt_stage.full_parameters(trainer.stage, grid)
        for name, p in trainer.stage.named_parameters():
            p.copy_(kept[name])
    return {"parameters": parameters, "velocities": velocities}


def _train(trainer, batches):
    losses, norms = zip(*(trainer.step(inputs, targets) for inputs, targets in batches))
    return {"losses": list(losses), "norms": list(norms)}


def _save_resume(path, sizes):
    """On 4 ranks: SAVED_BEFORE steps on pp 2 × tp 2, saved (the mistaken saves tried too), then on without
    stopping; a fresh trainer of another seed on `sizes` (the same ranks) loads the checkpoint and trains the
    same steps."""
    trainer, grid = _trainer(SAVED_ON, SAVED_SEED)
    _train(trainer, BATCHES[:SAVED_BEFORE])
    grid_checkpoint.save(trainer, grid, f"{path}/run", checkpoint_state)
    saved = _whole(trainer, grid)
    mistakes = _mistakes(trainer, grid, path)
    on = _train(trainer, BATCHES[SAVED_BEFORE:])
    return {"saved": saved, "on": on, "resumed": _resume(f"{path}/run", sizes), "mistakes": mistakes}


def _resume(path, sizes):
    trainer, grid = _trainer(sizes, FRESH_SEED)
    info = grid_checkpoint.load(trainer, grid, path, checkpoint_state)
    loaded = _whole(trainer, grid)
    return {"info": info, "loaded": loaded, "trained": _train(trainer, BATCHES[SAVED_BEFORE:])}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The checkpoint's folder, and what each of 4 ranks found (pp 2 × tp 2 saved, dp 2 × tp 2 loaded)."""
    path = str(tmp_path_factory.mktemp("checkpoints"))
    return f"{path}/run", course.launch(_save_resume, 4, args=(path, {"dp": 2, "tp": 2}), timeout=120)


def _assert_same(saved, loaded):
    for what in ("parameters", "velocities"):
        assert list(loaded[what]) == list(saved[what])
        for name, tensor in saved[what].items():
            assert torch.equal(loaded[what][name], tensor), (what, name)   # copied values: exact


def _assert_resumed(resumed, on, rank):
    check.assert_close(torch.tensor(resumed["losses"]), torch.tensor(on["losses"]), "losses", rank=rank)
    check.assert_close(torch.tensor(resumed["norms"]), torch.tensor(on["norms"]), "norms", rank=rank)


def test_a_run_saved_on_one_grid_loads_on_another_bit_for_bit_and_trains_on_as_if_it_never_stopped(saved):
    path, run = saved
    fresh = dict(gpt.GPT(SMALL, FRESH_SEED).named_parameters())
    for rank in run.ranks:
        got = run[rank]
        _assert_same(got["saved"], got["resumed"]["loaded"])
        assert not torch.equal(got["resumed"]["loaded"]["parameters"]["blocks.1.qkv.weight"],
                               fresh["blocks.1.qkv.weight"])
        assert got["resumed"]["info"] == {"saved_on": {"pp": 2, "dp": 1, "cp": 1, "tp": 2}, "steps_done": SAVED_BEFORE}
        _assert_resumed(got["resumed"]["trained"], got["on"], rank)
        assert any(v.abs().sum() > 0 for v in got["saved"]["velocities"].values())


def test_a_run_saved_on_4_ranks_resumes_on_2(saved):
    path, run = saved
    resumed = course.launch(_resume, 2, args=(path, {"tp": 2}), timeout=120)
    for rank in resumed.ranks:
        _assert_same(run[0]["saved"], resumed[rank]["loaded"])
        _assert_resumed(resumed[rank]["trained"], run[0]["on"], rank)


def _mistakes(trainer, grid, path):
    """On every rank of pp 2 × tp 2: what DCP alone does with the mistaken checkpoints (saved directly), and
    what grid_checkpoint.save says of each (refused before DCP: the trainer is left as it was)."""
    local = {name: p.detach() for name, p in trainer.stage.named_parameters()}
    out = {}
    for mistake in ("local layer index", "split as Replicate()", "row-split as Shard(0)", "a copy", "a plain tensor",
                    "the dp mesh", "raises on rank 1"):
        if mistake in ("local layer index", "split as Replicate()"):   # DCP alone: silent, and pieces lost
            folder = f"{path}/{mistake.split()[0]}"
            dcp.save(checkpoint_state(local, grid, mistake), checkpoint_id=folder)
            kept = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
            out[mistake, "saved elements"] = sum(math.prod(entry.size) for entry in kept.values())
        if mistake == "a plain tensor":
            answer = lambda local, grid: {k: v.to_local() for k, v in checkpoint_state(local, grid).items()}  # noqa: E731
        elif mistake == "the dp mesh":
            answer = _on_the_pp_mesh
        elif mistake == "raises on rank 1":
            answer = _raises_on_rank_1
        else:
            answer = lambda local, grid, mistake=mistake: checkpoint_state(local, grid, mistake)  # noqa: E731
        try:
            grid_checkpoint.save(trainer, grid, f"{path}/refused", answer)
            out[mistake] = None
        except (ValueError, KeyError) as error:
            out[mistake] = f"{type(error).__name__}: {error}"
    return out


def _raises_on_rank_1(local, grid):
    if grid.rank == 1:
        raise KeyError("no such layer")
    return checkpoint_state(local, grid)


def _on_the_pp_mesh(local, grid):
    """A mistake: the DTensors on a mesh of the pp group (same size as tp here), not the tp group."""
    from torch.distributed.device_mesh import DeviceMesh
    wrong = DeviceMesh.from_group(grid.groups["pp"], "cpu", mesh=torch.tensor(grid.ranks["pp"]))
    return {key: DTensor.from_local(value.to_local(), wrong, value.placements, run_check=False)
            for key, value in checkpoint_state(local, grid).items()}


def test_the_classic_mistakes_are_refused_where_dcp_alone_saves_them_silently(saved):
    _, run = saved
    run = {rank: dict(run[rank]["mistakes"]) for rank in run.ranks}
    whole = sum(p.numel() for p in gpt.GPT(SMALL).parameters())
    found = run[0]
    # DCP alone: stage 1's blocks written over stage 0's; every split tensor written as one rank's shard
    assert found["local layer index", "saved elements"] == whole - sum(
        math.prod(shape) for name, shape in gpt_stage.global_shapes(SMALL).items() if name.startswith("blocks.1."))
    assert found["split as Replicate()", "saved elements"] < whole
    raised = "ValueError: the checkpoint cannot be used:\nrank 1 (pp 0/2 dp 0/1 cp 0/1 tp 1/2): checkpoint_state " \
             "raised KeyError on the parameters: 'no such layer'"
    assert found.pop("raises on rank 1") == raised                          # no rank left waiting in DCP
    assert run[1].pop("raises on rank 1") == "KeyError: 'no such layer'"   # the student's own error, traceback kept
    for rank in run:
        run[rank].pop("raises on rank 1", None)
        assert run[rank] == found                                           # every rank raises the same error
    assert ("rank 2 (pp 1/2 dp 0/1 cp 0/1 tp 0/2): the parameters' 'blocks.0.ln1.weight' is not this stage's: it "
            "holds layers 1; a block's global name has its global layer index (the local index + 1)") in \
        found["local layer index"]
    assert ("rank 0 (pp 0/2 dp 0/1 cp 0/1 tp 0/2): the parameters' 'blocks.0.out.weight' has the global shape "
            "(32, 8) (a local (16, 8) placed S(0) over 2 tensor-parallel ranks), but the model's blocks.0.out.weight "
            "is (16, 16)") in found["row-split as Shard(0)"]
    assert "'embedding.weight' has the global shape (16, 16) (a local (16, 16) placed R" in \
        found["split as Replicate()"]
    assert "holds a tensor that is not one of this stage's parameters (a copy?)" in found["a copy"]
    assert "'embedding.weight' is a Tensor, not a DTensor" in found["a plain tensor"]
    assert "is a DTensor over the ranks [0, 2], but this rank's tensor-parallel group is [0, 1]" in \
        found["the dp mesh"]


def test_loading_from_a_folder_without_a_checkpoint_says_so(tmp_path):
    assert grid_checkpoint.saved_problems(str(tmp_path), SMALL) == [
        f"there is no checkpoint in {tmp_path}: save one there first (grid_checkpoint.save)"]


def test_folder_is_fresh_and_removed_after_and_refuses_to_remove_anything_else(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "older").mkdir(parents=True)
    (tmp_path / "run" / ".metadata").write_text("an earlier run's")
    (tmp_path / "run" / "older" / "__0_0.distcp").write_text("an earlier run's")
    with grid_checkpoint.folder("run") as path:
        assert path == str(tmp_path / "run") and not any((tmp_path / "run").iterdir())
    assert not (tmp_path / "run").exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("a student's")
    with pytest.raises(ValueError, match=r"notes holds other things than a checkpoint \(mine.txt\)"):
        with grid_checkpoint.folder("notes"):
            pass
    assert (tmp_path / "notes" / "mine.txt").exists()
    for name in (".", "..", "a/b", ""):
        with pytest.raises(ValueError, match="a plain folder name"):
            with grid_checkpoint.folder(name):
                pass
