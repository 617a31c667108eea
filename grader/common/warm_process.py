"""A helper process that stays up for a whole grading run and answers requests one at a time.

Starting Python and importing nbgrader costs seconds; a grading run needs it
for every notebook. A warm process pays once, while each request still runs
outside the grader: one that runs past its time is killed, with every process
it started, and the next request gets a fresh process.

Protocol: one JSON request per line on the helper's stdin, one JSON reply per
line on a copy of its stdout taken at start; the helper's own prints go to its
log, so they cannot garble a reply.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from .nbgrader_cli import die_with_grader, environment


class Answer(NamedTuple):
    reply: dict | None
    problem: str = ""        # why there is no reply
    timed_out: bool = False


class WarmProcess:
    """The grader's side: `ask` one request at a time of ``python -m MODULE``."""

    def __init__(self, module: str, root: Path, log: Path):
        self.module, self.root, self.log = module, root, log  # log: the helper's stderr, appended
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        """The process, started if there is none: early, its imports overlap other work."""
        if self.proc is None or self.proc.poll() is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("a", encoding="utf-8") as log:
                self.proc = subprocess.Popen([sys.executable, "-m", self.module], cwd=self.root,
                                             env=environment(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=log, text=True, start_new_session=True,
                                             preexec_fn=die_with_grader)
        return self.proc

    def ask(self, request: dict, timeout: float) -> Answer:
        """The reply, or what went wrong; past timeout the process is killed."""
        proc = self.start()
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return Answer(None, "died before it was asked")
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        reply = proc.stdout.readline() if ready else ""
        if reply:
            return Answer(json.loads(reply))
        died = proc.poll() is not None
        self.close()
        if died:
            return Answer(None, "died")
        return Answer(None, f"ran past the limit of {timeout:.0f} s and was stopped", timed_out=True)

    def close(self) -> None:
        """Kill the process and everything in its session (it is started in its own)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:  # a pipe to a killed process may not flush
                pass
        self.proc = None


def serve(handle: Callable[[dict], dict]) -> None:
    """The helper's side: answer each request on stdin with handle(request)."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # prints go to the log
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as e:  # the grader reports it; the next request may work
            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
