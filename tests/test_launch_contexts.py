"""course.launch where students and instructors run it: a Jupyter kernel, a
plain script, and torchrun."""
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

NOTEBOOK_CELLS = [
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


def _notebook(pid_dir: Path):
    cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in NOTEBOOK_CELLS]
    cells.insert(0, nbformat.v4.new_code_cell(f"PID_DIR = {str(pid_dir)!r}"))
    return nbformat.v4.new_notebook(cells=cells)


def test_in_a_jupyter_kernel_results_tracebacks_output_and_interrupt(tmp_path):
    notebook = _notebook(tmp_path)
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel(env=ENV):
        for index in range(4):
            client.execute_cell(notebook.cells[index], index)
        outputs = "".join(o.get("text", "") for c in notebook.cells[:4] for o in c.outputs)
        # rank output lands in the cell, prefixed
        assert "[rank 0] measured on 0" in outputs and "[rank 1] measured on 1" in outputs
        # the traceback names the cell and shows the line that raised
        assert "Traceback on rank 1 (most recent call last):" in outputs
        assert "Cell In[4], line 4, in fails" in outputs
        assert 'raise KeyError("missing on rank 1")' in outputs

        # the stop button: interrupt while the ranks sleep
        failure = []
        runner = threading.Thread(target=lambda: _run_expecting_error(client, notebook, failure))
        runner.start()
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert time.monotonic() < deadline, "ranks never started"
            time.sleep(0.05)
        pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
        run_sync(client.km.interrupt_kernel)()  # what the stop button sends
        interrupted = time.monotonic()
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() - interrupted < 2, "a rank outlived the interrupt"
            time.sleep(0.02)
        runner.join(30)
        assert failure and "KeyboardInterrupt" in str(failure[0])


def _run_expecting_error(client, notebook, failure):
    try:
        client.execute_cell(notebook.cells[4], 4)
    except CellExecutionError as error:
        failure.append(error)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_in_a_plain_script_without_a_main_guard(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import torch.distributed as dist, course

        class Point:                       # defined in __main__ of a script
            def __init__(self, x):
                self.x = x

        def where():
            return Point(dist.get_rank())

        results = course.launch(where, 2)  # no `if __name__ == "__main__":` guard
        print("points", [type(p).__name__ for p in results], [p.x for p in results],
              isinstance(results[1], Point))
    """))
    done = subprocess.run([sys.executable, str(script)], env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "points ['Point', 'Point'] [0, 1] True" in done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_under_torchrun_each_process_runs_its_own_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, os, torch, torch.distributed as dist, course

        def step():
            t = torch.ones(1000)
            dist.all_reduce(t)
            return t[0].item()

        results = course.launch(step, None)
        rank = int(os.environ["RANK"])
        print(json.dumps({"rank": rank, "ranks": list(results.ranks), "value": results[rank],
                          "ops": [r.op for r in results.comm], "backend": results.backend,
                          "pid": os.getpid()}))
    """))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script)]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(line["rank"] for line in lines) == [0, 1]
    for line in lines:
        assert line["ranks"] == [line["rank"]] and line["value"] == 2.0
        assert line["ops"] == ["all_reduce"] and line["backend"] == "gloo"
    assert len({line["pid"] for line in lines}) == 2  # in-process: the ranks are torchrun's


def test_under_torchrun_a_mismatched_world_size_is_refused(tmp_path):
    script = tmp_path / "wrong.py"
    script.write_text("import course\ncourse.launch(print, 4)\n")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script)]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=180)
    assert done.returncode != 0
    assert "launch asked for 4 ranks but torchrun started 2" in done.stderr


@pytest.fixture(autouse=True)
def _no_stray_processes():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    deadline = time.monotonic() + 5
    while True:
        stray = [p for p in psutil.Process().children(recursive=True)
                 if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
        if not stray or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not stray, f"processes left behind: {[p.cmdline() for p in stray]}"
