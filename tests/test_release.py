"""Covers: grader.release, grader.common.labs, grader.common.compare.

The student release labs/ is what `python -m grader release` makes of solutions/.

(a) The committed labs/ equals a fresh release of solutions/ (so nobody edits
    labs/ by hand or forgets to regenerate it), and the two trees pair up.
(b) The release pipeline itself, on a tiny throwaway course in a temp dir.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from grader import GraderError
from grader.common.compare import compare_releases
from grader.common.labs import DEMO_NOTEBOOK, find_labs, ignore_patterns, lab_notebooks
from grader.release import release
from helpers import REPO

pytestmark = pytest.mark.grading

SOLUTIONS = REPO / "solutions"
LABS = REPO / "labs"


# --------------------------------------------------------------------------
# (a) the committed release is up to date
# --------------------------------------------------------------------------


def test_labs_match_fresh_release(tmp_path):
    fresh = tmp_path / "labs"
    release(root=REPO, dest=fresh, quiet=True)
    # Nothing in nbgrader's output is volatile (cell ids are checked up front),
    # so notebooks are compared as parsed JSON with no field ignored; only
    # local litter such as .ipynb_checkpoints/ is skipped.
    problems = compare_releases(fresh, LABS, ignore_patterns(REPO))
    assert not problems, (
        "labs/ differs from a fresh release of solutions/ (missing = not in labs/, "
        "extra = only in labs/); run `make release` (it rewrites labs/, so any work "
        "done in labs/ itself is lost):\n  " + "\n  ".join(problems)
    )


def test_git_marks_the_generated_trees_generated_and_the_sources_not():
    """.gitattributes: the release, the stored reference values and the benchmarks' results are generated
    (GitHub folds their diffs); the notebooks they come from are sources."""
    tracked = subprocess.run(["git", "ls-files", "labs", "grader/reference", "bench/results", "solutions"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    attributes = subprocess.run(["git", "check-attr", "linguist-generated", "--", *tracked],
                                cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines()
    generated = {line.split(": ")[0] for line in attributes if line.endswith(": true")}
    assert {path for path in tracked if not path.startswith("solutions/")} <= generated
    assert not {path for path in tracked if path.startswith("solutions/")} & generated
    assert any(path.startswith("labs/") for path in generated)


def test_labs_and_solutions_pair_up():
    sources = {p.relative_to(SOLUTIONS) for p in lab_notebooks(SOLUTIONS)}
    released = {p.relative_to(LABS) for p in lab_notebooks(LABS)}
    assert sources, "no solutions/<lab>/<lab>.ipynb found"
    # solutions/demo.ipynb is the live demo (`make demo`), not a lab: never released
    assert (SOLUTIONS / DEMO_NOTEBOOK).is_file(), f"solutions/{DEMO_NOTEBOOK}: the live demo is missing"
    assert not list(LABS.rglob("demo*")), "the live demo is not a lab: nothing of it belongs in labs/"
    assert (LABS / "index.ipynb").is_file(), "labs/index.ipynb is missing; run `make release`"
    no_source = sorted(str(p) for p in released - sources)
    no_release = sorted(str(p) for p in sources - released)
    assert not no_source, f"notebooks in labs/ without a source in solutions/: {no_source}"
    assert not no_release, f"notebooks in solutions/ not released to labs/: {no_release}; run `make release`"


EXERCISE_HEADING = re.compile(r"^## Exercise (\d+) · .*\((\d+) points?\)$", re.MULTILINE)


@pytest.mark.parametrize("lab", [lab for lab in find_labs(REPO) if lab.points], ids=lambda lab: lab.name)
def test_every_written_answer_has_a_rubric_worth_its_points_with_the_wrong_answers_it_meets(lab):
    """A question graded by hand: its model answer ends with `**Rubric (N points).**`, N the cell's points,
    and names the common wrong answers, so that every grader gives the same points for the same answer."""
    nb = nbformat.read(lab.notebook, as_version=4)
    written = [cell for cell in nb.cells if cell.cell_type == "markdown"
               and cell.metadata.get("nbgrader", {}).get("solution")]
    for cell in written:
        points, grade_id = cell.metadata.nbgrader["points"], cell.metadata.nbgrader["grade_id"]
        rubric = re.search(r"\*\*Rubric \((\d+) points?\)\.\*\*", cell.source)
        assert rubric, f"{lab.name}/{grade_id}: no **Rubric ({points:g} points).** in its model answer"
        assert float(rubric.group(1)) == points, f"{lab.name}/{grade_id}: a rubric of {rubric.group(1)} points"
        assert "wrong answer" in cell.source[rubric.start():].lower(), \
            f"{lab.name}/{grade_id}: its rubric names no common wrong answer"


QUESTION_HEADING = re.compile(r"\*\*Question (\d+)\*\* \((\d+) points?, graded by hand\)")


@pytest.mark.parametrize("lab", [lab for lab in find_labs(REPO) if lab.written], ids=lambda lab: lab.name)
def test_each_written_question_is_numbered_on_with_the_points_of_its_answer(lab):
    """What a student reads before a written answer, in the release: its locked question cell, "**Question N**
    (P points, graded by hand)", N = 1, 2, ... in order through the lab, P the answer cell's points."""
    cells = nbformat.read(LABS / lab.name / f"{lab.name}.ipynb", as_version=4).cells
    asked = []
    for index, cell in enumerate(cells):
        grading = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown" and grading.get("solution") and grading.get("grade"):
            question = cells[index - 1]
            found = QUESTION_HEADING.findall(question.source)
            assert question.metadata.get("nbgrader", {}).get("locked") and len(found) == 1, (
                f"{lab.name}/{grading['grade_id']}: the cell before it is not one locked question cell "
                f"with one **Question N** (P points, graded by hand): {found}")
            asked.append((int(found[0][0]), int(found[0][1]), int(grading["points"]), grading["grade_id"]))
    assert [n for n, *_ in asked] == list(range(1, len(asked) + 1)), f"{lab.name}: questions numbered {asked}"
    wrong = [(n, says, has, gid) for n, says, has, gid in asked if says != has]
    assert not wrong, f"{lab.name}: questions whose points differ from their answer cells': {wrong}"


@pytest.mark.parametrize("lab", [lab for lab in find_labs(REPO) if lab.points], ids=lambda lab: lab.name)
def test_each_exercise_s_heading_gives_the_points_of_its_test_cell(lab):
    # what a student sees next to each exercise, in the release: "## Exercise 2 · ... (3 points)", the
    # points of the graded test cells up to the next exercise (one, or one per part), numbered 1, 2, ...
    cells = nbformat.read(LABS / lab.name / f"{lab.name}.ipynb", as_version=4).cells
    exercises = []   # [number, points stated, [test cells], points of those]
    for cell in cells:
        if cell.cell_type == "markdown":
            found = EXERCISE_HEADING.findall(cell.source)
            assert len(found) <= 1, f"{lab.name}: two exercise headings in one cell: {found}"
            exercises += [[int(found[0][0]), int(found[0][1]), [], 0]] if found else []
        grading = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and grading.get("grade"):
            assert exercises, f"{lab.name}: test cell {grading['grade_id']} comes before any exercise heading"
            exercises[-1][2].append(grading["grade_id"])
            exercises[-1][3] += grading["points"]
    assert [number for number, *_ in exercises] == list(range(1, len(exercises) + 1)), exercises
    assert all(tests for _, _, tests, _ in exercises), f"{lab.name}: an exercise without a test cell: {exercises}"
    wrong = [(number, says, tests, has) for number, says, tests, has in exercises if says != has]
    assert not wrong, f"{lab.name}: exercise headings whose points differ from their test cells': {wrong}"


# --------------------------------------------------------------------------
# (b) the pipeline, on a throwaway course
# --------------------------------------------------------------------------

SOLUTION_SRC = "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"
TEST_SRC = "assert add(1, 2) == 3\n### BEGIN HIDDEN TESTS\nassert add(20, 22) == 42\n### END HIDDEN TESTS"
# nbgrader's stub, its raise naming the function (grader/common/stubs.py)
STUB = ("def add(a, b):\n    # YOUR CODE HERE\n"
        '    raise NotImplementedError("add is yours to write: replace these two lines with your code")')
# A written question (common to every lab): a locked question, then a markdown answer graded by hand.
QUESTION_SRC = "**Question 1** (3 points, graded by hand) · Why?"
WRITTEN_SRC = ("### BEGIN SOLUTION\n**Model answer.** Because.\n\n**Rubric (3 points).** 3 for because.\n"
               "### END SOLUTION")

# Created in this (non-sorted) order; the index must list them sorted.
TINY_LABS = {
    "02_data_parallel": "Lab 2: Data parallel",
    "00_ranks": "Lab 0: Ranks",
    "01_single_gpu": "Lab 1: A single GPU",
}


def _nbgrader(**kw) -> dict:
    meta = {"grade": False, "locked": False, "schema_version": 3, "solution": False, "task": False}
    meta.update(kw)
    return {"nbgrader": meta}


def lab_notebook(title: str) -> nbformat.NotebookNode:
    solution = new_code_cell(SOLUTION_SRC, metadata=_nbgrader(solution=True, grade_id="add"))
    solution.execution_count = 1  # an executed source: the release must clear this
    solution.outputs = [nbformat.v4.new_output("stream", name="stdout", text="instructor output\n")]
    tests = new_code_cell(TEST_SRC, metadata=_nbgrader(grade=True, locked=True, points=2, grade_id="test_add"))
    question = new_markdown_cell(QUESTION_SRC, metadata=_nbgrader(locked=True, grade_id="why_question"))
    written = new_markdown_cell(WRITTEN_SRC, metadata=_nbgrader(grade=True, solution=True, points=3,
                                                               grade_id="written_why"))
    nb = new_notebook(
        cells=[new_markdown_cell(f"Some preamble.\n\n# {title}\n\nIntro."), solution, tests, question, written],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"  # fixed ids, like a notebook saved by JupyterLab
    return nb


def make_course(root: Path, labs: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    for name, title in labs.items():
        (root / "solutions" / name).mkdir(parents=True)
        nbformat.write(lab_notebook(title), root / "solutions" / name / f"{name}.ipynb")
    return root


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A released tiny course (released once: nbgrader takes ~2 s per lab)."""
    root = make_course(tmp_path_factory.mktemp("course"), TINY_LABS)
    (root / "solutions" / "01_single_gpu" / "data").mkdir()
    (root / "solutions" / "01_single_gpu" / "data" / "points.csv").write_text("x,y\n1,2\n")
    (root / "solutions" / "01_single_gpu" / "__pycache__").mkdir()
    (root / "solutions" / "01_single_gpu" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    release(root=root, quiet=True)
    return root


def released_cells(course: Path, lab: str = "00_ranks") -> list:
    return nbformat.read(course / "labs" / lab / f"{lab}.ipynb", as_version=4).cells


def test_solution_region_replaced_by_stub(course):
    cells = released_cells(course)
    assert cells[1].source == STUB
    text = (course / "labs" / "00_ranks" / "00_ranks.ipynb").read_text()
    assert "return a + b" not in text and "BEGIN SOLUTION" not in text


def test_a_written_answer_is_released_blank_and_known_to_the_gradebook_as_graded_by_hand(course):
    from nbgrader.api import Gradebook

    from grader.common.labs import find_labs
    cells = released_cells(course)
    assert cells[3].source == QUESTION_SRC and cells[3].metadata.get("editable") is False
    assert cells[4].source == "YOUR ANSWER HERE" and cells[4].metadata.nbgrader["points"] == 3
    text = (course / "labs" / "00_ranks" / "00_ranks.ipynb").read_text()
    assert "Model answer" not in text and "Rubric" not in text
    lab = next(lab for lab in find_labs(course) if lab.name == "00_ranks")
    assert (lab.points, lab.written) == ({"test_add": 2.0}, {"written_why": 3.0})  # the autograded maximum stays 2
    with Gradebook(f"sqlite:///{course / 'grader' / 'work' / 'gradebook.db'}", "multi-gpu-course") as gb:
        cell = gb.find_grade_cell("written_why", "00_ranks", "00_ranks")
        assert (cell.max_score, cell.cell_type) == (3, "markdown")


def test_hidden_tests_removed(course):
    cells = released_cells(course)
    assert cells[2].source.strip() == "assert add(1, 2) == 3"
    text = (course / "labs" / "00_ranks" / "00_ranks.ipynb").read_text()
    assert "add(20, 22)" not in text and "HIDDEN TESTS" not in text


def test_outputs_cleared_and_test_cells_locked(course):
    cells = released_cells(course)
    assert cells[1].outputs == [] and cells[1].execution_count is None
    assert cells[2].metadata.get("editable") is False and cells[2].metadata.get("deletable") is False


def test_other_files_copied_but_not_litter(course):
    lab = course / "labs" / "01_single_gpu"
    assert (lab / "data" / "points.csv").read_text() == "x,y\n1,2\n"
    assert not (lab / "__pycache__").exists()


def test_index_lists_labs_in_order_with_titles(course):
    index = nbformat.read(course / "labs" / "index.ipynb", as_version=4)
    nbformat.validate(index)
    assert index.nbformat == 4
    assert index.metadata.kernelspec.name == "python3"
    assert {c.cell_type for c in index.cells} == {"markdown"}
    text = "\n".join(c.source for c in index.cells)
    assert text.lstrip().startswith("# ")
    links = re.findall(r"\[([^\]]+)\]\(([^)]+)\)", text)
    expected = [(TINY_LABS[n], f"{n}/{n}.ipynb") for n in sorted(TINY_LABS)]
    assert links == expected
    for _, target in links:
        assert (course / "labs" / target).is_file()


def test_gradebook_records_release(course):
    # nbgrader autograde needs the graded cells of each lab in the gradebook.
    from nbgrader.api import Gradebook

    db = course / "grader" / "work" / "gradebook.db"
    with Gradebook(f"sqlite:///{db}", "multi-gpu-course") as gb:
        assert sorted(a.name for a in gb.assignments) == sorted(TINY_LABS)
        assert gb.find_grade_cell("test_add", "00_ranks", "00_ranks").max_score == 2


def test_release_is_deterministic_and_leaves_gradebook_alone(course, tmp_path):
    db = course / "grader" / "work" / "gradebook.db"
    db_before = db.read_bytes()
    again = tmp_path / "labs"
    release(root=course, dest=again, quiet=True)
    assert compare_releases(course / "labs", again) == []
    for p in (course / "labs").rglob("*"):  # byte for byte, not only as JSON
        if p.is_file():
            assert p.read_bytes() == (again / p.relative_to(course / "labs")).read_bytes(), p
    assert db.read_bytes() == db_before, "a release with dest= must not touch the course gradebook"


def test_compare_releases_reports_changes(course, tmp_path):
    copy = tmp_path / "labs"
    shutil.copytree(course / "labs", copy)
    nb = json.loads((copy / "00_ranks" / "00_ranks.ipynb").read_text())
    nb["cells"][1]["source"] = ["def add(a, b):\n", "    return a + b"]
    (copy / "00_ranks" / "00_ranks.ipynb").write_text(json.dumps(nb))  # also reformatted
    (copy / "01_single_gpu" / "data" / "points.csv").unlink()
    (copy / "02_data_parallel" / "stray.txt").write_text("hand-made")
    (copy / "00_ranks" / ".ipynb_checkpoints").mkdir()
    (copy / "00_ranks" / ".ipynb_checkpoints" / "x.ipynb").write_text("{}")
    problems = compare_releases(course / "labs", copy, ignore_patterns(course))
    assert problems == [
        "missing: 01_single_gpu/data/points.csv",
        "extra: 02_data_parallel/stray.txt",
        "differs: 00_ranks/00_ranks.ipynb (first at cells[1].source[1])",
    ]


# --- malformed labs fail, naming the file ------------------------------------


@pytest.fixture
def small_course(tmp_path) -> Path:
    return make_course(tmp_path / "course", {"00_ranks": "Lab 0: Ranks"})


def test_lab_folder_without_notebook(small_course):
    (small_course / "solutions" / "03_x").mkdir()
    with pytest.raises(GraderError, match=re.escape("solutions/03_x/03_x.ipynb")):
        release(root=small_course, quiet=True)
    assert not (small_course / "labs").exists()


def test_the_demo_notebook_is_skipped_and_other_stray_notebooks_still_fail(small_course):
    # not a lab: no folder of its own, no nbgrader metadata, nothing graded
    nbformat.write(new_notebook(cells=[new_markdown_cell("# The live demo"), new_code_cell("1 + 1")]),
                   small_course / "solutions" / DEMO_NOTEBOOK)
    assert [lab.name for lab in find_labs(small_course)] == ["00_ranks"]
    release(root=small_course, quiet=True)
    assert sorted(p.name for p in (small_course / "labs").iterdir()) == ["00_ranks", "index.ipynb"]
    assert "demo" not in (small_course / "labs" / "index.ipynb").read_text().lower()
    stray = small_course / "solutions" / "demo_2.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("1 + 1")]), stray)
    with pytest.raises(GraderError, match=re.escape("solutions/demo_2.ipynb: notebooks belong in a lab folder")):
        find_labs(small_course)


def test_jupyterlab_checkpoints_are_neither_labs_nor_released(small_course):
    # `make demo` and `make lab` open the notebooks in JupyterLab, which saves copies beside them
    demo = new_notebook(cells=[new_markdown_cell("# The live demo"), new_code_cell("1 + 1")])
    for folder in (small_course / "solutions", small_course / "solutions" / "00_ranks"):
        (folder / ".ipynb_checkpoints").mkdir()
        nbformat.write(demo, folder / ".ipynb_checkpoints" / "demo-checkpoint.ipynb")
    assert [p.relative_to(small_course).as_posix() for p in lab_notebooks(small_course / "solutions")] == [
        "solutions/00_ranks/00_ranks.ipynb"]
    assert [lab.name for lab in find_labs(small_course)] == ["00_ranks"]
    release(root=small_course, quiet=True)
    assert not list((small_course / "labs").rglob(".ipynb_checkpoints"))
    (small_course / "labs" / ".ipynb_checkpoints").mkdir()
    nbformat.write(demo, small_course / "labs" / ".ipynb_checkpoints" / "index-checkpoint.ipynb")
    assert [p.relative_to(small_course).as_posix() for p in lab_notebooks(small_course / "labs")] == [
        "labs/00_ranks/00_ranks.ipynb"]


def test_notebook_not_json(small_course):
    (small_course / "solutions" / "03_x").mkdir()
    (small_course / "solutions" / "03_x" / "03_x.ipynb").write_text('{"cells": [')
    with pytest.raises(GraderError, match=r"solutions/03_x/03_x\.ipynb: not valid JSON"):
        release(root=small_course, quiet=True)


def test_duplicate_cell_ids_rejected(small_course):
    # nbformat would silently replace the duplicate by a random id: the
    # release would then differ on every run.
    path = small_course / "solutions" / "00_ranks" / "00_ranks.ipynb"
    nb = json.loads(path.read_text())
    nb["cells"][2]["id"] = nb["cells"][1]["id"]
    path.write_text(json.dumps(nb))
    with pytest.raises(GraderError, match=r"00_ranks\.ipynb: cells 1 and 2 have the same id"):
        release(root=small_course, quiet=True)


def test_nbgrader_error_names_lab_and_changes_nothing(small_course):
    release(root=small_course, quiet=True)
    before = (small_course / "labs" / "00_ranks" / "00_ranks.ipynb").read_bytes()
    path = small_course / "solutions" / "00_ranks" / "00_ranks.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].metadata = {}  # a solution region outside a solution cell
    nbformat.write(nb, path)
    with pytest.raises(GraderError, match=r"solutions/00_ranks/00_ranks\.ipynb") as err:
        release(root=small_course, quiet=True)
    assert "Solution region detected in a non-solution cell" in str(err.value)
    assert (small_course / "labs" / "00_ranks" / "00_ranks.ipynb").read_bytes() == before


def test_cli_exits_nonzero_naming_the_file(small_course):
    (small_course / "solutions" / "03_x").mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "release", "--root", str(small_course)],
        cwd=small_course.parent, env=env, capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert "solutions/03_x/03_x.ipynb" in proc.stderr
