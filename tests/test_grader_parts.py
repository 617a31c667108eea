"""The grader's parts, one at a time: finding submissions, telling a damaged
notebook from a readable one, hiding hidden tests, noticing tests that never
ran, exporting "no submission", and the stored reference values.

The whole round trip is tests/test_grading_round_trip.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook, new_output

from course import grading
from grader import COURSE_ROOT, GraderError, reference
from grader.common.labs import graded_cells
from grader.common.quoting import quoted
from grader.common.warm_process import Answer, WarmProcess
from grader.feedback.page import HIDDEN_NOTE, HideHiddenTests, verdict_html
from grader.feedback.worker import FeedbackWorker
from grader.grading import collect, export, unzip, verdict
from grader.grading.submission import inspect_autograded
from grader.grading.workspace import gradable_labs, lab_infos
from grader.jail.bwrap import Limits
from grader.judge.server import required_checks
from helpers import graded_labs

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
    (b'{"cells": [{"cell_type": "nonsense"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}',
     "not a valid Jupyter notebook"),
])
def test_unreadable_says_why(tmp_path, content, words):
    path = tmp_path / "x.ipynb"
    path.write_bytes(content)
    assert words in collect.unreadable(path)


def test_a_readable_notebook_is_readable(tmp_path):
    assert collect.unreadable(_notebook(tmp_path / "x.ipynb", [new_code_cell("1")])) is None


def test_find_never_goes_through_a_link_and_says_so_in_the_student_s_verdict(tmp_path):
    """The grader reads submissions as root: a notebook, a lab folder or a student folder that is a link
    (to the instructor's solution, say) is refused with a verdict, never read."""
    elsewhere = tmp_path / "instructor"
    solution = _notebook(elsewhere / "02_data_parallel" / "02_data_parallel.ipynb")
    _notebook(elsewhere / "01_single_gpu.ipynb")
    folder = tmp_path / "submissions"
    (folder / "alice").mkdir(parents=True)
    (folder / "alice" / "01_single_gpu.ipynb").symlink_to(solution)
    (folder / "bob").mkdir()
    (folder / "bob" / "02_data_parallel").symlink_to(solution.parent, target_is_directory=True)
    (folder / "carol").symlink_to(elsewhere, target_is_directory=True)
    (folder / "dave").mkdir()
    os.mkfifo(folder / "dave" / "01_single_gpu.ipynb")
    _notebook(folder / "erin" / "01_single_gpu.ipynb")
    found, problems = collect.find(folder, LABS)
    assert [(s.student, s.lab) for s in found] == [("erin", "01_single_gpu")]
    verdicts = {(p.student, p.lab): p.why for p in problems if isinstance(p, collect.Problem) and p.student}
    assert "is a symbolic link" in verdicts[("alice", "01_single_gpu")]
    assert "02_data_parallel/ handed in is a link" in verdicts[("bob", "02_data_parallel")]
    assert "not a regular file" in verdicts[("dave", "01_single_gpu")]
    assert any(p.startswith("carol/: a link, not a student's folder") for p in problems), problems


def test_a_submitted_notebook_is_never_read_through_a_link(tmp_path):
    target = _notebook(tmp_path / "solution.ipynb", [new_code_cell("1")])
    link = tmp_path / "x.ipynb"
    link.symlink_to(target)
    assert "a symbolic link, which the grader never reads through" in collect.unreadable(link)
    with pytest.raises(collect.NotebookError, match="symbolic link"):
        collect.parse_notebook(link)
    os.mkfifo(tmp_path / "pipe.ipynb")  # opened without blocking, and refused
    assert "not a regular file" in collect.unreadable(tmp_path / "pipe.ipynb")
    assert collect.parse_notebook(target)["nbformat"] == 4


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



def test_feedback_worker_reports_a_failed_render_and_keeps_serving(tmp_path):
    worker = FeedbackWorker(COURSE_ROOT, timeout=120, log=tmp_path / "worker.log")
    try:
        problem = worker.write(tmp_path / "missing.ipynb", tmp_path / "page.html", "sqlite:///nowhere",
                               "alice", "01_single_gpu", ["graded"])
        assert problem and "missing.ipynb" in problem, problem
        assert not (tmp_path / "page.html").exists()
        first = worker.proc.pid
        again = worker.write(tmp_path / "missing.ipynb", tmp_path / "page.html", "sqlite:///nowhere",
                             "alice", "01_single_gpu", ["graded"])
        assert again == problem and worker.proc.pid == first  # the same process answered both
    finally:
        worker.close()
    assert "FileNotFoundError" in (tmp_path / "worker.log").read_text()


@pytest.mark.slow  # waits out the worker's 10 s limit
def test_feedback_worker_stops_a_render_that_hangs(tmp_path):
    fifo = tmp_path / "never-written.ipynb"
    os.mkfifo(fifo)  # reading it blocks forever: a render that never ends
    worker = FeedbackWorker(COURSE_ROOT, timeout=10, log=tmp_path / "worker.log")
    try:
        problem = worker.write(fifo, tmp_path / "page.html", "sqlite:///nowhere", "alice", "01_single_gpu", [])
        assert problem == "the feedback renderer ran past the limit of 10 s and was stopped"
        assert worker.proc is None
        # The next page gets a fresh process.
        problem = worker.write(tmp_path / "missing.ipynb", tmp_path / "page.html", "sqlite:///nowhere",
                               "alice", "01_single_gpu", [])
        assert "missing.ipynb" in problem
    finally:
        worker.close()

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
    rows = export.rows(["dora"], {"01_single_gpu": 9.0}, {}, f"sqlite:///{tmp_path / 'gb.db'}", COURSE_ROOT,
                       {"01_single_gpu": {"written_why": 2.0}})
    assert rows == [{"student_id": "dora", "01_single_gpu score": "", "01_single_gpu max score": 9.0,
                     "01_single_gpu written score": "", "01_single_gpu written max score": 2.0,
                     "01_single_gpu pending manual": "",
                     "01_single_gpu graded": "no", "01_single_gpu verdict": "not graded: no submission",
                     "total score": 0.0, "total max score": 11.0, "total pending manual": 0.0}]


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
    # A test that now checks a value on other ranks (or as often) drifted too: the judge holds submissions to it.
    grading.write(stored / "lab.json", "lab", values, None, {"w": [0, 1], "loss": [None]})
    grading.write(fresh / "lab.json", "lab", values, None, {"w": [0], "loss": [None]})
    assert reference.compare(stored, fresh, ["lab"]) == [
        "lab.json: 'w' is checked on ranks [0], stored as checked on [0, 1]"]


def _tiny_course(root, stored_value):
    """A course of one lab whose solution checks one value; its stored reference holds stored_value."""
    lab = "01_tiny"
    shutil.copy(COURSE_ROOT / "nbgrader_config.py", root)
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Lab 1: tiny"),
        _cell(f"import course\nREFERENCE = course.grading.Reference({lab!r})", "setup"),
        nbformat.v4.new_code_cell("REFERENCE.check('tiny/a sum', sum([0.5, 0.25]))"),
    ])
    (root / "solutions" / lab).mkdir(parents=True)
    nbformat.write(nb, root / "solutions" / lab / f"{lab}.ipynb")
    grading.write(root / "grader" / "reference" / f"{lab}.json", lab, {"tiny/a sum": stored_value}, None,
                  {"tiny/a sum": [None]})


# Every lab's own stored values are checked against its solution, as this command checks them, each
# time tests/test_notebooks.py executes the solution (on both instruction sets): here, the command.
@pytest.mark.timeout(120)
@pytest.mark.notebook
@pytest.mark.parametrize(("stored", "status", "says"), [(0.75, 0, "agrees with solutions/"),
                                                        (0.8, 1, "has drifted from solutions/")])
def test_reference_check_says_whether_the_stored_values_agree(stored, status, says, tmp_path):
    _tiny_course(tmp_path, stored)
    proc = subprocess.run([sys.executable, "-m", "grader", "reference", "--check", "--root", str(tmp_path)],
                          cwd=COURSE_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=110)
    assert proc.returncode == status, proc.stdout
    assert says in proc.stdout, proc.stdout


# --- grader.common.solution: the solution notebook's definitions, for benchmarks ----------

def _cell(source, *tags):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = list(tags)
    return cell


def test_solution_loader_runs_the_cells_tagged_for_it_only():
    from grader.common.solution import code_cells, defines_only, marking_problems
    assert defines_only("import torch\n\ndef f():\n    return 1\n\nclass A:\n    pass\n")
    assert not defines_only("def f():\n    pass\nf()\n")        # a call: a demonstration
    assert not defines_only("x = 1\n")
    assert not defines_only("")
    assert not defines_only("def broken(:\n")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# a lab"),
        _cell("SIZE = 3\nprint('setup')", "setup"),
        _cell("def answer():\n    return SIZE", "reused"),
        _cell("def helper_of_a_test():\n    return 0"),           # defines, but is not marked
        _cell("assert answer() == 3"),
    ])
    assert code_cells(nb) == ["SIZE = 3\nprint('setup')", "def answer():\n    return SIZE"]
    assert marking_problems(nb) == []


def test_a_reused_cell_that_does_more_than_define_is_named_with_its_statement():
    from grader.common.solution import marking_problems
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# a lab"),
        _cell("import torch", "setup"),
        _cell("def answer():\n    return 1\n\nanswer()", "reused"),
        _cell("SIZE = 4", "setup"),
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


def test_reference_check_fails_on_a_reused_cell_that_is_not_definitions_only(tmp_path):
    """Before executing anything: a solution whose tagged cell also runs code."""
    from grader.common.solution import REUSED_TAG
    shutil.copytree(COURSE_ROOT / "solutions" / "01_single_gpu", tmp_path / "solutions" / "01_single_gpu")
    shutil.copy(COURSE_ROOT / "nbgrader_config.py", tmp_path)
    path = tmp_path / "solutions" / "01_single_gpu" / "01_single_gpu.ipynb"
    nb = nbformat.read(path, as_version=4)
    reused = next(c for c in nb.cells if REUSED_TAG in c.metadata.get("tags", ()))
    reused.source += "\nprint('a demonstration')"
    nbformat.write(nb, path)
    proc = subprocess.run([sys.executable, "-m", "grader", "reference", "--check", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "is tagged 'reused' but does more than define" in proc.stderr
    assert "print('a demonstration')" in proc.stderr


def test_every_solution_tags_its_cells_for_the_loader_as_it_can_load_them():
    from grader.common.labs import find_labs
    from grader.common.solution import code_cells, marking_problems
    from grader.run import LABS
    for lab in find_labs():
        assert marking_problems(nbformat.read(lab.notebook, as_version=4), lab.name) == []
    for name in LABS:  # what `python -m grader run` loads: a setup and something reused
        nb = nbformat.read(COURSE_ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
        assert len(code_cells(nb)) > 1, f"{name}: load would give grader run nothing to run"


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
# Zips of submissions
# --------------------------------------------------------------------------

def _zip(path, members):
    import zipfile
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


def test_unpack_takes_both_layouts_inside_a_top_folder(tmp_path):
    nb = nbformat.writes(new_notebook())
    archive = _zip(tmp_path / "class.zip", {"export/alice/01_single_gpu.ipynb": nb,
                                            "export/bob/02_data_parallel/02_data_parallel.ipynb": nb,
                                            "export/bob/notes.txt": "not a notebook",
                                            "__MACOSX/export/._alice": "litter"})
    folder, problems = unzip.unpack(archive, tmp_path / "out", LABS)
    found, more = collect.find(folder, LABS)
    assert [(s.student, s.lab) for s in found] == [("alice", "01_single_gpu"), ("bob", "02_data_parallel")]
    assert problems == more == []
    single, _ = unzip.unpack(_zip(tmp_path / "one.zip", {"carol/01_single_gpu/01_single_gpu.ipynb": nb}),
                               tmp_path / "one", LABS)
    assert [s.student for s in collect.find(single, LABS)[0]] == ["carol"]


def test_placing_a_submission_puts_the_labs_grading_metadata_back(tmp_path):
    """nbgrader trusts a cell's metadata: claims the lab does not make are taken off, in words."""
    answer = new_code_cell("x = 1")
    answer.metadata["nbgrader"] = {"grade": False, "grade_id": "answer", "solution": True, "locked": False}
    released = new_notebook(cells=[answer, _graded_cell("assert x == 1", "test_answer", False)])
    submitted = nbformat.from_dict(json.loads(json.dumps(released)))
    submitted.cells[0].metadata["nbgrader"].update(grade=True, points=50)          # an answer claims points
    submitted.cells[1].metadata["nbgrader"]["points"] = 100                         # a test claims more
    bogus = new_code_cell("print(1)")
    bogus.metadata["nbgrader"] = {"grade": True, "grade_id": "bogus", "points": 9}  # a test of its own
    broken = new_code_cell("print(2)")
    broken.metadata["nbgrader"] = "not a dict"
    submitted.cells += [bogus, broken]
    path = tmp_path / "alice" / "01_single_gpu.ipynb"
    path.parent.mkdir()
    nbformat.write(submitted, path)
    notes = collect.place(collect.Submission("alice", "01_single_gpu", path), collect.parse_notebook(path),
                          tmp_path / "submitted", released)
    placed = json.loads((tmp_path / "submitted" / "alice" / "01_single_gpu" / "01_single_gpu.ipynb").read_text())
    assert [c["metadata"].get("nbgrader") for c in placed["cells"]] == \
        [released.cells[0].metadata["nbgrader"], released.cells[1].metadata["nbgrader"], None, None]
    assert notes == ["cell answer's grading metadata was changed; the lab's was put back",
                     "cell test_answer's grading metadata was changed; the lab's was put back",
                     "cell 3 claimed grading metadata (grade_id «bogus») that is no cell of the lab; "
                     "it ran as an ordinary cell",
                     "cell 4 claimed grading metadata (no grade_id) that is no cell of the lab; "
                     "it ran as an ordinary cell"]


@pytest.mark.parametrize("lab", [lab.name for lab in graded_labs()])
def test_a_test_cell_left_as_released_gets_its_hidden_tests_back_with_the_gradebook_s_checksum(tmp_path, lab):
    # nbgrader's autograde compares each locked cell's checksum with the gradebook's, taken before the
    # release cut the hidden tests (its issue #1961): the untouched release "has changed" in every such
    # cell. Placed as the grader places it, each is the solution's cell again, to nbgrader's checksum;
    # a test cell the student edited is left as it is, for nbgrader to say so and put it back.
    from nbgrader.utils import compute_checksum

    info = lab_infos(COURSE_ROOT)[lab]
    assert info.with_hidden_tests, f"{lab} has graded cells but no hidden tests"
    source = nbformat.read(COURSE_ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    solution_cells = {c.metadata["nbgrader"]["grade_id"]: c for c in source.cells
                      if c.metadata.get("nbgrader", {}).get("grade_id") in info.with_hidden_tests}
    submitted = json.loads(json.dumps(info.released))
    edited = next(c for c in submitted["cells"]
                  if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") in info.with_hidden_tests)
    edited_id = edited["metadata"]["nbgrader"]["grade_id"]
    edited["source"] = "pass  # the student's own test\n"
    path = tmp_path / "alice" / f"{lab}.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(submitted))
    collect.place(collect.Submission("alice", lab, path), collect.parse_notebook(path), tmp_path / "submitted",
                  info.released, info.with_hidden_tests)
    placed = nbformat.read(tmp_path / "submitted" / "alice" / lab / f"{lab}.ipynb", as_version=4)
    by_id = {c.metadata["nbgrader"]["grade_id"]: c for c in placed.cells if "nbgrader" in c.metadata}
    for grade_id, cell in solution_cells.items():
        if grade_id == edited_id:
            assert by_id[grade_id].source == "pass  # the student's own test\n"
        else:
            assert compute_checksum(by_id[grade_id]) == compute_checksum(cell), grade_id


def test_a_long_verdict_line_is_cut_between_clauses_never_inside_a_value():
    # the judge's words for a gradient exactly doubled: what shows the mistake is got against expected
    check = ("test cell test_zero1_step, the grader's check: zero1_step/every rank's parameters after three "
             "steps on 4 ranks, seeded on rank 2: 3 of 10 elements differ; the largest difference is 0.016 at "
             "[2] (got 0.016029086, expected 0.032058172); allowed: |got - expected| <= 1e-12 + 1e-07 * "
             "|expected| (torch.float64)")
    line = verdict.fitted(check)
    assert len(line) <= verdict.MAX_LINE < len(check)
    assert line.endswith("(got 0.016029086, expected 0.032058172); …"), line
    # a student's words are never split at a "; " of their own, nor left without their closing mark
    raised = "cell 4 raised ValueError: " + quoted("a; b; " + "x" * 150) + "; and " + "y" * 100
    line = verdict.fitted(raised)
    assert len(line) <= verdict.MAX_LINE and line.count("«") == line.count("»") == 1, line
    one_clause = "word " * 100
    line = verdict.fitted(one_clause)
    assert len(line) <= verdict.MAX_LINE and line.endswith("word…"), line
    assert verdict.fitted("short; enough") == "short; enough"
    # nor is a number in a student's words: cut through, it would read as a value
    for said, cut in (("expected 0.5714286", "«expected …»"), ("got -1.5e-07", "«got …»"),
                      ("at [2]: 12345", "«at [2]: …»")):
        assert quoted("x" * 150 + " " + said, 150 + len(said) - 3) == "«" + "x" * 150 + " " + cut[1:], said
    assert quoted("y" * 200, 160) == "«" + "y" * 159 + "…»"       # words are cut where the limit falls
    # and on the feedback page, a long unbroken value wraps rather than running off the screen
    assert 'style="overflow-wrap: anywhere"' in verdict_html(["graded: 0 of 1 points", "x" * 500])


def test_unpack_refuses_paths_out_of_the_folder(tmp_path):
    nb = nbformat.writes(new_notebook())
    archive = _zip(tmp_path / "evil.zip", {"../../escape/01_single_gpu.ipynb": nb,
                                           "/abs/01_single_gpu.ipynb": nb, "dan/01_single_gpu.ipynb": nb})
    folder, problems = unzip.unpack(archive, tmp_path / "out", LABS)
    assert len(problems) == 2 and all("refused" in p for p in problems), problems
    assert not (tmp_path / "escape").exists()
    assert [p.relative_to(folder).as_posix() for p in folder.rglob("*.ipynb")] == ["dan/01_single_gpu.ipynb"]
    (tmp_path / "junk.zip").write_text("not a zip")
    with pytest.raises(GraderError, match="not a zip"):
        unzip.unpack(tmp_path / "junk.zip", tmp_path / "junk", LABS)


# --------------------------------------------------------------------------
# The judge's keys (the judge itself: tests/test_judge.py)
# --------------------------------------------------------------------------

# Every lab with graded cells, found in solutions/ as the grader finds them: a new lab is held to
# these rules without being listed (test_a_new_lab_folder_is_held_to_the_judge_s_rules_unlisted).
GRADED_LABS = graded_labs()


def assert_every_stored_value_is_required(lab, root=COURSE_ROOT):
    """The lab's stored reference values are exactly the keys its test cells check: none unasked for."""
    source = nbformat.read(lab.notebook, as_version=4)
    required = {key for keys in required_checks(source).values() for key in keys}
    path = root / reference.REFERENCE_DIR / f"{lab.name}.json"
    assert path.is_file(), (f"{lab.name} has graded cells but no stored values: run `make reference` and "
                            f"commit {reference.REFERENCE_DIR}/{lab.name}.json")
    stored = set(grading.read(path))
    assert required == stored, f"{lab.name}: checks the judge cannot hold to account: {stored ^ required}"


# The hidden tests' seeded inputs: REFERENCE.seed(), or a generator seeded from it (course.grading.Reference).
SEEDED = re.compile(r"REFERENCE\.(seed|generator|random)\(")


def assert_every_graded_cell_is_judged(lab):
    """Each graded test cell has a hidden check the judge holds, on inputs of the run's seed."""
    source = nbformat.read(lab.notebook, as_version=4)
    judged = required_checks(source)
    unjudged = set(graded_cells(source)) - set(judged)
    assert not unjudged, f"{lab.name}: test cells whose points no check outside the kernel decides: {sorted(unjudged)}"
    for cell in source.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in judged:
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[-1]
            assert SEEDED.search(hidden), \
                f"{lab.name}/{cell.metadata.nbgrader.grade_id}: the judged inputs must come from REFERENCE.seed() " \
                "(or REFERENCE.generator() / REFERENCE.random(), which it seeds)"


@pytest.mark.parametrize("lab", GRADED_LABS, ids=lambda lab: lab.name)
def test_every_stored_reference_value_is_required_by_a_test_cell(lab):
    assert_every_stored_value_is_required(lab)


@pytest.mark.parametrize("lab", GRADED_LABS, ids=lambda lab: lab.name)
def test_every_graded_test_cell_earns_its_points_through_the_judge(lab):
    assert_every_graded_cell_is_judged(lab)


def test_every_stored_reference_file_is_a_graded_lab_s():
    stored = {path.stem for path in (COURSE_ROOT / reference.REFERENCE_DIR).glob("*.json")}
    unasked = sorted(stored - {lab.name for lab in GRADED_LABS})
    assert not unasked, f"stored values of no lab with graded cells, which nothing asks for: {unasked}"


NEW_LAB = "07_new_lab"


def _course_with_a_new_lab(root, judged=True):
    """A course of an ungraded tour and one new graded lab, NEW_LAB, in folders no test names."""
    root.mkdir(exist_ok=True)
    shutil.copy(COURSE_ROOT / "nbgrader_config.py", root)
    answer = new_code_cell("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION")
    answer.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": "add",
                                   "schema_version": 3, "task": False}
    hidden = ("a = REFERENCE.seed()\nREFERENCE.check('add/a sum', add(a, 1))" if judged
              else "assert add(20, 22) == 42")
    test = _graded_cell(f"assert add(1, 2) == 3\n### BEGIN HIDDEN TESTS\n{hidden}\n### END HIDDEN TESTS",
                        "test_add", False)
    labs = {"00_tour": [nbformat.v4.new_markdown_cell("# 00 · A tour"), new_code_cell("print('no exercise')")],
            NEW_LAB: [nbformat.v4.new_markdown_cell("# 07 · A new lab"),
                      _cell(f"import course\nREFERENCE = course.grading.Reference({NEW_LAB!r})", "setup"),
                      answer, test]}
    for name, cells in labs.items():
        _notebook(root / "solutions" / name / f"{name}.ipynb", cells)


def test_a_new_lab_folder_is_held_to_the_judge_s_rules_unlisted(tmp_path):
    """graded_labs, which the tests of every lab iterate over (these and tests/test_tampering.py's), finds
    a new lab folder as the grader does; the judge's rules above then hold it to account."""
    course, unjudged = tmp_path / "course", tmp_path / "unjudged"
    _course_with_a_new_lab(course)
    assert [lab.name for lab in graded_labs(course)] == [NEW_LAB] == list(gradable_labs(course))
    new_lab, = graded_labs(course)
    assert_every_graded_cell_is_judged(new_lab)
    stored = course / reference.REFERENCE_DIR / f"{NEW_LAB}.json"
    with pytest.raises(AssertionError, match=f"{NEW_LAB} has graded cells but no stored values"):
        assert_every_stored_value_is_required(new_lab, course)
    grading.write(stored, NEW_LAB, {"add/a sum": 1.0})
    assert_every_stored_value_is_required(new_lab, course)
    grading.write(stored, NEW_LAB, {"add/a sum": 1.0, "x": 2.0})
    with pytest.raises(AssertionError, match=re.escape("checks the judge cannot hold to account: {'x'}")):
        assert_every_stored_value_is_required(new_lab, course)
    _course_with_a_new_lab(unjudged, judged=False)
    with pytest.raises(AssertionError, match="test cells whose points no check outside the kernel decides"):
        assert_every_graded_cell_is_judged(graded_labs(unjudged)[0])
    # this checkout's labs come the same way: the grader's own list of what it grades
    assert [lab.name for lab in GRADED_LABS] == list(gradable_labs(COURSE_ROOT))


# --------------------------------------------------------------------------
# A grading run's order: each lab's recording, then its students
# --------------------------------------------------------------------------

class _Stand:
    """Stand-ins for a grading run's sandboxed parts, noting what happened in which order."""

    def __init__(self, failing_lab=None):
        self.events, self.lock, self.failing_lab = [], threading.Lock(), failing_lab
        self.recording_at_once = self.recording_now = 0
        self.gradebook_prepared = False

    def prepare_gradebook(self, *args):
        time.sleep(0.5)  # nbgrader's seconds per lab, while the labs are recorded
        self.gradebook_prepared = True

    def record(self, ws, root, lab, say=print, reuse=None):
        with self.lock:
            self.recording_now += 1
            self.recording_at_once = max(self.recording_at_once, self.recording_now)
        try:
            time.sleep(0.3)
            if lab.name == self.failing_lab:
                raise GraderError(f"{lab.name}: solutions/{lab.name} failed while recording its reference outputs")
            return Path(f"{lab.name}.json"), 1
        finally:
            with self.lock:
                self.recording_now -= 1

    def grader(self, *args, judges=None):
        stand, judged = self, args[-1]

        class Grader:
            lock = threading.Lock()

            def grade(self, submission, slot):
                with stand.lock:
                    ready = submission.lab in judged and stand.gradebook_prepared
                    stand.events.append(("grade", submission.lab, ready))
                return {"verdict": ["graded: 1 of 1 points"], "seconds": 0.0, "graded": True}
        return Grader()


def _run_with(stand, tmp_path, monkeypatch, labs, jobs, handed_in=None, whole_term=False):
    """Grade ada's and bo's notebooks of `handed_in` (default: `labs`) with the stand's parts; the labs
    the CSV would report go to stand.reported."""
    from grader import grade as grading_run

    class Worker:
        def __init__(self, *args):
            pass
        start = close = lambda self: None
    for name, value in {"record_judged_values": stand.record, "SubmissionGrader": stand.grader,
                        "AutogradeWorker": Worker, "FeedbackWorker": Worker,
                        "prepare_gradebook": stand.prepare_gradebook}.items():
        monkeypatch.setattr(grading_run, name, value)
    monkeypatch.setattr(grading_run, "jail_unavailable", lambda: None)
    monkeypatch.setattr(grading_run.export, "write_csv",
                        lambda path, students, points, *args, **kwargs: setattr(stand, "reported", list(points)))
    for student in ("ada", "bo"):
        for lab in labs if handed_in is None else handed_in:
            _notebook(tmp_path / "in" / student / f"{lab}.ipynb")
    return grading_run.grade(tmp_path / "in", labs=labs, work=tmp_path / "work", jobs=jobs, whole_term=whole_term,
                             say=lambda line: None)


def test_each_lab_is_recorded_before_its_students_are_graded_several_at_once(tmp_path, monkeypatch):
    labs = ["02_data_parallel", "03_model_parallel", "04_hybrid"]
    stand = _Stand()
    _run_with(stand, tmp_path, monkeypatch, labs, jobs=2)
    graded = [event for event in stand.events if event[0] == "grade"]
    # each student after their lab's recording and the gradebook's preparation
    assert sorted(graded) == sorted(("grade", lab, True) for lab in labs for _ in range(2))
    assert stand.recording_at_once == 2  # --jobs recordings side by side


def test_the_csv_reports_the_labs_handed_in_unless_named_or_asked_for_the_whole_term(tmp_path, monkeypatch):
    every = list(gradable_labs(COURSE_ROOT))
    for labs, whole_term, reported in ((None, False, ["03_model_parallel"]),   # not 7 labs nobody was given
                                       (None, True, every),
                                       (["02_data_parallel", "03_model_parallel"], False,
                                        ["02_data_parallel", "03_model_parallel"])):
        stand = _Stand()
        _run_with(stand, tmp_path / str(len(reported)) / str(whole_term), monkeypatch, labs, jobs=1,
                  handed_in=["03_model_parallel"], whole_term=whole_term)
        assert stand.reported == reported, (labs, whole_term)


def test_a_failed_recording_stops_the_run_and_none_of_its_labs_students_is_graded(tmp_path, monkeypatch):
    stand = _Stand(failing_lab="03_model_parallel")
    with pytest.raises(GraderError, match="03_model_parallel failed while recording"):
        _run_with(stand, tmp_path, monkeypatch, ["02_data_parallel", "03_model_parallel"], jobs=1)
    assert not [event for event in stand.events if event[:2] == ("grade", "03_model_parallel")]


def test_a_solution_that_fails_while_recording_is_named_in_one_line_with_what_to_do(tmp_path):
    from grader.common.labs import Lab

    folder = tmp_path / "solutions" / "09_broken"
    test = new_code_cell("assert False, 'never reached'")
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "test_broken", "points": 1, "solution": False,
                                 "locked": True, "schema_version": 3, "task": False}
    notebook = _notebook(folder / "09_broken.ipynb", [new_code_cell("x = 1"), new_code_cell(
        "import torch\n\ntorch.ones(2) @ torch.ones(3)  # a shape mistake in the solution"), test])
    lab = Lab("09_broken", notebook, "Broken", {"test_broken": 1.0})
    shutil.copyfile(COURSE_ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    with pytest.raises(GraderError) as raised:
        reference.record(lab, tmp_path / "recorded", tmp_path)
    said = str(raised.value)
    assert "\n" not in said and len(said) < 600, said
    assert said.startswith("solutions/09_broken/09_broken.ipynb: the solution failed while recording"), said
    assert "cell 2 ('import torch') raised RuntimeError:" in said and "make test-lab LAB=09_broken" in said, said
    log = Path(said.rsplit(" is in ", 1)[1])
    report = log.read_text()
    log.unlink()          # kept for an instructor to read; this test has read it
    assert "torch.ones(2) @ torch.ones(3)" in report and "RuntimeError" in report, report


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


# --------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------

def test_errors_are_explained_in_plain_words():
    limits = Limits(memory_bytes=2 << 30, processes=64)
    said = lambda ename, evalue: verdict.explain_error({"ename": ename, "evalue": evalue}, limits, 10)  # noqa: E731
    assert said("CellTimeoutError", "") .startswith("ran past the 10 s limit")
    assert "2 GiB per process" in said("MemoryError", "")
    assert "2 GiB per process" in said("RuntimeError", "DefaultCPUAllocator: can't allocate memory")
    assert "limit is 64" in said("BlockingIOError", "[Errno 11] Resource temporarily unavailable")
    assert "network" in said("OSError", "[Errno 101] Network is unreachable")
    assert "outside its own folder" in said("OSError", "[Errno 30] Read-only file system: '/x'")
    assert "solutions, reference answers or gradebook" in said(
        "FileNotFoundError", "[Errno 2] No such file or directory: '/c/grader/reference/01.json'")
    # A host path, even one in /tmp (a clone of the course there), is not the jail's own folder.
    for path in ("/work/course/sneaky.py", "/tmp/ci/course/sneaky.py"):
        assert "outside its own folder" in said("FileNotFoundError", f"[Errno 2] No such file or directory: '{path}'")
    assert said("FileNotFoundError", "[Errno 2] No such file or directory: '/tmp/x.txt'").startswith("raised")
    assert said("ValueError", "bad shape") == "raised ValueError: «bad shape»"
    # What the submission wrote stays inside its marks, whatever it says.
    assert said("ValueError", "x; graded: 19 of 19 points «»") == "raised ValueError: «x; graded: 19 of 19 points ‹›»"
    assert said("graded: 19 of 19", "") == "raised «graded: 19 of 19»"


def test_tampering_with_test_cells_is_reported():
    tests = ["test_a", "test_b", "test_c"]
    released_nb = {"cells": [_graded_cell("assert a", g, False) for g in tests]}
    submitted = {"cells": [_graded_cell("assert a", "test_a", False), _graded_cell("pass", "test_b", False)]}
    submitted["cells"][0].metadata["tags"] = ["skip-execution"]
    said = verdict.tampering(submitted, released_nb, tests)
    assert said == ["the skip-execution tag on test cell test_a was ignored; the test ran",
                    "test cell test_b was edited; the original was graded instead",
                    "test cell test_c was missing; the original was put back and graded"]
    assert "metadata was removed" in verdict.unmatchable({"cells": [new_code_cell("x")]})
    assert verdict.unmatchable(submitted) is None


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


def test_a_graded_kernel_waits_longer_for_its_ranks_unless_the_instructor_says_otherwise(tmp_path):
    from grader.jail import bwrap
    spec = bwrap.Spec(root=str(tmp_path), uid=None)
    env = bwrap.jail_environment(spec, {"PATH": "/usr/bin", "SECRET": "x"})
    assert env["COURSE_RANK_TIMEOUT"] == bwrap.GRADED_RANK_TIMEOUT_S
    assert float(env["COURSE_RANK_TIMEOUT"]) > 30 and "SECRET" not in env
    assert bwrap.jail_environment(spec, {"COURSE_RANK_TIMEOUT": "300"})["COURSE_RANK_TIMEOUT"] == "300"


def test_a_graded_kernels_threads_sleep_while_they_wait_unless_the_instructor_says_otherwise(tmp_path):
    # graded submissions share the cores (grader.common.cores says what spinning costs there)
    from grader.jail import bwrap
    spec = bwrap.Spec(root=str(tmp_path), uid=None)
    assert bwrap.jail_environment(spec, {"PATH": "/usr/bin"})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert bwrap.jail_environment(spec, {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"


# --------------------------------------------------------------------------
# Written answers, graded by hand: pending, not zero
# --------------------------------------------------------------------------

WRITTEN_LAB = "01_single_gpu"
WRITTEN = {"written_why": 2.0, "written_sum": 3.0, "written_blank": 1.0}


def _gradebook_with_written_answers(path, students):
    """A class gradebook as `grader grade` leaves it: each student's test cell autograded (4 of 5
    points), and three written answers: two answered and not graded yet, one left as released
    (autograde scores it 0). students: {student: {written grade_id: a manual score, as formgrader sets}}."""
    import warnings

    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    from grader.common.labs import course_config
    course_id = course_config(COURSE_ROOT).CourseDirectory.course_id
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{path}", course_id=course_id) as gb:
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission trips autoflush warnings
        gb.add_assignment(WRITTEN_LAB)
        gb.add_notebook(WRITTEN_LAB, WRITTEN_LAB)
        gb.add_grade_cell("test_step", WRITTEN_LAB, WRITTEN_LAB, max_score=5, cell_type="code")
        for gid, points in WRITTEN.items():
            gb.add_grade_cell(gid, WRITTEN_LAB, WRITTEN_LAB, max_score=points, cell_type="markdown")
            gb.add_solution_cell(gid, WRITTEN_LAB, WRITTEN_LAB)
        for student, manual in students.items():
            gb.add_student(student)
            gb.add_submission(WRITTEN_LAB, student)
            gb.find_grade("test_step", WRITTEN_LAB, WRITTEN_LAB, student).auto_score = 4.0
            gb.find_grade("written_blank", WRITTEN_LAB, WRITTEN_LAB, student).auto_score = 0.0
            for gid, score in manual.items():
                gb.find_grade(gid, WRITTEN_LAB, WRITTEN_LAB, student).manual_score = score
        gb.db.commit()
    return f"sqlite:///{path}"


def test_written_answers_are_exported_as_pending_until_graded_by_hand(tmp_path):
    db = _gradebook_with_written_answers(tmp_path / "gb.db", {"ada": {}, "bo": {"written_why": 1.5},
                                                               "cy": {"written_why": 2.0, "written_sum": 0.0}})
    entry = {"graded": True, "verdict": ["graded: 4 of 5 points"]}
    status = {student: {WRITTEN_LAB: entry} for student in ("ada", "bo", "cy")}
    exercises = {WRITTEN_LAB: {"test_step": 5.0}}
    rows = {row["student_id"]: row for row in export.rows(["ada", "bo", "cy", "dora"], {WRITTEN_LAB: 5.0}, status,
                                                           db, COURSE_ROOT, {WRITTEN_LAB: WRITTEN}, exercises)}
    assert set(rows["ada"]) == set(export.columns([WRITTEN_LAB], exercises))
    lab = WRITTEN_LAB
    # each exercise's autograded points in a column of its own (one here): they add up to the score
    assert [rows[s][f"{lab} test_step"] for s in ("ada", "bo", "cy", "dora")] == [4.0, 4.0, 4.0, ""]
    # Nothing graded by hand yet: the autograded score is the code's, the 5 points of answers pending.
    ada = rows["ada"]
    assert (ada[f"{lab} score"], ada[f"{lab} max score"]) == (4.0, 5.0)
    assert (ada[f"{lab} written score"], ada[f"{lab} written max score"], ada[f"{lab} pending manual"]) == (0, 6, 5)
    assert ada[f"{lab} verdict"].startswith("graded: 4 of 5 points; 5 points await manual grading in formgrader")
    assert "1 left unanswered" in ada[f"{lab} verdict"]
    assert (ada["total score"], ada["total max score"], ada["total pending manual"]) == (4.0, 11.0, 5.0)
    # One answer graded in formgrader: its points counted apart from the code's, the other still pending.
    bo = rows["bo"]
    assert (bo[f"{lab} score"], bo[f"{lab} written score"], bo[f"{lab} pending manual"]) == (4.0, 1.5, 3.0)
    assert bo["total score"] == 5.5
    # Every answer graded (a 0 given by hand is a grade, not pending).
    cy = rows["cy"]
    assert (cy[f"{lab} score"], cy[f"{lab} written score"], cy[f"{lab} pending manual"]) == (4.0, 2.0, 0.0)
    assert "written answers: 2 of 6 points, graded by hand" in cy[f"{lab} verdict"]
    assert "await" not in cy[f"{lab} verdict"]
    assert rows["dora"][f"{lab} pending manual"] == "" and rows["dora"]["total max score"] == 11.0


def test_the_feedback_page_says_pending_for_an_answer_nobody_graded_and_escapes_it(tmp_path):
    from nbformat.v4 import new_markdown_cell

    from grader.feedback.page import html_page
    db = _gradebook_with_written_answers(tmp_path / "gb.db", {"ada": {}, "bo": {"written_why": 1.5}})
    released = "YOUR ANSWER HERE"
    cells = [_graded_cell("assert True", "test_step", True)]
    for gid, points in WRITTEN.items():
        cell = new_markdown_cell(released if gid == "written_blank" else
                                 f"My answer to {gid} <script>alert('{gid}')</script><img src=x onerror=alert(1)>")
        cell.metadata["nbgrader"] = {"grade": True, "solution": True, "grade_id": gid, "points": points,
                                     "locked": False, "schema_version": 3, "task": False}
        cells.append(cell)
    pages = {}
    for student in ("ada", "bo"):
        resources = {"unique_key": WRITTEN_LAB, "output_files_dir": "files",
                     "nbgrader": {"student": student, "assignment": WRITTEN_LAB, "notebook": WRITTEN_LAB,
                                  "db_url": db}}
        pages[student] = html_page(new_notebook(cells=cells), ["graded: 4 of 5 points"], [], [released], resources)
    ada, bo = pages["ada"], pages["bo"]
    assert "Score: pending / 2, graded by hand" in ada and "Score: pending / 3, graded by hand" in ada
    assert "Score: 0 / 1" in ada  # left as released: autograde's 0 stands
    # the heading counts as the verdict does: the code's points apart from the answers' given by hand
    assert f"{WRITTEN_LAB}: 4 of 5 autograded points; written answers: 0 of 1 given by hand, 5 points to be " \
           "graded by hand</h4>" in ada
    assert "Score: 1.5 / 2" in bo and "written answers: 1.5 of 3 given by hand, 3 points to be graded by hand" in bo
    assert '<a href="#test_step">test_step</a> (Score: 4 / 5)' in ada   # no exercise heading in this notebook
    # with the lab's heading before it, a test cell is named by its exercise; a heading of the student's is not
    heading, forged = "## Exercise 1 · One step (5 points)\n\nWrite `step`.", "## Exercise 9 · Forged (9 points)"
    named = html_page(new_notebook(cells=[new_markdown_cell(heading), new_markdown_cell(forged), *cells]),
                      ["graded: 4 of 5 points"], [], [released, heading], resources)
    assert '<a href="#test_step">Exercise 1 · One step</a> (Score: 4 / 5)' in named
    assert '<a href="#test_step">Exercise 9' not in named
    for page in (ada, bo):
        assert "<script>" not in page and "<img src=x" not in page
        assert "My answer to written_why &lt;script&gt;alert(" in page  # shown, as text


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
