"""What `course.launch` raises when ranks fail, and how it says where.

A rank's own exception is raised again in the cell, chained to a
`RemoteTraceback` that shows that rank's traceback with the notebook's source
lines, so the real cause comes first. When the exception cannot travel, or
the failure is the launcher's to report (a rank that died, ranks that hang),
a `RankError` says which ranks and what happened.

In a notebook, all of them show the student's cell and the rank's own lines,
not the launcher's frames (`_render_traceback_`, IPython's hook; see
course._tracebacks.ipython_traceback).

Used in: lab 0 (00_ranks), lab 6 (06_pipeline_parallel), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import functools
import signal

import cloudpickle

from course import _tracebacks

#: The variable that sets how long course.launch waits for its ranks (seconds); RankTimeout names it.
TIMEOUT_VARIABLE = "COURSE_RANK_TIMEOUT"

_PARTNER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe",
                 "connection refused", "communicator was aborted", "socket closed")


class RankError(RuntimeError):
    """A launch failed on one or more ranks. `ranks` lists them."""

    def __init__(self, message: str, ranks=()):
        super().__init__(message)
        self.ranks = tuple(ranks)

    def _render_traceback_(self) -> list[str]:
        """IPython's traceback of it, without the launcher's frames."""
        return _tracebacks.ipython_traceback(self)


class RankExited(RankError):
    """A rank's process ended before it returned: os._exit, a signal, a crash."""


class RankTimeout(RankError, TimeoutError):
    """Ranks did not finish in time; usually a collective some rank skipped."""


class RemoteTraceback(Exception):
    """The traceback of the rank that raised; shown first in the cell."""

    def __str__(self):
        return self.args[0]


# --- the reports, from what the ranks sent back ---------------------------------------

def lost_partner(report: dict) -> bool:
    """True for the errors a rank gets because another rank went away."""
    message = f"{report['type']}: {report['message']}".lower()
    return any(phrase in message for phrase in _PARTNER_LOST)


def rank_exception(rank: int, report: dict, others: dict, world_size: int) -> BaseException:
    """The exception rank `rank` raised, to raise again in the cell, chained
    to its traceback. `others` maps the other failed ranks to their reports."""
    text = report["text"]
    if report["summary"] is not None:  # format here, where the cells' source is
        text = "".join(cloudpickle.loads(report["summary"]).format())
    text = _tracebacks.relabel_cells(text.replace(
        "Traceback (most recent call last):",
        f"Traceback on rank {rank} (most recent call last):", 1))
    note = f"raised on rank {rank} of {world_size}"
    if report["while"]:
        note += f" while {report['while']}"
    for other, theirs in sorted(others.items()):
        if lost_partner(theirs):
            note += f"; rank {other} then lost its partner"
        elif (theirs["type"], theirs["message"]) == (report["type"], report["message"]):
            note += f"; rank {other} raised the same {theirs['type']}"
        else:
            note += f"; rank {other} raised {theirs['type']}: {theirs['message']}"
    note += "; every rank was stopped"
    exception = None
    if report["exception"] is not None:
        try:
            exception = cloudpickle.loads(report["exception"])
            exception.add_note(note)
            exception.rank = rank
            exception._render_traceback_ = functools.partial(_tracebacks.ipython_traceback, exception)
        except Exception:  # noqa: BLE001 - fall back to a RankError
            exception = None
    if exception is None:
        exception = RankError(f"rank {rank} raised {report['type']}: {report['message']}\n"
                              f"({note})", [rank])
    exception.__cause__ = RemoteTraceback(text)
    return exception


def with_what_ranks_did(error: BaseException, what: tuple[dict, dict]) -> BaseException:
    """`error`, given what the ranks that replied had done: `error.records` ({rank: course.comm.CommLog of its
    calls up to its failure or return}) and `error.flight_records` ({rank: its Flight Recorder entries, a list
    of course.flight_records.FlightEntry, or None where the launch set no collective_timeout or this torch
    keeps none}). A rank that died or was stopped without a word is in neither."""
    records, flight = what
    try:
        error.records, error.flight_records = records, flight
    except AttributeError:  # an exception type that takes no attributes: the error itself still says what
        pass
    return error


def exit_error(exit_codes: dict, fn_name: str) -> RankExited:
    """Ranks that ended without a word, in the order they ended: rank -> code
    (negative: the signal that killed it)."""
    lines = []
    for rank, code in exit_codes.items():
        if code is not None and code < 0:
            how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
        else:
            how = f"exited with code {code}"
        line = f"rank {rank} {how} before {fn_name} returned"
        if code == -signal.SIGKILL:
            line += " (SIGKILL often comes from the out-of-memory killer)"
        lines.append(line)
    return RankExited("; ".join(lines) + ". Every other rank was stopped.", list(exit_codes))


def timeout_error(timeout: float, fn_name: str, returned_after: dict, stack_dumps: dict,
                  entry: str) -> RankTimeout:
    """Ranks still running at the deadline: where each one waits (from its
    faulthandler dump), and which ones already returned (rank -> seconds)."""
    waiting = sorted(stack_dumps)
    lines = [f"ranks {waiting} did not finish {fn_name} within {timeout:g} s. Usually a rank "
             "waits in a collective that another rank never calls. Where each rank was:"]
    for rank in sorted([*returned_after, *stack_dumps]):
        if rank in returned_after:
            lines.append(f"rank {rank} returned from {fn_name} after "
                         f"{returned_after[rank]:.2f} s and is waiting for the others.")
            continue
        frames = _tracebacks.user_stack(stack_dumps[rank], entry)
        if frames is None:
            frames = _tracebacks.main_thread_stack(stack_dumps[rank])
            lines.append(f"rank {rank} had not reached {fn_name} yet:")
        else:
            lines.append(f"rank {rank} is waiting here:")
        lines.append(_tracebacks.format_waiting(frames).rstrip("\n"))
    lines.append(f"If the ranks were only slow, not stuck, give them longer: launch(..., timeout=120), or "
                 f"{TIMEOUT_VARIABLE}=120 in the environment (os.environ[{TIMEOUT_VARIABLE!r}] = '120' in the "
                 "notebook) for every launch.")
    return RankTimeout("\n".join(lines), waiting)
