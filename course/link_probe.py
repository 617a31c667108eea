"""The link the ranks run on, measured: alpha and beta of the time model from a ping-pong.

    link = link_probe.measure()        # 2 ranks of the labs' backend, about a second
    timemodel.ring_all_reduce_seconds(4e6, 2, link)

Rank 0 sends a message of b bytes to rank 1, which sends it straight back. In
the time model (course.timemodel.Link) a round trip is two messages,
2 (alpha + b / beta); the median of many round trips of a small and of a large
message gives two such equations, solved for alpha and beta. The course's
recording of torch.distributed is off meanwhile: it is the link that is timed.

Measured, not assumed: the figures hold for this machine, now (a busy machine
gives a slower link). `bench/gloo_link.py` repeats the measurement and reports
its spread; `timemodel.LOCAL_GLOO` is one such record.

Used in: lab 2 (02_data_parallel).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from course import recorder, timemodel
from course.launch import launch
from course.placement import message_device

SMALL_BYTES = 1024
LARGE_BYTES = 8_000_000


def round_trip_seconds(sizes: tuple[int, ...], repeats: tuple[int, ...]) -> list[float] | None:
    """Runs on 2 ranks: rank 0's median seconds per round trip of a message of each
    size (bytes), over that many repeats, after one round trip to warm up."""
    if dist.get_world_size() != 2:
        raise ValueError(f"a ping-pong runs on 2 ranks, got {dist.get_world_size()}")
    rank = dist.get_rank()
    medians = []
    with recorder.unrecorded():
        for nbytes, times in zip(sizes, repeats):
            message = torch.zeros(max(1, nbytes // 4), device=message_device())   # float32: 4 bytes each
            seconds = []
            for _ in range(times + 1):
                started = time.perf_counter()
                if rank == 0:
                    dist.send(message, dst=1)
                    dist.recv(message, src=1)
                else:
                    dist.recv(message, src=0)
                    dist.send(message, dst=0)
                if message.is_cuda:      # NCCL returns before the GPU is done: wait for it
                    torch.cuda.synchronize(message.device)
                seconds.append(time.perf_counter() - started)
            medians.append(statistics.median(seconds[1:]))
    return medians if rank == 0 else None


def alpha_beta(small_seconds: float, large_seconds: float, small_bytes: int = SMALL_BYTES,
               large_bytes: int = LARGE_BYTES) -> tuple[float, float]:
    """(alpha in s, beta in bytes/s) from two round trips: each is 2 (alpha + b / beta)."""
    if not large_bytes > small_bytes >= 0:
        raise ValueError(f"need a large message larger than the small one, got {large_bytes} and {small_bytes} bytes")
    if not large_seconds > small_seconds > 0:
        raise ValueError(f"the large message's round trip ({large_seconds * 1e3:.3f} ms) must take longer than the "
                         f"small one's ({small_seconds * 1e3:.3f} ms): the machine was too busy to measure; "
                         "run it again")
    beta = (large_bytes - small_bytes) / ((large_seconds - small_seconds) / 2)
    return max(small_seconds / 2 - small_bytes / beta, 0.0), beta


def measure(*, small_bytes: int = SMALL_BYTES, large_bytes: int = LARGE_BYTES, small_repeats: int = 200,
            large_repeats: int = 20, backend: str | None = None, name: str | None = None) -> timemodel.Link:
    """The link between 2 ranks of `backend` (the labs' default if None), as a timemodel.Link."""
    rank0 = launch(round_trip_seconds, 2, args=((small_bytes, large_bytes), (small_repeats, large_repeats)),
                   backend=backend)[0]
    alpha, beta = alpha_beta(*rank0, small_bytes, large_bytes)
    backend_name = backend or "the labs' backend"
    return timemodel.Link(name or f"{backend_name}, measured now", beta, alpha,
                          f"course.link_probe: ping-pong between 2 ranks, median round trip of {small_bytes:,} B "
                          f"({small_repeats}x) and {large_bytes:,} B ({large_repeats}x), solved for alpha and beta")
