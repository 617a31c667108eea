"""The physical limits a transfer figure is read against, measured on this machine in the run that reports it.

    limits = _limits.measure(rounds=5)           # one launch of 2 ranks
    limits["loopback_GBps"], limits["copy_GBps"], limits["gloo_path"]
    _limits.bus_bandwidth(nbytes, ranks, seconds)  # an all-reduce's, as nccl-tests defines it

- The loopback link: rank 0 streams MESSAGES messages of MESSAGE_MB to rank 1 through gloo's isend/irecv, every
  receive posted before the stream starts, and rank 1 answers with one element when the last has landed: the
  bytes over rank 0's seconds from its first send to that answer. Then both ranks stream to each other at once
  (`loopback_both_ways_GBps`, each direction's rate, the slower rank's time): a rank of a ring or an all-to-all
  sends while it receives, so this is the limit its transfers are read against. Gloo sends a message as the two
  processes' TCP sockets carry it, so these are the most a rank's messages can move here, with messages as large
  as a ring's largest chunk and larger.
- The memory: one COPY_MB tensor copied into another on one rank (each byte read once and written once):
  bytes copied a second. A transfer between processes on one machine copies at least twice (into the
  socket's buffers and out of them).
- Gloo's path: the bytes each rank wrote (`wchar` of /proc/self/io: the sockets' writes) in one all-reduce of
  PATH_MB on a gloo group made with LOCAL_WORLD_SIZE unset and one made with it set to the world size. A
  shared-memory path would write next to nothing; TCP writes what the ring formula says, 2(N - 1)/N of the
  tensor, and its headers. The installed torch's gloo is asked, not assumed.

Each is the median over `rounds` with its range. A rank here is a process on the same cores as the others:
with more ranks than cores, the ranks share the cores that the link and the copies need.
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from _rounds import spread, unrecorded

import course
from course import comm, transfer

MESSAGE_MB, MESSAGES = 16, 8
COPY_MB = 256
PATH_MB = 16


def measure(rounds: int) -> dict:
    """{"loopback_GBps", "copy_GBps": {median, min, max}, "gloo_path": {...}, "rounds"}, measured on 2 ranks."""
    run = course.launch(_limits_on_rank, 2, args=(rounds,), timeout=600)
    loopback = [MESSAGES * MESSAGE_MB * 1e6 / s / 1e9 for s in run[0]["stream"]]
    both = [MESSAGES * MESSAGE_MB * 1e6 / max(a, b) / 1e9 for a, b in zip(run[0]["both"], run[1]["both"])]
    copy = [COPY_MB * 1e6 / s / 1e9 for s in run[0]["copy"]]
    written = {setting: [run[r]["written"][setting] for r in run.ranks] for setting in ("unset", "set")}
    formula = transfer.ring_all_reduce(PATH_MB * 1_000_000, 2)
    tcp = all(w is not None and w >= 0.9 * formula for ws in written.values() for w in ws)
    return {"rounds": rounds, "loopback_GBps": spread(loopback), "loopback_both_ways_GBps": spread(both),
            "copy_GBps": spread(copy),
            "gloo_path": {"tensor_MB": PATH_MB, "ranks": 2, "formula_bytes": formula,
                          "written_LOCAL_WORLD_SIZE_unset": written["unset"],
                          "written_LOCAL_WORLD_SIZE_set": written["set"],
                          "transport": os.environ.get("GLOO_DEVICE_TRANSPORT", "TCP (gloo's default)"),
                          "path": "TCP sockets, both ways" if tcp else "not all through the sockets"}}


def bus_bandwidth(nbytes: float, ranks: int, seconds: float) -> float:
    """An all-reduce's bus bandwidth, bytes a second: what each rank's link carries, the ring's 2(N - 1)/N · S,
    over t."""
    return transfer.ring_all_reduce(nbytes, ranks) / seconds


def limits_text(limits: dict) -> str:
    """One paragraph of markdown: the limits, how measured, and gloo's path."""
    path = limits["gloo_path"]
    return (f"Physical limits, measured in this run (medians of {limits['rounds']} rounds): the loopback link "
            f"through gloo's isend/irecv, {MESSAGES} messages of {MESSAGE_MB} MB streamed from one rank to another, "
            f"**{limits['loopback_GBps']['median']:.2f} GB/s** ({limits['loopback_GBps']['min']:.2f}-"
            f"{limits['loopback_GBps']['max']:.2f}) one way, and **{limits['loopback_both_ways_GBps']['median']:.2f} "
            f"GB/s** each way with both ranks streaming at once (the link a ring's rank has: it sends while it "
            f"receives); one {COPY_MB} MB copy in memory, "
            f"**{limits['copy_GBps']['median']:.2f} GB/s** ({limits['copy_GBps']['min']:.2f}-"
            f"{limits['copy_GBps']['max']:.2f}). Gloo's own all-reduce of {path['tensor_MB']} MB on 2 ranks wrote "
            f"{_bytes(path['written_LOCAL_WORLD_SIZE_unset'])} to its sockets with LOCAL_WORLD_SIZE unset and "
            f"{_bytes(path['written_LOCAL_WORLD_SIZE_set'])} with it set (the ring formula: "
            f"{path['formula_bytes']:,.0f} B): transport {path['transport']}, {path['path']}; the students' "
            "messages go the same way.")


def _bytes(written: list) -> str:
    if any(w is None for w in written):
        return "an unknown number of bytes (no /proc/self/io here)"
    return " and ".join(f"{w:,} B" for w in written) + " (ranks 0 and 1)"


@unrecorded
def _limits_on_rank(rounds: int) -> dict:
    """Runs on both ranks: the stream's and the copy's seconds a round (rank 0's), and each setting's bytes."""
    rank = dist.get_rank()
    message = torch.ones(MESSAGE_MB * 250_000)
    landed = torch.zeros(1)
    out = {"stream": [], "both": [], "copy": [], "written": {}}
    buffers = [torch.empty_like(message) for _ in range(MESSAGES)]
    for round_ in range(rounds + 1):                        # round 0 warms up
        receiving = [dist.irecv(b, src=0) for b in buffers] if rank == 1 else []
        dist.barrier()
        started = time.perf_counter()
        if rank == 0:                                       # one way: rank 0 to rank 1, then one element back
            for request in [dist.isend(message, dst=1) for _ in range(MESSAGES)]:
                request.wait()
            dist.recv(landed, src=1)
            if round_:
                out["stream"].append(time.perf_counter() - started)
        else:
            for request in receiving:
                request.wait()
            dist.send(landed, dst=0)
        other = 1 - rank                                    # both ways at once, as a ring's rank sends and receives
        receiving = [dist.irecv(b, src=other) for b in buffers]
        dist.barrier()
        started = time.perf_counter()
        for request in [dist.isend(message, dst=other) for _ in range(MESSAGES)] + receiving:
            request.wait()
        if round_:
            out["both"].append(time.perf_counter() - started)
    source, target = torch.ones(COPY_MB * 250_000), torch.empty(COPY_MB * 250_000)
    target.copy_(source)
    for _ in range(rounds):
        started = time.perf_counter()
        target.copy_(source)
        out["copy"].append(time.perf_counter() - started)
    dist.barrier()
    tensor = torch.ones(PATH_MB * 250_000)
    for setting in ("unset", "set"):
        if setting == "set":
            os.environ["LOCAL_WORLD_SIZE"] = str(dist.get_world_size())
        else:
            os.environ.pop("LOCAL_WORLD_SIZE", None)
        group = dist.new_group(backend="gloo")
        dist.all_reduce(tensor, group=group)               # connections made, buffers allocated
        dist.barrier(group=group)
        before = comm.socket_bytes_written()
        dist.all_reduce(tensor, group=group)
        after = comm.socket_bytes_written()
        out["written"][setting] = None if before is None else after - before
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    return out
