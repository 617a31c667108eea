"""Covers: the test map.

Every tests/test_*.py names what it covers, in one form: its docstring opens with "Covers: ",
then modules and promises separated by commas, ending at the first blank line, e.g.

    \"""Covers: grader.jail.bwrap, grader.jail.host.
    \"""Covers: the fairness of lab 3.

- a module is its dotted path from the repository's root (course/launch.py is course.launch,
  bench/sharded.py bench.sharded, tests/helpers/reach.py tests.helpers.reach, a package its folder):
  it must exist;
- a promise is one of PROMISES below, word for word, N standing for a lab's number in solutions/.

And every module of grader/ and course_tools/ is named by some file: the grader's tests mirror its
subsystems (tests/README.md's Layout), module by module. `grep -L '^\"""Covers: ' tests/test_*.py` lists
the files without the line. Files are read as text: no test module is imported.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from helpers import REPO, package_files

#: What a test file may cover besides modules: a promise of the course that no one module keeps,
#: each with what it is.
PROMISES = {
    "the architecture": "imports run one way, each module in one layer (course/ and grader/'s docstrings)",
    "the browser": "the course as a person uses it: every lab run in JupyterLab in headless Chromium",
    "the demo": "the instructor's live demo (solutions/demo.ipynb, `make demo`) runs and fits a projector",
    "the docs": "README.md, docs/ and the other pages: links, commands and what code decides, true",
    "the environment": "pyproject.toml and environment.yml name one set of dependencies; the Makefile's torch",
    "the fairness of lab N": "lab N's tests grade fairly: each mistake costs its own exercise, other answers score",
    "the grading host's privacy": "a grading run leaves nothing for the host's other users to read, write or signal",
    "the hostile students": "submissions that attack the grader, the jail or the judge, graded beside honest ones",
    "the hub": "the classroom on a real JupyterHub (deploy/hub/), each person in their own login",
    "the instructor's guide": "course_guide/: one page per lab, in step with the solution notebooks",
    "the lab server": "`make lab` and `make demo` start JupyterLab on the course",
    "the modules' docstrings": "each course/ module's docstring says where it is used",
    "the recipe for a new lab": "CONTRIBUTING.md's table of every file a new lab touches, against the repository",
    "the notebooks' words": "one name for each thing in the solution notebooks (CONTRIBUTING.md's Words)",
    "one submission never stops the class": "whatever one notebook breaks is its student's verdict alone",
    "the solution of lab N": "lab N's solution trains as a reference (one process, PyTorch's own) does",
    "the solutions": "every solution notebook runs headless and records what grader/reference/ stores",
    "the test map": "every test file names what it covers (this file)",
    "the views": "the contracts every course/*_view.py keeps: bad settings refused, nbgrader, sliders",
}
#: The opening a test file's docstring starts with.
OPENING = '"""Covers: '
MODULE = re.compile(r"[A-Za-z_]\w*(\.\w+)*")
LAB_NUMBER = re.compile(r"\bN\b")


def covered(text: str) -> list[str] | None:
    """What a test file's text says it covers: the items of its Covers paragraph, or None without one."""
    if not text.startswith(OPENING):
        return None
    paragraph = re.split(r'\n[ \t]*\n|"""', text[len(OPENING):], maxsplit=1)[0]
    return [item.strip() for item in " ".join(paragraph.split()).rstrip(".").split(",")]


def is_module(name: str, root: Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def is_promise(item: str, root: Path) -> bool:
    """Whether item is a promise of PROMISES, with a lab of solutions/ for N."""
    labs = {int(p.name[:2]) for p in (root / "solutions").glob("[0-9][0-9]_*") if p.is_dir()}
    for promise in PROMISES:
        pattern = LAB_NUMBER.sub(r"(\\d+)", re.escape(promise))
        found = re.fullmatch(pattern, item)
        if found and all(int(n) in labs for n in found.groups()):
            return True
    return False


def modules(root: Path) -> list[str]:
    """Every module of the instructor's packages, grader/ and course_tools/, by dotted name (a package's
    __init__ holds its docstring only, and is no module of its own here)."""
    return [name for package in ("grader", "course_tools") for name, path in package_files(root, package).items()
            if path.stem != "__init__"]


def problems(tests: Path, root: Path = REPO) -> list[str]:
    """Each test file in `tests` without a Covers line, or covering what is no module or promise; each
    module of grader/ and course_tools/ no file covers. Each says what to write."""
    said, named = [], set()
    for path in sorted(tests.glob("test_*.py")):
        items = covered(path.read_text(encoding="utf-8"))
        if items is None:
            said.append(f"{path.name}: its docstring does not open with what it covers: start it with "
                        f"{OPENING}<modules or promises>. and a blank line (e.g. {OPENING}course.launch.), "
                        "modules by their dotted path from the repository's root")
            continue
        for item in items:
            if MODULE.fullmatch(item):
                if is_module(item, root):
                    named.add(item)
                else:
                    said.append(f"{path.name}: covers {item}, which is no module of the repository: write a module's "
                                "dotted path from the root (course/launch.py is course.launch) or a promise")
            elif not is_promise(item, root):
                said.append(f"{path.name}: covers «{item}», which is no promise of tests/test_test_map.py's "
                            "PROMISES: name a module, write a promise as it is listed, or add yours to PROMISES "
                            "with one line saying what it is")
    for module in modules(root):
        if module not in named:
            said.append(f"{module} is covered by no test file: name it in the Covers line of the test file that "
                        f"tests it (its subsystem's, tests/README.md's Layout), e.g. {OPENING}{module}.")
    return said


def test_every_test_file_names_the_modules_or_promises_it_covers():
    found = problems(REPO / "tests")
    assert not found, "\n".join([*found, "The promises: " + "; ".join(f"«{p}»" for p in PROMISES)])


def test_every_promise_says_what_it_is():
    assert all(what and name == name.strip() and "," not in name for name, what in PROMISES.items())


@pytest.fixture
def copy(tmp_path):
    """The test files, copied: bad inputs are written there."""
    folder = tmp_path / "tests"
    folder.mkdir()
    for path in (REPO / "tests").glob("test_*.py"):
        shutil.copy(path, folder)
    return folder


def test_a_file_without_its_line_an_unknown_module_or_promise_and_an_uncovered_module_are_caught(copy):
    before = set(problems(copy))  # this checkout's own, which the test above reports
    (copy / "test_plain.py").write_text('"""What it tests, but not in the form."""\n')
    (copy / "test_typo.py").write_text('"""Covers: course.lanch, the fairness of lab 99,\nthe weather.\n\nMore.\n"""')
    (copy / "test_ok.py").write_text('"""Covers: course.launch, the fairness of lab 1,\ntests.helpers.reach.\n"""')
    for path in copy.glob("test_*.py"):  # no file names grader.jail.uids any more
        path.write_text(re.sub(r"\bgrader\.jail\.uids\b", "course.launch", path.read_text()))
    found = [line for line in problems(copy) if line not in before]
    assert [line.split(":")[0] for line in found] == ["test_plain.py", "test_typo.py", "test_typo.py",
                                                      "test_typo.py", "grader.jail.uids is covered by no test file"]
    assert f"start it with {OPENING}<modules or promises>. and a blank line" in found[0]
    assert "covers course.lanch, which is no module" in found[1]
    assert "covers «the fairness of lab 99», which is no promise" in found[2]
    assert "covers «the weather», which is no promise" in found[3]
    assert f"e.g. {OPENING}grader.jail.uids." in found[4]


def test_the_covers_paragraph_ends_at_its_blank_line():
    assert covered('"""Covers: course.launch.\n\ncourse.launch from a plain process, results, errors.\n"""') == [
        "course.launch"]
    assert covered('"""Covers: a.b,\n    c.d."""') == ["a.b", "c.d"]
    assert covered('"""course.launch, by hand."""') is None
