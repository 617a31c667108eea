"""PyTorch's Flight Recorder, read in a rank: the collectives its process groups began, in order.

    entries = flight_records.read()      # in a rank: [FlightEntry(seq=1, op="all_reduce", sizes=((4,),), ...)]

Every process group keeps a ring buffer of the collectives it was asked for (TORCH_FR_BUFFER_SIZE entries;
torch's default is on). On gloo with torch 2.13 it records collectives (not sends and receives), each with
its group's sequence number, operation, input shapes and the Python stack that called it; each call's state
stays "scheduled" (gloo never reports "started" or "completed"), so the entries say what each rank began, not
what finished: the last entry of a rank that hangs is the call it waited in. What works on gloo, measured:
bench/debug_tools.py, in bench/results/report.md.

`course.launch` reads it in each rank that fails (and in each that returns, where the launch failed), so a
failed launch's exception carries every rank's entries (`error.flight_records`): what lab 10 diagnoses a
hang from. A torch without a Flight Recorder dump (before 2.6 on a build without NCCL) gives None.

Used in: lab 10 (10_debugging).
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import torch

_TORCH = os.path.dirname(torch.__file__)
_COURSE = os.path.dirname(os.path.abspath(__file__))
#: The most entries a rank reports: a buffer holds up to TORCH_FR_BUFFER_SIZE (2,000 by default).
MOST = 2000


@dataclass(frozen=True)
class FlightEntry:
    """One collective as the Flight Recorder saw it begin on this rank."""
    seq: int                            # its process group's collective sequence number, from 1
    op: str                             # "all_reduce", "broadcast", "all_gather", "barrier", ...
    sizes: tuple[tuple[int, ...], ...]  # each input tensor's shape
    group: str                          # the process group's name ("default_pg", or its description)
    caller: str | None                  # "file:line function", the first frame outside torch and course/


def read() -> list[FlightEntry] | None:
    """This process's Flight Recorder entries, oldest first; None where this torch has no dump of them."""
    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)
    if dump is None:
        return None
    return entries(pickle.loads(dump()))


def entries(trace: dict) -> list[FlightEntry]:
    """The FlightEntry list of a Flight Recorder dump (the dict `_dump_fr_trace` pickles)."""
    found = []
    for entry in (trace or {}).get("entries", [])[-MOST:]:
        if entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or ("", "")
        found.append(FlightEntry(seq=int(entry["collective_seq_id"]),
                                 op=str(entry["profiling_name"]).split(":")[-1],
                                 sizes=tuple(tuple(int(n) for n in shape) for shape in entry.get("input_sizes", [])),
                                 group=str(group[1] or group[0]),
                                 caller=_caller(entry.get("frames", []))))
    return found


def _caller(frames) -> str | None:
    for frame in frames:
        folder = os.path.dirname(os.path.abspath(frame["filename"])) if frame["filename"].startswith("/") else ""
        if not (folder.startswith(_TORCH) or folder == _COURSE):
            return f"{os.path.basename(frame['filename'])}:{frame['line']} {frame['name']}"
    return None
