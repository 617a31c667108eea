"""A process that renders feedback pages (grader.feedback.render) for a whole grading run.

Starting nbgrader once per notebook costs seconds of imports each time; this
process imports once and then renders on request. It stays a separate process
for the same reason ``nbgrader generate_feedback`` was one: a submission's
markdown and outputs are rendered outside the grader, under a time limit,
and a render that runs past it is killed without taking the grader down.

Protocol: one JSON request per line on stdin ({autograded, target, db_url,
student, lab, verdict}); one JSON reply per line on stdout ({"error": null or
a message}).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from .nbgrader_cli import die_with_grader, environment


class FeedbackWorker:
    """The grader's side: `write` one page at a time; a new process after one is killed."""

    def __init__(self, root: Path, timeout: float, log: Path):
        self.root, self.timeout, self.log = root, timeout, log  # log: the renderer's stderr, appended
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("a", encoding="utf-8") as log:
                self.proc = subprocess.Popen([sys.executable, "-m", "grader.feedback_worker"], cwd=self.root,
                                             env=environment(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=log, text=True, start_new_session=True,
                                             preexec_fn=die_with_grader)
        return self.proc

    def write(self, autograded: Path, target: Path, db_url: str, student: str, lab: str,
              verdict: list[str]) -> str | None:
        """Write the feedback page to target; None if it was written, else what went wrong."""
        proc = self._start()
        request = {"autograded": str(autograded), "target": str(target), "db_url": db_url,
                   "student": student, "lab": lab, "verdict": verdict}
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return "the feedback renderer died before it was asked"
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
        reply = proc.stdout.readline() if ready else ""
        if not reply:
            died = proc.poll() is not None
            self.close()
            return ("the feedback renderer died" if died
                    else f"rendering the feedback took more than {self.timeout:.0f} s and was stopped")
        return json.loads(reply)["error"]

    def close(self) -> None:
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


def serve() -> None:
    from .feedback import render  # the slow imports, once

    for line in sys.stdin:
        request = json.loads(line)
        try:
            started = time.perf_counter()
            page = render(Path(request["autograded"]), request["db_url"], request["student"],
                          request["lab"], request["verdict"])
            target = Path(request["target"])
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            tmp.write_text(page, encoding="utf-8")
            tmp.replace(target)
            error = None
            print(f"rendered {target} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        except Exception as e:  # the grader reports it in the verdict; the next page may work
            traceback.print_exc()
            error = f"{type(e).__name__}: {e}"
        sys.stdout.write(json.dumps({"error": error}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
