"""Recording a rank's torch.distributed calls, by patching them while it runs.

`Recorder.patch()` replaces `torch.distributed.<op>` with wrappers that log
each call as a `course.comm.CommRecord` and restores the originals after;
every other path to the wire (a process group's own methods, which the object
calls and distributed_c10d's functions use, and the c10d ops that skip
Python) is recorded where it meets, by course._group_recording.
Timing and bytes: a measurement window stays open while any call is in
flight; its bytes (gloo's socket writes) go to the calls in it, split in
proportion to their predictions when there are several. What a call sends, by
its arguments, is course._call_sizes's.

Used by: course._worker, course.grid_costs, course.grid_step, course.launch, course.link_probe, course.timeline.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import time

import torch.distributed as dist

from course import _call_sizes, _group_recording, transfer
from course._work_done import when_done
from course.comm import RECORDED, CommLog, CommRecord, refuse_a_missing_peer, socket_bytes_written

_ACTIVE: Recorder | None = None  # the recorder of the function running now, if any
# id(wrapper) -> the function it wraps: kept off the wrapper, so that no attribute of
# torch.distributed's names (`__wrapped__`, `_original`) leads around the recording.
_ORIGINAL_OF: dict[int, object] = {}


def active() -> Recorder | None:
    """The recorder of this process's running rank function (None outside one)."""
    return _ACTIVE


@contextlib.contextmanager
def unrecorded():
    """Inside a rank's function: calls in this block go straight to torch.distributed,
    unrecorded and without the recording's small cost per call (for benchmarks that
    time the course's code against PyTorch's C++, which is never recorded)."""
    if _ACTIVE is None:
        yield
        return
    with _ACTIVE.paused():
        yield


class _Recorded:
    """A torch.distributed function that logs each call. It compares equal to
    the function it wraps because torch's P2POp checks `op in [isend, irecv]`.
    Its name and docstring are the function's; no attribute holds the function."""

    def __init__(self, name, original, recorder):
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(self, attribute, getattr(original, attribute, None))
        _ORIGINAL_OF[id(self)] = original
        self._name, self._recorder = name, recorder
        self._signature = inspect.signature(original)

    def __call__(self, *args, **kwargs):
        return self._recorder.call(self, args, kwargs)

    def __eq__(self, other):
        return other is self or other is _ORIGINAL_OF.get(id(self))

    def __hash__(self):
        return hash(_ORIGINAL_OF.get(id(self)))


class Recorder:
    """Logs the calls of one rank; `patch()` routes torch.distributed through it."""

    def __init__(self, rank: int, backend: str, measure: bool | None = None):
        self.rank, self.backend = rank, backend
        self.log = CommLog()
        self.measure = (backend == "gloo") if measure is None else measure
        if self.measure and socket_bytes_written() is None:
            self.measure = False  # not Linux: predictions only
        self._t0 = time.perf_counter()
        self.spans: list = []  # course.timeline.Span, recorded by timeline.span
        self._lock = threading.Lock()
        self._inside = threading.local()  # torch calling itself is not a second call
        self._in_flight: list[CommRecord] = []  # the open window: calls since it began
        self._window_start: int | None = None
        self._awaited: dict[int, tuple] = {}  # id(tensor) -> (tensor, records): functional results not waited for

    # --- one call ----------------------------------------------------------------
    def call(self, wrapper: _Recorded, args, kwargs):
        original = _ORIGINAL_OF[id(wrapper)]
        if getattr(self._inside, "active", False):
            return original(*args, **kwargs)
        try:
            arguments = wrapper._signature.bind(*args, **kwargs).arguments
        except TypeError:  # bad arguments: torch says what is wrong
            return original(*args, **kwargs)
        refuse_a_missing_peer(self.rank, wrapper._name, arguments)
        try:
            record = self._record(wrapper._name, arguments)
        except Exception:  # noqa: BLE001 - torch says what is wrong; the group's method records what it does
            record = None
        if record is None:  # or this rank is not in the group: torch does nothing
            return original(*args, **kwargs)
        self._begin(record)
        self._inside.active = True
        try:
            result = original(*args, **kwargs)
        except BaseException:
            self._end(record)
            raise
        finally:
            self._inside.active = False
        if record.async_op and result is not None:
            return when_done(result, lambda: self._end(record))
        self._end(record)
        return result

    def _group_call(self, name: str, describe, run):
        """A process group's method or a c10d op (course._group_recording), unless
        torch.distributed.<op>, recorded already, is what called it."""
        if getattr(self._inside, "active", False):
            return run()
        try:
            records = [r for r in (_group_recording.record(call, self.rank, self.backend) for call in describe())
                       if r is not None]
        except Exception:  # noqa: BLE001 - arguments it cannot read: recorded by name, torch says what is wrong
            op = _group_recording.COURSE_OP.get(name, name)
            records = [CommRecord(self.rank, op, (), "", 0, 0, None, False, "unknown", 0)]
        for record in records:
            self._begin(record)
        self._inside.active = True
        try:
            result = run()
        except BaseException:
            for record in records:
                self._end(record)
            raise
        finally:
            self._inside.active = False
        return self._group_result(result, records)

    def _group_result(self, result, records):
        """Return `result`; end the records when it completes: a Work (a group's methods), a Work
        among tensors (c10d's ops), or the functional collectives' tensors, when waited for."""
        def end():
            for record in records:
                self._end(record)
        if isinstance(result, dist.Work):
            return when_done(result, end)
        if isinstance(result, tuple) and any(isinstance(item, dist.Work) for item in result):
            return tuple(when_done(item, end) if isinstance(item, dist.Work) else item for item in result)
        outputs = _group_recording.tensors_in(result)
        if outputs and records:
            with self._lock:
                self._awaited.update((id(t), (t, records)) for t in outputs)
            return result
        end()
        return result

    def _functional_waited(self, tensor) -> None:
        """A functional collective's result waited for (wait_tensor): its call is done."""
        with self._lock:
            _, records = self._awaited.pop(id(tensor), (None, ()))
        for record in records:
            self._end(record)

    def _record(self, name: str, arguments: dict) -> CommRecord | None:
        group = arguments.get("group")
        group_rank = dist.get_rank(group)
        if group_rank < 0:
            return None
        size = dist.get_world_size(group)
        shape, dtype, nbytes, peer = _call_sizes.describe(name, arguments)
        if peer is not None:
            key, value = peer
            global_rank = group is not None and not key.startswith("group_")
            peer = dist.get_group_rank(group, value) if global_rank else value
        formula = transfer.predict(_call_sizes.FORMULA_OF.get(name, name), nbytes, size, rank=group_rank,
                                   root=peer if peer is not None else 0, backend=self.backend,
                                   kept=_call_sizes.own_chunk(name, arguments, group_rank, nbytes))
        async_op = name in ("isend", "irecv") or bool(arguments.get("async_op", False))
        return CommRecord(self.rank, name, shape, dtype, nbytes, size, peer, async_op,
                          formula.algorithm, formula.sent, **_group_recording.named(group))

    # --- timing and bytes: a window stays open while any call is in flight --------
    def _begin(self, record: CommRecord) -> None:
        with self._lock:
            if not self._in_flight and self.measure:
                self._window_start = socket_bytes_written()
            record.start = self.now()
            self._in_flight.append(record)
            self.log.append(record)

    def _end(self, record: CommRecord) -> None:
        with self._lock:
            if record.end is not None:
                return  # already ended (a second wait())
            record.end = self.now()
            if any(r.end is None for r in self._in_flight):
                return  # the window stays open while any call in it is
            window, self._in_flight = self._in_flight, []
            if not self.measure:
                return
            written = socket_bytes_written() - self._window_start
            if len(window) == 1:
                window[0].measured = written
                return
            total = sum(r.predicted for r in window)
            for r in window:
                share = r.predicted / total if total else 1 / len(window)
                r.measured, r.shared = round(written * share), True

    def _batch_isend_irecv(self, p2p_op_list):
        """Each P2POp counts as its isend/irecv. torch's batch code needs the
        original functions back (it tests `op.op is isend`)."""
        records = []
        for p2p in p2p_op_list:
            if isinstance(p2p.op, _Recorded):
                p2p.op = _ORIGINAL_OF[id(p2p.op)]
            name = "isend" if p2p.op is self._originals["isend"] else "irecv"
            peer_key = "dst" if name == "isend" else "src"
            record = self._record(name, {"tensor": p2p.tensor, "group": p2p.group,
                                         peer_key: p2p.peer})
            if record is not None:
                self._begin(record)
                records.append(record)
        self._inside.active = True
        try:
            works = self._originals["batch_isend_irecv"](p2p_op_list)
        finally:
            self._inside.active = False
        remaining = [len(works or ())]

        def one_done():
            with self._lock:
                remaining[0] -= 1
                last = remaining[0] <= 0
            if last:
                for r in records:
                    self._end(r)
        if not works:
            one_done()
            return works
        return [when_done(w, one_done) for w in works]

    def finish(self) -> None:
        """Close calls never waited for, so their records get an end."""
        self._awaited.clear()
        for record in list(self._in_flight):
            self._end(record)

    def now(self) -> float:
        """Seconds since this rank's function started: the clock of records and spans."""
        return time.perf_counter() - self._t0

    @contextlib.contextmanager
    def paused(self):
        """torch.distributed's own functions for a while: nothing recorded, no recording cost."""
        patched = {name: getattr(dist, name) for name in self._originals}
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._groups.remove()
        try:
            yield
        finally:
            self._groups.install()
            for name, wrapper in patched.items():
                setattr(dist, name, wrapper)

    @contextlib.contextmanager
    def patch(self):
        """Route torch.distributed.<op>, every process group's methods and c10d's ops through
        this recorder, then restore."""
        global _ACTIVE
        _ACTIVE = self
        self._originals = {name: getattr(dist, name) for name in (*RECORDED, "batch_isend_irecv")
                           if hasattr(dist, name)}
        wrappers = [_Recorded(name, self._originals[name], self) for name in RECORDED if name in self._originals]
        for wrapper in wrappers:
            setattr(dist, wrapper._name, wrapper)

        def batch_isend_irecv(p2p_op_list):
            return self._batch_isend_irecv(p2p_op_list)
        batch_isend_irecv.__doc__ = self._originals["batch_isend_irecv"].__doc__
        dist.batch_isend_irecv = batch_isend_irecv
        self._groups = _group_recording.GroupPatch(self._group_call, self._functional_waited)
        self._groups.install()
        try:
            yield self.log
        finally:
            self._groups.remove()
            self.finish()
            _ACTIVE = None
            for name, original in self._originals.items():
                setattr(dist, name, original)
            for wrapper in wrappers:
                _ORIGINAL_OF.pop(id(wrapper), None)
