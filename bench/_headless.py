"""Executing a notebook headless for a benchmark, leaving nothing running after it.

grader.execute hands nbclient a kernel manager of its own, and nbclient shuts
down only the kernels it made itself: the kernel (with the forkserver it
started, torch in each) would stay running until the benchmark ends, one more
per notebook. Here whatever the call started is ended when it returns.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import nbformat
import psutil

from grader.execute import execute


def _descendants() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


def end_started_since(before: set[psutil.Process]) -> None:
    started = _descendants() - before
    for process in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(started, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def execute_headless(nb: nbformat.NotebookNode, cwd: Path, **options) -> float:
    """grader.execute(nb, cwd, **options): its wall time in seconds; then ends its kernel."""
    before = _descendants()
    try:
        return execute(nb, cwd, **options)
    finally:
        end_started_since(before)
