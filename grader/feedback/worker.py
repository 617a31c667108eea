"""Renders feedback pages (grader.feedback.page.render) in a warm process, one per grading slot.

It stays a separate process for the reason ``nbgrader generate_feedback`` was
one: a submission's markdown and outputs are rendered outside the grader,
under a time limit, and a render that runs past it is killed without taking
the grader down (grader.common.warm_process).
"""
from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

from grader.common.warm_process import WarmProcess, serve


class FeedbackWorker(WarmProcess):
    def __init__(self, root: Path, timeout: float, log: Path):
        super().__init__("grader.feedback.worker", root, log)
        self.timeout = timeout

    def write(self, autograded: Path, target: Path, db_url: str, student: str, lab: str,
              verdict: list[str], hidden_lines: list[str] = (), lab_markdown: list[str] = ()) -> str | None:
        """Write the feedback page to target; None if it was written, else what went wrong.

        hidden_lines: the lab's hidden tests, cut from the page; lab_markdown: the released
        lab's markdown cells, the only ones rendered as markdown (grader.feedback.page.render).
        """
        answer = self.ask({"autograded": str(autograded), "target": str(target), "db_url": db_url,
                           "student": student, "lab": lab, "verdict": verdict,
                           "hidden_lines": list(hidden_lines), "lab_markdown": list(lab_markdown)}, self.timeout)
        return answer.reply["error"] if answer.reply else f"the feedback renderer {answer.problem}"


def _write(request: dict) -> dict:
    from .page import render  # the slow imports, once: later calls find them loaded

    started = time.perf_counter()
    page = render(Path(request["autograded"]), request["db_url"], request["student"],
                  request["lab"], request["verdict"], request["hidden_lines"], request["lab_markdown"])
    target = Path(request["target"])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    print(f"rendered {target} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return {"error": None}


if __name__ == "__main__":
    importlib.import_module("grader.feedback.page")  # now, while the grader starts the first autograde
    serve(_write)
