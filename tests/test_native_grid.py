"""Covers: course.native_grid.

Lab 9's GPT trained with PyTorch's own parts (DeviceMesh, parallelize_module's sequence-parallel plan,
loss_parallel, fully_shard, torch.distributed.pipelining) on 4 CPU ranks: the losses, gradient norms and
parameters equal one process's within course.check's float32 tolerance (the module's docstring says what was
measured), each axis's bytes found by its group's name; layouts the model or the world cannot take refused
before any rank starts; and context_parallel still failing on CPU ranks, as the module's docstring says."""
from __future__ import annotations

import pytest
import torch

import course
from course import check, gpt, native_grid
from course.comm import CommRecord

SMALL = gpt.Config(vocab=64, width=16, heads=2, layers=2, sequence=8)
STEPS = 2


@pytest.fixture(scope="module")
def one_process():
    batches = gpt.token_batches(SMALL, batch=8, steps=STEPS, seed=3)
    return batches, gpt.one_process_training(SMALL, batches, seed=5)


def same_as_one_process(run, want):
    for rank in run.ranks:
        got = run[rank]
        check.assert_close(torch.tensor(got["losses"]), torch.tensor(want.losses), "losses", rank=rank)
        check.assert_close(torch.tensor(got["norms"]), torch.tensor(want.norms), "gradient norms", rank=rank)
        check.assert_close(got["parameters"], want.parameters, "parameters after the last step", rank=rank)


def axes_sent(run, rank):
    return native_grid.bytes_per_axis(run.comm.rank(rank), run[rank]["windows"])


@pytest.mark.slow
def test_dp_by_tp_with_sequence_parallelism_trains_as_one_process(one_process):
    batches, want = one_process
    run = course.launch(native_grid.training, 4, args=(SMALL, batches, {"dp": 2, "tp": 2}), kwargs={"seed": 5},
                        timeout=120)
    same_as_one_process(run, want)
    for rank in run.ranks:
        sent = axes_sent(run, rank)
        assert set(sent) == {"dp", "tp"} and min(sent.values()) > 0, sent     # fully_shard's and the plan's
        assert len(run[rank]["seconds"]) == STEPS and min(run[rank]["seconds"]) > 0


@pytest.mark.slow
def test_pipeline_by_tp_sums_the_tied_embedding_across_the_first_and_last_stage(one_process):
    batches, want = one_process
    run = course.launch(native_grid.training, 4, args=(SMALL, batches, {"pp": 2, "tp": 2}),
                        kwargs={"seed": 5, "micro_batches": 2}, timeout=120)
    same_as_one_process(run, want)
    for rank in run.ranks:
        sent = axes_sent(run, rank)
        assert {"pp", "tp", "embedding"} <= set(sent) and "dp" not in sent, sent
        # the tied copy's gradient, one ring all-reduce of the rank's vocabulary shard over 2 ranks: its size
        assert sent["embedding"] >= SMALL.vocab // 2 * SMALL.width * 4, sent


def test_layouts_the_model_or_the_world_cannot_take_are_refused_naming_both_numbers():
    def refused(sizes, world_size, batch=8, micro_batches=2):
        with pytest.raises(ValueError) as error:
            native_grid.check_layout(SMALL, sizes, world_size, batch=batch, micro_batches=micro_batches)
        return str(error.value)

    assert "needs 8 ranks, the world has 4" in refused({"dp": 2, "tp": 2, "pp": 2}, 4)
    assert "the model's 2 heads do not split evenly over tp = 4" in refused({"tp": 4}, 4)
    assert "the model's 2 layers do not split evenly over pp = 4" in refused({"pp": 4}, 4)
    assert "unknown axis 'ep'" in refused({"ep": 2}, 2)
    assert "context parallelism does not run on CPU ranks" in refused({"cp": 2}, 2)
    assert "a batch of 6 does not split into dp=2 × 2 micro-batches" in refused({"dp": 2, "pp": 2}, 4, batch=6)
    assert native_grid.check_layout(SMALL, {"dp": 2, "tp": 2}, 4, batch=8, micro_batches=2) == \
        {"pp": 1, "dp": 2, "tp": 2}


def test_bytes_are_binned_by_the_group_s_name_and_need_the_steps_windows():
    def record(group, start, predicted):
        return CommRecord(0, "all_reduce", (4,), "float32", 16, 2, None, False, "ring", predicted, start=start,
                          group=group)

    records = [record("mesh_tp", 1.0, 100), record("mesh_dp", 1.5, 40), record("embedding", 2.5, 8),
               record("default_pg", 1.2, 4), record("mesh_tp", 9.0, 1000)]      # the last outside both steps
    assert native_grid.bytes_per_axis(records, [(0.5, 2.0), (2.0, 3.0)]) == {"tp": 50.0, "dp": 20.0,
                                                                              "embedding": 4.0}
    with pytest.raises(ValueError, match="windows of a launched run"):
        native_grid.bytes_per_axis(records, [None])


def context_parallel_on_cpu(sequence: int = 16) -> str | None:
    """Runs on every rank (CPU): PyTorch's context_parallel around causal scaled_dot_product_attention, one
    forward; None where it runs, else torch's error, in a line."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    q, k, v = (torch.randn(1, 2, sequence, 8) for _ in range(3))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except Exception as error:    # noqa: BLE001 - what torch says is the finding
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


@pytest.mark.slow
def test_context_parallel_still_fails_on_cpu_ranks_as_the_docstring_says():
    run = course.launch(context_parallel_on_cpu, 2, timeout=60)
    for rank in run.ranks:
        assert run[rank] is not None, "context_parallel ran on CPU ranks: add cp to native_grid and its docstring"
        assert "does not have a sharding strategy" in run[rank], run[rank]
