"""Covers: course.grid_costs.

course.grid_costs: lab 9's GPT as lab 6's chooser sees it, the chooser's prediction for a layout of the lab, the
lab's own bytes by formula, a run's bytes binned by axis, and the table of prediction against measurement."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import course
from course import choosing, gpt, grid_costs, memory, mesh, recorder, timemodel
from course.comm import CommRecord

CONFIG = gpt.Config()
SMALL = gpt.Config(vocab=96, width=32, heads=4, layers=2, sequence=16)
FAST = timemodel.Processor("a made-up processor", 1e9, 1.0, "a test's")


def _cluster(ranks=4):
    return grid_costs.this_machine(ranks, link=timemodel.LOCAL_GLOO, processor=FAST)


def test_the_parameters_counted_from_the_shapes_are_the_models():
    for config in (CONFIG, SMALL):
        assert grid_costs.parameter_count(config) == sum(p.numel() for p in gpt.GPT(config).parameters())
    model = grid_costs.model_of(CONFIG, 8)
    assert (model.layers, model.hidden, model.heads, model.sequence, model.dropout) == (4, 64, 4, 32, False)


def test_every_rank_holds_a_stages_parameters_once():
    sizes = {"pp": 2, "tp": 2}
    held = [grid_costs.stage_parameters(CONFIG, sizes, stage) for stage in (0, 1)]
    split = sum(n for stage in held for name, n, s in stage if s and name != "head.weight")
    replicated = sum(n for stage in held for _, n, s in stage if not s)
    assert 2 * split + replicated == grid_costs.parameter_count(CONFIG)      # two tp ranks hold a split one
    assert [name for name, _, _ in held[1]][-1] == "head.weight"           # the tied copy, last stage only
    assert "head.weight" not in [name for name, _, _ in grid_costs.stage_parameters(CONFIG, {"tp": 2}, 0)]
    with pytest.raises(ValueError, match="stage 2 is not one of the 2 stages"):
        grid_costs.stage_parameters(CONFIG, sizes, 2)


def test_a_layout_of_the_lab_is_the_choosers_with_zero1_over_the_replicas():
    assert grid_costs.layout_of({"dp": 2, "tp": 2}, 2) == choosing.Layout(2, 1, 2, 1, 2, 1)
    assert grid_costs.layout_of({"cp": 2, "tp": 2}, 1) == choosing.Layout(1, 1, 2, 1, 1, 2)   # dp·cp replicas
    assert grid_costs.layout_of({"pp": 2, "tp": 2}, 4).zero == 0                              # one replica
    with pytest.raises(ValueError, match=r"\['ep'\] is not one of them"):
        grid_costs.layout_of({"dp": 2, "ep": 2}, 1)
    with pytest.raises(ValueError, match="tp"):
        grid_costs.layout_of({"tp": 0}, 1)


def test_the_prediction_is_the_choosers_for_the_lab_s_training():
    guess = grid_costs.predicted(CONFIG, {"dp": 2, "tp": 2}, batch=8, micro_batches=2, cluster=_cluster())
    held = -(-grid_costs.parameter_count(CONFIG) // 2)                    # P/tp: the chooser spreads them evenly
    state = memory.per_rank(held, 2, "ZeRO-1", optimizer="momentum", precision="fp32")
    assert guess.memory["parameters"] == state["parameters"] == 4 * held       # fp32
    assert guess.memory["optimizer state"] == state["optimizer state"] == 4 * (held // 2)   # momentum, sharded
    assert guess.sent["pp"] == guess.sent["cp"] == 0 and guess.seconds["bubble"] == 0


def test_what_cannot_be_predicted_or_measured_is_refused_in_words():
    with pytest.raises(ValueError, match=r"heads \(4,\) do not split over 8 tp ranks"):
        grid_costs.predicted(CONFIG, {"tp": 8}, batch=8, micro_batches=1, cluster=_cluster(8))
    with pytest.raises(ValueError, match="needs at least 2 batches"):
        grid_costs.measure_steps(None, gpt.token_batches(SMALL, batch=2, steps=1))
    with pytest.raises(ValueError, match="inside a launched function"):
        grid_costs.measure_steps(None, gpt.token_batches(SMALL, batch=2, steps=2))


def test_the_lab_and_the_chooser_agree_on_the_pipeline_and_differ_by_gloo_on_tp():
    sizes = {"pp": 2, "tp": 2}
    guess = grid_costs.predicted(CONFIG, sizes, batch=8, micro_batches=4, cluster=_cluster())
    for stage in (0, 1):
        lab = grid_costs.lab_bytes(CONFIG, sizes, batch=8, micro_batches=4, stage=stage)
        assert lab["pp"]["boundaries"] == guess.sent["pp"] == 4 * 2 * 32 // 2 * 64 * 4   # (b, s/tp, w) a micro-batch
        # gloo reduce-scatters by an all-reduce: 4 all-gathers + 4 all-reduces a layer against the chooser's
        # 4 all-reduces (NCCL's reduce-scatter + all-gather): 1.5 times the bytes
        assert lab["tp"]["blocks"] == 1.5 * guess.sent["tp"]
        assert lab["embedding"]["tied gradient"] == 512 // 2 * 64 * 4           # an all-reduce over 2 ranks
    first, last = (grid_costs.totals(grid_costs.lab_bytes(CONFIG, sizes, batch=8, micro_batches=4, stage=stage))
                   for stage in (0, 1))
    assert first["tp"] > last["tp"]         # the position embedding's gradient, more than ln_f's and the loss's
    assert grid_costs.busiest_lab_bytes(CONFIG, sizes, batch=8, micro_batches=4) == {
        axis: max(first[axis], last[axis]) for axis in first}
    middle = grid_costs.lab_bytes(CONFIG, {"pp": 4}, batch=8, micro_batches=4, stage=1)
    assert middle["pp"]["boundaries"] == 2 * 4 * 2 * 32 * 64 * 4 and middle["embedding"]["tied gradient"] == 0
    with pytest.raises(ValueError, match="batch of 6 must split into dp × micro-batches = 2 × 2"):
        grid_costs.lab_bytes(CONFIG, {"dp": 2}, batch=6, micro_batches=2, stage=0)


def test_context_parallel_bytes_are_the_all_gathers_of_k_and_v():
    lab = grid_costs.lab_bytes(CONFIG, {"cp": 2, "tp": 2}, batch=4, micro_batches=1, stage=0)
    kv = 4 * 16 * 32 * 4                                          # (b, s/cp, w/tp) float32
    assert lab["cp"]["K and V"] == 4 * 2 * (kv + 2 * kv)          # layers × (K, V) × (gather + gloo's reduce-scatter)


def _record(rank, op, nbytes, sent):
    return CommRecord(rank, op, (nbytes // 4,), "float32", nbytes, 2, None, False, "ring", sent, measured=sent)


def test_bytes_are_binned_by_axis_and_a_step():
    records = [_record(0, "all_reduce", 100, 100), _record(0, "all_gather", 40, 40), _record(0, "send", 8, 8),
               _record(0, "barrier", 0, 0)]
    axes = {"all_reduce": "dp_cp", "all_gather": "tp", "send": "pp"}
    sent = grid_costs.bytes_per_axis(records, lambda r: axes.get(r.op), steps=2)
    assert sent == {"dp": 50, "tp": 20, "pp": 4, "cp": 0, "embedding": 0, "other": 0}
    assert grid_costs.bytes_per_axis(records, lambda r: axes.get(r.op), calls=True)["other"] == 1   # the barrier
    with pytest.raises(ValueError, match=r"axis_of named 'model' for a record of all_reduce \(rank 0\)"):
        grid_costs.bytes_per_axis(records, lambda r: "model")


def test_the_busiest_rank_and_the_largest_gap():
    one = grid_costs.Measured({"dp": 10, "tp": 5}, 100, 0.2, [0])
    two = grid_costs.Measured({"dp": 4, "tp": 8}, 300, 0.1, [1])
    worst = grid_costs.busiest([one, two])
    assert (worst.sent, worst.memory, worst.seconds, worst.ranks) == ({"dp": 10, "tp": 8}, 300, 0.2, [0, 1])
    guess = grid_costs.predicted(CONFIG, {"dp": 2, "tp": 2}, batch=8, micro_batches=2, cluster=_cluster())
    seen = grid_costs.Measured({"dp": guess.sent["dp"], "tp": 2 * guess.sent["tp"]}, guess.memory["total"],
                               100 * guess.seconds["total"])
    rows = grid_costs.table(guess, seen, formula={"dp": 1.0, "tp": 2.0})
    assert [row["what"] for row in rows] == ["memory a rank (bytes)", "bytes a step, dp", "bytes a step, tp",
                                             "step (seconds)"]
    assert rows[1]["measured / predicted"] == 1 and rows[2]["lab's formula"] == 2.0
    assert grid_costs.largest_gap(rows)["what"] == "step (seconds)"
    nothing = grid_costs.Measured({**seen.sent, "dp": 0.0}, seen.memory, seen.seconds)    # dp's bytes never seen
    assert grid_costs.largest_gap(grid_costs.table(guess, nothing))["what"] == "bytes a step, dp"
    with pytest.raises(ValueError, match="no row has both"):
        grid_costs.largest_gap([{"what": "x", "measured / predicted": None}])
    with pytest.raises(ValueError, match="at least one rank"):
        grid_costs.busiest([])


def test_this_machine_measures_its_processor_and_asks_for_what_it_cannot_time():
    threads = torch.get_num_threads()
    rate = grid_costs.matmul_rate(SMALL, rows=32, repeats=3)
    assert rate.flops > 0 and rate.efficiency == 1 and "one thread" in rate.name
    assert torch.get_num_threads() == threads                 # timed on one thread, the caller's threads restored
    with pytest.raises(ValueError, match="needs the model's config"):
        grid_costs.this_machine(2, link=timemodel.LOCAL_GLOO)
    shared = grid_costs.this_machine(4, link=timemodel.LOCAL_GLOO, processor=FAST, cores=2)
    assert shared.processor.flops == FAST.flops / 2 and shared.gpus_per_node == 4      # 4 ranks on 2 cores
    assert grid_costs.this_machine(2, link=timemodel.LOCAL_GLOO, processor=FAST, cores=2).processor == FAST


# --- a real run of lab 9's step (course.grid_step) with correct stand-ins for the students' four answers ---
TINY = gpt.Config(vocab=64, width=16, heads=4, layers=4, sequence=8)


class _VocabCrossEntropy(torch.autograd.Function):
    """Vocabulary-parallel cross-entropy: the max, the sum of exponentials and the target's logit
    all-reduced over the tp group, (b, t) each; backward softmax − one-hot on the shard, no message."""

    @staticmethod
    def forward(ctx, logits, targets, group):
        rows, start = logits.shape[-1], dist.get_rank(group) * logits.shape[-1]
        largest = logits.detach().amax(-1)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
        shifted = logits.detach() - largest[..., None]
        exps = shifted.exp()
        total = exps.sum(-1)
        dist.all_reduce(total, group=group)
        mine = (targets >= start) & (targets < start + rows)
        local = (targets - start).clamp(0, rows - 1)
        picked = shifted.gather(-1, local[..., None])[..., 0] * mine
        dist.all_reduce(picked, group=group)
        counted = targets != gpt.IGNORE
        ctx.save_for_backward(exps / total[..., None], local, mine & counted, counted)
        return (total.log() - picked) * counted

    @staticmethod
    def backward(ctx, grad):
        softmax, local, mine, counted = ctx.saved_tensors
        out = softmax.scatter_add(-1, local[..., None], -mine[..., None].to(softmax.dtype))
        return out * (grad * counted)[..., None], None, None


def _cross_entropy(logits, targets, group):
    return _VocabCrossEntropy.apply(logits, targets, group)


def _micro_batch_loss(token_losses, targets, step_targets, grid):
    counted = torch.tensor(float(gpt.counted_tokens(step_targets)))
    dist.all_reduce(counted, group=grid.groups["dp_cp"])
    return token_losses.sum() / counted


def _reduce_gradients(stage, grid):
    for name, p in stage.named_parameters():
        if not stage.split_over_tp(name):
            dist.all_reduce(p.grad, group=grid.groups["tp"])
        dist.all_reduce(p.grad, group=grid.groups["dp_cp"])
        if stage.tied(name):
            dist.all_reduce(p.grad, group=grid.groups["embedding"])


def _grad_norm(stage, grid):
    squares = torch.zeros((), dtype=torch.float64)
    for name, p in stage.named_parameters():
        if (stage.split_over_tp(name) or grid.coords["tp"] == 0) and not (stage.tied(name) and not stage.first_stage):
            squares += p.grad.double().square().sum()
    dist.all_reduce(squares, group=grid.groups["tp"])
    dist.all_reduce(squares, group=grid.groups["pp"])
    return float(squares.sqrt())


def _twice_over_the_replicas(stage, grid):
    """A classic mistake: the gradients reduced twice over dp·cp (the loss stays right, the bytes do not)."""
    _reduce_gradients(stage, grid)
    for p in stage.parameters():
        dist.all_reduce(p.grad, group=grid.groups["dp_cp"])


def _step_bytes(trainer, batch):
    """One step's records (tensors: lab_bytes leaves the scalars out), by axis, by their formulas."""
    log = recorder.active().log
    start = len(log)
    trainer.step(*batch)
    return grid_costs.bytes_per_axis([r for r in log[start:] if r.nbytes > 16], trainer.grid.axis_of, formula=True)


def _lab_step(sizes, batches, micro_batches):
    """On every rank of `sizes`: one step's bytes by axis with the right reduction and with one done twice,
    then measure_steps on the rest of the batches."""
    from course import grid_step
    grid = mesh.Grid.from_device_mesh(sizes)
    trainers = [grid_step.Trainer(TINY, grid, micro_batches=micro_batches, cross_entropy=_cross_entropy,
                                  micro_batch_loss=_micro_batch_loss, reduce_gradients=reduce, grad_norm=_grad_norm)
                for reduce in (_reduce_gradients, _twice_over_the_replicas)]
    right, twice = (_step_bytes(trainer, batches[0]) for trainer in trainers)
    held = sum(p.numel() for p in trainers[0].stage.parameters())
    return grid.coords["pp"], right, twice, held, grid_costs.measure_steps(trainers[0], batches[1:])


@pytest.mark.parametrize("sizes", [{"pp": 2, "tp": 2}, {"dp": 2, "cp": 2}])
def test_a_grid_steps_bytes_are_the_labs_formula_and_a_reduction_done_twice_is_not(sizes):
    batch, micro_batches = 4, 2
    batches = gpt.token_batches(TINY, batch=batch, steps=3, seed=1)
    run = course.launch(_lab_step, 4, args=(sizes, batches, micro_batches))
    for rank, (stage, counted, twice, held, seen) in enumerate(run):
        parts = grid_costs.lab_bytes(TINY, sizes, batch=batch, micro_batches=micro_batches, stage=stage)
        expected = grid_costs.totals(parts)
        for axis in (*grid_costs.AXES, "embedding"):
            assert counted[axis] == pytest.approx(expected[axis], rel=1e-12), (
                f"rank {rank} ({sizes}), axis {axis}: the step's records sent {counted[axis]} bytes by their "
                f"formulas, lab_bytes says {expected[axis]}")
        assert counted["other"] == 0
        # the gradients all-reduced twice over dp·cp: the formula's gradient part once more, on dp alone
        more = parts["dp"]["gradients"] or 0
        assert twice == {**counted, "dp": pytest.approx(counted["dp"] + more, rel=1e-12)}
        assert (more > 0) == (sizes.get("dp", 1) * sizes.get("cp", 1) > 1)
        for axis, formula in seen.formula.items():     # the wire adds gloo's 48 bytes a message: tiny tensors here
            assert formula <= seen.sent[axis] <= 2 * formula + 1024, f"rank {rank}, {axis}: {seen}"
        assert seen.memory >= 3 * 4 * held and seen.seconds > 0   # parameters, gradients, velocities: float32
        assert all(seen.calls[axis] >= 1 for axis, sent in seen.formula.items() if sent)
    worst = grid_costs.busiest([seen for *_, seen in run])
    assert worst.ranks == [0, 1, 2, 3]
