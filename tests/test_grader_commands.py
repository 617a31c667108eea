"""Covers: grader.reference, grader.grade, grader.__main__, grader.grading.gradebook.

What an instructor types, its parts tested alone: `reference` compares stored values with fresh
ones, checks a solution's tagged cells before executing it, and names a solution that fails while
recording in one line with what to do; `grade` records each lab before its students are graded
(several at once), stops on a failed recording, and reports in the CSV the labs handed in unless
named or asked for the whole term. Stand-ins (`_Stand`) play the jailed parts of a grading run.

The whole round trip is tests/test_grading_round_trip.py; `judge_values`, `release`, `handout`,
`site` and `run` have test files of their names.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell

from course import grading
from grader import COURSE_ROOT, GraderError, reference
from grader.grading.workspace import gradable_labs
from helpers.notebooks import tagged_cell, write_notebook

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
        tagged_cell(f"import course\nREFERENCE = course.grading.Reference({lab!r})", "setup"),
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


def test_a_solution_that_fails_while_recording_is_named_in_one_line_with_what_to_do(tmp_path):
    from grader.common.labs import Lab

    folder = tmp_path / "solutions" / "09_broken"
    test = new_code_cell("assert False, 'never reached'")
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "test_broken", "points": 1, "solution": False,
                                 "locked": True, "schema_version": 3, "task": False}
    notebook = write_notebook(folder / "09_broken.ipynb", [new_code_cell("x = 1"), new_code_cell(
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

# --------------------------------------------------------------------------
# A grading run's order: each lab's recording, then its students
# --------------------------------------------------------------------------

class _Stand:
    """Stand-ins for a grading run's jailed parts, noting what happened in which order."""

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
            write_notebook(tmp_path / "in" / student / f"{lab}.ipynb")
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
