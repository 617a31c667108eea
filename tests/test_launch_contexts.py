"""Covers: course.launch.

course.launch where students and instructors run it: a Jupyter kernel, a
plain script, and torchrun."""
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from helpers import REPO

ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

def test_in_a_jupyter_kernel_results_tracebacks_output_and_interrupt(tmp_path):
    driver = Path(__file__).parent / "helpers" / "kernel_session.py"
    done = subprocess.run([sys.executable, str(driver), str(tmp_path)], env=ENV,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    outputs = report["outputs"]
    # rank output lands in the cell, prefixed; notebook classes come back (asserted in-cell)
    assert "[rank 0] measured on 0" in outputs and "[rank 1] measured on 1" in outputs
    # the traceback names the cell and shows the line that raised
    assert "Traceback on rank 1 (most recent call last):" in outputs
    assert "Cell In[4], line 4, in fails" in outputs
    assert 'raise KeyError("missing on rank 1")' in outputs
    # the stop button ends every rank within 2 s, and the cell reports the interrupt
    assert report["ranks_alive"] == [] and report["ranks_gone_after_s"] < 2, report
    assert "KeyboardInterrupt" in (report["last_cell_error"] or "")


# Cells of a notebook whose launches fail three ways; the driver prints each error output.
FAILING_CELLS = [
    "import os, torch, torch.distributed as dist, course",
    """
    def fails():
        if dist.get_rank() == 1:
            raise KeyError("missing on rank 1")
        dist.barrier()

    course.launch(fails, 2)
    """,
    """
    def skips():
        t = torch.ones(2)
        if dist.get_rank() == 0:
            dist.all_reduce(t)            # rank 1 never calls it

    os.environ["COURSE_RANK_TIMEOUT"] = "2"
    course.launch(skips, 2)
    """,
    """
    def exits():
        if dist.get_rank() == 1:
            os._exit(3)
        dist.barrier()

    course.launch(exits, 2)
    """,
]

KERNEL_DRIVER = """
import json, sys
import nbformat
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from grader.common.execute import this_interpreters_kernel

cells = json.loads(sys.argv[1])
notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
client = NotebookClient(notebook, km=this_interpreters_kernel(), timeout=120, allow_errors=True)
with client.setup_kernel():
    for index in range(len(cells)):
        client.execute_cell(notebook.cells[index], index)
# nbclient ends only a kernel it made: this one's connection file (in TMPDIR) goes with its shutdown
run_sync(client.km.shutdown_kernel)(now=True)
print(json.dumps([[o.ename, "\\n".join(o.traceback)] for c in notebook.cells for o in c.outputs
                  if o.output_type == "error"]))
"""


def test_in_a_jupyter_kernel_a_failed_launch_shows_the_cell_and_the_ranks_line_not_the_launcher(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(KERNEL_DRIVER)
    cells = [textwrap.dedent(c).strip() for c in FAILING_CELLS]
    done = subprocess.run([sys.executable, str(driver), json.dumps(cells)], env=ENV, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    plain = [(name, re.sub(r"\x1b\[[0-9;]*m", "", text)) for name, text in errors]  # without colours
    assert [name for name, _ in plain] == ["KeyError", "RankTimeout", "RankExited"]
    (_, raised), (_, hung), (_, exited) = plain
    for text, call in ((raised, "course.launch(fails, 2)"), (hung, "course.launch(skips, 2)"),
                       (exited, "course.launch(exits, 2)")):
        assert "Cell In[" in text and call in text, text            # the student's cell and line
        assert "course/launch.py" not in text and "_processes.py" not in text, text
        assert "skipping hidden" not in text, text
    # the rank's own line: the raise, and the collective it waits in
    assert "Traceback on rank 1" in raised and 'raise KeyError("missing on rank 1")' in raised
    assert "rank 0 is waiting here:" in hung and "dist.all_reduce(t)" in hung
    assert "within 2 s" in hung and "COURSE_RANK_TIMEOUT=120" in hung   # the variable, read at the call
    assert "rank 1 exited with code 3 before exits returned" in exited


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


@pytest.mark.torchrun
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
        with open(os.path.join(os.path.dirname(__file__), f"{rank}.json"), "w") as out:
            json.dump({"rank": rank, "ranks": list(results.ranks), "value": results[rank],
                       "ops": [r.op for r in results.comm], "backend": results.backend,
                       "pid": os.getpid()}, out)
    """))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script)]
    # (torchrun keeps its logs in a torchelastic_* folder of TMPDIR, never removed: this test's folder)
    done = subprocess.run(command, env={**ENV, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("*.json"))]
    assert sorted(line["rank"] for line in lines) == [0, 1]
    for line in lines:
        assert line["ranks"] == [line["rank"]] and line["value"] == 2.0
        assert line["ops"] == ["all_reduce"] and line["backend"] == "gloo"
    assert len({line["pid"] for line in lines}) == 2  # in-process: the ranks are torchrun's


@pytest.mark.torchrun
def test_under_torchrun_a_mismatched_world_size_is_refused(tmp_path):
    script = tmp_path / "wrong.py"
    script.write_text("import course\ncourse.launch(print, 4)\n")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script)]
    # (torchrun keeps its logs in a torchelastic_* folder of TMPDIR, never removed: this test's folder)
    done = subprocess.run(command, env={**ENV, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=180)
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
