"""A helper process that stays up for a whole grading run and answers requests one at a time.

Starting Python and importing nbgrader costs seconds; a grading run needs it
for every notebook. A warm process pays once, while each request still runs
outside the grader: one that runs past its time is killed, with every process
it started, and the next request gets a fresh process.

Protocol: the helper says it is ready (one JSON line, once its imports are
done), then answers one JSON request per line on its stdin with one JSON reply
per line, on a copy of its stdout taken at start; its own prints go to its log,
so they cannot garble a reply. A request's time limit starts once the helper is
ready: a fresh helper's imports, slow on a loaded machine, are not taken from
the time of the notebook that follows one that was stopped.
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

# How long a helper may take to import what it needs (nbgrader, torch) before its first request:
# seconds alone, much more on a machine busy with the notebooks of other slots.
STARTUP_LIMIT_S = 300
READY = {"ready": True}


class Answer(NamedTuple):
    reply: dict | None
    problem: str = ""        # why there is no reply
    timed_out: bool = False


class WarmProcess:
    """The grader's side: `ask` one request at a time of ``python -m MODULE``."""

    def __init__(self, module: str, root: Path, log: Path):
        self.module, self.root, self.log = module, root, log  # log: the helper's stderr, appended
        self.proc: subprocess.Popen | None = None
        self.ready = False  # whether this process has said it is ready

    def start(self) -> subprocess.Popen:
        """The process, started if there is none: early, its imports overlap other work."""
        if self.proc is None or self.proc.poll() is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("a", encoding="utf-8") as log:
                self.proc = subprocess.Popen([sys.executable, "-m", self.module], cwd=self.root,
                                             env=environment(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=log, text=True, start_new_session=True,
                                             preexec_fn=die_with_grader)
            self.ready = False
        return self.proc

    def _reply(self, timeout: float) -> Answer:
        """The next line from the process within timeout, or why there is none (the process then killed)."""
        proc = self.proc
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else ""
        if line:
            try:
                return Answer(json.loads(line))
            except json.JSONDecodeError:  # e.g. a print during its imports, before serve() took stdout
                self.close()
                return Answer(None, f"wrote something other than a reply: {line[:80]!r}")
        died = proc.poll() is not None
        self.close()
        if died:
            return Answer(None, "died")
        return Answer(None, f"ran past the limit of {timeout:.0f} s and was stopped", timed_out=True)

    def ask(self, request: dict, timeout: float) -> Answer:
        """The reply, or what went wrong; past timeout the process is killed."""
        proc = self.start()
        if not self.ready:
            started = self._reply(STARTUP_LIMIT_S)
            if started.reply != READY:  # not the request's fault: it is not timed out
                self.close()
                return Answer(None, f"did not start: it {started.problem or 'answered before it was ready'}")
            self.ready = True
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return Answer(None, "died before it was asked")
        return self._reply(timeout)

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
    replies.write(json.dumps(READY) + "\n")
    replies.flush()
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as e:  # the grader reports it; the next request may work
            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
