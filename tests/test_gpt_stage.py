"""Covers: course.gpt_stage.

course.gpt_stage: a rank's part of lab 9's GPT on a grid (pipeline stage, tensor-parallel slices with sequence
parallelism, vocabulary-parallel embedding and tied output layer, context parallelism's K/V all-gather), held
against one process on 4 ranks in five layouts: the stages chained by hand (a plain send/recv between them),
the logits and, after backward of the gathered cross-entropy and the reductions exercise 5 names, every
parameter's gradient equal to the one-process gradient's slice within float32's tolerance; the whole model
gathered back bit for bit; the layouts a model cannot take refused, naming both numbers."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import course
from course import check, context, gpt, gpt_stage, mesh

SMALL = gpt.Config(vocab=32, width=16, heads=4, layers=2, sequence=8)
SEED, BATCH = 3, 4
# What each tp rank holds a part of (the rest whole on every tp rank), by local name's tail.
SPLIT = {"embedding.weight", "head.weight", "qkv.weight", "qkv.bias", "out.weight", "mlp.0.weight", "mlp.0.bias",
         "mlp.2.weight"}


def _reduce_gradients(stage, grid):
    """Exercise 5's reductions, written here so that the test depends on no answer: summed over dp × cp,
    the replicated ones over tp, the tied ones over the embedding group."""
    for name, parameter in stage.named_parameters():
        grad = parameter.grad
        if grid.sizes["dp"] * grid.sizes["cp"] > 1:
            dist.all_reduce(grad, group=grid.groups["dp_cp"])
        if not stage.split_over_tp(name) and grid.sizes["tp"] > 1:
            dist.all_reduce(grad, group=grid.groups["tp"])
        if stage.tied(name):
            dist.all_reduce(grad, group=grid.groups["embedding"])


def _chained(sizes):
    """On every rank: the stages run in order (activations sent forward, their gradients back), the loss
    of the rank's rows and chunk over the step's counted tokens; what the test compares."""
    grid = mesh.Grid.from_device_mesh(sizes)
    model = gpt.GPT(SMALL, seed=SEED)
    stage = gpt_stage.Stage(model, grid)
    inputs, targets = gpt.token_batches(SMALL, batch=BATCH, steps=1, seed=SEED)[0]
    rows = torch.arange(BATCH).chunk(grid.sizes["dp"])[grid.coords["dp"]]
    positions = context.contiguous_positions(SMALL.sequence, grid.sizes["cp"])[grid.coords["cp"]]
    x = inputs[rows][:, positions]
    if not grid.first_stage:
        x = torch.empty(len(rows), len(positions) // grid.sizes["tp"], SMALL.width)
        dist.recv(x, grid.previous_rank)
        x.requires_grad_()
    got = {"refused": []}
    for wrong in (positions.flip(0), positions[:1]):        # not this cp rank's contiguous chunk; tp does not divide
        try:
            stage(x, wrong)
        except ValueError as error:
            got["refused"].append(str(error))
    if not grid.first_stage:
        try:
            stage(x[:, :1], positions)
        except ValueError as error:
            got["refused"].append(str(error))
    out = stage(x, positions)
    if grid.last_stage:
        losses = gpt_stage.gathered_cross_entropy(out, targets[rows][:, positions], grid.groups["tp"])
        (losses.sum() / gpt.counted_tokens(targets)).backward()
        got["logits"] = gpt_stage.gather_copies(out.detach(), grid.groups["tp"], -1)
    else:
        dist.send(out.detach(), grid.next_rank)
        grad = torch.empty_like(out)
        dist.recv(grad, grid.next_rank)
        out.backward(grad)
    if not grid.first_stage:
        dist.send(x.grad, grid.previous_rank)
    raw = {name: p.grad.clone() for name, p in stage.named_parameters()}
    _reduce_gradients(stage, grid)
    # one process, the whole batch and sequence
    model.zero_grad()
    logits = model(inputs)
    gpt.step_loss(logits, targets).backward()
    whole_grads = {name: p.grad for name, p in model.named_parameters()}
    got.update(
        expected_logits=logits.detach()[rows][:, positions], raw=raw,
        grads={name: p.grad for name, p in stage.named_parameters()},
        expected=gpt_stage.slice_of(stage, grid, whole_grads),
        split={name: stage.split_over_tp(name) for name, _ in stage.named_parameters()},
        tied={name: stage.tied(name) for name, _ in stage.named_parameters()},
        full=gpt_stage.full_parameters(stage, grid), model=dict(model.named_parameters()),
        own=gpt_stage.slice_of(stage, grid, dict(model.named_parameters())),
        parameters={name: p.detach() for name, p in stage.named_parameters()},
        layers=list(grid.layers(SMALL)), place=grid.describe())
    return got


LAYOUTS = [{"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}, {"cp": 2, "tp": 2}, {"tp": 4}, {"pp": 2, "cp": 2}]


@pytest.mark.parametrize("sizes", LAYOUTS, ids=lambda s: "x".join(f"{a}{n}" for a, n in s.items()))
def test_the_stages_chained_give_one_process_s_logits_and_gradients(sizes):
    run = course.launch(_chained, 4, args=(sizes,))
    pipelined = sizes.get("pp", 1) > 1
    kinds = set()
    for rank in run.ranks:
        got = run[rank]
        where = f"{got['place']}"
        if "logits" in got:
            check.assert_close(got["logits"], got["expected_logits"], f"logits ({where})", rank=rank)
        check.assert_close(got["grads"], got["expected"], f"gradients ({where})", rank=rank)
        for name in got["grads"]:
            tail = name.split(".", 2)[-1] if name.startswith("blocks.") else name
            assert got["split"][name] == (tail in SPLIT), (rank, name)
            assert got["tied"][name] == (pipelined and tail in ("embedding.weight", "head.weight")), (rank, name)
            kinds.add("tied" if got["tied"][name] else "split" if got["split"][name] else "replicated")
        # local names: blocks numbered on the stage, the last stage's tied copy its own parameter
        blocks = {int(n.split(".")[1]) for n in got["grads"] if n.startswith("blocks.")}
        assert blocks == set(range(len(got["layers"]))), (rank, blocks)
        assert ("head.weight" in got["grads"]) == (pipelined and got["layers"][-1] == SMALL.layers - 1)
        # the whole model gathered back, and each rank's slices, are copies of the model's values: exact
        assert list(got["full"]) == list(got["model"])
        for name, value in got["full"].items():
            assert torch.equal(value, got["model"][name]), (rank, name)
        for name, value in got["own"].items():
            assert torch.equal(value, got["parameters"][name]), (rank, name)
        if sizes.get("tp", 1) > 1:   # sequence parallelism: a replicated parameter's gradient is the rank's part
            part = got["raw"]["blocks.0.ln1.weight"]
            assert not torch.allclose(part, got["expected"]["blocks.0.ln1.weight"], rtol=1e-3, atol=1e-6), rank
        # the unhappy paths: each refused in words, before any message is sent
        assert len(got["refused"]) == (2 if got["layers"][0] == 0 else 3), (rank, got["refused"])
        assert "are not contiguous chunk" in got["refused"][0] and "context.contiguous_positions" in got["refused"][0]
        assert any(words in got["refused"][1] for words in ("do not split over tp", "not contiguous chunk",
                                                             "takes tokens (batch, 1) for 1 positions",
                                                             "expected the hidden shard (batch, 1, 16)"))
        assert all(f"rank {rank}: " in message for message in got["refused"])
        if got["layers"][0] != 0:
            assert "expected the hidden shard (batch, " in got["refused"][2]
        # the recorder sees each collective on its axis's group: per layer two all-gathers and two reduce-scatters
        # over tp each way (forward and its adjoint), the embedding's and ln_f's one more; K and V's over cp
        # (an axis that spans the world is torch's default group: DeviceMesh reuses it, and its records say so)
        world_axis = next((axis for axis, size in sizes.items() if size == 4), None)
        axes = [mesh.axis_of(r) or world_axis for r in run.comm if r.rank == rank and r.op.startswith("reduce_scatter")]
        layers = len(got["layers"])
        scattered = {axis: axes.count(axis) for axis in ("tp", "cp", None)}
        tp_scatters = 2 * 2 * layers + (layers and got["layers"][0] == 0) + (got["layers"][-1] == SMALL.layers - 1)
        assert scattered == {"tp": tp_scatters if sizes.get("tp", 1) > 1 else 0,
                             "cp": layers if sizes.get("cp", 1) > 1 else 0, None: 0}, (rank, scattered)
    assert kinds == ({"split", "replicated", "tied"} if pipelined else {"split", "replicated"})


def test_a_layout_the_model_cannot_take_is_refused_naming_both_numbers():
    model = gpt.GPT(SMALL)
    for sizes, words in (({"tp": 3}, "4 heads do not split evenly over tp = 3"),
                         ({"pp": 4}, "2 layers do not split evenly over pp = 4"),
                         ({"cp": 4, "tp": 4}, "8 sequence's tokens do not split evenly over cp × tp = 16")):
        with pytest.raises(ValueError, match=words):
            gpt_stage.Stage(model, SimpleNamespace(sizes={"pp": 1, "dp": 1, "cp": 1, "tp": 1} | sizes))
    with pytest.raises(ValueError, match="40 vocabulary's tokens do not split evenly over tp = 16"):
        gpt_stage.check_layout(gpt.Config(vocab=40, width=16, heads=16), {"tp": 16})


def test_global_shapes_and_names_are_the_model_s():
    model = gpt.GPT(SMALL)
    assert gpt_stage.global_shapes(SMALL) == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert gpt_stage.stage_names(SMALL, 1, 2) == [n for n in gpt_stage.global_shapes(SMALL)
                                                  if n.startswith(("blocks.1.", "ln_f."))]
    assert gpt_stage.global_name("blocks.0.mlp.2.weight", 3) == "blocks.3.mlp.2.weight"
    assert gpt_stage.global_name("head.weight", 2) == "embedding.weight"
    assert gpt_stage.split_dim("blocks.7.out.weight") == 1 and gpt_stage.split_dim("blocks.0.out.bias") is None
    assert gpt_stage.split_dim("head.weight") == 0 and gpt_stage.split_dim("position.weight") is None
    for wrong in ("blocks.0.mlp.1.weight", "qkv.weight", "blocks.x.ln1.weight", "lm_head.weight"):
        with pytest.raises(ValueError, match="not a parameter of lab 9's GPT"):
            gpt_stage.split_dim(wrong)


def _fake_grid(sizes, coords):
    """What Stage's constructor reads of a grid (it sends nothing): sizes, coords, the stage's layers and ends."""
    full = {"pp": 1, "dp": 1, "cp": 1, "tp": 1}
    sizes, coords = full | sizes, {axis: 0 for axis in full} | coords
    each = SMALL.layers // sizes["pp"]
    return SimpleNamespace(sizes=sizes, coords=coords, rank=0, first_stage=coords["pp"] == 0,
                           last_stage=coords["pp"] == sizes["pp"] - 1, describe=lambda: "a fake grid",
                           layers=lambda config: range(coords["pp"] * each, (coords["pp"] + 1) * each))


def test_a_stage_holds_copies_of_its_slices_named_as_megatron_names_a_stage_s():
    model = gpt.GPT(SMALL, seed=SEED)
    w, heads_rows = SMALL.width, 3 * SMALL.width // 2            # tp rank 1 of 2: heads 2 and 3, q k v each
    grid = _fake_grid({"pp": 2, "tp": 2}, {"pp": 1, "tp": 1})
    stage = gpt_stage.Stage(model, grid)
    got = dict(stage.named_parameters())
    assert list(got) == [f"blocks.0.{n}" for n, _ in model.blocks[1].named_parameters()] + [
        "ln_f.weight", "ln_f.bias", "head.weight"]
    block = model.blocks[1]
    expected = {"blocks.0.qkv.weight": block.qkv.weight[heads_rows:], "blocks.0.qkv.bias": block.qkv.bias[heads_rows:],
                "blocks.0.out.weight": block.out.weight[:, w // 2:], "blocks.0.out.bias": block.out.bias,
                "blocks.0.mlp.0.weight": block.mlp[0].weight[2 * w:],
                "blocks.0.mlp.2.weight": block.mlp[2].weight[:, 2 * w:],
                "blocks.0.ln2.bias": block.ln2.bias, "head.weight": model.embedding.weight[SMALL.vocab // 2:]}
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
    assert gpt_stage.slice_of(stage, grid, dict(model.named_parameters())).keys() == got.keys()
    model_storage = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert not model_storage & {p.untyped_storage().data_ptr() for p in stage.parameters()}     # copies, not views
    assert stage.global_name("blocks.0.mlp.2.bias") == "blocks.1.mlp.2.bias"
    assert stage.tied("head.weight") and not stage.tied("ln_f.weight") and stage.split_over_tp("head.weight")
    with pytest.raises(ValueError, match=r"rank 0 \(a fake grid\) holds no parameter 'embedding.weight'"):
        stage.tied("embedding.weight")
    with pytest.raises(ValueError, match="no 'blocks.1.ln1.weight' in the full tensors given"):
        gpt_stage.slice_of(stage, grid, {"embedding.weight": model.embedding.weight})
    # one stage of one rank: the model itself, same names, same values, nothing tied
    whole = gpt_stage.Stage(model, _fake_grid({}, {}))
    assert [n for n, _ in whole.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(torch.equal(p, q) for p, q in zip(whole.parameters(), model.parameters()))
    assert not any(whole.tied(n) for n, _ in whole.named_parameters())
