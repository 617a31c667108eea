"""Counting communication: every torch.distributed call a rank makes, logged.

While a function runs under `course.launch`, the collectives and messages it
calls are recorded, however it spells them (`dist.<name>(...)`, the object
calls such as `all_gather_object`, a process group's own methods,
`torch.ops.c10d`, the functional collectives): operation, shape, dtype, bytes,
the bytes this rank sends by the formula of the algorithm the backend runs
(`course.transfer`), and on gloo the bytes the process really wrote to its
sockets. A call below `dist.<name>` is recorded in the course's words: a
group's `allgather` as `all_gather`, its `send` and `recv` as `isend` and
`irecv` (they return a Work), an object call as the collectives it makes.

The measurement reads the `wchar` line of /proc/self/io, which grows by every
byte the process writes: gloo's socket writes, plus a small header per
message. Operations in flight at the same time share one measurement, split
in proportion to their predictions and marked `shared`.

This module owns the records; `course.recorder` makes them (it and
course._group_recording are the only modules that patch torch.distributed).

Not counted per call: calls inside `with course.recorder.unrecorded():`, and
what C++ sends to a process group by itself (DistributedDataParallel's
reducer, `dist._broadcast_coalesced`). They still move bytes; compare totals.

Used in: lab 0 (00_ranks), lab 2 (02_data_parallel), lab 3 (03_model_parallel).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch.distributed as dist

RECORDED = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
            "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
            "reduce_scatter_single", "all_to_all", "all_to_all_single", "gather", "scatter",
            "send", "recv", "isend", "irecv", "barrier")


def socket_bytes_written() -> int | None:
    """Bytes this process has written so far (Linux), or None where unknown."""
    try:
        with open("/proc/self/io", "rb") as io:
            for line in io:
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class CommRecord:
    rank: int
    op: str
    shape: tuple
    dtype: str
    nbytes: int           # size of the tensor(s) named in transfer.SIZE_OF
    group_size: int
    peer: int | None      # root, source or destination (rank in the group)
    async_op: bool
    algorithm: str
    predicted: int | float  # bytes this rank sends, by the algorithm's formula
    measured: int | None = None  # bytes written to sockets (gloo, Linux)
    shared: bool = False  # measured together with overlapping operations
    start: float = 0.0    # seconds since the rank started its function
    end: float | None = None
    group: str = ""       # the group's description (torch's group_desc: lab 9's grid names each by its axis)
    group_ranks: tuple = ()  # the group's global ranks, in group order (): unknown

    @property
    def sent(self) -> int | float:
        """The bytes this rank sent: as written to the sockets where read, else by the formula."""
        return self.measured if self.measured is not None else self.predicted


class CommLog(list):
    """Records of one run, all ranks, in call order per rank."""

    def to_frame(self):
        import pandas as pd
        columns = list(CommRecord.__dataclass_fields__)
        return pd.DataFrame([asdict(r) for r in self], columns=columns)

    def rank(self, rank: int) -> CommLog:
        return CommLog(r for r in self if r.rank == rank)

    def _repr_html_(self):
        return self.to_frame()._repr_html_()

    def __repr__(self):
        return f"CommLog({len(self)} records)" if self else "CommLog([])"


def every_collective(rows: int = 1000, cols: int = 500) -> None:
    """Call each recorded operation once on a rows x cols float32 tensor (a
    send and a recv between ranks 0 and 1): the workload of bench/comm_bytes.py
    and of the tests that check the records against the formulas."""
    import warnings

    import torch
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 renamed the *_tensor forms
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(rows, cols)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.all_gather([torch.empty_like(t) for _ in range(n)], t)
    dist.all_gather_into_tensor(torch.empty(n * rows, cols), t)
    dist.reduce_scatter(t, [torch.ones_like(t) for _ in range(n)])
    dist.reduce_scatter_tensor(t, torch.ones(n * rows, cols))
    dist.all_to_all_single(torch.empty(n * rows, cols), torch.ones(n * rows, cols))
    dist.gather(t, [torch.empty_like(t) for _ in range(n)] if rank == 0 else None, dst=0)
    dist.scatter(t, [torch.ones_like(t) for _ in range(n)] if rank == 0 else None, src=0)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    dist.barrier()


_PEER_KEYS = {"send": ("dst", "group_dst", "to"), "isend": ("dst", "group_dst", "to"),
              "recv": ("src", "group_src", "from"), "irecv": ("src", "group_src", "from")}


def refuse_a_missing_peer(rank: int, name: str, arguments: dict) -> None:
    """A message to or from a rank that does not exist is refused here, in words: gloo would wait
    for ever, or crash the process without a word (signal 11)."""
    if name not in _PEER_KEYS:
        return
    global_key, group_key, direction = _PEER_KEYS[name]
    group = arguments.get("group")
    if arguments.get(group_key) is not None:
        peer, ranks = arguments[group_key], dist.get_world_size(group)
    elif arguments.get(global_key) is not None:
        peer, ranks = arguments[global_key], dist.get_world_size()
    else:
        return
    if isinstance(peer, int) and not 0 <= peer < ranks:
        raise ValueError(f"rank {rank}: dist.{name} {direction} rank {peer}, but there is no rank {peer}: the "
                         f"ranks are 0 to {ranks - 1}. The first rank has no rank before it and the last none "
                         f"after it: leave their message out, or wrap around with % {ranks} where a ring is meant")
