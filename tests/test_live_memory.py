"""Covers: course.live_memory.

course.live_memory: the bytes of tensor memory alive, counted by hand against what it measures.

A float32 element is 4 bytes, so every expected figure here is a count of elements times 4.
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist

import course
from course.live_memory import LiveMemory

FLOAT = 4  # bytes per float32


def test_torch_keeps_one_python_object_per_storage_until_its_memory_is_freed():
    """What the CPU count rests on: a weak reference to a storage dies with the memory, not with a wrapper."""
    tensor = torch.zeros(10)
    assert tensor.untyped_storage() is tensor.untyped_storage()
    died = []
    weakref.finalize(tensor.untyped_storage(), died.append, True)
    view = tensor[2:5]
    gc.collect()
    assert not died  # every wrapper is gone, the memory is not
    del tensor
    gc.collect()
    assert not died  # the view still holds the memory
    del view
    assert died


def test_a_tensor_made_inside_counts_its_bytes_until_deleted():
    with LiveMemory("cpu") as memory:
        assert memory.now() == 0
        tensor = torch.empty(1000)
        assert memory.now() == 1000 * FLOAT
        copy = tensor.clone()
        assert memory.now() == 2000 * FLOAT
        del tensor, copy
        assert memory.now() == 0
        assert memory.peak == 2000 * FLOAT


def test_torch_tensor_from_data_counts():
    with LiveMemory("cpu") as memory:
        values = torch.tensor([1.0, 2.0, 3.0])
        assert memory.now() == 3 * FLOAT
    assert values.sum() == 6


def test_views_and_in_place_results_share_their_storage():
    with LiveMemory(torch.device("cpu")) as memory:
        tensor = torch.zeros(100, 10)
        views = [tensor.t(), tensor[:50], tensor.view(1000), tensor.add_(1)]
        assert memory.now() == 1000 * FLOAT
        del tensor
        assert memory.now() == 1000 * FLOAT  # the views hold it
        del views
        assert memory.now() == 0


def test_views_of_an_untracked_older_tensor_do_not_count_it():
    older = torch.zeros(100)
    with LiveMemory("cpu") as memory:
        view = older[:10]
        older.mul_(2)
        assert memory.now() == 0
        memory.track(older)
        assert memory.now() == 100 * FLOAT
    assert view.shape == (10,)


def test_storage_resize_to_nothing_and_back_is_seen():
    """How sharded training frees a gathered parameter and regrows it: no op, the storage itself."""
    with LiveMemory("cpu") as memory:
        parameter = torch.zeros(1000)
        parameter.untyped_storage().resize_(0)
        assert memory.now() == 0
        parameter.untyped_storage().resize_(1000 * FLOAT)
        assert memory.mark("regrown") == 1000 * FLOAT
        parameter.untyped_storage().resize_(2000 * FLOAT)
        assert memory.peak == 2000 * FLOAT
    assert memory.marks == {"regrown": 1000 * FLOAT}


def test_the_peak_survives_a_free_until_reset_and_is_frozen_on_exit():
    with LiveMemory("cpu") as memory:
        big = torch.ones(5000)
        del big
        small = torch.ones(10)
        assert memory.now() == 10 * FLOAT and memory.peak == 5000 * FLOAT
        memory.reset_peak()
        assert memory.peak == 10 * FLOAT
    later = torch.ones(10_000)
    assert memory.peak == 10 * FLOAT and small.numel() + later.numel() == 10_010


def test_tracked_older_tensors_modules_and_optimizers_count_once():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    model(torch.randn(3, 8)).sum().backward()
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.step()
    parameters = sum(p.numel() for p in model.parameters()) * FLOAT
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())  # num_batches_tracked is int64
    steps = sum(state["step"].untyped_storage().nbytes() for state in optimizer.state.values())
    extra = torch.zeros(7)
    with LiveMemory("cpu") as memory:
        memory.track(model)
        assert memory.now() == 2 * parameters + buffers  # parameters and their .grad
        memory.track(optimizer, [extra, {"again": extra}], model)
        assert memory.now() == 4 * parameters + buffers + steps + 7 * FLOAT


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def measure_training_step(batch: int = 32) -> dict:
    """Marks (bytes) through one step of an MLP with Adam, and the counts they should match."""
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters())
    with LiveMemory("cpu") as memory:
        memory.track(model, optimizer)
        baseline = memory.mark("baseline")
        memory.reset_peak()
        x = torch.randn(batch, 64)
        loss = model(x).sum()
        forward_peak = memory.peak
        loss.backward()
        del loss
        memory.mark("after backward")
        if dist.is_initialized():
            for p in model.parameters():
                dist.all_reduce(p.grad)
            memory.mark("after all-reduce")
        optimizer.step()
        memory.mark("after step")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return dict(marks=memory.marks, baseline=baseline, forward_peak=forward_peak,
                parameters=sum(p.numel() for p in model.parameters()) * FLOAT, input=x.numel() * FLOAT,
                saved_inputs=sum(batch * m.in_features * FLOAT for m in linears))


def check_training_step(step: dict) -> None:
    marks, parameters = step["marks"], step["parameters"]
    assert step["baseline"] == parameters  # tracked before the step: the parameters only
    # forward keeps the inputs each Linear saves for its backward
    assert step["forward_peak"] - step["baseline"] >= step["saved_inputs"]
    # backward frees them and leaves the gradients, one per parameter, beside the input batch
    assert marks["after backward"] - step["baseline"] == parameters + step["input"]
    # Adam's first step adds exp_avg and exp_avg_sq, and a scalar step per parameter
    added = marks["after step"] - marks["after backward"]
    assert 2 * parameters <= added <= 2 * parameters * 1.01


def test_an_mlp_step_counts_gradients_activations_and_adam_state():
    step = measure_training_step()
    check_training_step(step)
    assert step["saved_inputs"] == 32 * (64 + 128 + 128) * FLOAT


def test_it_measures_inside_ranks_of_course_launch():
    results = course.launch(measure_training_step, 2)
    for step in results:
        check_training_step(step)
        assert step["marks"]["after all-reduce"] == step["marks"]["after backward"]  # in place: no new memory


def test_tensor_subclasses_count_their_inner_tensors():
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    with LiveMemory("cpu") as memory:
        pair = two_tensor.TwoTensor(torch.zeros(10), torch.zeros(10))
        doubled = pair * 2
        assert memory.now() == 40 * FLOAT
        del doubled
        assert memory.now() == 20 * FLOAT


@pytest.mark.parametrize("device, says", [("meta", "not 'meta'"), ("gpu", "pass 'cpu' or 'cuda:N'"),
                                          (0, "needs a device")])
def test_a_device_that_is_not_cpu_or_cuda_is_refused(device, says):
    with pytest.raises(ValueError, match=says):
        LiveMemory(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gives")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="sees no CUDA device"):
        LiveMemory("cuda")


@pytest.mark.parametrize("objects, says", [((3,), "got int 3"), (("weights",), "got str 'weights'"),
                                           (([torch.zeros(1), object()],), "got object"),
                                           ((torch.zeros(2, device="meta"),), "on meta")])
def test_tracking_what_is_not_a_tensor_here_is_refused(objects, says):
    with LiveMemory("cpu") as memory, pytest.raises(ValueError, match=says):
        memory.track(*objects)


def test_one_tracker_cannot_be_entered_twice_at_once():
    memory = LiveMemory("cpu")
    with memory, pytest.raises(RuntimeError, match="already measuring"):
        with memory:
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="measures CUDA memory: needs a GPU")
def test_on_cuda_it_reads_the_allocator():
    device = torch.device("cuda", torch.cuda.current_device())
    with LiveMemory("cuda") as memory:
        start = memory.now()
        big = torch.empty(1 << 20, device=device)
        assert memory.now() - start == (1 << 20) * FLOAT
        del big
        assert memory.now() == start and memory.peak >= start + (1 << 20) * FLOAT
        model = torch.nn.Linear(2, 2).to(device)
        optimizer = torch.optim.Adam(model.parameters())
        model(torch.ones(1, 2, device=device)).sum().backward()
        optimizer.step()
        memory.track(model, optimizer)  # Adam's step tensors stay on the CPU: nothing to refuse
        with pytest.raises(ValueError, match="got int"):
            memory.track(3)
