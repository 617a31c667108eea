"""Covers: one submission never stops the class, grader.grading.logs.

One submission never stops the class: whatever a step of grading one notebook raises (reading
it, scoring it, the tampering scan, the verdict, its feedback page, merging its grade, its CSV
row), and whatever is wrong with one student's part of the class's zip or folder (a damaged
member, stray notebooks, an id nbgrader cannot use, a folder named like a lab), is that
student's verdict alone: every other student is graded and the CSV is written.

A grading run's orchestration runs for real here (grader.grade, grader.grading.submission's
SubmissionGrader, grader.grading.export's CSV), with stand-ins for nbgrader, the feedback renderer and
the gradebook's database: seconds, not a real grading run (tests/test_hostile_grading.py has those).
"""
from __future__ import annotations

import copy
import csv
import html
import io
import json
import struct
import threading
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from grader import grade as grading_run
from grader.grading import collect, unzip, verdict
from grader.grading import submission as submission_grading
from grader.grading.submission import SubmissionGrader
from grader.grading.workspace import LabInfo, Workspace
from grader.jail.bwrap import Limits
from grader.judge import tampering

LAB = "01_tiny"


def _released() -> dict:
    answer = new_code_cell("def answer():\n    return 42")
    answer.metadata["nbgrader"] = {"grade": False, "grade_id": "answer", "solution": True, "locked": False,
                                   "schema_version": 3, "task": False}
    test = new_code_cell("assert answer() == 42")
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "test_answer", "points": 1, "solution": False,
                                 "locked": True, "schema_version": 3, "task": False}
    return json.loads(nbformat.writes(new_notebook(cells=[new_markdown_cell("# Lab 1: tiny"), answer, test])))


INFO = LabInfo(LAB, {"test_answer": 1.0}, _released(), {}, "v1")


def _handed_in(*extra_cells: str) -> str:
    """The released lab, answered, with the student's own cells after it."""
    nb = copy.deepcopy(INFO.released)
    nb["cells"] += [json.loads(json.dumps(new_code_cell(source))) for source in extra_cells]
    return json.dumps(nb)


# Each student breaks one step; a marker cell tells the stand-ins, where a step has no student to go by.
BREAKS = {
    "s_read": None,      # a real notebook nested too deep for the JSON parser (RecursionError)
    "s_compare": "verdict.tampering",
    "s_scan": "tampering.flags",
    "s_ran": "verdict.execution",
    "s_score": "gradebook.score",
    "s_feedback": "feedback",
    "s_merge": "gradebook.merge",
    "s_export": "export",
    "s_whole": "autograde",  # a failure around nbgrader itself: caught by the run, not the submission grader
    "s_file": "fingerprint",  # its fingerprint cannot be read: graded, and graded again next time
}


def _marked(nb: dict, step: str) -> bool:
    return any(f"# break {step}" in "".join(cell.get("source", "")) for cell in nb.get("cells", []))


class _Class:
    """A grading run of one tiny lab, its jailed parts and gradebook database stood in for."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.tmp, self.work = tmp_path, tmp_path / "work"
        self.merged: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()
        self.said: list[str] = []
        ws, merged, lock = Workspace(self.work), self.merged, self.lock

        class Autograde:
            def __init__(self, *args):
                pass
            start = close = lambda self: None

            def run(self, args, env, log, timeout):
                student = next(a for a in args if a.startswith("--student=")).split("=", 1)[1]
                if student == "s_whole":
                    raise RuntimeError("the autograde worker broke")
                nb = json.loads((ws.submitted / student / LAB / f"{LAB}.ipynb").read_text())
                for number, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
                    cell["execution_count"] = number + 1
                target = ws.autograded / student / LAB / f"{LAB}.ipynb"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(nb))
                Path(log).write_text("autograded\n")
                return 0

        class Feedback:
            def __init__(self, *args):
                pass
            start = close = lambda self: None

            def write(self, autograded, target, db_url, student, lab, lines, **kwargs):
                if student == "s_feedback":
                    raise RuntimeError("the renderer broke")
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                Path(target).write_text("rendered: " + verdict.as_text(lines))

        def private_copy(master, target):
            Path(target).write_text("")
            return target

        def score(path, course_id, lab, student):
            if student == "s_score":
                raise RuntimeError("the gradebook broke")
            return 1.0

        def merge(private, master, course_id, lab, student):
            if student == "s_merge":
                raise RuntimeError("the class gradebook broke")
            with lock:
                merged[(student, lab)] = 1.0

        class Gradebook:  # nbgrader.api.Gradebook, as grader.grading.export reads it
            def __init__(self, *args, **kwargs):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def find_submission(self, lab, student):
                if student == "s_export":
                    raise RuntimeError("a query broke")
                if (student, lab) not in merged:
                    raise grading_run.export.MissingEntry()
                return type("Found", (), {"score": merged[(student, lab)]})()

            def find_submission_notebook(self, notebook, lab, student):  # each exercise's column
                grade = type("Grade", (), {"name": "test_answer", "score": self.find_submission(lab, student).score})
                return type("Found", (), {"grades": [grade()]})()

        real_flags, real_tampering, real_execution = tampering.flags, verdict.tampering, verdict.execution

        def flags(submitted, released):
            if _marked(submitted, "tampering.flags"):
                raise RecursionError("maximum recursion depth exceeded")
            return real_flags(submitted, released)

        def tampering_(submitted, released, tests):
            if _marked(submitted, "verdict.tampering"):
                raise ValueError("a cell the comparison did not expect")
            return real_tampering(submitted, released, tests)

        def execution(autograded, *args):
            if _marked(autograded, "verdict.execution"):
                raise RuntimeError("an output the report did not expect")
            return real_execution(autograded, *args)

        for name, value in {"lab_infos": lambda root, labs=None: {LAB: INFO}, "prepare_gradebook": lambda *args: None,
                            "AutogradeWorker": Autograde, "FeedbackWorker": Feedback}.items():
            monkeypatch.setattr(grading_run, name, value)
        monkeypatch.setattr(grading_run, "jail_unavailable", lambda: "no jail in this test")
        for name, value in {"private_copy": private_copy, "cell_scores": lambda *a: {"test_answer": 1.0},
                            "zero_cells": lambda *a: None, "score": score, "merge": merge}.items():
            monkeypatch.setattr(submission_grading.gradebook, name, value)
        monkeypatch.setattr(submission_grading.tampering, "flags", flags)
        monkeypatch.setattr(submission_grading.verdict, "tampering", tampering_)
        monkeypatch.setattr(submission_grading.verdict, "execution", execution)
        monkeypatch.setattr(grading_run.export, "Gradebook", Gradebook)
        real_fingerprint = grading_run.fingerprint

        def fingerprint(submission, lab):
            if submission.student == "s_file":
                raise PermissionError(13, "Permission denied")
            return real_fingerprint(submission, lab)
        monkeypatch.setattr(grading_run, "fingerprint", fingerprint)

    def grade(self, submissions: Path, jobs: int = 2) -> dict[str, dict]:
        """The CSV's rows, by student."""
        target = grading_run.grade(submissions, work=self.work, jobs=jobs, unsafe=True, say=self.said.append)
        with target.open(newline="", encoding="utf-8") as f:
            return {row["student_id"]: row for row in csv.DictReader(f)}


@pytest.fixture
def a_class(tmp_path, monkeypatch):
    return _Class(tmp_path, monkeypatch)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------
# Grading: each step's failure is one student's verdict
# --------------------------------------------------------------------------

def test_a_step_that_fails_for_one_notebook_is_that_student_s_verdict_and_the_class_is_graded(a_class):
    folder = a_class.tmp / "in"
    for student, step in BREAKS.items():
        _write(folder / student / f"{LAB}.ipynb", _handed_in(f"# break {step}") if step else "")
    _write(folder / "s_read" / f"{LAB}.ipynb", '{"cells": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for student in ("ada", "zoe"):
        _write(folder / student / LAB / f"{LAB}.ipynb", _handed_in("print('my own cell')"))
    rows = a_class.grade(folder)

    assert sorted(rows) == sorted([*BREAKS, "ada", "zoe"])  # everyone has a row: the CSV was written
    said = {student: (row[f"{LAB} graded"], row[f"{LAB} verdict"]) for student, row in rows.items()}
    clean = ("yes", "graded: 1 of 1 points")
    assert said["ada"] == said["zoe"] == said["s_file"] == clean
    assert said["s_read"] == ("no", "not graded: the grader could not read this notebook: RecursionError")
    assert said["s_score"] == ("no", "not graded: the grader could not score this notebook: RuntimeError")
    assert said["s_merge"] == ("no", "not graded: the grader could not merge this notebook's grade into the "
                                     "class gradebook: RuntimeError")
    assert said["s_whole"] == ("no", "not graded: the grader could not grade this notebook: RuntimeError")
    assert said["s_export"] == ("no", "not graded: the grader could not export this student's grades: "
                                      "RuntimeError")
    # What only reports on a grade says it failed, on a verdict that is never a clean one
    # A scan that could not run vouches for nothing: every test cell's points are withheld pending review
    # (this stand-in gradebook's score does not see the cell zeroed; the real one does).
    assert said["s_scan"] == ("yes", "graded: 1 of 1 points; 1 point withheld pending the instructor's review: the "
                                     "grader could not scan this notebook for tampering: RecursionError; to give them "
                                     "back, empty their score boxes in formgrader's Manual Grading; test cell "
                                     "test_answer; the grader could not scan this notebook for tampering: "
                                     "RecursionError; flagged for the instructor to read by hand")
    assert said["s_compare"] == ("yes", "graded: 1 of 1 points; the grader could not compare this notebook's "
                                        "test cells with the lab's: ValueError; flagged for the instructor to "
                                        "compare by hand")
    assert said["s_ran"] == ("yes", "graded: 1 of 1 points; the grader could not report how this notebook's "
                                    "cells ran: RuntimeError")
    assert said["s_feedback"] == ("yes", "graded: 1 of 1 points; no feedback page: the grader could not render "
                                         "the feedback page of this notebook: RuntimeError")
    assert rows["s_merge"][f"{LAB} score"] == "" and rows["ada"]["total score"] == "1.0"

    ws = Workspace(a_class.work)
    for student in BREAKS.keys() - {"s_export", "s_file"}:  # s_export's failure is in the CSV alone
        log = ws.root / "logs" / student / f"{LAB}.errors.log"
        assert "Traceback" in log.read_text(), f"{student}: no traceback for the instructor"
    assert not (ws.root / "logs" / "ada" / f"{LAB}.errors.log").exists()
    # a page for each: the verdict where nothing (or no renderer) could make one
    for student in [*BREAKS, "ada"]:
        page = html.unescape((ws.feedback / student / LAB / f"{LAB}.html").read_text())
        assert said[student][1].split(";")[0] in page or student == "s_export", student
    assert "no feedback page: the grader could not render" in html.unescape(
        (ws.feedback / "s_feedback" / LAB / f"{LAB}.html").read_text())
    status = ws.load_status()
    assert status["s_whole"][LAB]["graded"] is False and status["ada"][LAB]["graded"] is True
    assert "fingerprint" in status["ada"][LAB] and "fingerprint" not in status["s_file"][LAB]


def test_a_notebook_whose_tampering_scan_cannot_run_is_flagged_not_passed(tmp_path, monkeypatch):
    """A 100,000-term chain once raised RecursionError in the scan, and so in the grader. The real scan now
    flags such a cell itself; a scan that raises anyway is flagged by the grader's own step."""
    chain = "x = " + "+".join(["1"] * 100_000)
    submitted = json.loads(_handed_in(chain))
    grader = SubmissionGrader(tmp_path, Workspace(tmp_path / "work"), {LAB: INFO}, Limits(), None, False,
                              threading.Lock(), {}, {}, {}, course_id="course")
    lines = grader._tampering(collect.Submission("eve", LAB, tmp_path / "eve.ipynb"), submitted, INFO)
    assert len(lines) == 1 and lines[0].endswith("is nested too deeply for the scan to read: flagged for the "
                                                 "instructor"), lines

    def raises(*args):
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(tampering, "flags", raises)
    lines = grader._tampering(collect.Submission("eve", LAB, tmp_path / "eve.ipynb"), submitted, INFO)
    assert lines == ["the grader could not scan this notebook for tampering: RecursionError; flagged for "
                     "the instructor to read by hand"]
    assert "RecursionError" in (tmp_path / "work" / "logs" / "eve" / f"{LAB}.errors.log").read_text()


# --------------------------------------------------------------------------
# Collecting: one student's part of the class's zip or folder is that student's problem
# --------------------------------------------------------------------------

def _zip(path: Path, members: dict[str, str], deflated: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text, compress_type=zipfile.ZIP_DEFLATED if name in deflated else zipfile.ZIP_STORED)
    return path


def _damage(path: Path, name: str, how: str) -> None:
    """A member's bytes changed after the zip was written: a bad CRC, or a deflate stream that cannot be read."""
    data = bytearray(path.read_bytes())
    info = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo(name)
    (extra_len,) = struct.unpack_from("<H", data, info.header_offset + 28)
    start = info.header_offset + 30 + len(info.filename.encode()) + extra_len
    if how == "crc":
        data[start + info.compress_size // 2] ^= 1
    else:  # a deflate block of the reserved type
        data[start] = 0x07
    path.write_bytes(bytes(data))


def test_a_class_zip_with_one_student_s_damage_grades_everyone_else(a_class):
    nb = _handed_in()
    members = {"export/ada/01_tiny.ipynb": nb,
               "export/bo/01_tiny/01_tiny.ipynb": nb,
               "export/crc/01_tiny.ipynb": nb,                       # a bad CRC
               "export/cut/01_tiny.ipynb": nb,                       # a deflate stream that cannot be read
               "export/many/01_tiny.ipynb": nb,                      # and 21 stray notebooks
               **{f"export/many/scratch/try{i:02}.ipynb": nb for i in range(21)},
               "export/01_tiny/01_tiny.ipynb": nb,                   # a student folder named like the lab
               "export/newline\n/01_tiny.ipynb": nb,                 # an id nbgrader cannot use
               "export/tab\tid/01_tiny.ipynb": nb,
               "export/-dash/01_tiny.ipynb": nb,
               "export/.dot/01_tiny.ipynb": nb,
               "export/.git/objects/x.ipynb": nb,                    # litter: skipped without a word
               "export/ada/.ipynb_checkpoints/01_tiny-checkpoint.ipynb": nb,
               "__MACOSX/export/ada/._01_tiny.ipynb": "AppleDouble"}
    archive = _zip(a_class.tmp / "class.zip", members, deflated=("export/cut/01_tiny.ipynb",))
    _damage(archive, "export/crc/01_tiny.ipynb", "crc")
    _damage(archive, "export/cut/01_tiny.ipynb", "deflate")
    rows = a_class.grade(archive)

    assert sorted(rows) == ["ada", "bo", "crc", "cut", "many"]
    for student in ("ada", "bo", "many"):
        assert rows[student][f"{LAB} verdict"] == "graded: 1 of 1 points", student
    assert rows["crc"][f"{LAB} verdict"] == ("not graded: the notebook is damaged in the zip and could not be "
                                             "unpacked (Bad CRC-32 for file 'export/crc/01_tiny.ipynb'); ask for it "
                                             "again")
    assert rows["cut"][f"{LAB} verdict"] == ("not graded: the notebook is damaged in the zip and could not be "
                                             "unpacked (Error -3 while decompressing data: invalid block type); "
                                             "ask for it again")
    assert rows["crc"][f"{LAB} graded"] == rows["cut"][f"{LAB} graded"] == "no"
    said = "\n".join(a_class.said)
    assert "skipped crc/01_tiny.ipynb: refused, damaged in the zip (Bad CRC-32" in said
    assert "skipped '01_tiny': a folder named like a lab, not a student id" in said
    assert r"skipped 'newline\n': not a usable student id" in said
    assert r"skipped 'tab\tid': not a usable student id" in said
    assert "skipped '-dash': not a usable student id" in said and "skipped '.dot': not a usable student id" in said
    assert ".git" not in said and "checkpoint" not in said and "MACOSX" not in said
    assert said.count("many/scratch/try") == collect.LISTED_STRAYS
    assert "skipped many/: 16 more notebooks that are no lab to grade, not listed" in said
    unzipped = a_class.work / "unzipped" / "class"
    assert sorted(p.name for p in unzipped.iterdir()) == ["ada", "bo", "many"]  # no folder for a refused id
    assert not (unzipped / "many" / "scratch").exists()  # strays are not even unpacked


def test_a_notebook_too_big_in_the_zip_is_its_student_s_problem(tmp_path, monkeypatch):
    monkeypatch.setattr(unzip, "MAX_NOTEBOOK_BYTES", 100)
    archive = _zip(tmp_path / "class.zip", {"ada/01_tiny.ipynb": "x" * 50, "bo/01_tiny.ipynb": "y" * 500})
    folder, problems = unzip.unpack(archive, tmp_path / "out", [LAB])
    assert [p.relative_to(folder).as_posix() for p in folder.rglob("*.ipynb")] == ["ada/01_tiny.ipynb"]
    (problem,) = problems
    assert isinstance(problem, collect.Problem) and (problem.student, problem.lab) == ("bo", LAB)
    assert problem.startswith("bo/01_tiny.ipynb: refused (") and "a notebook may have at most" in problem


def test_a_folder_of_submissions_refuses_bad_ids_and_lab_named_folders_and_collects_the_rest(tmp_path):
    folder = tmp_path / "class"
    for student in ("ada", "bo", "01_tiny", "newline\n", "tab\tid", "a" * 101, ".dot"):
        _write(folder / student / f"{LAB}.ipynb", "{}")
    _write(folder / ".git" / "x.ipynb", "{}")
    for i in range(21):
        _write(folder / "bo" / f"stray{i:02}.ipynb", "{}")
    found, problems = collect.find(folder, [LAB])
    assert [(s.student, s.lab) for s in found] == [("ada", LAB), ("bo", LAB)]
    text = "\n".join(problems)
    assert "'01_tiny': a folder named like a lab" in text
    assert r"'newline\n': not a usable student id" in text and r"'tab\tid': not a usable" in text
    assert "'.dot': not a usable student id" in text and ".git" not in text
    assert "'" + "a" * 60 + "'…: not a usable student id" in text
    assert text.count("bo/stray") == collect.LISTED_STRAYS and "bo/: 16 more notebooks" in text
    assert "\n" not in "".join(problems) and "\t" not in "".join(problems)  # every name shown escaped


def test_an_unreadable_student_folder_is_that_student_s_problem_and_an_unreadable_class_the_run_s(
        tmp_path, monkeypatch):
    folder = tmp_path / "class"
    for student in ("ada", "bo"):
        _write(folder / student / f"{LAB}.ipynb", "{}")
    real_rglob = Path.rglob

    def rglob(self, pattern):
        if self.name == "bo":
            raise PermissionError(13, "Permission denied")
        return real_rglob(self, pattern)
    monkeypatch.setattr(Path, "rglob", rglob)
    found, problems = collect.find(folder, [LAB])
    assert [s.student for s in found] == ["ada"]
    assert problems == ["bo/: its notebooks could not be listed (Permission denied); not graded"]

    def iterdir(self):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "iterdir", iterdir)
    with pytest.raises(collect.GraderError, match="cannot read the folder of submissions"):
        collect.find(folder, [LAB])
