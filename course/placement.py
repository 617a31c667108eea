"""Which backend and which device each rank gets.

NCCL needs one GPU per rank, so it is chosen only when there are at least as
many GPUs as ranks. Otherwise the ranks use gloo: on the CPU, or sharing the
GPUs there are (gloo copies through host memory, NCCL refuses two ranks on
one GPU).

Used in: every lab, the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    backend: str
    devices: tuple[str, ...]  # one per rank: "cpu" or "cuda:i"

    @property
    def world_size(self) -> int:
        return len(self.devices)


def choose(world_size: int, backend: str | None = None, device: str | None = None,
           gpu_count: int | None = None) -> Placement:
    """Backend and per-rank devices for `world_size` ranks on this machine.

    backend: None picks for the machine; "gloo" or "nccl" forces one.
    device: None picks for the machine; "cpu" keeps every rank on the CPU,
        "cuda" puts rank i on GPU i % gpu_count.
    gpu_count: how many GPUs to assume (default: what torch sees).
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive whole number, got {world_size!r}")
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend must be None, 'gloo' or 'nccl', got {backend!r}")
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"device must be None, 'cpu' or 'cuda', got {device!r}")
    if gpu_count is None:
        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0

    if device == "cuda" and gpu_count == 0:
        raise ValueError("device='cuda' was asked for, but torch sees no GPU on this machine; "
                         "use device='cpu' (or leave it out)")
    on_gpu = device == "cuda" or (device is None and gpu_count > 0)
    if backend == "nccl":
        if device == "cpu":
            raise ValueError("NCCL runs on GPUs only; use backend='gloo' for CPU ranks")
        if gpu_count < world_size:
            raise ValueError(
                f"NCCL needs one GPU per rank: {world_size} ranks asked for, "
                f"{gpu_count} GPU(s) here. Use fewer ranks, or backend='gloo' to let ranks share.")
    if backend is None:
        backend = "nccl" if on_gpu and gpu_count >= world_size else "gloo"

    if on_gpu:
        devices = tuple(f"cuda:{rank % gpu_count}" for rank in range(world_size))
    else:
        devices = ("cpu",) * world_size
    return Placement(backend, devices)


# --- the rank this process is -------------------------------------------------------

rank_device: torch.device | None = None  # set when this process becomes a rank


def device() -> torch.device:
    """The device of the rank this runs on; outside a rank, the device one
    process would train on (the GPU if there is one)."""
    if rank_device is not None:
        return rank_device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def message_device() -> torch.device:
    """Where a rank keeps tensors it sends point to point (send, recv, isend,
    irecv). NCCL moves GPU memory only; gloo sends CPU memory only (of its
    collectives, only all_reduce and broadcast also take GPU tensors)."""
    import torch.distributed as dist

    if dist.is_initialized() and "nccl" in dist.get_backend():
        return device()
    return torch.device("cpu")


def process_group_backend(backend: str) -> str:
    """What init_process_group gets for `backend`: NCCL ranks also get gloo for CPU
    tensors, so code that keeps a tensor on the CPU (a test's reference, a small
    count) still runs on GPU ranks."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


RANKS_VARIABLE = "COURSE_RANKS"


def lab_ranks(default: int = 2) -> int:
    """How many ranks a lab launches: $COURSE_RANKS if set (to run a lab on 4
    ranks headless, say), else `default`."""
    text = os.environ.get(RANKS_VARIABLE)
    if text is None:
        return default
    try:
        ranks = int(text)
    except ValueError:
        ranks = 0
    if ranks < 1:
        raise ValueError(f"{RANKS_VARIABLE}={text!r}: it must be a positive whole number of "
                         f"ranks, such as 2 or 4; unset it to use the lab's default ({default})")
    return ranks


# --- already a rank? (torchrun, or inside a course worker) -------------------------

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """True when this process was started as a rank by torchrun (or any
    launcher that sets the standard environment variables)."""
    return all(name in os.environ for name in _TORCHRUN_VARS)


def gpu_claim(local_rank: int) -> str:
    """The GPU a torchrun rank with this LOCAL_RANK would take, named so that ranks
    on any node can tell one GPU claimed twice from two GPUs: its UUID (else host
    and index); "" when this machine has no GPU for it."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank >= gpus:
        return ""
    uuid = getattr(torch.cuda.get_device_properties(local_rank), "uuid", None)
    return str(uuid) if uuid else f"{socket.gethostname()}/cuda:{local_rank}"


def torchrun_placement(claims: list[str] | None = None) -> tuple[int, int, Placement]:
    """(rank, world_size, placement of this one rank) from torchrun's variables.

    claims: every rank's `gpu_claim`, in rank order. NCCL only when each rank
        claims a GPU no other rank claims: two torchrun "nodes" on one machine
        both have LOCAL_RANK 0, and NCCL refuses two ranks on one GPU. Otherwise
        gloo for every rank (all ranks must agree), each on a GPU of its machine,
        shared, or the CPU, as `choose` does. Without claims, this node alone
        decides: NCCL when it has a GPU for each of its LOCAL_WORLD_SIZE ranks.
    """
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if claims is None:
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))
        own_gpus = gpus >= ranks_here
    else:
        own_gpus = all(claims) and len(set(claims)) == len(claims)
    device = f"cuda:{local_rank % gpus}" if gpus else "cpu"
    return rank, world_size, Placement("nccl" if own_gpus else "gloo", (device,))
