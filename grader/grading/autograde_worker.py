"""``nbgrader autograde`` in a warm process, one per grading slot.

The same application and configuration as the command line (nbgrader's own
tests run it in-process the same way: initialize, start, reset), without
starting Python and importing nbgrader again for every notebook. The kernel's
jail dies with this process (bwrap --die-with-parent), so a notebook that runs
past its time is stopped by killing the worker (grader.common.warm_process).
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

from grader.common.warm_process import WarmProcess, serve


class AutogradeWorker(WarmProcess):
    def __init__(self, root: Path, log: Path):
        super().__init__("grader.grading.autograde_worker", root, log)

    def run(self, args: Sequence[str], env: Mapping[str, str], log: Path, timeout: float) -> int | None:
        """`nbgrader autograde ARGS` with env added, its output in log; None if it ran past timeout."""
        answer = self.ask({"args": ["autograde", *args], "env": dict(env), "log": str(log)}, timeout)
        reply = answer.reply
        if reply is None:
            with log.open("a", encoding="utf-8") as out:
                out.write(f"\n[grader] the autograde worker {answer.problem}\n")
            return None if answer.timed_out else 1
        if reply.get("error"):
            with log.open("a", encoding="utf-8") as out:
                out.write(f"\n[grader] ERROR the autograde worker failed: {reply['error']}\n")
            return 1
        return reply["code"]


def _exit_code(e: SystemExit) -> int:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


def _autograde(request: dict) -> dict:
    from jupyter_core.application import NoStart
    from nbgrader.apps import NbGraderApp

    saved_env, saved_fds = dict(os.environ), (os.dup(1), os.dup(2))
    os.environ.update(request["env"])
    with open(request["log"], "w", encoding="utf-8") as log:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        app = NbGraderApp.instance()
        try:
            app.initialize(request["args"])
            app.start()
            code = 0
        except NoStart:  # how jupyter_core says the subcommand (autograde) ran
            code = 0
        except SystemExit as e:
            code = _exit_code(e)
        except Exception:
            traceback.print_exc()
            code = 1
        finally:
            app.reset()
            sys.stdout.flush(), sys.stderr.flush()
            for fd, saved in zip((1, 2), saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
            os.environ.clear()
            os.environ.update(saved_env)
    return {"code": code}


if __name__ == "__main__":
    importlib.import_module("nbgrader.apps")  # the slow imports, once, before the first request
    serve(_autograde)
