"""Knowing when a torch.distributed Work completes: by its future where it has one, else at its
wait() (gloo gives no future for point-to-point messages or reduce_scatter).

Used by: course.recorder.
"""
from __future__ import annotations

import threading

import torch.distributed as dist


class _TrackedWork(dist.Work):
    """A Work whose completion is seen at wait()."""

    def __init__(self, inner, on_done):
        super().__init__()
        self._inner, self._on_done = inner, on_done

    def wait(self, timeout=None):
        done = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        self._on_done()
        return done

    def is_completed(self):
        return self._inner.is_completed()

    def is_success(self):
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def source_rank(self):
        return self._inner.source_rank()

    def result(self):
        return self._inner.result()

    def synchronize(self):
        return self._inner.synchronize()

    def get_future(self):
        return self._inner.get_future()


def when_done(work, callback):
    """Return `work` (or a Work standing for it); call `callback` once, when it completes."""
    fired = threading.Event()

    def once(*_):
        if not fired.is_set():
            fired.set()
            callback()
    try:
        work.get_future().add_done_callback(once)
        return work
    except RuntimeError:  # gloo: no future for p2p and reduce_scatter
        return _TrackedWork(work, once)
