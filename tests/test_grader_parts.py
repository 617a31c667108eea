"""The grader's parts, one at a time: finding submissions, telling a damaged
notebook from a readable one, hiding hidden tests, noticing tests that never
ran, exporting "no submission", and the stored reference values.

The whole round trip is tests/test_grading_round_trip.py.
"""
from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook, new_output

from course import grading
from grader import COURSE_ROOT, GraderError, collect, export, reference
from grader.feedback import HIDDEN_NOTE, HideHiddenTests
from grader.grade import gradable_labs, inspect_autograded

LABS = ["01_single_gpu", "02_data_parallel"]


def _notebook(path, cells=()):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(new_notebook(cells=list(cells)), path)
    return path


# --------------------------------------------------------------------------
# Finding submissions
# --------------------------------------------------------------------------

def test_find_accepts_both_layouts_and_reports_the_rest(tmp_path):
    _notebook(tmp_path / "alice" / "01_single_gpu.ipynb")
    _notebook(tmp_path / "bob" / "02_data_parallel" / "02_data_parallel.ipynb")
    _notebook(tmp_path / "bob" / ".ipynb_checkpoints" / "01_single_gpu-checkpoint.ipynb")
    _notebook(tmp_path / "carol" / "scratch.ipynb")
    _notebook(tmp_path / "carol" / "deep" / "down" / "01_single_gpu.ipynb")
    _notebook(tmp_path / "bad id!" / "01_single_gpu.ipynb")
    _notebook(tmp_path / "loose.ipynb")
    found, problems = collect.find(tmp_path, LABS)
    assert [(s.student, s.lab) for s in found] == [("alice", "01_single_gpu"), ("bob", "02_data_parallel")]
    text = "\n".join(problems)
    for culprit in ("carol/scratch.ipynb", "carol/deep/down/01_single_gpu.ipynb", "bad id!", "loose.ipynb"):
        assert culprit in text, f"{culprit} not reported in:\n{text}"
    assert "checkpoint" not in text


def test_find_reports_a_second_copy_and_a_missing_folder(tmp_path):
    _notebook(tmp_path / "alice" / "01_single_gpu.ipynb")
    _notebook(tmp_path / "alice" / "01_single_gpu" / "01_single_gpu.ipynb")
    found, problems = collect.find(tmp_path, LABS)
    assert len(found) == 1 and "second copy" in problems[0]
    with pytest.raises(GraderError, match="no such folder"):
        collect.find(tmp_path / "nope", LABS)


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe\x00binary", "not UTF-8 text"),
    (b'{"cells": [', "not valid JSON"),
    (b'{"hello": 1}', "not a Jupyter notebook"),
    (b'{"cells": [{"cell_type": "nonsense"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}', "not a valid Jupyter notebook"),
])
def test_unreadable_says_why(tmp_path, content, words):
    path = tmp_path / "x.ipynb"
    path.write_bytes(content)
    assert words in collect.unreadable(path)


def test_a_readable_notebook_is_readable(tmp_path):
    assert collect.unreadable(_notebook(tmp_path / "x.ipynb", [new_code_cell("1")])) is None


# --------------------------------------------------------------------------
# Feedback and status
# --------------------------------------------------------------------------

def test_hidden_tests_and_their_tracebacks_are_removed():
    source = "visible()\n    ### BEGIN HIDDEN TESTS\n    secret_check()\n    ### END HIDDEN TESTS\nafter()"
    cell = new_code_cell(source, outputs=[new_output(
        "error", ename="AssertionError", evalue="weights on rank 1: 3 of 8 elements differ",
        traceback=["Traceback", "secret_check()"])])
    plain = new_code_cell("print(1)", outputs=[new_output("error", ename="E", evalue="v", traceback=["keep me"])])
    nb = new_notebook(cells=[cell, plain])
    nb, _ = HideHiddenTests().preprocess(nb, {})
    assert "secret_check" not in nb.cells[0].source
    assert nb.cells[0].source == f"visible()\n    {HIDDEN_NOTE}\nafter()"
    traceback = "\n".join(nb.cells[0].outputs[0]["traceback"])
    assert "secret_check" not in traceback
    assert "weights on rank 1: 3 of 8 elements differ" in traceback
    assert nb.cells[1].outputs[0]["traceback"] == ["keep me"]


def _graded_cell(source, grade_id, executed):
    cell = new_code_cell(source, execution_count=1 if executed else None)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "points": 1, "solution": False,
                                 "locked": True, "schema_version": 3, "task": False}
    return cell


def test_tests_that_never_ran_mean_not_graded(tmp_path):
    ran = _notebook(tmp_path / "ran.ipynb", [new_code_cell("x = 1", execution_count=1),
                                             _graded_cell("assert x", "test_a", True)])
    assert inspect_autograded(ran) == (True, "")
    died = _notebook(tmp_path / "died.ipynb", [new_code_cell("x = 1", execution_count=1),
                                               _graded_cell("assert x", "test_a", True),
                                               new_code_cell("import os; os._exit(1)"),
                                               _graded_cell("assert x", "test_b", False)])
    graded, why = inspect_autograded(died)
    assert not graded and "test_b" in why and "test_a" not in why and "after cell 2" in why
    assert inspect_autograded(tmp_path / "missing.ipynb")[0] is False


def test_csv_row_for_a_student_without_a_submission(tmp_path):
    rows = export.rows(["dora"], {"01_single_gpu": 9.0}, {}, f"sqlite:///{tmp_path / 'gb.db'}", COURSE_ROOT)
    assert rows == [{"student_id": "dora", "01_single_gpu score": "", "01_single_gpu max score": 9.0,
                     "01_single_gpu graded": "no", "01_single_gpu not graded because": "no submission",
                     "total score": 0.0, "total max score": 9.0}]


def test_only_labs_with_graded_cells_are_graded():
    points = gradable_labs(COURSE_ROOT)
    assert "00_ranks" not in points  # a demonstration, nothing to grade
    assert points["01_single_gpu"] > 0


# --------------------------------------------------------------------------
# Stored reference values
# --------------------------------------------------------------------------

def test_compare_reports_drift(tmp_path):
    stored, fresh = tmp_path / "stored", tmp_path / "fresh"
    values = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "loss": 0.5}
    grading.write(stored / "lab.json", "lab", values)
    grading.write(fresh / "lab.json", "lab", values)
    assert reference.compare(stored, fresh) == []
    grading.write(fresh / "lab.json", "lab", {"w": torch.tensor([1.0, 2.1], dtype=torch.float64), "new": 1})
    grading.write(fresh / "other.json", "other", {})
    problems = "\n".join(reference.compare(stored, fresh))
    assert "'loss' is stored but no longer recorded" in problems
    assert "'new' is recorded but not stored" in problems
    assert "w: 1 of 2 elements differ" in problems
    assert "other.json: recorded by the solutions, but not stored" in problems


@pytest.mark.timeout(300)
def test_stored_references_agree_with_the_solutions():
    proc = subprocess.run([sys.executable, "-m", "grader", "reference", "--check"], cwd=COURSE_ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout
    assert "agrees with solutions/" in proc.stdout


# --- grader.solution: the solution notebook's definitions, for benchmarks ----------

def test_solution_loader_runs_setup_and_definitions_only():
    from grader.solution import code_cells, defines_only
    assert defines_only("import torch\n\ndef f():\n    return 1\n\nclass A:\n    pass\n")
    assert not defines_only("def f():\n    pass\nf()\n")        # a call: a demonstration
    assert not defines_only("x = 1\n")
    assert not defines_only("")
    assert not defines_only("def broken(:\n")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# a lab"),
        nbformat.v4.new_code_cell("SIZE = 3\nprint('setup')"),
        nbformat.v4.new_code_cell("def answer():\n    return SIZE"),
        nbformat.v4.new_code_cell("assert answer() == 3"),
    ])
    assert code_cells(nb) == ["SIZE = 3\nprint('setup')", "def answer():\n    return SIZE"]


def test_solution_loader_gives_lab_2_answers_that_run_on_ranks():
    import course
    from grader.solution import load
    lab = load("02_data_parallel")
    assert callable(lab.ring_all_reduce) and isinstance(lab.BucketedGradients, type)

    def ring_of_ranks(ring_all_reduce):
        import torch
        import torch.distributed as dist
        t = torch.full((7,), float(dist.get_rank() + 1))
        return ring_all_reduce(t).tolist()

    assert list(course.launch(ring_of_ranks, 2, args=(lab.ring_all_reduce,))) == [[3.0] * 7] * 2


def test_solution_loader_names_the_labs_it_has(tmp_path):
    from grader.solution import load
    (tmp_path / "solutions" / "01_x").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"01_x"):
        load("02_missing", root=tmp_path)
