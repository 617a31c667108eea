"""Covers: course_tools.handout.

The students' copy of the course (`make handout`, course_tools/handout.py): the release and the
package, how to open them, and no answer.

A lab of the handout runs from it alone (its kernel imports the handout's course/, not the
repository's); the others differ from it only by their exercises, which the release tests
(tests/test_release.py) and the browser (tests/test_browser.py) run.
"""
from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import nbformat
import pytest

from course_tools import handout as handout_command
from grader import GraderError
from grader.common.execute import execute
from grader.common.labs import find_labs
from helpers import REPO, graded_labs
from helpers.submissions import hidden_lines, regions

EXPECTED = {"labs", "course", "pyproject.toml", "Makefile", "README.md", "jupyterlab-overrides.json"}


@pytest.fixture(scope="module")
def handout(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("handout") / "handout"
    written = handout_command.handout(dest, archive=True)
    assert written == [dest, dest.with_suffix(".zip")]
    return dest


def _tracked(folder: str) -> list[str]:
    listed = subprocess.run(["git", "ls-files", folder], cwd=REPO, capture_output=True, text=True, check=True)
    return [line for line in listed.stdout.splitlines() if "__pycache__" not in line]


def test_the_handout_is_the_release_the_package_and_how_to_open_them(handout):
    assert {p.name for p in handout.iterdir()} == EXPECTED
    for folder in ("labs", "course"):
        tracked = _tracked(folder)
        assert tracked, f"git lists nothing in {folder}/"
        copied = sorted(str(p.relative_to(handout)) for p in (handout / folder).rglob("*") if p.is_file())
        assert copied == sorted(tracked), f"{folder}/ in the handout is not the repository's"
        for name in tracked:
            assert (handout / name).read_bytes() == (REPO / name).read_bytes(), name


def test_no_solution_hidden_test_or_stored_value_reaches_the_handout(handout):
    text = {p: p.read_text(encoding="utf-8", errors="replace") for p in handout.rglob("*") if p.is_file()}
    for marker in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS"):
        assert not [p for p, t in text.items() if marker in t], marker
    # JupyterLab's defaults for the course are the one JSON file a handout holds, and they hold no value
    overrides = handout / "jupyterlab-overrides.json"
    assert [p for p in handout.rglob("*.json") if p != overrides] == [], \
        "a stored value (grader/reference/<lab>.json) in the handout"
    assert list(json.loads(overrides.read_text())) == ["@jupyterlab/apputils-extension:notification"]
    for lab in graded_labs():
        released = "\n".join(c.source for c in nbformat.read(handout / "labs" / lab.name / f"{lab.name}.ipynb",
                                                            as_version=4).cells)
        solution = nbformat.read(REPO / "solutions" / lab.name / f"{lab.name}.ipynb", as_version=4)
        # a line of an answer or a hidden test that the rest of the lab does not also have
        open_text = "\n".join(_cut(cell.source) for cell in solution.cells)
        answers = [line.strip() for cell in solution.cells for region in regions(cell.source, "SOLUTION")
                   for line in region.split("\n") if len(line.strip()) > 30 and line.strip() not in open_text]
        hidden = [line for line in hidden_lines(lab.name) if line not in open_text]
        assert answers and hidden, f"{lab.name}: no distinctive line to look for"
        leaked = [line for line in answers + hidden if line in released]
        assert not leaked, f"{lab.name}'s answers or hidden tests in the handout: {leaked[:3]}"


def _cut(source: str) -> str:
    """source without its answers and hidden tests: what a release keeps of it."""
    for kind in ("SOLUTION", "HIDDEN TESTS"):
        for region in regions(source, kind):
            source = source.replace(region, "")
    return source


def test_the_handouts_project_installs_the_package_without_the_grader(handout):
    course = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    project = tomllib.loads((handout / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"] == ["course"]
    assert project["project"]["dependencies"] == [
        r for r in course["dependencies"] if handout_command.requirement_name(r) not in handout_command.GRADER_ONLY]
    assert project["project"]["requires-python"] == course["requires-python"]
    assert handout_command.requirement_name("jupyterlab>=4.2,<5") == "jupyterlab"
    assert handout_command.requirement_name("nbgrader==0.9.6") == "nbgrader"
    # what the handout goes without, nothing in it imports
    code = [p.read_text(encoding="utf-8") for p in (handout / "course").rglob("*.py")]
    code += [c.source for p in (handout / "labs").rglob("*.ipynb") for c in nbformat.read(p, as_version=4).cells
             if c.cell_type == "code"]
    for module in handout_command.GRADER_ONLY:
        assert not [c for c in code if f"import {module}" in c or f"from {module}" in c], module


def test_make_lab_in_the_handout_installs_the_courses_torch_and_opens_the_index(handout):
    def pin(makefile: Path) -> list[str]:
        return [line for line in makefile.read_text().splitlines() if line.startswith("TORCH_PIN :=")]

    assert pin(handout / "Makefile") == pin(REPO / "Makefile") != []
    planned = subprocess.run(["make", "-n", "lab"], cwd=handout, capture_output=True, text=True, check=True).stdout
    assert "pip install -q -e ." in planned
    assert "cp jupyterlab-overrides.json .venv/share/jupyter/lab/settings/overrides.json" in planned  # no news prompt
    assert "--index-url" not in planned
    # a Linux laptop without a GPU: PyTorch's CPU build, not PyPI's with the CUDA libraries
    cpu = subprocess.run(["make", "-n", "lab", "TORCH=cpu"], cwd=handout, capture_output=True, text=True,
                         check=True).stdout
    assert "pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in cpu
    jupyter = next(line for line in planned.splitlines() if "jupyter lab" in line)
    assert f"--ServerApp.root_dir='{handout}'" in jupyter
    assert "--LabApp.default_url=/lab/tree/labs/index.ipynb" in jupyter


def test_the_handout_is_written_only_where_it_belongs(tmp_path):
    for inside in (REPO, REPO / "labs", REPO / "course" / "handout"):
        with pytest.raises(GraderError, match="the course's own folder"):
            handout_command.handout(inside)
    taken = tmp_path / "notes"
    taken.mkdir()
    (taken / "mine.txt").write_text("a student's notes")
    with pytest.raises(GraderError, match="not a handout"):
        handout_command.handout(taken)
    assert (taken / "mine.txt").read_text() == "a student's notes", "a folder that is not a handout is left alone"
    again = tmp_path / "again"
    handout_command.handout(again)
    (again / "labs" / "stale.ipynb").write_text("{}")
    handout_command.handout(again)                        # a handout is replaced whole
    assert not (again / "labs" / "stale.ipynb").exists()


@pytest.mark.notebook
def test_a_lab_runs_from_the_handout_alone(handout):
    [lab] = [lab for lab in find_labs(REPO) if not lab.points][:1]   # runs as released: nothing to write
    path = handout / "labs" / lab.name / f"{lab.name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import course\nprint(course.__file__)"))
    execute(nb, path.parent, timeout=300, env={"PYTHONPATH": str(handout)})
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs).strip()
    assert Path(printed).parent == handout / "course", f"the kernel imported {printed}, not the handout's course/"
