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
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import multiprocessing
import multiprocessing.spawn
import os
import selectors
import signal
import socket
import time
import uuid
from collections.abc import Sequence

import cloudpickle
import torch
import torch.distributed as dist

from course import _worker, comm, errors, placement
from course._output import RankOutput
from course.errors import RankError, RankExited, RankTimeout

_GRACE = 0.1  # seconds to gather errors raised at the same moment on other ranks
_PARTNER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe",
                 "connection refused", "communicator was aborted", "socket closed")


class RankResults(Sequence):
    """What each rank returned, indexed by rank, with the run's records."""

    def __init__(self, values: dict, world_size: int, comm_log, backend: str, devices,
                 seconds: dict):
        self._values = dict(sorted(values.items()))
        self.world_size, self.comm, self.backend = world_size, comm_log, backend
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
           device: str | None = None, timeout: float | None = 120.0,
           num_threads: int = 1) -> RankResults:
    """Run `fn(*args, **kwargs)` on `world_size` ranks; return their results by rank.

    backend, device: see course.placement.choose (default: NCCL with a GPU per
        rank where there are enough GPUs, gloo otherwise).
    timeout: seconds until the ranks must have returned; then each rank's
        stack is reported and every rank is stopped. None waits forever.
    num_threads: torch threads per rank. One per rank on a CPU machine: more
        threads than cores makes every measurement lie.
    """
    kwargs = dict(kwargs or {})
    if not callable(fn):
        raise TypeError(f"launch needs a function to run on the ranks, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of arguments for {_name(fn)}, got "
                        f"{type(args).__name__}; write args=(x,) for a single one")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout}")
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive whole number, got {num_threads!r}")
    if placement.under_torchrun():
        return _launch_in_process(fn, world_size, args, kwargs, num_threads)
    if placement.rank_device is not None:
        raise RuntimeError("course.launch was called inside a rank; call the function "
                           "directly there, or launch from the notebook")
    if world_size is None:
        raise ValueError("world_size is needed outside torchrun: how many ranks to start")
    where = placement.choose(world_size, backend, device)
    try:
        payload = cloudpickle.dumps((fn, tuple(args), kwargs))
    except Exception as error:
        raise TypeError(f"could not send {_name(fn)} and its arguments to the ranks: {error}. "
                        "Pass only data (tensors, numbers, lists) and functions or classes "
                        "defined in the notebook or in importable modules.") from error
    return _Run(where, payload, timeout, num_threads, _name(fn)).result()


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


# --- under torchrun ----------------------------------------------------------------

def _launch_in_process(fn, world_size, args, kwargs, num_threads) -> RankResults:
    rank, size, here = placement.torchrun_placement()
    if world_size is not None and world_size != size:
        raise ValueError(f"launch asked for {world_size} ranks but torchrun started {size}; "
                         "pass world_size=None to take torchrun's")
    placement.rank_device = device = torch.device(here.devices[0])
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(num_threads)
        dist.init_process_group(here.backend)
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    backend = dist.get_backend()
    recorder = comm.Recorder(rank, backend)
    started = time.perf_counter()
    with recorder.patch():
        value = fn(*args, **kwargs)
    return RankResults({rank: value}, size, recorder.log, backend, [str(device)],
                       {rank: time.perf_counter() - started})


# --- one launch from a notebook or script -----------------------------------------

def _forkserver():
    context = multiprocessing.get_context("forkserver")
    # The server imports torch once; every rank is a fork of it after that.
    context.set_forkserver_preload(["course._worker"])
    return context


@contextlib.contextmanager
def _without_main_module():
    """Start ranks without re-running the parent's script in them.

    forkserver, like spawn, imports the parent's __main__ in every child: a
    script without an `if __name__ == "__main__":` guard would launch again
    from each rank. Ranks need nothing from __main__ (cloudpickle sends the
    function by value), so its entry is left out of what children prepare.
    """
    original = multiprocessing.spawn.get_preparation_data

    def without_main(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data
    multiprocessing.spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        multiprocessing.spawn.get_preparation_data = original


def _loopback_interface() -> str | None:
    try:
        return next(name for _, name in socket.if_nameindex() if name.startswith("lo"))
    except (OSError, StopIteration):
        return None


class _Rank:
    """The parent's handles on one rank's process."""

    def __init__(self, rank, process, control, stdout, stderr, stack):
        self.rank, self.process, self.control = rank, process, control
        self.stdout, self.stderr, self.stack = stdout, stderr, stack
        self.reply = None        # ("result", ...) or ("error", report)
        self.exit_code = None    # set when the process ended on its own
        self.failed_at = None    # time.time() of its failure

    @property
    def returned(self):
        return self.reply is not None and self.reply[0] == "result"


class _Run:
    def __init__(self, where, payload, timeout, num_threads, fn_name):
        self.where, self.payload, self.timeout = where, payload, timeout
        self.num_threads, self.fn_name = num_threads, fn_name
        self.ranks: list[_Rank] = []
        self.output = RankOutput()
        self.selector = selectors.DefaultSelector()

    def result(self) -> RankResults:
        store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60))
        try:
            self._start(store.port)
            outcome = self._wait()
            if outcome == "done":
                return self._finish()
            raise self._failure(outcome)
        finally:
            self._stop()
            del store

    def _start(self, store_port: int) -> None:
        context = _forkserver()
        env = {"OMP_NUM_THREADS": str(self.num_threads)}
        lo = _loopback_interface()
        if lo and "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = lo  # every rank is on this machine
        collective_timeout = (self.timeout or 1800) + 60  # ours fires first, with stacks
        prefix = uuid.uuid4().hex
        for rank, device in enumerate(self.where.devices):
            spec = _worker.RankSpec(rank, self.where.world_size, self.where.backend, device,
                                    store_port, prefix, collective_timeout, self.num_threads,
                                    self.payload, env)
            control, control_child = context.Pipe(duplex=True)
            pipes = [context.Pipe(duplex=False) for _ in range(3)]  # stdout, stderr, stack
            process = context.Process(target=_worker.main, name=f"rank {rank}",
                                      args=(spec, control_child, *(w for _, w in pipes)))
            with _without_main_module():
                process.start()
            for child_end in (control_child, *(w for _, w in pipes)):
                child_end.close()
            rank_ = _Rank(rank, process, control, *(r for r, _ in pipes))
            self.ranks.append(rank_)
            self.selector.register(control.fileno(), selectors.EVENT_READ, ("control", rank_))
            self.selector.register(process.sentinel, selectors.EVENT_READ, ("exit", rank_))
            for stream, reader in (("stdout", rank_.stdout), ("stderr", rank_.stderr)):
                self.selector.register(reader.fileno(), selectors.EVENT_READ,
                                       ("output", rank_, stream))

    def _wait(self) -> str:
        """Until every rank returned ("done"), one failed ("failed") or time
        ran out ("timeout")."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        first_failure = None
        while not all(r.returned for r in self.ranks):
            now = time.monotonic()
            if first_failure is not None and now >= first_failure + _GRACE:
                return "failed"
            if deadline is not None and now >= deadline:
                return "timeout"
            limits = [t for t in (deadline, first_failure and first_failure + _GRACE) if t]
            wait = max(0.0, min(limits) - now) if limits else None
            for key, _ in self.selector.select(wait):
                kind, rank = key.data[0], key.data[1]
                if kind == "output":
                    self._read_output(key.fd, rank, key.data[2])
                elif kind == "control":
                    self._read_control(rank)
                else:
                    self._read_control(rank)  # a last word may wait in the pipe
                    self.selector.unregister(key.fd)
                    if rank.reply is None:
                        rank.exit_code = rank.process.exitcode
                        if rank.exit_code is None:
                            rank.process.join(1)
                            rank.exit_code = rank.process.exitcode
                        rank.failed_at = time.time()
                if first_failure is None and any(r.failed_at for r in self.ranks):
                    first_failure = time.monotonic()
        return "done"

    def _read_control(self, rank: _Rank) -> None:
        try:
            while rank.control.poll():
                rank.reply = rank.control.recv()
                if rank.reply[0] == "error":
                    rank.failed_at = rank.reply[1]["time"]
        except (EOFError, OSError):
            try:
                self.selector.unregister(rank.control.fileno())
            except (KeyError, ValueError):
                pass

    def _read_output(self, fd: int, rank: _Rank, stream: str) -> None:
        data = os.read(fd, 65536)
        if data:
            self.output.write(rank.rank, stream, data)
        else:
            self.selector.unregister(fd)

    def _finish(self) -> RankResults:
        """Every rank returned: release them, collect their output, unpickle."""
        for rank in self.ranks:
            rank.control.send("exit")
        deadline = time.monotonic() + 10
        for rank in self.ranks:
            rank.process.join(max(0.0, deadline - time.monotonic()))
        self._drain_output()
        values, log, seconds = {}, comm.CommLog(), {}
        for rank in self.ranks:
            _, result, records, took = rank.reply
            values[rank.rank] = cloudpickle.loads(result)
            log.extend(cloudpickle.loads(records))
            seconds[rank.rank] = took
        return RankResults(values, self.where.world_size, log, self.where.backend,
                           self.where.devices, seconds)

    # --- failures ------------------------------------------------------------------
    def _failure(self, outcome: str) -> BaseException:
        if outcome == "timeout":
            return self._timeout_error()
        failed = [r for r in self.ranks if r.failed_at is not None]
        raised = [r for r in failed if r.reply is not None]
        died = [r for r in failed if r.reply is None]
        own_cause = [r for r in raised if not _lost_partner(r.reply[1])]
        self._kill()
        self._drain_output()
        if own_cause:
            return self._rank_exception(min(own_cause, key=lambda r: r.failed_at), failed)
        if died:
            return self._exit_error(died)
        return self._rank_exception(min(raised, key=lambda r: r.failed_at), failed)

    def _rank_exception(self, culprit: _Rank, failed: list[_Rank]) -> BaseException:
        report = culprit.reply[1]
        text = report["text"]
        if report["summary"] is not None:  # format here, where the cells' source is
            text = "".join(cloudpickle.loads(report["summary"]).format())
        text = errors.relabel_cells(text.replace(
            "Traceback (most recent call last):",
            f"Traceback on rank {culprit.rank} (most recent call last):", 1))
        note = f"raised on rank {culprit.rank} of {self.where.world_size}"
        if report["while"]:
            note += f" while {report['while']}"
        for other in sorted((r for r in failed if r is not culprit), key=lambda r: r.rank):
            if other.reply is None:
                continue
            theirs = other.reply[1]
            if _lost_partner(theirs):
                note += f"; rank {other.rank} then lost its partner"
            elif (theirs["type"], theirs["message"]) == (report["type"], report["message"]):
                note += f"; rank {other.rank} raised the same {theirs['type']}"
            else:
                note += f"; rank {other.rank} raised {theirs['type']}: {theirs['message']}"
        note += "; every rank was stopped"
        exception = None
        if report["exception"] is not None:
            try:
                exception = cloudpickle.loads(report["exception"])
                exception.add_note(note)
                exception.rank = culprit.rank
            except Exception:  # noqa: BLE001 - fall back to a RankError
                exception = None
        if exception is None:
            exception = RankError(f"rank {culprit.rank} raised {report['type']}: "
                                  f"{report['message']}\n({note})", [culprit.rank])
        exception.__cause__ = errors.RemoteTraceback(text)
        return exception

    def _exit_error(self, died: list[_Rank]) -> RankExited:
        lines = []
        for rank in sorted(died, key=lambda r: r.failed_at):
            code = rank.exit_code
            if code is not None and code < 0:
                name = signal.Signals(-code).name
                how = f"was killed by signal {-code} ({name})"
            else:
                how = f"exited with code {code}"
            line = f"rank {rank.rank} {how} before {self.fn_name} returned"
            if code == -signal.SIGKILL:
                line += " (SIGKILL often comes from the out-of-memory killer)"
            lines.append(line)
        return RankExited("; ".join(lines) + ". Every other rank was stopped.",
                          [r.rank for r in died])

    def _timeout_error(self) -> RankTimeout:
        waiting = [r for r in self.ranks if not r.returned]
        dumps = self._stacks(waiting)
        self._kill()
        self._drain_output()
        lines = [f"ranks {[r.rank for r in waiting]} did not finish {self.fn_name} within "
                 f"{self.timeout:g} s. Usually a rank waits in a collective that another "
                 "rank never calls. Where each rank was:"]
        for rank in self.ranks:
            if rank.returned:
                lines.append(f"rank {rank.rank} returned from {self.fn_name} after "
                             f"{rank.reply[3]:.2f} s and is waiting for the others.")
                continue
            frames = errors.user_stack(dumps.get(rank.rank, ""), _worker.USER_ENTRY)
            if frames is None:
                frames = errors.main_thread_stack(dumps.get(rank.rank, ""))
                lines.append(f"rank {rank.rank} had not reached {self.fn_name} yet:")
            else:
                lines.append(f"rank {rank.rank} is waiting here:")
            lines.append(errors.format_waiting(frames).rstrip("\n"))
        return RankTimeout("\n".join(lines), [r.rank for r in waiting])

    def _stacks(self, ranks: list[_Rank]) -> dict[int, str]:
        """Each rank's Python stacks, dumped by faulthandler on SIGUSR1."""
        for rank in ranks:
            try:
                os.kill(rank.process.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        text = {r.rank: b"" for r in ranks}
        readers = {r.stack.fileno(): r for r in ranks}
        selector = selectors.DefaultSelector()
        for fd in readers:
            selector.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + 2.0
        while readers and time.monotonic() < deadline:
            ready = selector.select(0.2)  # faulthandler writes at once; quiet means done
            if not ready:
                break
            for key, _ in ready:
                data = os.read(key.fd, 65536)
                if data:
                    text[readers[key.fd].rank] += data
                else:
                    selector.unregister(key.fd)
                    del readers[key.fd]
        selector.close()
        return {rank: data.decode("utf-8", "replace") for rank, data in text.items()}

    # --- leaving nothing behind ---------------------------------------------------
    def _kill(self) -> None:
        for rank in self.ranks:
            for kill in (lambda: os.killpg(rank.process.pid, signal.SIGKILL), rank.process.kill):
                try:
                    kill()
                except (ProcessLookupError, PermissionError, OSError, AttributeError):
                    pass
        for rank in self.ranks:
            rank.process.join(2)

    def _drain_output(self, seconds: float = 1.0) -> None:
        """Forward what the ranks printed last; stop when every pipe closed."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            outputs = [k for k in self.selector.get_map().values() if k.data[0] == "output"]
            if not outputs:
                break
            ready = self.selector.select(max(0.0, deadline - time.monotonic()))
            for key, _ in ready:
                if key.data[0] == "output":
                    self._read_output(key.fd, key.data[1], key.data[2])
                else:
                    self.selector.unregister(key.fd)
        self.output.flush()

    def _stop(self) -> None:
        """Whatever happened (an interrupt too): no process, pipe or port left."""
        if any(r.process.is_alive() for r in self.ranks):
            self._kill()
        self.output.flush()
        self.selector.close()
        for rank in self.ranks:
            for connection in (rank.control, rank.stdout, rank.stderr, rank.stack):
                connection.close()
            rank.process.close()


def _lost_partner(report: dict) -> bool:
    """True for the errors a rank gets because another rank went away."""
    message = f"{report['type']}: {report['message']}".lower()
    return any(phrase in message for phrase in _PARTNER_LOST)
