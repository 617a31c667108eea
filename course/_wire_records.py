"""What a launch's records say its ranks sent, told to the grader's judge after the launch.

While grading, the grader reads from outside the jail how many bytes the jail's processes
wrote to each other over TCP (the jail's loopback counters, grader/judge/wire.py) and
compares them, cell by cell, with what the ranks' records account for. This module is the
records' half: after each launch, the bytes every record predicts (`CommRecord.predicted`,
by the algorithm's formula, from the call's arguments), the most one record predicts, and how
many records, sent to the judge (grader/judge/server.py) over its unix socket. Outside grading
(no judge) it does nothing.

A launch that fails returns no records and reports nothing: the wire its ranks wrote before
they failed counts against its cell (no graded test cell of the labs catches a failed launch).

Used by: course.grading, course.launch.
"""
from __future__ import annotations

import json
import math
import os
import socket

#: The judge's socket while grading (course.grading.JUDGE_ENV names the same variable).
JUDGE_ENV = "COURSE_REFERENCE_JUDGE"
_TIMEOUT_S = 30


def totals(records, world_size: int) -> dict:
    """{"bytes": what the records predict the ranks sent, "largest": the most one record predicts
    (what one segment TCP sends again can carry, at most), "records": how many, "ranks": world_size}."""
    sent = [float(r.predicted) for r in records]
    sent = [b for b in sent if math.isfinite(b) and b > 0]
    return {"op": "records", "bytes": sum(sent), "largest": max(sent, default=0.0), "records": len(records),
            "ranks": int(world_size)}


def exchange(socket_path: str, data: bytes, timeout_s: float) -> dict:
    """One request to the judge (a JSON line), its answer (a JSON object; {} for none). course.grading's
    checks are asked the same way."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout_s)
        connection.connect(socket_path)
        connection.sendall(data)
        return json.loads(connection.makefile("rb").readline(1 << 16) or b"{}")


def report(records, world_size: int) -> None:
    """Tell the judge, if there is one, what this launch's records account for; never raises:
    records that do not arrive count as none."""
    judge = os.environ.get(JUDGE_ENV)
    if not judge:
        return
    try:  # the judge has logged them once it answers
        exchange(judge, json.dumps(totals(records, world_size)).encode() + b"\n", _TIMEOUT_S)
    except (OSError, TypeError, ValueError, AttributeError):
        pass
