"""Covers: grader.grading.verdict, grader.grading.submission, grader.grading.export, grader.grading.workspace,
grader.common.quoting.

What a grading run says of each submission, in the verdict and the CSV: tests that never ran mean
not graded, errors and tampering in plain words, a long verdict line cut between clauses, only the
labs with graded cells graded, "no submission" exported, written answers pending until graded by hand.

The whole round trip is tests/test_grading_round_trip.py.
"""
from __future__ import annotations

from nbformat.v4 import new_code_cell

from grader import COURSE_ROOT
from grader.common.quoting import quoted
from grader.feedback.page import verdict_html
from grader.grading import export, verdict
from grader.grading.submission import inspect_autograded
from grader.grading.workspace import gradable_labs
from grader.jail.bwrap import Limits
from helpers.notebooks import WRITTEN, WRITTEN_LAB, gradebook_with_written_answers, graded_cell, write_notebook


def test_tests_that_never_ran_mean_not_graded(tmp_path):
    ran = write_notebook(tmp_path / "ran.ipynb", [new_code_cell("x = 1", execution_count=1),
                                             graded_cell("assert x", "test_a", True)])
    assert inspect_autograded(ran) == (True, "")
    died = write_notebook(tmp_path / "died.ipynb", [new_code_cell("x = 1", execution_count=1),
                                               graded_cell("assert x", "test_a", True),
                                               new_code_cell("import os; os._exit(1)"),
                                               graded_cell("assert x", "test_b", False)])
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
# Verdicts
# --------------------------------------------------------------------------

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
    released_nb = {"cells": [graded_cell("assert a", g, False) for g in tests]}
    submitted = {"cells": [graded_cell("assert a", "test_a", False), graded_cell("pass", "test_b", False)]}
    submitted["cells"][0].metadata["tags"] = ["skip-execution"]
    said = verdict.tampering(submitted, released_nb, tests)
    assert said == ["the skip-execution tag on test cell test_a was ignored; the test ran",
                    "test cell test_b was edited; the original was graded instead",
                    "test cell test_c was missing; the original was put back and graded"]
    assert "metadata was removed" in verdict.unmatchable({"cells": [new_code_cell("x")]})
    assert verdict.unmatchable(submitted) is None

# --------------------------------------------------------------------------
# Written answers, graded by hand: pending, not zero
# --------------------------------------------------------------------------

def test_written_answers_are_exported_as_pending_until_graded_by_hand(tmp_path):
    db = gradebook_with_written_answers(tmp_path / "gb.db", {"ada": {}, "bo": {"written_why": 1.5},
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
