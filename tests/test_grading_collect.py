"""Covers: grader.grading.collect, grader.grading.unzip.

A grading run's submissions, found and placed: both layouts of a class's folder (or of a zip of
it), what else is there reported, a damaged notebook told from a readable one, a link never read
through, a zip's paths kept inside its folder, and each notebook placed with the lab's own
grading metadata and hidden tests.

The whole round trip is tests/test_grading_round_trip.py.
"""
from __future__ import annotations

import json
import os

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader import COURSE_ROOT, GraderError
from grader.grading import collect, unzip
from grader.grading.workspace import lab_infos
from helpers import graded_labs
from helpers.notebooks import graded_cell, write_notebook

LABS = ["01_single_gpu", "02_data_parallel"]


def _zip(path, members):
    import zipfile
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path

# --------------------------------------------------------------------------
# Finding submissions
# --------------------------------------------------------------------------

def test_find_accepts_both_layouts_and_reports_the_rest(tmp_path):
    write_notebook(tmp_path / "alice" / "01_single_gpu.ipynb")
    write_notebook(tmp_path / "bob" / "02_data_parallel" / "02_data_parallel.ipynb")
    write_notebook(tmp_path / "bob" / ".ipynb_checkpoints" / "01_single_gpu-checkpoint.ipynb")
    write_notebook(tmp_path / "carol" / "scratch.ipynb")
    write_notebook(tmp_path / "carol" / "deep" / "down" / "01_single_gpu.ipynb")
    write_notebook(tmp_path / "bad id!" / "01_single_gpu.ipynb")
    write_notebook(tmp_path / "loose.ipynb")
    found, problems = collect.find(tmp_path, LABS)
    assert [(s.student, s.lab) for s in found] == [("alice", "01_single_gpu"), ("bob", "02_data_parallel")]
    text = "\n".join(problems)
    for culprit in ("carol/scratch.ipynb", "carol/deep/down/01_single_gpu.ipynb", "bad id!", "loose.ipynb"):
        assert culprit in text, f"{culprit} not reported in:\n{text}"
    assert "checkpoint" not in text


def test_find_reports_a_second_copy_and_a_missing_folder(tmp_path):
    write_notebook(tmp_path / "alice" / "01_single_gpu.ipynb")
    write_notebook(tmp_path / "alice" / "01_single_gpu" / "01_single_gpu.ipynb")
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
    assert collect.unreadable(write_notebook(tmp_path / "x.ipynb", [new_code_cell("1")])) is None


def test_find_never_goes_through_a_link_and_says_so_in_the_student_s_verdict(tmp_path):
    """The grader reads submissions as root: a notebook, a lab folder or a student folder that is a link
    (to the instructor's solution, say) is refused with a verdict, never read."""
    elsewhere = tmp_path / "instructor"
    solution = write_notebook(elsewhere / "02_data_parallel" / "02_data_parallel.ipynb")
    write_notebook(elsewhere / "01_single_gpu.ipynb")
    folder = tmp_path / "submissions"
    (folder / "alice").mkdir(parents=True)
    (folder / "alice" / "01_single_gpu.ipynb").symlink_to(solution)
    (folder / "bob").mkdir()
    (folder / "bob" / "02_data_parallel").symlink_to(solution.parent, target_is_directory=True)
    (folder / "carol").symlink_to(elsewhere, target_is_directory=True)
    (folder / "dave").mkdir()
    os.mkfifo(folder / "dave" / "01_single_gpu.ipynb")
    write_notebook(folder / "erin" / "01_single_gpu.ipynb")
    found, problems = collect.find(folder, LABS)
    assert [(s.student, s.lab) for s in found] == [("erin", "01_single_gpu")]
    verdicts = {(p.student, p.lab): p.why for p in problems if isinstance(p, collect.Problem) and p.student}
    assert "is a symbolic link" in verdicts[("alice", "01_single_gpu")]
    assert "02_data_parallel/ handed in is a link" in verdicts[("bob", "02_data_parallel")]
    assert "not a regular file" in verdicts[("dave", "01_single_gpu")]
    assert any(p.startswith("carol/: a link, not a student's folder") for p in problems), problems


def test_a_submitted_notebook_is_never_read_through_a_link(tmp_path):
    target = write_notebook(tmp_path / "solution.ipynb", [new_code_cell("1")])
    link = tmp_path / "x.ipynb"
    link.symlink_to(target)
    assert "a symbolic link, which the grader never reads through" in collect.unreadable(link)
    with pytest.raises(collect.NotebookError, match="symbolic link"):
        collect.parse_notebook(link)
    os.mkfifo(tmp_path / "pipe.ipynb")  # opened without blocking, and refused
    assert "not a regular file" in collect.unreadable(tmp_path / "pipe.ipynb")
    assert collect.parse_notebook(target)["nbformat"] == 4

# --------------------------------------------------------------------------
# Zips of submissions
# --------------------------------------------------------------------------

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
# Placing a submission
# --------------------------------------------------------------------------

def test_placing_a_submission_puts_the_labs_grading_metadata_back(tmp_path):
    """nbgrader trusts a cell's metadata: claims the lab does not make are taken off, in words."""
    answer = new_code_cell("x = 1")
    answer.metadata["nbgrader"] = {"grade": False, "grade_id": "answer", "solution": True, "locked": False}
    released = new_notebook(cells=[answer, graded_cell("assert x == 1", "test_answer", False)])
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
