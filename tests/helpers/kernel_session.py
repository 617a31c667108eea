"""Drives one Jupyter kernel through the launcher's notebook scenarios and
prints what happened as JSON. tests/test_launch_contexts.py runs it as its own
process: an interrupted, threaded nbclient session leaves event-loop and zmq
state behind that stalls later kernels in the same process.

    python tests/helpers/kernel_session.py PID_DIR
"""
import json
import sys
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import psutil
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from grader.common.execute import this_interpreters_kernel

CELLS = [
    """
    import os, time, torch, torch.distributed as dist, course

    class Reading:                       # a class defined in the notebook
        def __init__(self, rank, value):
            self.rank, self.value = rank, value
    """,
    """
    def measure(scale):
        t = torch.ones(2) * scale
        dist.all_reduce(t)
        print("measured on", dist.get_rank())
        return Reading(dist.get_rank(), t.sum().item())

    results = course.launch(measure, 2, args=(3,))
    assert all(isinstance(r, Reading) for r in results), type(results[0])
    assert [(r.rank, r.value) for r in results] == [(0, 12.0), (1, 12.0)]
    """,
    """
    def fails():
        value = dist.get_rank()
        if value == 1:
            raise KeyError("missing on rank 1")
        dist.barrier()

    try:
        course.launch(fails, 2)
    except KeyError as error:
        report = str(error.__cause__)
    print(report)
    """,
    """
    def sleeps(folder):
        open(os.path.join(folder, f"{dist.get_rank()}.pid"), "w").write(str(os.getpid()))
        time.sleep(3600)

    course.launch(sleeps, 2, args=(PID_DIR,), timeout=None)
    """,
]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids_written(folder: Path) -> list[int] | None:
    """Both ranks' pids, once each has written its file whole (a file exists before its number is in it)."""
    texts = [p.read_text() for p in folder.glob("*.pid")]
    if len(texts) < 2 or not all(text.strip().isdigit() for text in texts):
        return None
    return [int(text) for text in texts]


def main(pid_dir: Path) -> dict:
    cells = [nbformat.v4.new_code_cell(f"PID_DIR = {str(pid_dir)!r}")]
    cells += [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in CELLS]
    notebook = nbformat.v4.new_notebook(cells=cells)
    client = NotebookClient(notebook, km=this_interpreters_kernel(), timeout=120,
                            resources={"metadata": {"path": str(pid_dir)}})
    report = {}
    with client.setup_kernel():
        for index in range(4):
            client.execute_cell(notebook.cells[index], index)
        report["outputs"] = "".join(o.get("text", "") for c in notebook.cells[:4]
                                    for o in c.outputs)
        failure = []

        def run_last_cell():
            try:
                client.execute_cell(notebook.cells[4], 4)
            except CellExecutionError as error:
                failure.append(str(error))
        runner = threading.Thread(target=run_last_cell)
        runner.start()
        deadline = time.monotonic() + 60
        while (pids := _pids_written(pid_dir)) is None:
            if time.monotonic() > deadline:
                raise SystemExit("ranks never started")
            time.sleep(0.05)
        interrupted = time.monotonic()
        run_sync(client.km.interrupt_kernel)()  # what the stop button sends
        while any(_alive(pid) for pid in pids) and time.monotonic() - interrupted < 10:
            time.sleep(0.02)
        report["ranks_gone_after_s"] = time.monotonic() - interrupted
        report["ranks_alive"] = [pid for pid in pids if _alive(pid)]
        runner.join(30)
        report["last_cell_error"] = failure[0] if failure else None
    # nbclient ends only a kernel it made: this one's connection file (in TMPDIR) goes with its shutdown
    run_sync(client.km.shutdown_kernel)(now=True)
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
