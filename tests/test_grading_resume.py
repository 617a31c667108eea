"""Covers: grader.grade.

Grading again loses nothing and redoes nothing: `python -m grader grade` run
twice grades only what changed, and a run killed half-way resumes without
regrading the students it finished."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell

from grader.jail.uids import kill_until_gone
from helpers import REPO
from helpers.submissions import judge_values, keep_judge_values, released, write

pytestmark = pytest.mark.grading

LAB = "01_single_gpu"


def _grade(folder, work, *extra):
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(folder), "--lab", LAB,
                           "--work", str(work), "--unsafe", *judge_values(), *extra],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout
    keep_judge_values(work)
    return proc.stdout


def _status(work) -> dict:
    path = work / "status.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _rows(work) -> dict:
    with open(work / "grades.csv", newline="") as f:
        return {row["student_id"]: row for row in csv.DictReader(f)}


def _with_tmpdir(tmp: str) -> list[int]:
    """The processes still running with TMPDIR=`tmp`: the killed grader's children in sessions of their own,
    which its process group's kill missed (a kernel's ranks, the judge)."""
    marker, found = f"TMPDIR={tmp}".encode(), []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:         # gone meanwhile, or not ours to read
            continue
    return found


@pytest.mark.timeout(900)
def test_an_interrupted_run_resumes_and_a_second_run_grades_only_what_changed(tmp_path):
    folder, work = tmp_path / "submissions", tmp_path / "work"
    # Unsolved notebooks: what is tested is which submissions are graded again, not their
    # scores, and an unsolved one is graded in seconds (every exercise raises at once).
    for student in ("ann", "ben"):
        write(released(LAB), folder, student, LAB)
    (folder / "cat").mkdir()
    (folder / "cat" / f"{LAB}.ipynb").write_text('{"cells": [')
    # Killed (its whole session, as Ctrl-C or a crash would) once the first student is done. Killed so, it
    # cannot remove its temporary folders (the notebook's, nbgrader's): a TMPDIR of its own, removed here.
    # (Beside the system's, not in tmp_path: the judge's unix socket path has at most 107 bytes.)
    with tempfile.TemporaryDirectory(prefix="killed-grader-") as private_tmp:
        grader = subprocess.Popen([sys.executable, "-m", "grader", "grade", str(folder), "--lab", LAB,
                                   "--work", str(work), "--unsafe", *judge_values()], cwd=REPO,
                                  start_new_session=True, env={**os.environ, "TMPDIR": private_tmp},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while not _status(work) and time.monotonic() < deadline and grader.poll() is None:
            time.sleep(0.2)
        os.killpg(grader.pid, signal.SIGKILL)
        grader.wait()
        # None may write into private_tmp while it is removed: killed, and waited for until gone.
        left = kill_until_gone(lambda: _with_tmpdir(private_tmp), wait_s=60)
        assert not left, f"processes of the killed grader still run after a minute: {left}"
    keep_judge_values(work)
    finished = _status(work)
    assert len([lab for labs in finished.values() for lab in labs]) == 1, finished
    (first,) = finished

    log = _grade(folder, work)
    assert "1 submissions unchanged" in log, log
    resumed = _status(work)
    assert resumed[first] == finished[first], "the student graded before the interruption was graded again"
    rows = _rows(work)
    assert sorted(rows) == ["ann", "ben", "cat"]
    assert [rows[s][f"{LAB} graded"] for s in ("ann", "ben", "cat")] == ["yes", "yes", "no"]
    grades = (work / "grades.csv").read_bytes()

    log = _grade(folder, work)
    assert "3 submissions unchanged" in log, log
    assert _status(work) == resumed and (work / "grades.csv").read_bytes() == grades

    nb = nbformat.read(folder / "ben" / f"{LAB}.ipynb", as_version=4)
    nb.cells.append(new_markdown_cell("A note added after grading."))
    nbformat.write(nb, folder / "ben" / f"{LAB}.ipynb")
    log = _grade(folder, work)
    assert "2 submissions unchanged" in log and "ben" in log and "ann 01" not in log, log
    assert _status(work)["ann"] == resumed["ann"] and _status(work)["ben"] != resumed["ben"]
    assert _rows(work) == rows
