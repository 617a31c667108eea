"""One rank: the process `course.launch` starts for each rank.

It joins the process group, runs the cell's function with communication
recorded, sends the result (or the error) to the parent over its control
pipe, and waits for the parent's word before it leaves, so that a rank that
finished early never looks like a crash to a rank still waiting for it.

Used by: course._processes.
"""
from __future__ import annotations

import datetime
import faulthandler
import io
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field

import cloudpickle
import torch
import torch.distributed as dist

from course import _tracebacks, flight_records, placement, recorder

# The frame of this function marks where the user's code begins, in tracebacks
# and in stack dumps; the parent trims everything above it.
USER_ENTRY = "_call_user_function"


@dataclass
class RankSpec:
    rank: int
    world_size: int
    backend: str
    device: str
    store_path: str  # the file the ranks meet through (a fresh one for each launch)
    collective_timeout: float  # seconds; longer than the parent's deadline unless the launch set it shorter
    num_threads: int
    payload: bytes  # cloudpickle of (fn, args, kwargs)
    env: dict = field(default_factory=dict)
    flight_records: bool = False  # send the Flight Recorder's entries back (a launch with a collective_timeout)


def main(spec: RankSpec, control, stdout_pipe, stderr_pipe, stack_pipe) -> None:
    os.setpgid(0, 0)  # own process group: the parent ends us and our children at once
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when ranks stop
    _redirect_output(stdout_pipe, stderr_pipe)
    # torch 2.13 renamed all_gather_into_tensor and reduce_scatter_tensor and warns on every call. The old names
    # are the course's own for torch 2.4 on, and nbgrader scores a test cell that writes to stderr 0: a student
    # who used them would lose an exercise to a rename.
    warnings.filterwarnings("ignore", category=FutureWarning, message=r"`torch\.distributed\.\w+` is deprecated")
    faulthandler.enable(file=sys.stderr)  # a segfault still shows a Python stack
    faulthandler.register(signal.SIGUSR1, file=stack_pipe.fileno(), all_threads=True)
    released = threading.Event()
    threading.Thread(target=_watch_parent, args=(control, released), daemon=True,
                     name="course-watch-parent").start()

    os.environ.update(spec.env)
    torch.set_num_threads(spec.num_threads)
    held: dict = {}  # the rank's Recorder, once it exists: its records go back with an error too
    try:
        result, records, seconds = _run(spec, control, held)
        try:
            reply = ("result", _ResultPickler.dumps(result), cloudpickle.dumps(records), seconds,
                     _flight(spec))
        except Exception as error:  # noqa: BLE001 - e.g. a generator, an open file
            reply = ("error", error_report(error, spec.rank,
                                           while_doing="sending its return value to the cell"))
    except BaseException as error:  # noqa: BLE001 - everything goes to the parent
        reply = ("error", error_report(error, spec.rank))
    if reply[0] == "error":
        reply[1].update(_what_it_did(spec, held))
    _flush()
    control.send(reply)
    released.wait()
    if dist.is_initialized():
        dist.destroy_process_group()
    _flush()


def _run(spec: RankSpec, control, held: dict):
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    placement.rank_device = device
    dist.init_process_group(placement.process_group_backend(spec.backend),
                            store=dist.FileStore(spec.store_path, spec.world_size),
                            rank=spec.rank, world_size=spec.world_size,
                            timeout=datetime.timedelta(seconds=spec.collective_timeout))
    fn, args, kwargs = cloudpickle.loads(spec.payload)
    control.send(("started",))  # the launch's timeout runs from here: a loaded machine starts ranks slowly
    calls = held["calls"] = recorder.Recorder(spec.rank, spec.backend)
    started = time.perf_counter()
    with calls.patch():
        result = _call_user_function(fn, args, kwargs)
    return result, (calls.log, calls.spans), time.perf_counter() - started


def _flight(spec: RankSpec):
    """This rank's Flight Recorder entries where the launch asked for them (a collective_timeout), else None."""
    if not spec.flight_records or not dist.is_initialized():
        return None
    try:
        return flight_records.read()
    except Exception:  # noqa: BLE001 - a diagnosis aid: its absence must not hide the rank's own error
        return None


def _what_it_did(spec: RankSpec, held: dict) -> dict:
    """What a failed rank had done: its course records (CommLog, Timeline) up to the failure, pickled, and its
    Flight Recorder entries (where asked for)."""
    calls = held.get("calls")
    try:
        records = None if calls is None else cloudpickle.dumps((calls.log, calls.spans))
    except Exception:  # noqa: BLE001 - as above
        records = None
    return {"records": records, "flight": _flight(spec)}


def _call_user_function(fn, args, kwargs):
    return fn(*args, **kwargs)


def _watch_parent(control, released: threading.Event) -> None:
    """Leave when the parent says so, or at once if the parent is gone."""
    try:
        while control.recv() != "exit":
            pass
        released.set()
    except (EOFError, OSError):
        os._exit(70)


def _redirect_output(stdout_pipe, stderr_pipe) -> None:
    """Send fd 1 and 2 (Python's prints and C++ messages alike) to the parent."""
    for fd, pipe, name in ((1, stdout_pipe, "stdout"), (2, stderr_pipe, "stderr")):
        os.dup2(pipe.fileno(), fd)
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def error_report(error: BaseException, rank: int, while_doing: str | None = None) -> dict:
    """What the parent needs to re-raise `error` in the cell: the exception
    itself if it survives pickling, and its traceback with our frames cut."""
    summary = traceback.TracebackException.from_exception(error, lookup_lines=False)
    _trim_to_user_code(summary)
    report = {"rank": rank, "time": time.time(), "type": type(error).__qualname__,
              "message": str(error), "while": while_doing, "summary": None, "exception": None}
    try:  # before formatting: formatting caches source lines, and ours has no cells
        report["summary"] = cloudpickle.dumps(summary)
    except Exception:  # noqa: BLE001 - the text below still carries the traceback
        pass
    report["text"] = "".join(summary.format())
    try:
        error.__traceback__ = None
        report["exception"] = cloudpickle.dumps(error)
        cloudpickle.loads(report["exception"])
    except Exception:  # noqa: BLE001 - unpicklable: the parent raises RankError instead
        report["exception"] = None
    return report


def _trim_to_user_code(summary: traceback.TracebackException) -> None:
    """Drop the frames of the course's own plumbing from a traceback chain."""
    todo, seen = [summary], set()
    while todo:
        summary = todo.pop()
        if summary is None or id(summary) in seen:
            continue
        seen.add(id(summary))
        frames = _tracebacks.below_entry(list(summary.stack), USER_ENTRY,
                                         lambda f: f.name, lambda f: f.filename)
        summary.stack = traceback.StackSummary.from_list(frames)
        todo += [summary.__cause__, summary.__context__]


class _ResultPickler(cloudpickle.Pickler):
    """Results come back to the cell on the CPU: the cell is not a rank and
    holds no device of its own."""

    @classmethod
    def dumps(cls, obj) -> bytes:
        buffer = io.BytesIO()
        cls(buffer).dump(obj)
        return buffer.getvalue()

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
            on_cpu = obj.detach().cpu()
            if isinstance(obj, torch.nn.Parameter):
                on_cpu = torch.nn.Parameter(on_cpu, requires_grad=obj.requires_grad)
            return _same, (on_cpu,)
        return super().reducer_override(obj)


def _same(obj):
    return obj
