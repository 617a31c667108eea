"""Many notebooks that share their first cells, run once up to where each differs.

A planted mistake changes one exercise's answer: every cell before it runs as
it does in the reference. So instead of a kernel a notebook, one process runs
the reference's cells in an IPython shell and, just before the first cell a
variant changes, forks: the child (the same shell, its state a copy) runs the
variant's cells from there on and reports which graded cells raised, while
the parent runs on (CHILDREN_AT_ONCE variants at a time, since a variant mostly
waits). Each variant costs only the cells from its own change on; the kernel,
the setup cell and the ranks' forkserver are paid once.

    base, variants = failing_tests_forked(graded_only(solved(lab), lab),
                                          {name: graded_only(solved(lab, edits), lab)}, tmp_path)

Each result is {test grade_id: "Error: message"} of the graded cells that
raised, as nbclient reports a cell's error in a kernel (its ename and evalue).

The process is started with the kernel's settings a test asks for: torch's
CPU instruction set (``ATEN_CPU_CAPABILITY``; None, the machine's own) and the
number of threads of the notebook's own computations (ranks always use one).
Forking a process whose OpenMP pool has threads can hang in the child, so a
run that forks keeps its notebook on one thread (`threads=1`).

Run as a script, this file is that process: python forked_cells.py PLAN RESULT.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

CAPABILITY_VARIABLE = "ATEN_CPU_CAPABILITY"
THREADS_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
LOG_TAIL = 4000  # characters of a case's output kept for a failure message
#: Variants running side by side: most of a variant's time is waiting (on messages between its
#: ranks, or for a planted deadlock to reach the ranks' timeout), so 3 keep 2 cores busy.
CHILDREN_AT_ONCE = 3
STARTUP_S = 120  # the runner's own start (Python, torch, IPython) on a loaded 2-core machine
# What reports, from inside a kernel, the settings it ran on (its last line: JSON).
SETTINGS_PROBE = ("import json, torch\n"
                  "print(json.dumps({'threads': torch.get_num_threads(), "
                  "'capability': torch.backends.cpu.get_cpu_capability()}))")


def settings_env(capability: str | None, threads: int) -> dict[str, str]:
    """The variables that start a Python process on these settings: torch's CPU instruction set
    (None: the machine's own, which needs ATEN_CPU_CAPABILITY unset) and its threads."""
    return {**({CAPABILITY_VARIABLE: capability} if capability else {}),
            **{name: str(threads) for name in THREADS_VARIABLES}}


def assert_ran_on(settings: dict, capability: str | None, threads: int) -> None:
    """What SETTINGS_PROBE printed agrees with the settings asked for."""
    assert settings["threads"] == threads, f"the notebook ran on {settings['threads']} threads, not {threads}"
    if capability:
        assert settings["capability"] == capability.upper(), \
            f"torch ran with {settings['capability']}, not {CAPABILITY_VARIABLE}={capability}"


def changed_cells(base, variant) -> set[int]:
    """The indices of the cells whose source differs."""
    if len(base.cells) != len(variant.cells):
        raise ValueError(f"a variant has {len(variant.cells)} cells, the base {len(base.cells)}: "
                         "build both with submissions.graded_only")
    return {i for i, (a, b) in enumerate(zip(base.cells, variant.cells)) if a.source != b.source}


def first_difference(base, variant) -> int:
    """The index of the first cell whose source differs (len(cells) where none does)."""
    return min(changed_cells(base, variant), default=len(base.cells))


def _cells(nb) -> list[dict]:
    return [{"source": c.source, "grade_id": c.metadata.get("nbgrader", {}).get("grade_id")}
            for c in nb.cells if c.cell_type == "code"]


def failing_tests_forked(base, variants: dict, folder: Path, *, threads: int = 1, capability: str | None = None,
                         case_timeout: float = 300, stop_where_unreached: frozenset = frozenset()) -> tuple[dict, dict]:
    """Run `base` and every notebook of `variants` (name -> notebook, as `base` but for some
    cells) in one process, forked where each variant first differs. A variant named in
    `stop_where_unreached` stops after the last cell its changed cells can reach through a
    name (helpers/reach.py): the cells after it would run as the base's.

    Returns (the base's failing tests, {name: that variant's failing tests}). Raises
    AssertionError when the process did not run on the asked settings or a variant
    could not be run to its end (a crash or more than case_timeout seconds).
    """
    if variants and threads != 1:
        raise ValueError("a run that forks keeps its notebook on one thread (an OpenMP pool does not survive a fork)")
    base = _code_only(base)
    plan = {"cells": _cells(base), "threads": threads, "case_timeout": case_timeout, "variants": {}}
    for name, nb in variants.items():
        nb = _code_only(nb)
        start, stop = first_difference(base, nb), len(nb.cells)
        if name in stop_where_unreached and start < stop:
            from .reach import last_cell_reached  # here: this file also runs as a script, outside the package
            stop = last_cell_reached([c.source for c in nb.cells], changed_cells(base, nb)) + 1
        plan["variants"][name] = {"start": start, "sources": [c.source for c in nb.cells[start:stop]]}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plan_path, result_path, log_path = folder / "plan.json", folder / "result.json", folder / "runner.log"
    plan_path.write_text(json.dumps(plan))
    run_env = {**os.environ, "MPLBACKEND": "Agg", "IPYTHONDIR": str(folder / ".ipython")}
    run_env.pop(CAPABILITY_VARIABLE, None)
    run_env.update(settings_env(capability, threads))
    total = STARTUP_S + case_timeout * (1 + len(variants))
    with open(log_path, "wb") as log:
        proc = subprocess.run([sys.executable, __file__, str(plan_path), str(result_path)], cwd=folder,
                              env=run_env, stdout=log, stderr=subprocess.STDOUT, timeout=total)
    output = log_path.read_text(errors="replace")
    assert proc.returncode == 0 and result_path.is_file(), \
        f"the forked runner ended with {proc.returncode}:\n{output[-LOG_TAIL:]}"
    result = json.loads(result_path.read_text())
    assert_ran_on(result["settings"], capability, threads)
    broken = {name: r["crash"] for name, r in result["variants"].items() if "crash" in r}
    assert not broken, "variants that did not run to their end: " + "; ".join(
        f"{name}: {why}" for name, why in broken.items())
    return result["base"], {name: r["failed"] for name, r in result["variants"].items()}


def _code_only(nb):
    copy = nb.copy()
    copy.cells = [c for c in nb.cells if c.cell_type == "code"]
    return copy


# --------------------------------------------------------------------------
# The runner process
# --------------------------------------------------------------------------

def _shell():
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False  # no sqlite file (nor its thread) to share with a fork
    return InteractiveShell.instance(config=config)


def _run(shell, source: str) -> str | None:
    """Run one cell; 'Error: message' if it raised (as nbclient reports it), else None."""
    result = shell.run_cell(source, store_history=True)
    sys.stdout.flush()
    sys.stderr.flush()
    error = result.error_before_exec or result.error_in_exec
    return None if error is None else f"{type(error).__name__}: {error}"


def _run_cells(shell, cells: list[dict], sources: list[str], start: int) -> dict[str, str]:
    failed = {}
    for cell, source in zip(cells[start:], sources):
        error = _run(shell, source)
        if error is not None and cell["grade_id"]:
            failed[cell["grade_id"]] = error
    return failed


def _reuse_parents_forkserver():
    """In a forked child: launch ranks from the forkserver the parent started.

    multiprocessing asks whether its forkserver is alive with waitpid, which only
    the parent may call; the parent outlives its children, so the server is alive.
    """
    import multiprocessing.forkserver as forkserver

    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        server.ensure_running = lambda: None


class _Children:
    """The forked variants still running, at most `limit` at once.

    A variant mostly waits (on its ranks' messages, or for a deadlock it plants to
    reach the ranks' timeout), so several run side by side while the parent goes on
    with the base's cells; each reports its result through a pipe of its own."""

    def __init__(self, limit: int, timeout: float):
        self.limit, self.timeout = limit, timeout
        self.running: dict[int, dict] = {}  # the pipe's read end -> the child
        self.results: dict[str, dict] = {}

    def start(self, shell, cells, name: str, variant: dict, log_path: Path) -> None:
        while len(self.running) >= self.limit:
            self._collect_one()
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: this variant's cells, then out without the parent's exit handlers
            status = 1
            try:
                os.close(read_end)
                for other in self.running:  # the other children's pipes are not this one's
                    os.close(other)
                log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.setpgid(0, 0)  # a group of its own: a timeout kills it and whatever it forked itself
                _reuse_parents_forkserver()
                failed = _run_cells(shell, cells, variant["sources"], variant["start"])
                os.write(write_end, json.dumps({"failed": failed}).encode())
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        self.running[read_end] = {"name": name, "pid": pid, "log": log_path, "data": b"",
                                  "deadline": time.monotonic() + self.timeout}

    def finish(self) -> dict[str, dict]:
        while self.running:
            self._collect_one()
        return self.results

    def _collect_one(self) -> None:
        """Read from the running children until one of them ends (or runs out of time)."""
        while True:
            first_deadline = min(child["deadline"] for child in self.running.values())
            ready, _, _ = select.select(list(self.running), [], [], max(0.0, first_deadline - time.monotonic()))
            if not ready:
                late = next(fd for fd, child in self.running.items() if child["deadline"] <= time.monotonic())
                child = self.running.pop(late)
                os.killpg(child["pid"], signal.SIGKILL)
                os.waitpid(child["pid"], 0)
                os.close(late)
                self.results[child["name"]] = {
                    "crash": f"still running after {self.timeout:.0f} s: " + _tail(child["log"])}
                return
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    self.running[fd]["data"] += chunk
                    continue
                child = self.running.pop(fd)
                os.close(fd)
                _, status = os.waitpid(child["pid"], 0)
                self.results[child["name"]] = json.loads(child["data"]) if child["data"] else {
                    "crash": f"the fork ended ({status}) without a result: " + _tail(child["log"])}
                return


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-LOG_TAIL:] if path.is_file() else ""


def _start_forkserver_once_course_is_imported():
    """The ranks' forkserver, in this process, if the notebook has not started it yet: a variant
    forked before the notebook's first launch would otherwise start (and pay for) one of its own."""
    import multiprocessing.forkserver as forkserver

    if forkserver._forkserver._forkserver_pid is not None or "course._processes" not in sys.modules:
        return
    from course import _rank_process

    _rank_process.forkserver()  # the course's preloads, as its first launch sets them
    forkserver.ensure_running()


def main(plan_path: str, result_path: str) -> None:
    import torch

    plan = json.loads(Path(plan_path).read_text())
    torch.set_num_threads(plan["threads"])
    shell = _shell()
    cells, variants = plan["cells"], plan["variants"]
    starts: dict[int, list[str]] = {}
    for name, variant in variants.items():
        starts.setdefault(variant["start"], []).append(name)
    order = list(variants)
    children, base_failed = _Children(CHILDREN_AT_ONCE, plan["case_timeout"]), {}
    for i, cell in enumerate(cells):
        if starts.get(i):
            _start_forkserver_once_course_is_imported()
        for name in starts.get(i, []):
            log_path = Path(plan_path).parent / f"variant-{order.index(name)}.log"
            children.start(shell, cells, name, variants[name], log_path)
        error = _run(shell, cell["source"])
        if error is not None and cell["grade_id"]:
            base_failed[cell["grade_id"]] = error
    results = children.finish()
    for name in starts.get(len(cells), []):  # the same cells as the base: the base's result
        results[name] = {"failed": dict(base_failed)}
    settings = {"threads": torch.get_num_threads(), "capability": torch.backends.cpu.get_cpu_capability()}
    Path(result_path).write_text(json.dumps({"base": base_failed, "variants": results, "settings": settings}))


if __name__ == "__main__":
    main(*sys.argv[1:])
