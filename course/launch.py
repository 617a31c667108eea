"""Run a function on N ranks from a notebook cell, a script, or under torchrun.

    results = course.launch(train, 2, args=(data,))
    results[1]        # what rank 1 returned
    results.comm      # every collective and message, per rank

Each rank is a real torch.distributed process, forked from a server process
that has torch imported already (multiprocessing's forkserver): a launch
takes a tenth of a second where spawning fresh interpreters takes seconds,
and nothing is forked from the notebook's own threads (plain fork can hang
inside a threaded matmul). The function and its arguments travel with
cloudpickle, so functions and classes defined in the notebook work.

Under torchrun the process already is a rank: `launch` runs the function
in-process and returns this rank's result only.

Ranks that hang (a collective one rank never calls) are stopped after
DEFAULT_TIMEOUT_S, so that a deadlock is reported in half a minute, not two.
Every launch of the labs and the demo took at most 5 s on a busy 2-core
machine (4 ranks, a kernel's first launch included): 30 s leaves a machine six
times slower room. A slow machine raises it for every launch with one
variable, COURSE_RANK_TIMEOUT=120 (seconds), or for one launch with timeout=.

`world_size` is torch.distributed's word for the number of ranks; the cost models say `ranks`,
the views `gpus` (CONTRIBUTING.md, "Words", says why).

Used in: every lab that launches ranks, the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import atexit
import math
import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

# Before any process group exists: torch.distributed.nn's functions take `group=group.WORLD`
# as a default, evaluated when the module is first imported (torch._dynamo imports it, and
# the first optimizer imports dynamo). Imported after init_process_group, those defaults hold
# the world group for good: destroy_process_group then leaves gloo's threads running, and
# tearing them down at interpreter exit can abort a torchrun rank (SIGABRT, "terminate
# called without an active exception").
import torch.distributed.nn  # noqa: F401

from course import _pickling, _processes, _wire_records, placement, recorder
from course.errors import TIMEOUT_VARIABLE
from course.timeline import Timeline

#: Seconds a launch waits for its ranks unless told otherwise ($COURSE_RANK_TIMEOUT changes it).
DEFAULT_TIMEOUT_S = 30.0


class _FromEnvironment:
    """launch's default timeout: $COURSE_RANK_TIMEOUT, else DEFAULT_TIMEOUT_S (read at each call)."""

    def __repr__(self):
        return f"${TIMEOUT_VARIABLE} or {DEFAULT_TIMEOUT_S:g} s"


FROM_ENVIRONMENT = _FromEnvironment()


def default_timeout() -> float:
    """Seconds a launch waits when not given `timeout`: $COURSE_RANK_TIMEOUT if set, else DEFAULT_TIMEOUT_S."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r} is not a number of seconds: set it to a positive "
                         f"number, such as {TIMEOUT_VARIABLE}=120 on a slow machine, or unset it for the "
                         f"default {DEFAULT_TIMEOUT_S:g} s")
    return seconds


class RankResults(Sequence):
    """What each rank returned, indexed by rank, with the run's records."""

    def __init__(self, values: dict, world_size: int, comm_log, backend: str, devices,
                 seconds: dict, timeline=()):
        self._values = dict(sorted(values.items()))
        self.world_size, self.comm, self.backend = world_size, comm_log, backend
        self.timeline = Timeline(timeline)  # compute spans marked with course.timeline.span
        self.devices = tuple(devices)
        self.seconds = seconds  # rank -> seconds its function ran

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(self._values)

    def __getitem__(self, rank):
        if isinstance(rank, slice):
            return list(self._values.values())[rank]
        if rank not in self._values:
            raise IndexError(f"no result for rank {rank}: this process holds ranks {self.ranks}"
                             + (" (under torchrun each process sees only its own)"
                                if len(self._values) < self.world_size else ""))
        return self._values[rank]

    def __len__(self):
        return len(self._values)

    def __iter__(self):
        return iter(self._values.values())

    def __repr__(self):
        return f"RankResults({list(self._values.values())!r})"


def launch(fn, world_size: int | None, args=(), kwargs=None, *, backend: str | None = None,
           device: str | None = None, timeout: float | None = FROM_ENVIRONMENT,
           num_threads: int = 1, collective_timeout: float | None = None) -> RankResults:
    """Run `fn(*args, **kwargs)` on `world_size` ranks; return their results by rank.

    backend, device: see course.placement.choose (default: NCCL with a GPU per
        rank where there are enough GPUs, gloo otherwise).
    timeout: seconds the ranks may run `fn`, from when every rank has begun it (starting
        the ranks is not counted, up to a minute); then each rank's stack is reported
        and every rank is stopped (course.RankTimeout).
        None waits forever. Default: $COURSE_RANK_TIMEOUT if set, else 30 s,
        which every launch of the labs fits in with a wide margin; on a slow
        machine, set COURSE_RANK_TIMEOUT=120 (seconds) before starting Jupyter
        or in the notebook's os.environ, and every launch waits that long.
    num_threads: torch threads per rank. One per rank on a CPU machine: more
        threads than cores makes every measurement lie.
    collective_timeout: seconds a collective may wait for its peers before the
        process group itself raises on the waiting rank (shorter than `timeout`).
        A hang then ends with each rank's own error, and the exception carries what
        every rank that replied had done: `error.records` ({rank: its CommLog}) and
        `error.flight_records` ({rank: PyTorch's Flight Recorder entries,
        course.flight_records}). None (the default): the launch's own timeout
        fires first and reports where each rank waits. Under torchrun, the
        process group is torchrun's and this is not used.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython's debugger steps over the launcher
    kwargs = dict(kwargs or {})
    if timeout is FROM_ENVIRONMENT:
        timeout = default_timeout()
    if not callable(fn):
        raise TypeError(f"launch needs a function to run on the ranks, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of arguments for {_name(fn)}, got "
                        f"{type(args).__name__}; write args=(x,) for a single one")
    if timeout is not None and not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds or None (wait forever), got {timeout!r}")
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive whole number, got {num_threads!r}")
    if collective_timeout is not None and not (
            isinstance(collective_timeout, (int, float)) and math.isfinite(collective_timeout)
            and 0 < collective_timeout and (timeout is None or collective_timeout < timeout)):
        raise ValueError(f"collective_timeout must be a positive number of seconds under the launch's timeout "
                         f"({timeout!r}), or None; got {collective_timeout!r}")
    if placement.under_torchrun():
        return _launch_in_process(fn, world_size, args, kwargs, num_threads)
    if placement.rank_device is not None:
        raise RuntimeError("course.launch was called inside a rank; call the function "
                           "directly there, or launch from the notebook")
    if world_size is None:
        raise ValueError("world_size is needed outside torchrun: how many ranks to start")
    where = placement.choose(world_size, backend, device)
    try:
        payload = _pickling.dumps((fn, tuple(args), kwargs))   # cell functions keep their file names
    except Exception as error:
        raise TypeError(f"could not send {_name(fn)} and its arguments to the ranks: {error}. "
                        "Pass only data (tensors, numbers, lists) and functions or classes "
                        "defined in the notebook or in importable modules.") from error
    values, log, spans, seconds = _processes.Run(where, payload, timeout, num_threads, _name(fn),
                                                 collective_timeout).result()
    # While grading, the judge compares it with the wire (a launch that failed reports nothing).
    _wire_records.report(log, where.world_size)
    return RankResults(values, where.world_size, log, where.backend, where.devices, seconds, spans)


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


# --- under torchrun ----------------------------------------------------------------

def _launch_in_process(fn, world_size, args, kwargs, num_threads) -> RankResults:
    size = int(os.environ["WORLD_SIZE"])
    if world_size is not None and world_size != size:
        raise ValueError(f"launch asked for {world_size} ranks but torchrun started {size}; "
                         "pass world_size=None to take torchrun's")
    if not dist.is_initialized():
        _join_torchrun(num_threads)
    elif placement.rank_device is None:  # the script made the process group itself
        placement.rank_device = (torch.device("cuda", torch.cuda.current_device())
                                 if "nccl" in dist.get_backend() else torch.device("cpu"))
    rank, device = dist.get_rank(), placement.rank_device
    backend = "nccl" if "nccl" in dist.get_backend() else dist.get_backend()
    calls = recorder.Recorder(rank, backend)
    started = time.perf_counter()
    with calls.patch():
        value = fn(*args, **kwargs)
    return RankResults({rank: value}, size, calls.log, backend, [str(device)],
                       {rank: time.perf_counter() - started}, calls.spans)


def _join_torchrun(num_threads) -> None:
    """Make the process group torchrun's variables describe, on the backend every rank
    can use. The ranks first say, through torchrun's store, which GPU each would take:
    two torchrun "nodes" on one machine both have LOCAL_RANK 0, and where they would
    share a GPU, NCCL refuses, so every rank takes gloo (see placement.torchrun_placement)."""
    store, rank, size = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # keys fresh after a restart
    store.set(f"course/gpu/{attempt}/{rank}", placement.gpu_claim(int(os.environ["LOCAL_RANK"])))
    claims = [store.get(f"course/gpu/{attempt}/{r}").decode() for r in range(size)]
    rank, size, here = placement.torchrun_placement(claims)
    placement.rank_device = device = torch.device(here.devices[0])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(num_threads)
    dist.init_process_group(placement.process_group_backend(here.backend), rank=rank,
                            world_size=size, store=dist.PrefixStore("default_pg", store))
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
