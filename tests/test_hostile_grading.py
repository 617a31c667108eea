"""Covers: the hostile students.

The hostile suite: a class of lab 1 submissions that try to break the grader.

One run of `python -m grader grade` (as instructors run it: a zip of the
class, two submissions at a time) grades honest students beside students whose
notebooks deadlock their ranks, loop forever, kill a rank, segfault, eat
memory, start processes by the thousand, tamper with the test cells, strip the
metadata, are not JSON, read the solutions and the reference answers, write
outside their folder, open network connections, print megabytes, or switch
the hidden checks off. Each must end in a plain verdict in the CSV and the
feedback, never a false pass, and the honest students must be graded as if
they were alone.
"""
from __future__ import annotations

import html
import socket
import sqlite3
import subprocess
import threading
import zipfile

import nbformat
import pytest
from nbformat.v4 import new_code_cell
from test_lab1_grading import MISTAKES

from grader.common.labs import graded_cells, read_notebook
from grader.jail.uids import outlived
from helpers import REPO, needs_jail
from helpers.submissions import grade_class, grade_id, released, solved

LAB = "01_single_gpu"
POINTS = graded_cells(read_notebook(REPO / "solutions" / LAB / f"{LAB}.ipynb"))
FULL = sum(POINTS.values())
# Short, since the deadlock and the endless loop run it out, but not tight: lab 1's setup cell
# (torch imported in a fresh kernel) takes 5 s alone and 9 s beside five busy loops; in CI, with
# a heavier test beside this one, a 20 s limit stopped it, and every later test lost its points.
CELL_TIMEOUT_S = 60
MEMORY_GB = 2
MAX_PROCESSES = 128
# The whole-notebook limit of the test that trips it: room for the student graded after the stuck
# one, whose unsolved lab's autograde takes 15 s alone, to finish while other tests load the cores
# (at 40 s, with the fresh nbgrader's imports then counted in its time, it once did not in CI).
NOTEBOOK_LIMIT_S = 50
MOMENTUM_DAMPENED = MISTAKES["momentum dampened"][0]
# Three exercises answered wrongly, each of their test cells tampered with a different way (one
# student: a graded lab 1 costs the suite more than its checks).
THREE_WRONG = {**MOMENTUM_DAMPENED, **MISTAKES["no zero_grad: gradients add up from step to step"][0],
               **MISTAKES["the biases counted too"][0]}

pytestmark = [pytest.mark.grading, needs_jail()]


EITHER = "graded (at most full marks), or not graded"


def _with_cells(*sources, edits=None, unsolved=False):
    """The solved lab (or the release) with hostile cells right after its setup cell (course is imported there)."""
    nb = released(LAB) if unsolved else solved(LAB, edits)
    setup = next(i for i, c in enumerate(nb.cells) if "REFERENCE = course.grading.Reference" in c.source)
    nb.cells[setup + 1:setup + 1] = [new_code_cell(s) for s in sources]
    return nb


def _retagged(nb, gid, *, tag=None, source=None, delete=False):
    for cell in list(nb.cells):
        if grade_id(cell) == gid:
            if delete:
                nb.cells.remove(cell)
            if tag:
                cell.metadata.setdefault("tags", []).append(tag)
            if source is not None:
                cell.source = source
    return nb


def _stripped(nb):
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    return nb


def _class(port: int, work) -> dict:
    """student -> (notebook or raw text, expected score (None: not graded), words its verdict must have)."""
    tampered = solved(LAB, THREE_WRONG)
    _retagged(tampered, "test_momentum_sgd", delete=True)
    _retagged(tampered, "test_train_step", source="print('all good')")
    _retagged(tampered, "test_step_flops", tag="skip-execution")
    three = POINTS["test_momentum_sgd"] + POINTS["test_train_step"] + POINTS["test_step_flops"]
    return {
        "honest": (solved(LAB), FULL, [f"graded: {FULL:g} of {FULL:g} points"]),
        "deadlock": (_with_cells(
            "import torch, torch.distributed as dist\n"
            "def wait_for_each_other():\n"
            "    dist.recv(torch.zeros(1), src=1 - dist.get_rank())   # both receive, nobody sends\n"
            "course.launch(wait_for_each_other, 2, timeout=None)"),
            FULL, [f"ran past the {CELL_TIMEOUT_S} s limit"]),
        # It sleeps rather than spins: the limit stops a cell by the clock, whatever it does, and a spinning
        # one would only take a core from the students and tests beside it for a minute.
        "endless_loop": (_with_cells("import time\nwhile True:\n    time.sleep(0.1)"), FULL,
                         [f"ran past the {CELL_TIMEOUT_S} s limit"]),
        "rank_exits": (_with_cells("import os\ndef leave():\n    os._exit(3)\ncourse.launch(leave, 2)"),
                       FULL, ["raised", "exit"]),
        # A kernel that dies takes the tests after it along: not graded, and why.
        "segfault": (_with_cells("import ctypes\nctypes.string_at(0)"), None,
                     ["not graded: the kernel died while running the notebook"]),
        # These two end in an error in the cell or in the kernel's death, whichever the
        # limit hits first (Python or a C library): either way, the verdict names the limit.
        "memory_bomb": (_with_cells("hog = []\nwhile True:\n    hog.append(bytearray(100 << 20))"), EITHER,
                        # the process's own limit (MemoryError in the cell), or the jail's (killed)
                        ["memory", f"{MEMORY_GB:g} GiB"]),
        "process_burst": (_with_cells("import subprocess\n"
                                      "sleepers = [subprocess.Popen(['sleep', '600']) for _ in range(5000)]"),
                          EITHER, [f"too many processes or threads (the limit is {MAX_PROCESSES})"]),
        # each tampered test cell is graded as released, so each wrong answer costs its points
        "tampers_with_tests": (tampered, FULL - three,
                               ["test cell test_momentum_sgd was missing; the original was put back",
                                "test cell test_train_step was edited; the original was graded",
                                "skip-execution tag on test cell test_step_flops was ignored",
                                "cell test_momentum_sgd failed", "cell test_train_step failed",
                                "cell test_step_flops failed"]),
        "metadata_stripped": (_stripped(solved(LAB)), None,
                              ["not graded: the notebook's grading metadata was removed"]),
        "malformed": ('{"cells": [', None, ["not graded: the file is not valid JSON"]),
        # reads what the jail hides, writes outside its folder, opens connections: each flagged, and
        # the lab, solved, still earns its points
        "trespasses": (_with_cells(
            f"print(open({str(REPO / 'solutions' / LAB / f'{LAB}.ipynb')!r}).read()[:300])",
            f"print(open({str(REPO / 'grader' / 'reference' / f'{LAB}.json')!r}).read()[:300])",
            f"print(open({str(work / 'gradebook.db')!r}, 'rb').read()[:300])",
            f"open({str(REPO / 'course' / 'sneaky.py')!r}, 'w').write('owned = True')",
            f"open({str(work / 'autograded' / 'honest' / LAB / 'sneaky.txt')!r}, 'w').write('hi')",
            "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=5)",
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)"),
            FULL, ["tried to read the course's solutions, reference answers or gradebook",
                   "tried to write outside its own folder", "tried to reach the network"]),
        "floods_output": (_with_cells("for line in range(400_000):\n    print('spam ' * 25)"),
                          # printed N MB in all, or more than the frame cap in one message: both are cut
                          FULL, ["printed", " MB", "; only the first 1024 kB are kept"]),
    }


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    work = tmp / "work"
    server = socket.create_server(("127.0.0.1", 0))   # on the host: the jail must not reach it
    connections = []
    threading.Thread(target=lambda: connections.append(server.accept()), daemon=True).start()
    students = _class(server.getsockname()[1], work)
    archive = tmp / "class.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for student, (nb, _, _) in students.items():
            text = nb if isinstance(nb, str) else nbformat.writes(nb)
            # Inside a top folder, as LMS exports are; half in nbgrader's submitted/ layout.
            name = f"{student}/{LAB}/{LAB}.ipynb" if len(student) % 2 else f"{student}/{LAB}.ipynb"
            zf.writestr(f"class/{name}", text)
    grades, log = grade_class(archive, work, LAB, "--jobs", "2", f"--cell-timeout={CELL_TIMEOUT_S}",
                              f"--memory-gb={MEMORY_GB}", f"--max-processes={MAX_PROCESSES}", "--timeout=300")
    server.close()
    return {"work": work, "students": students, "csv": grades, "log": log, "connections": connections}


CASES = list(_class(0, REPO))


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("student", CASES)
def test_each_case_gets_its_verdict_and_never_a_false_pass(hostile, student):
    _, expected, words = hostile["students"][student]
    row = hostile["csv"][student]
    verdict = row[f"{LAB} verdict"]
    for w in words:
        assert w in verdict, f"{student}: {w!r} not in the verdict {verdict!r}\n{hostile['log']}"
    said = f"{student}: {verdict}"   # the verdict says why, where a score is not the one expected
    if expected is EITHER and row[f"{LAB} graded"] == "yes":  # a hog left in memory may sink later cells
        assert float(row[f"{LAB} score"]) <= FULL, said
    elif expected in (None, EITHER):
        assert (row[f"{LAB} graded"], row[f"{LAB} score"]) == ("no", ""), said
    else:
        assert row[f"{LAB} graded"] == "yes", said
        assert float(row[f"{LAB} score"]) == expected, said
    page = hostile["work"] / "feedback" / student / LAB / f"{LAB}.html"
    text = html.unescape(page.read_text(encoding="utf-8"))
    assert verdict.split("; ")[0] in text, f"{student}'s feedback does not give the verdict"
    assert page.stat().st_size < 5 << 20, f"{student}'s feedback page is {page.stat().st_size >> 20} MB"


def test_nothing_outlives_the_jail(hostile):
    # outlived(): jails of another grading run at the same time (a test beside this one) are not leftovers
    assert outlived() == {}, "a submission's processes outlived it"
    sleepers = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, text=True).stdout.split()
    assert sleepers == [], sleepers


def test_the_course_the_other_students_and_the_network_are_out_of_reach(hostile):
    assert not (REPO / "course" / "sneaky.py").exists()
    assert not (hostile["work"] / "autograded" / "honest" / LAB / "sneaky.txt").exists()
    assert hostile["connections"] == [], "a submission reached a server on the grading machine"


def test_the_gradebook_holds_every_grade_intact(hostile):
    db = sqlite3.connect(hostile["work"] / "gradebook.db")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    from nbgrader.api import Gradebook

    from grader.common.labs import course_config
    course_id = course_config(REPO).CourseDirectory.course_id
    with Gradebook(f"sqlite:///{hostile['work'] / 'gradebook.db'}", course_id=course_id) as gb:
        for student, row in hostile["csv"].items():
            if row[f"{LAB} graded"] == "yes":
                assert gb.find_submission(LAB, student).score == float(row[f"{LAB} score"]), student


@pytest.mark.timeout(900)
def test_a_notebook_past_the_whole_notebook_limit_is_stopped_and_the_next_student_graded(tmp_path):
    # No cell limit trips first: only the per-notebook limit can stop it. It and its child sleep
    # (spinning would only take the cores from the tests beside this one), so killing the notebook
    # must take the child too; the next student gets a fresh nbgrader. Both are unsolved (every
    # exercise raises at once): what is tested is the limit, not the lab.
    stuck = _with_cells("import subprocess, time\nsubprocess.Popen(['sleep', '601'])\nwhile True:\n    time.sleep(1)",
                        unsolved=True)
    folder, work = tmp_path / "class", tmp_path / "work"
    for student, nb in (("a_stuck", stuck), ("b_next", released(LAB))):
        (folder / student).mkdir(parents=True)
        nbformat.write(nb, folder / student / f"{LAB}.ipynb")
    grades, _ = grade_class(folder, work, LAB, "--cell-timeout=600", f"--timeout={NOTEBOOK_LIMIT_S}", timeout=600)
    stopped = grades["a_stuck"]
    assert stopped[f"{LAB} graded"] == "no", stopped
    assert f"ran past the limit of {NOTEBOOK_LIMIT_S} s for one notebook" in stopped[f"{LAB} verdict"], stopped
    following = grades["b_next"]
    assert following[f"{LAB} graded"] == "yes" and float(following[f"{LAB} score"]) == 0, following
    # the release as handed out: nbgrader has no cell to say "has changed" of (collect.place)
    log = (work / "logs" / "b_next" / f"{LAB}.log").read_text()
    assert "has changed" not in log, log
    assert outlived() == {}
    assert subprocess.run(["pgrep", "-f", "sleep 601"], capture_output=True, text=True).stdout == ""
