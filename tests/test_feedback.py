"""Covers: grader.feedback.page, grader.feedback.worker.

The feedback page's contents: hidden tests and their tracebacks cut, written answers nobody graded
yet said to be pending (and escaped); and the feedback worker, a process of its own that reports a
failed render and keeps serving, and is stopped past its time.

What a hostile notebook can do to its page is tests/test_feedback_safety.py's.
"""
from __future__ import annotations

import os

import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from grader import COURSE_ROOT
from grader.feedback.page import HIDDEN_NOTE, HideHiddenTests
from grader.feedback.worker import FeedbackWorker
from helpers.notebooks import WRITTEN, WRITTEN_LAB, gradebook_with_written_answers, graded_cell


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


def test_the_feedback_page_says_pending_for_an_answer_nobody_graded_and_escapes_it(tmp_path):
    from nbformat.v4 import new_markdown_cell

    from grader.feedback.page import html_page
    db = gradebook_with_written_answers(tmp_path / "gb.db", {"ada": {}, "bo": {"written_why": 1.5}})
    released = "YOUR ANSWER HERE"
    cells = [graded_cell("assert True", "test_step", True)]
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

# --------------------------------------------------------------------------
# The feedback worker
# --------------------------------------------------------------------------

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
