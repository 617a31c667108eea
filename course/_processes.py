"""Starting, watching and stopping the ranks of one launch.

Ranks are forked from multiprocessing's forkserver, which imports torch once
(course._rank_process). The parent then watches every rank's control pipe (result or error), exit
sentinel and output pipes in one selector loop, until all ranks returned, one
failed, or time ran out. Whatever happens, every rank is stopped and every
pipe closed before the call returns.

Used by: course.launch.
"""
from __future__ import annotations

import os
import selectors
import shutil
import signal
import tempfile
import time

import cloudpickle

from course import _rank_process, _worker, comm, errors, timeline
from course._output import RankOutput

_GRACE = 0.1  # seconds to gather errors raised at the same moment on other ranks
#: A launch's timeout counts the function's run, from when every rank has begun it: starting a rank
#: (its process, the imports its function needs) took over 5 s on a loaded 2-core machine, which a
#: demo's 5 s timeout must not pay. Ranks that never begin it are stopped this much later.
STARTUP_S = 60


class _Rank:
    """The parent's handles on one rank's process."""

    def __init__(self, rank, process, control, stdout, stderr, stack):
        self.rank, self.process, self.control = rank, process, control
        self.stdout, self.stderr, self.stack = stdout, stderr, stack
        self.reply = None        # ("result", ...) or ("error", report)
        self.started = False     # it has begun the function
        self.exit_code = None    # set when the process ended on its own
        self.failed_at = None    # time.time() of its failure

    @property
    def returned(self):
        return self.reply is not None and self.reply[0] == "result"


class Run:
    def __init__(self, where, payload, timeout, num_threads, fn_name, collective_timeout=None):
        self.where, self.payload, self.timeout = where, payload, timeout
        self.collective_timeout = collective_timeout   # set: gloo's timeout fires first, every rank reports
        self.all_started = False   # every rank has begun fn: the timeout runs from then (a report says which ran out)
        self.num_threads, self.fn_name = num_threads, fn_name
        self.ranks: list[_Rank] = []
        self.output = RankOutput()
        self.selector = selectors.DefaultSelector()

    def result(self) -> tuple[dict, comm.CommLog, dict]:
        """(values, communication log, timeline, seconds), each by rank; raises what failed."""
        __tracebackhide__ = True  # noqa: F841 - IPython's debugger steps over the launcher
        # The ranks meet through a file, not a TCP store: a TCP store looks up its peers'
        # host names, and where the resolver drops queries sent at once (several launches
        # on one machine) each lookup waits 5 s for its timeout.
        meeting = tempfile.mkdtemp(prefix="course-ranks-")
        try:
            self._start(os.path.join(meeting, "store"))
            outcome = self._wait()
            if outcome == "done":
                return self._finish()
            raise self._failure(outcome)
        finally:
            self._stop()
            shutil.rmtree(meeting, ignore_errors=True)

    def _start(self, store_path: str) -> None:
        context = _rank_process.forkserver()
        env = {"OMP_NUM_THREADS": str(self.num_threads)}
        lo = _rank_process.loopback_interface()
        if lo and "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = lo  # every rank is on this machine
        # Ours fires first, with stacks; unless the launch set one shorter, for ranks that report what they did.
        collective_timeout = self.collective_timeout or (self.timeout or 1800) + 60
        for rank, device in enumerate(self.where.devices):
            spec = _worker.RankSpec(rank, self.where.world_size, self.where.backend, device,
                                    store_path, collective_timeout, self.num_threads,
                                    self.payload, env, flight_records=self.collective_timeout is not None)
            control, control_child = context.Pipe(duplex=True)
            pipes = [context.Pipe(duplex=False) for _ in range(3)]  # stdout, stderr, stack
            process = context.Process(target=_worker.main, name=f"rank {rank}",
                                      args=(spec, control_child, *(w for _, w in pipes)))
            try:
                with _rank_process.without_main_module():
                    process.start()
                for child_end in (control_child, *(w for _, w in pipes)):
                    child_end.close()
                rank_ = _Rank(rank, process, control, *(r for r, _ in pipes))
                self.ranks.append(rank_)
            except BaseException:
                # An interrupt while this rank starts: it may run already (a forked child can
                # begin before start() returns), but _stop knows only self.ranks. Left alive,
                # it would wait for its control pipe to close, and this process's exit would
                # wait for it (multiprocessing joins its children at exit): both, forever.
                if not self.ranks or self.ranks[-1].process is not process:
                    _rank_process.abandon(process, control, control_child, *(end for pipe in pipes for end in pipe))
                raise
            self.selector.register(control.fileno(), selectors.EVENT_READ, ("control", rank_))
            self.selector.register(process.sentinel, selectors.EVENT_READ, ("exit", rank_))
            for stream, reader in (("stdout", rank_.stdout), ("stderr", rank_.stderr)):
                self.selector.register(reader.fileno(), selectors.EVENT_READ,
                                       ("output", rank_, stream))

    def _wait(self) -> str:
        """Until every rank returned ("done"), one failed ("failed") or time
        ran out ("timeout"): `timeout` seconds after every rank has begun the function, or
        STARTUP_S more than that after the launch, for ranks that never begin it."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout + STARTUP_S
        first_failure = None
        while not all(r.returned for r in self.ranks):
            now = time.monotonic()
            if not self.all_started and all(r.started for r in self.ranks):
                self.all_started = True
                deadline = None if self.timeout is None else min(deadline, now + self.timeout)
            if first_failure is not None and now >= first_failure + self._grace:
                return "failed"
            if deadline is not None and now >= deadline:
                return "timeout"
            limits = [t for t in (deadline, first_failure and first_failure + self._grace) if t]
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
                message = rank.control.recv()
                if message[0] == "started":
                    rank.started = True
                    continue
                rank.reply = message
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

    def _finish(self) -> tuple[dict, comm.CommLog, dict]:
        """Every rank returned: release them, collect their output, unpickle."""
        for rank in self.ranks:
            rank.control.send("exit")
        deadline = time.monotonic() + 10
        for rank in self.ranks:
            rank.process.join(max(0.0, deadline - time.monotonic()))
        self._drain_output()
        values, log, spans, seconds = {}, comm.CommLog(), timeline.Timeline(), {}
        for rank in self.ranks:
            _, result, records, took, _ = rank.reply
            values[rank.rank] = cloudpickle.loads(result)
            rank_log, rank_spans = cloudpickle.loads(records)
            log.extend(rank_log)
            spans.extend(rank_spans)
            seconds[rank.rank] = took
        return values, log, spans, seconds

    # --- failures ------------------------------------------------------------------
    def _failure(self, outcome: str) -> BaseException:
        if outcome == "timeout":
            waiting = [r for r in self.ranks if not r.returned]
            dumps = self._stacks(waiting)
            self._kill()
            self._drain_output()
            returned = {r.rank: r.reply[3] for r in self.ranks if r.returned}
            # ranks that never began the function waited for their start as well
            waited = self.timeout + (0 if self.all_started else STARTUP_S)
            return errors.with_what_ranks_did(
                errors.timeout_error(waited, self.fn_name, returned, dumps, _worker.USER_ENTRY),
                self._what_ranks_did())
        failed = sorted((r for r in self.ranks if r.failed_at is not None),
                        key=lambda r: r.failed_at)
        raised = [r for r in failed if r.reply is not None]
        died = [r for r in failed if r.reply is None]
        own_cause = [r for r in raised if not errors.lost_partner(r.reply[1])]
        self._kill()
        self._drain_output()
        if died and not own_cause:
            error = errors.exit_error({r.rank: r.exit_code for r in died}, self.fn_name)
        else:
            culprit = (own_cause or raised)[0]
            others = {r.rank: r.reply[1] for r in raised if r is not culprit}
            error = errors.rank_exception(culprit.rank, culprit.reply[1], others,
                                          self.where.world_size)
        return errors.with_what_ranks_did(error, self._what_ranks_did())

    @property
    def _grace(self) -> float:
        """Seconds to wait, after a rank failed, for the others' reports: a moment; or, where gloo's own
        timeout was set short, long enough for a rank that waits in another call to time out as well."""
        return _GRACE if self.collective_timeout is None else self.collective_timeout + 2 * _GRACE

    def _what_ranks_did(self) -> tuple[dict, dict]:
        """Of every rank that replied: ({rank: its CommLog}, {rank: its Flight Recorder entries or None})."""
        records, flight = {}, {}
        for rank in self.ranks:
            if rank.reply is None:
                continue
            if rank.reply[0] == "result":
                pickled, entries = rank.reply[2], rank.reply[4]
            else:
                pickled, entries = rank.reply[1].get("records"), rank.reply[1].get("flight")
            if pickled is not None:
                records[rank.rank] = cloudpickle.loads(pickled)[0]
            flight[rank.rank] = entries
        return records, flight

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
            _rank_process.kill_rank(rank.process)
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
