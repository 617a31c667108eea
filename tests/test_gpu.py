"""Covers: course.launch, course.placement.

On a machine with a GPU: NCCL where each rank has its own GPU, gloo where
ranks share one. Skipped without CUDA (the course's CI has none); run on a
GPU machine with `python -m pytest tests/test_gpu.py`."""
import pytest
import torch
import torch.distributed as dist

import course

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def on_my_gpu():
    t = torch.ones(1000, 500, device=course.device()) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    return {"device": str(t.device), "value": t[0, 0].item(), "tensor": t[:2, :2]}


def test_as_many_ranks_as_gpus_use_nccl():
    n = torch.cuda.device_count()
    results = course.launch(on_my_gpu, n)
    assert results.backend == "nccl"
    assert [r["device"] for r in results] == [f"cuda:{i}" for i in range(n)]
    assert all(r["value"] == n * (n + 1) / 2 for r in results)
    assert all(r["tensor"].device.type == "cpu" for r in results)  # results come back on CPU
    record = results.comm.rank(0)[0]
    assert record.algorithm == "ring all-reduce" and record.measured is None  # no sockets
    assert record.predicted == 2 * (n - 1) * 2_000_000 // n


def test_more_ranks_than_gpus_share_them_over_gloo():
    n = torch.cuda.device_count() + 1
    results = course.launch(on_my_gpu, n)
    assert results.backend == "gloo"
    assert results.devices[-1] == "cuda:0"
    assert all(r["value"] == n * (n + 1) / 2 for r in results)


def test_a_cuda_error_on_one_rank_names_that_rank():
    def bad_index():
        t = torch.zeros(3, device=course.device())
        if dist.get_rank() == 0:
            t[torch.tensor([5], device=t.device)] = 1.0  # out of range
            torch.cuda.synchronize()
        dist.barrier()
    with pytest.raises(Exception) as caught:
        course.launch(bad_index, torch.cuda.device_count(), timeout=60)
    assert "rank 0" in "".join(getattr(caught.value, "__notes__", [])) + str(caught.value)
