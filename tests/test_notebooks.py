"""Covers: the solutions.

The solution notebooks that neither launch ranks nor grade anything run top to bottom,
headless, on CPU, and record the values grader/reference/ stores for them.

Each is executed with nbclient in its own folder, with the ``python3`` kernel of the
interpreter running pytest, matplotlib's inline backend (figures become images in the
notebook), and a 300 s per-cell timeout, as `python -m grader reference --check` runs it:
the solution records its checked values (seed 0) into a scratch folder, compared with
grader/reference/ as the command compares them. Its time is recorded and shown, not
asserted: the tests run beside each other, so the course's promise of time (90 s a lab on
2 CPU cores, 3 minutes on 4 ranks) is held by bench/labs.py, run alone. Notebooks are
only read: outputs are not written back.

These run here on the machine's instruction set and 2 threads; every lab runs in JupyterLab
(tests/test_browser.py) on torch's "default" one and 2 threads, on 4 ranks where it launches
ranks, checked as here; the fairness tests run each graded lab on the machine's set and 1 thread
(helpers/solution_runs.py has the table). The stored values hold on both instruction sets,
and the reference answers score full on each (tests/helpers/submissions.py, CORRECT_SETTINGS).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from grader import reference
from grader.common.execute import INLINE_BACKEND, execute
from helpers import REPO
from helpers import solution_runs as runs
from helpers.forked_cells import CAPABILITY_VARIABLE, settings_env

pytestmark = pytest.mark.notebook

CELL_TIMEOUT_S = 300
# Those that launch ranks run on 4 in the browser; the graded ones, on this machine's instruction
# set, in their fairness tests.
HEADLESS = [p for p in runs.UNGRADED if p not in runs.ON_RANKS]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _execute(nb: nbformat.NotebookNode, cwd: Path, progress: dict | None = None, env=None) -> float:
    """Run all cells of nb (in place) with cwd; progress["index"] follows the running cell."""
    progress = {} if progress is None else progress

    def on_cell_start(cell, cell_index, **_):
        progress["index"] = cell_index

    return execute(nb, cwd, timeout=CELL_TIMEOUT_S, on_cell_start=on_cell_start, env=env)


@pytest.fixture(autouse=True)
def _headless(monkeypatch):
    # The kernel inherits this process's environment.
    monkeypatch.setenv("MPLBACKEND", "Agg")  # grader.common.execute gives the kernel the inline backend
    monkeypatch.delenv(CAPABILITY_VARIABLE, raising=False)  # the machine's own, unless a run sets it


@pytest.fixture(scope="module")
def wall_times(request):
    times: dict[str, float] = {}
    yield times
    tr = request.config.pluginmanager.getplugin("terminalreporter")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if tr is None or capman is None or not times:
        return
    with capman.global_and_fixture_disabled():  # show it, don't capture it
        tr.ensure_newline()
        tr.write_sep("-", "solution notebook wall times")
        for name, secs in times.items():
            tr.write_line(f"{secs:7.1f} s  {name}")


def test_solution_notebooks_exist():
    # Without this, an empty solutions/ would make the parametrized test below
    # a single skip, and the suite would pass having executed nothing.
    assert runs.SOLUTIONS, f"no solution notebooks found: expected {REPO}/solutions/<lab>/<lab>.ipynb"


def test_kernel_setup(tmp_path):
    code = "import os, sys; print(sys.prefix, os.getcwd(), os.environ.get('MPLBACKEND'), sep='\\n')"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    _execute(nb, tmp_path)
    prefix, cwd, backend = nb.cells[0].outputs[0]["text"].splitlines()
    assert prefix == sys.prefix, f"the kernel runs in {prefix}, pytest in {sys.prefix}"
    assert Path(cwd).resolve() == tmp_path.resolve()
    assert backend == INLINE_BACKEND


@pytest.mark.timeout(CELL_TIMEOUT_S * 3)
@pytest.mark.parametrize("path", HEADLESS, ids=[str(p.relative_to(REPO)) for p in HEADLESS])
def test_notebook_executes(path: Path, wall_times, record_property, tmp_path):
    _run_and_check(path, wall_times, record_property, tmp_path, runs.WITHOUT_RANKS)


def _run_and_check(path: Path, wall_times, record_property, scratch: Path, settings: tuple[str | None, int]):
    name = str(path.relative_to(REPO))
    nb = runs.with_probe(nbformat.read(path, as_version=4))
    env = {**settings_env(*settings), **reference.recording_env(scratch)}
    before = runs.snapshot(path.parent)
    progress: dict = {}
    failure = None
    try:
        wall = _execute(nb, path.parent, progress, env)
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        i = progress.get("index")
        failure = f"{name}: execution failed at " + (f"cell {i}" if i is not None else "kernel start")
        failure += ":\n" + _ANSI.sub("", str(e))
        if i is not None and isinstance(e, DeadKernelError):  # the others quote the cell already
            failure += "\n------------------\n" + nb.cells[i].source
    if failure:  # outside the except block: no chained traceback in the report
        pytest.fail(failure, pytrace=False)
    wall_times[name] = wall
    record_property("wall_time_s", round(wall, 2))
    print(f"{name}: executed in {wall:.1f} s")
    # nbgrader copies every file of the lab folder into the student release.
    runs.assert_created_nothing(name, path.parent, before)
    runs.assert_ran_as_asked(name, nb.cells[-1].outputs[-1]["text"], settings)
    runs.assert_recorded_the_reference(name, path.parent.name, scratch)
