"""Covers: the recipe for a new lab.

CONTRIBUTING.md's recipe table ("Every file a new lab touches") against the repository.

- every test the table names exists (its file, and the function where it names one);
- every new or generated path with `NN_slug` or `N` in it exists for every lab of the kind its row names;
- every path without a placeholder names a file that exists (a pattern with `<...>` or `*` at least one);
- every tracked file named for the newest lab (its slug, or `labN`/`_NN` in its name) matches a row,
  so the table lists what the last lab added, and the next lab is held to it.
"""
from __future__ import annotations

import fnmatch
import re
import subprocess

import pytest

from grader.common.labs import find_labs
from helpers import REPO, graded_labs

SECTION = "### Every file a new lab touches"
ROW = re.compile(r"^\| (?P<file>[^|]+?) \| (?P<kind>[^|]+?) \| (?P<labs>[^|]+?) \| (?P<step>[^|]+?) \| "
                 r"(?P<test>[^|]+?) \|$", re.MULTILINE)


def table(text: str) -> list[dict]:
    if SECTION not in text:
        return []
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [match.groupdict() for match in ROW.finditer(section)]
    return [row for row in rows if row["file"] not in ("file", "---")]


def code(cell: str) -> str | None:
    """The text of a cell's first `code span`, or None."""
    match = re.search(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def labs_of(kind: str) -> list:
    """The labs a row's "labs" cell names: every lab, the graded ones, those that train; [] for the rest."""
    if kind == "every lab":
        return find_labs(REPO)
    if kind == "graded":
        return graded_labs()
    if kind == "trains":
        from course_tools.trainings import LABS

        return [lab for lab in find_labs(REPO) if lab.name in LABS]
    return []


def for_lab(pattern: str, lab) -> str:
    return pattern.replace("NN_slug", lab.name).replace("labN", f"lab{int(lab.name[:2])}")


def problems(text: str, tracked: list[str]) -> list[str]:
    """What the table says that the repository does not hold, in words."""
    found = []
    rows = table(text)
    if not rows:
        return [f"CONTRIBUTING.md has no table under {SECTION!r}"]
    patterns = []
    for row in rows:
        test = code(row["test"])
        path, _, function = (test or "").partition("::")
        if not test or not (REPO / path).is_file():
            found.append(f"row {row['file']}: its test {row['test']!r} is no file of tests/")
        elif function and not re.search(rf"^\s*def {re.escape(function)}\(", (REPO / path).read_text(), re.M):
            found.append(f"row {row['file']}: {path} has no test {function}")
        pattern = code(row["file"])
        if pattern is None:
            continue
        patterns.append(pattern)
        if "NN_slug" in pattern or "labN" in pattern:
            for lab in labs_of(row["labs"]):
                if not (REPO / for_lab(pattern, lab)).is_file():
                    found.append(f"row {pattern}: {for_lab(pattern, lab)} does not exist ({row['labs']})")
        elif not any(fnmatch.fnmatch(name, re.sub(r"<[^>]+>", "*", pattern)) for name in tracked):
            found.append(f"row {pattern}: no tracked file is one")
    newest = find_labs(REPO)[-1]
    named = re.compile(rf"{re.escape(newest.name)}|(^|/)test_lab{int(newest.name[:2])}_|_{newest.name[:2]}[._]")
    for name in tracked:
        if named.search(name) and not any(fnmatch.fnmatch(name, re.sub(r"<[^>]+>", "*", for_lab(p, newest)))
                                          for p in patterns):
            found.append(f"{name} is named for {newest.name}, the newest lab, and no row of the table lists it")
    return found


@pytest.fixture(scope="module")
def tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


def test_the_recipe_table_holds_for_every_lab_and_lists_what_the_newest_lab_added(tracked):
    assert not problems((REPO / "CONTRIBUTING.md").read_text(encoding="utf-8"), tracked)


def test_a_missing_file_test_or_row_is_caught_and_named(tracked):
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    newest = find_labs(REPO)[-1].name
    guide = "| `course_guide/NN_slug.md` |"
    broken = (text.replace(guide, "| `course_guide/NN_slug_notes.md` |")
              .replace("`tests/test_release.py::test_labs_match_fresh_release`", "`tests/test_release.py::test_gone`")
              .replace("| `bench/results/*` |", "| `bench/nothing/*` |"))
    said = "\n".join(problems(broken, tracked))
    assert f"course_guide/{newest}_notes.md does not exist" in said
    assert "tests/test_release.py has no test test_gone" in said
    assert "no tracked file is one" in said
    assert f"course_guide/{newest}.md is named for {newest}" in said
    assert problems(text.replace(SECTION, "### Some other table"), tracked) == [
        f"CONTRIBUTING.md has no table under {SECTION!r}"]
