"""Covers: grader.common.warm_process, grader.common.solution, grader.common.stubs, grader.common.execute,
grader.common.nbgrader_cli, grader.common.command_line.

The parts the grader's subsystems share: a helper process kept warm (its start not taken from a
request's time), the solution loader and the tags it reads, the release's stubs named for what
they stand in, a notebook executed in this interpreter's kernel leaving nothing running, and
nbgrader's processes leaving no config folder behind.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader import COURSE_ROOT
from grader.common.warm_process import Answer, WarmProcess
from helpers.notebooks import tagged_cell

# --------------------------------------------------------------------------
# A helper process kept warm
# --------------------------------------------------------------------------

def test_a_helper_s_start_is_not_taken_from_a_request_s_time(tmp_path, monkeypatch):
    # A helper that takes 3 s to import answers requests limited to 2 s: the limit starts when it is
    # ready, so the notebook after one that was stopped (a fresh helper) keeps its whole time.
    (tmp_path / "slow_helper.py").write_text(
        "import time\ntime.sleep(3)\nfrom grader.common.warm_process import serve\n"
        "def answer(request):\n    time.sleep(request['sleep'])\n    return {'slept': request['sleep']}\n"
        "serve(answer)\n")
    monkeypatch.setenv("PYTHONPATH", str(COURSE_ROOT))
    helper = WarmProcess("slow_helper", tmp_path, tmp_path / "helper.log")
    try:
        assert helper.ask({"sleep": 0}, timeout=2) == Answer({"slept": 0})
        stopped = helper.ask({"sleep": 60}, timeout=2)
        assert stopped.timed_out and helper.proc is None, stopped
        assert helper.ask({"sleep": 0}, timeout=2) == Answer({"slept": 0})  # a fresh helper, slow to start again
    finally:
        helper.close()


def test_a_helper_that_never_says_it_is_ready_is_not_a_timed_out_request(tmp_path, monkeypatch):
    (tmp_path / "mute_helper.py").write_text("print('not the protocol', flush=True)\n")
    monkeypatch.setenv("PYTHONPATH", str(COURSE_ROOT))
    helper = WarmProcess("mute_helper", tmp_path, tmp_path / "helper.log")
    try:
        answer = helper.ask({}, timeout=2)
    finally:
        helper.close()
    assert answer.reply is None and not answer.timed_out and answer.problem.startswith("did not start"), answer

# --------------------------------------------------------------------------
# The solution loader: the solution notebook's definitions, for benchmarks
# --------------------------------------------------------------------------

def test_solution_loader_runs_the_cells_tagged_for_it_only():
    from grader.common.solution import code_cells, defines_only, marking_problems
    assert defines_only("import torch\n\ndef f():\n    return 1\n\nclass A:\n    pass\n")
    assert not defines_only("def f():\n    pass\nf()\n")        # a call: a demonstration
    assert not defines_only("x = 1\n")
    assert not defines_only("")
    assert not defines_only("def broken(:\n")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# a lab"),
        tagged_cell("SIZE = 3\nprint('setup')", "setup"),
        tagged_cell("def answer():\n    return SIZE", "reused"),
        tagged_cell("def helper_of_a_test():\n    return 0"),           # defines, but is not marked
        tagged_cell("assert answer() == 3"),
    ])
    assert code_cells(nb) == ["SIZE = 3\nprint('setup')", "def answer():\n    return SIZE"]
    assert marking_problems(nb) == []


def test_a_reused_cell_that_does_more_than_define_is_named_with_its_statement():
    from grader.common.solution import marking_problems
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# a lab"),
        tagged_cell("import torch", "setup"),
        tagged_cell("def answer():\n    return 1\n\nanswer()", "reused"),
        tagged_cell("SIZE = 4", "setup"),
        nbformat.v4.new_markdown_cell("prose"),
    ])
    nb.cells[4].metadata["tags"] = ["reused"]
    assert marking_problems(nb, "lab.ipynb") == [
        "lab.ipynb, cell 2 is tagged 'reused' but does more than define: line 4: answer(). "
        "Move that into a cell of its own, or remove the tag",
        "lab.ipynb, cell 3 is tagged 'setup' but is not the first code cell: the setup runs first, "
        "in the notebook as in `load`",
        "lab.ipynb, cell 4 is markdown, not code, but is tagged 'reused'",
        "lab.ipynb has 2 cells tagged 'setup' (lab.ipynb, cell 1, lab.ipynb, cell 3): tag one",
    ]
    nb.cells[1].metadata["tags"] = []
    nb.cells[3].metadata["tags"] = []
    assert marking_problems(nb, "lab.ipynb")[-1] == (
        "lab.ipynb has cells tagged 'reused' but none tagged 'setup': tag its first code cell (imports and sizes)")


def test_every_solution_tags_its_cells_for_the_loader_as_it_can_load_them():
    from course_tools.trainings import LABS
    from grader.common.labs import find_labs
    from grader.common.solution import code_cells, marking_problems
    for lab in find_labs():
        assert marking_problems(nbformat.read(lab.notebook, as_version=4), lab.name) == []
    for name in LABS:  # what `python -m course_tools run` loads: a setup and something reused
        nb = nbformat.read(COURSE_ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
        assert len(code_cells(nb)) > 1, f"{name}: load would give course_tools run nothing to run"


def test_solution_loader_gives_lab_2_answers_that_run_on_ranks():
    import course
    from grader.common.solution import load
    lab = load("02_data_parallel")
    assert callable(lab.ring_all_reduce) and isinstance(lab.BucketedGradients, type)

    def ring_of_ranks(ring_all_reduce):
        import torch
        import torch.distributed as dist
        t = torch.full((7,), float(dist.get_rank() + 1))
        return ring_all_reduce(t).tolist()

    assert list(course.launch(ring_of_ranks, 2, args=(lab.ring_all_reduce,))) == [[3.0] * 7] * 2


def test_solution_loader_names_the_labs_it_has(tmp_path):
    from grader.common.solution import load
    (tmp_path / "solutions" / "01_x").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"01_x"):
        load("02_missing", root=tmp_path)

# --------------------------------------------------------------------------
# Stubs, execution, nbgrader's processes
# --------------------------------------------------------------------------

def test_a_stub_names_the_function_or_method_it_stands_in():
    from grader.common.stubs import enclosing_name, named

    lines = ["import torch", "", "class Timer:", "    def __init__(self):", "        self.t = 0", "",
             "    def lap(self, name):", "        def inner():", "            # YOUR CODE HERE",
             "            raise NotImplementedError()", "        # YOUR CODE HERE",
             "        raise NotImplementedError()", "", "def step(model):", "    raise NotImplementedError()",
             "raise NotImplementedError()"]
    assert [enclosing_name(lines, i) for i in (9, 11, 14, 15)] == ["Timer.lap.inner", "Timer.lap", "step", None]
    assert named("raise NotImplementedError()", "step") == \
        'raise NotImplementedError("step is yours to write: replace these two lines with your code")'
    assert "this cell's answer" in named("raise NotImplementedError()", None)


@pytest.mark.parametrize("last_cell", ["course.launch(one, 2)", "raise KeyError('a student error')"])
def test_execute_leaves_no_kernel_or_rank_running(tmp_path, last_cell):
    # nbclient shuts down only kernels it starts itself; grader.common.execute starts its own, with a
    # forkserver holding torch: one of each left per notebook would pile up in a test run
    import psutil
    from nbclient.exceptions import CellExecutionError

    from grader.common.execute import execute

    nb = new_notebook(cells=[new_code_cell("import course\ndef one():\n    return 1\ncourse.launch(one, 2)"),
                             new_code_cell(last_cell)])
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        execute(nb, tmp_path, timeout=120)
    except CellExecutionError as error:
        assert "a student error" in str(error)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    gone, alive = psutil.wait_procs(left, timeout=5)
    assert not alive, f"still running after execute: {[p.cmdline()[:3] for p in alive]}"
    assert "RankResults([1, 1])" in nb.cells[0].outputs[-1]["data"]["text/plain"]


def test_the_nbgrader_processes_the_grader_starts_leave_no_config_folder_in_tmp(tmp_path):
    # jupyter_core gives each process run with JUPYTER_NO_CONFIG an empty config folder in
    # TMPDIR and never removes it: one a process, hundreds a grading run. The grader's
    # processes get a TMPDIR of its own, removed when it exits.
    script = (
        "import subprocess, sys\n"
        "from grader.common.nbgrader_cli import environment\n"
        "probe = 'from jupyter_core.paths import jupyter_config_dir; print(jupyter_config_dir())'\n"
        "print(subprocess.run([sys.executable, '-c', probe], env=environment(), capture_output=True,\n"
        "                     text=True, check=True).stdout.strip())\n")
    made = subprocess.run([sys.executable, "-c", script], cwd=COURSE_ROOT, capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=120, check=True).stdout.strip()
    assert Path(made).name.startswith("jupyter-clean-cfg-"), made
    assert Path(made).is_relative_to(tmp_path), made
    assert list(tmp_path.iterdir()) == [], f"left in TMPDIR: {sorted(p.name for p in tmp_path.iterdir())}"


def test_a_command_s_grader_error_is_its_message_and_status_1_and_other_statuses_pass_through(tmp_path, monkeypatch,
                                                                                              capsys):
    """grader.common.command_line: the parser both `python -m grader` and `python -m course_tools` build."""
    from grader.common import command_line

    package = tmp_path / "some_commands"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fails.py").write_text(
        "from grader import GraderError\n"
        "def add_subcommand(sub):\n"
        "    p = sub.add_parser('fails')\n"
        "    p.add_argument('why')\n"
        "    p.set_defaults(func=lambda args: (_ for _ in ()).throw(GraderError(f'no {args.why}')))\n")
    (package / "ends.py").write_text(
        "def add_subcommand(sub):\n"
        "    sub.add_parser('ends').set_defaults(func=lambda args: 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    parser = command_line.build_parser("prog", "what it does", "some_commands", ("fails", "ends"))
    assert command_line.run(parser, ["fails", "solutions"]) == 1
    assert capsys.readouterr().err == "error: no solutions\n"
    assert command_line.run(parser, ["ends"]) == 3
    with pytest.raises(SystemExit):  # an unknown command is argparse's: usage and status 2
        command_line.run(parser, ["other"])
    assert "invalid choice: 'other'" in capsys.readouterr().err
