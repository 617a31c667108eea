"""The judges of a grading run, forked from one warm process.

Each submission has a judge of its own (grader.judge.server): a process that binds the
jail's socket, drops to an unprivileged uid and answers the kernel. Started with
``python -m``, every judge paid Python's start and the import of `course` and torch:
1.4 s of CPU a submission on 2 cores, a tenth of grading one. A grading run keeps one
JudgeSpawner instead, a warm process (grader.common.warm_process) that imports them once,
as the grader's user, and forks one child per submission. The child is then that
submission's judge as before: `grader.judge.server.main` with the same arguments, in a
session of its own, under its own memory limit, with the same uid drop, and with none of
the spawner's pipes. The spawner itself never reads a jail's request, never holds a
reference value, and forks from its one thread before it has computed anything.
"""
from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from grader.common.warm_process import WarmProcess, serve
from grader.jail.uids import start_time

SPAWN_TIMEOUT_S = 30


class JudgeSpawner(WarmProcess):
    """The grader's side: `spawn` a judge; one spawner serves every slot of a run, in turn."""

    def __init__(self, root: Path, log: Path):
        super().__init__("grader.judge.spawner", root, log)
        self.lock = threading.Lock()

    def spawn(self, args: list[str], out: Path) -> tuple[int, int]:
        """(pid, start time) of a new judge, `python -m grader.judge.server ARGS` as a fork,
        its stdout and stderr into `out` (a file of the grader's, which no jail sees)."""
        with self.lock:
            answer = self.ask({"args": list(args), "out": str(out)}, SPAWN_TIMEOUT_S)
        reply = answer.reply or {}
        if "pid" not in reply:
            raise RuntimeError(f"the judges' spawner {answer.problem or reply.get('error', 'gave no judge')}")
        return int(reply["pid"]), int(reply["start"])


def _spawn(request: dict) -> dict:
    """The spawner's side: fork a judge for `request`; its pid and start time."""
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the judge: nothing of the spawner but its imports
        code = 1
        try:
            os.setsid()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            nothing = os.open(os.devnull, os.O_RDONLY)
            os.dup2(nothing, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the spawner's pipes to the grader among them
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # for the child's whole life
            sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
            from grader.judge import server
            server.main(request["args"])
            code = 0
        except BaseException:  # SystemExit from argparse included: said in `out`, for the grader
            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    os.close(out)
    return {"pid": pid, "start": start_time(pid) or 0}  # 0: it has ended already


if __name__ == "__main__":
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the judges as they end
    importlib.import_module("grader.judge.server")  # course and torch, once, before the first judge
    serve(_spawn)
