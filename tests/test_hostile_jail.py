"""Covers: grader.jail, the hostile students.

Attacks on the jail, through a real grading run (SLOW: the shared lab 1 class, helpers.lab1_class).

Students whose notebooks plant symlinks where the grader (root) used to
write, split a memory bomb over several processes, flood the notebook through
display updates and through a huge exception message, and fill their disk.
Nothing outside the jail may change, each gets a plain verdict, and the
graded notebooks stay small.
"""
from __future__ import annotations

import os
import stat

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from grader.jail import bwrap
from helpers import REPO, needs_jail
from helpers.lab1_class import HONEST, LAB, MEMORY_GB, TEST_TIMEOUT_S
from helpers.submissions import solved

pytestmark = [pytest.mark.grading, needs_jail()]


def _with_cells(*sources):
    nb = solved(LAB)
    setup = next(i for i, c in enumerate(nb.cells) if "REFERENCE = course.grading.Reference" in c.source)
    nb.cells[setup + 1:setup + 1] = [new_code_cell(s) for s in sources]
    return nb


def _symlinker(targets: dict[str, str], work) -> str:
    """A cell that puts links to the targets everywhere the grader used to look."""
    return (
        "import os, glob\n"
        f"targets = {targets!r}\n"
        f"places = [os.getcwd(), {str(work / 'autograded' / 'symlinks' / LAB)!r}] + glob.glob('/tmp/grader-*/kernel')\n"
        "for place in places:\n"
        "    for name, target in targets.items():\n"
        "        for link in (os.path.join(place, name), os.path.join(place, 'kernel.json')):\n"
        "            try:\n"
        "                os.remove(link)\n"
        "            except OSError:\n"
        "                pass\n"
        "            try:\n"
        "                os.symlink(target, link)\n"
        "            except OSError as e:\n"
        "                print('refused', link, e)\n"
        "print(os.getcwd(), os.listdir('.'))")


# What the symlinks point at, and each one's mode and bytes before grading: lab1_students fills it.
_VICTIMS: dict = {}


def lab1_students(tmp, work) -> dict:
    """This module's students in the shared lab 1 class (helpers.lab1_class), beside its honest one."""
    root_only = tmp / "root_only.txt"
    root_only.write_text("secret")
    os.chmod(root_only, 0o600)
    victim = {"root_only": str(root_only), "solution": str(REPO / "solutions" / LAB / f"{LAB}.ipynb"),
              "other": str(work / "submitted" / HONEST / LAB / f"{LAB}.ipynb"),
              "gradebook": str(work / "gradebook.db")}
    # The notebook's own name, and each target under its own name, in every place the jail might reach.
    targets = {f"{LAB}.ipynb": victim["root_only"], **{f"{k}.link": v for k, v in victim.items()}}
    _VICTIMS.update(victim=victim,
                    before={k: (os.stat(v).st_mode, open(v, "rb").read()) for k, v in victim.items()
                            if os.path.exists(v)})
    return {
        "symlinks": _with_cells(_symlinker(targets, work)),
        "memory_split": _with_cells(
            "import subprocess, sys\n"
            f"hold = 'x = bytearray({int(MEMORY_GB * 0.6 * 1024)} << 20)\\nfor i in range(0, len(x), 4096): x[i] = 1\\n"
            "import time; time.sleep(5)'\n"
            "children = [subprocess.Popen([sys.executable, '-c', hold]) for _ in range(3)]\n"
            "print([c.wait() for c in children])"),
        "display_flood": _with_cells(
            "from IPython.display import display, update_display\n"
            "for _ in range(50):\n"
            "    display({'text/plain': 'x'}, display_id='d', raw=True)\n"
            "for _ in range(20):\n"
            "    update_display({'text/plain': 'y' * (2 << 20)}, display_id='d', raw=True)"),
        "huge_error": _with_cells("raise ValueError('z' * (50 << 20))"),
        # Files under the 256 MiB a file, 2 GB in all: the working folder's size is what stops it.
        "disk_flood": _with_cells(
            "for part in range(16):\n"
            "    with open(f'big{part}', 'wb') as f:\n"
            "        for _ in range(128):\n"
            "            f.write(b'x' * (1 << 20))"),
    }


@pytest.fixture(scope="module")
def graded(lab1_class):
    return {**lab1_class, **_VICTIMS}


def _verdict(graded, student):
    return graded["csv"][student][f"{LAB} verdict"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_links_the_student_planted_are_never_followed_by_the_grader(graded):
    root_only = graded["victim"]["root_only"]
    assert open(root_only).read() == "secret"
    assert stat.S_IMODE(os.stat(root_only).st_mode) == 0o600, "a root-only file was made readable"
    solution = graded["victim"]["solution"]
    assert (os.stat(solution).st_mode, open(solution, "rb").read()) == graded["before"]["solution"]
    notebook = graded["work"] / "autograded" / "symlinks" / LAB / f"{LAB}.ipynb"
    assert notebook.is_file() and not notebook.is_symlink()
    assert not [p for p in (graded["work"] / "autograded").rglob("*") if p.is_symlink()]
    assert graded["csv"][HONEST][f"{LAB} graded"] == "yes"
    assert graded["csv"]["symlinks"][f"{LAB} graded"] == "yes", _verdict(graded, "symlinks")
    import sqlite3
    db = sqlite3.connect(graded["victim"]["gradebook"])
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_memory_split_over_processes_is_held_to_the_jails_limit(graded):
    assert f"the {MEMORY_GB:g} GiB memory limit of its jail" in _verdict(graded, "memory_split"), graded["log"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("student", ["display_flood", "huge_error"])
def test_display_updates_and_error_messages_count_against_the_output_cap(graded, student):
    notebook = graded["work"] / "autograded" / student / LAB / f"{LAB}.ipynb"
    limits = bwrap.Limits()
    assert notebook.stat().st_size < limits.notebook_output_bytes + (2 << 20), notebook.stat().st_size
    nb = nbformat.read(notebook, as_version=4)
    if student == "huge_error":
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert errors and errors[0]["ename"] == "ValueError", "the error must stay: it fails the cell"
        assert "raised ValueError" in _verdict(graded, student)
    else:
        assert "printed" in _verdict(graded, student), _verdict(graded, student)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_full_disk_stays_in_the_jail(graded):
    assert "No space left on device" in _verdict(graded, "disk_flood"), _verdict(graded, "disk_flood")
    assert graded["csv"]["disk_flood"][f"{LAB} graded"] == "yes"
