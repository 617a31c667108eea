"""course.launch where students and instructors run it: a Jupyter kernel, a
plain script, and torchrun."""
import json
import os
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
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=180)
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
