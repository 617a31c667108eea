"""Covers: the docs.

The documentation's links and commands work, and what it says that code decides agrees with the code.

The pages: README.md, docs/*.md, bench/README.md, CONTRIBUTING.md and tests/README.md, read as text.
- Every relative link (markdown links and images) names a file or folder that exists; an anchor
  (`page.md#heading`, `#heading`) names a heading of its page, slugged as GitHub slugs it.
- Every `make TARGET` written as code (a code span, a fenced or an indented block) is a target of the
  Makefile.
- Every `python -m grader COMMAND ...` and `python -m course_tools COMMAND ...` written as code
  (also after torchrun) names a command of that package's parser, and its `--options` are options
  of that command (of the lab's parser, for `course_tools run LAB`). A command's old name
  (`grader run`, forwarding to `course_tools run` for one term: grader.__main__.MOVED) is checked
  as the new one while it forwards, and fails once the forward goes.
- README's list of labs is the labs of solutions/ as the grader finds them (grader.common.labs.find_labs),
  in order, each with its notebook's title: a new lab without a line fails.
- tests/README.md's table of tiers names exactly pyproject.toml's markers (`lab` is no tier).
- The suite's time is stated in tests/README.md alone: README.md, docs/ and bench/README.md link it.
"""
from __future__ import annotations

import argparse
import importlib
import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

from grader.common.labs import find_labs
from helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md",
         REPO / "CONTRIBUTING.md", REPO / "tests" / "README.md"]
# Where the suite's time must not be written: the pages that link tests/README.md for it.
LINKING_THE_SUITES_TIME = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]

FENCED = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+((?:[A-Z_]+=\S*\s+)*)([a-z][\w.-]*)")
COMMAND = re.compile(r"-m\s+(grader|course_tools)\b(?:\s+(.*))?$", re.MULTILINE)
MAKE_TARGET = re.compile(r"^([A-Za-z][\w.-]*)\s*:(?!=)", re.MULTILINE)
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def indented_blocks(text: str) -> list[str]:
    """CommonMark's indented code blocks: lines indented 4 or more after a blank line that ends a
    paragraph which is not a list item (there, an indented line continues the item)."""
    blocks, block, lines = [], [], text.split("\n")
    for i, line in enumerate(lines):
        if block and (not line.strip() or line.startswith("    ")):
            block.append(line)
            continue
        if block:
            blocks.append("\n".join(block))
            block = []
        if line.startswith("    ") and line.strip() and i > 0 and not lines[i - 1].strip():
            before = next((previous for previous in reversed(lines[:i]) if previous.strip()), "")
            if not before.startswith((" ", "\t")) and not LIST_ITEM.match(before):
                block.append(line)
    if block:
        blocks.append("\n".join(block))
    return blocks


def without_blocks(text: str) -> str:
    """The page without its fenced and indented code blocks: headings are read from this."""
    text = FENCED.sub("", text)
    for block in indented_blocks(text):
        text = text.replace(block, "")
    return text


def prose(text: str) -> str:
    """The page without any code: links are read from this."""
    return CODE_SPAN.sub("", without_blocks(text))


def code(text: str) -> list[str]:
    """The page's code: fenced and indented blocks, with `\\` continuations joined, and code spans."""
    blocks = [m.group(0) for m in FENCED.finditer(text)] + indented_blocks(text)
    spans = [m.group(0).strip("`") for m in CODE_SPAN.finditer(FENCED.sub("", text))]
    return [re.sub(r"\\\n\s*", " ", block) for block in blocks] + spans


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (no markup) lowercased, punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every heading's anchor on a page; the second heading of one text gets -1, as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(without_blocks(page.read_text(encoding="utf-8"))):
        slug = github_slug(match.group(1))
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return frozenset(found)


def broken_links(page: Path) -> list[str]:
    """What is wrong with each relative link of a page, in words that say what to fix."""
    problems = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            problems.append(f"{rel(page)} links {target!r}, but {path_part} does not exist from {rel(page.parent)}/: "
                            "fix the path (relative to the page) or create the file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{rel(page)} links {target!r}, but {rel(linked)} has no heading with anchor "
                            f"#{anchor}; its anchors are {sorted(anchors(linked))}")
    return problems


def makefile_targets() -> set[str]:
    return set(MAKE_TARGET.findall((REPO / "Makefile").read_text(encoding="utf-8")))


@cache
def command_parsers(package: str) -> dict[str, argparse.ArgumentParser]:
    """{command: its parser} of `python -m package` (grader, course_tools)."""
    build_parser = importlib.import_module(f"{package}.__main__").build_parser
    return dict(next(action.choices for action in build_parser()._actions
                     if isinstance(action, argparse._SubParsersAction)))


@cache
def lab_parsers() -> dict[str, argparse.ArgumentParser]:
    """{lab: its parser} of `python -m course_tools run`."""
    from course_tools.run import parsers

    return parsers()[1]


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def wrong_command(package: str, words: list[str]) -> str | None:
    """Why `-m package` (grader, course_tools) followed by words is not a command it takes, or None."""
    if not words or words[0].startswith("-") or words[0].isupper():   # COMMAND is a placeholder
        return None
    command, rest = words[0], words[1:]
    if package == "grader" and command in importlib.import_module("grader.__main__").MOVED:
        package = "course_tools"    # the old name, forwarding for one term: checked as what it runs
    commands = command_parsers(package)
    if command not in commands:
        return f"`python -m {package}` has no command {command!r} (its commands: {sorted(commands)})"
    parsers = [commands[command]]
    if (package, command) == ("course_tools", "run"):
        labs = lab_parsers()
        lab = next((word for word in rest if not word.startswith("-")), None)
        if lab is not None and lab in labs:
            parsers = [labs[lab]]
        elif lab is not None and not lab.isupper():  # LAB is a placeholder, a lab name is not
            return f"`python -m course_tools run` has no lab {lab!r} (its labs: {sorted(labs)})"
        else:
            parsers = list(labs.values())
    for word in rest:
        option = word.strip("[]").split("=")[0]
        if option.startswith("--") and not any(option in options_of(p) for p in parsers):
            return f"`python -m {package} {command}` has no option {option}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves(page):
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_make_command_is_a_target_of_the_makefile(page):
    targets = makefile_targets()
    written = {m.group(2) for snippet in code(page.read_text(encoding="utf-8")) for m in MAKE.finditer(snippet)}
    unknown = sorted(written - targets)
    assert not unknown, (f"{rel(page)} writes `make {unknown[0]}`, but the Makefile has no such target "
                         f"(unknown: {unknown}; its targets: {sorted(targets)}): fix the page or add the target")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_grader_or_course_tools_command_is_one_they_take(page):
    problems = []
    for snippet in code(page.read_text(encoding="utf-8")):
        for match in COMMAND.finditer(snippet):
            package, written = match.group(1), match.group(2) or ""
            words = re.split(r"\s+", re.split(r"\s#|[|;&]", written)[0].strip())
            why = wrong_command(package, [word for word in words if word])
            if why:
                problems.append(f"{rel(page)} writes `-m {package} {written}`: {why}")
    assert not problems, "\n".join(problems) + "\nFix the page, or the command's parser if the page is right."


def test_an_unknown_command_lab_or_option_is_caught():
    assert "`python -m grader` has no command 'train'" in wrong_command("grader", ["train", "02_data_parallel"])
    assert "has no lab '09_nothing'" in wrong_command("course_tools", ["run", "09_nothing"])
    assert "has no lab '09_nothing'" in wrong_command("grader", ["run", "09_nothing"])   # forwarding, for a term
    assert wrong_command("course_tools", ["run", "04_hybrid", "--grid", "2x2"]) is None
    assert wrong_command("course_tools", ["run", "02_data_parallel", "--grid"]) == \
        "`python -m course_tools run` has no option --grid"
    assert wrong_command("course_tools", ["site", "--out", "x"]) is None


def readme_labs() -> list[tuple[str, str, str]]:
    """(lab, its link, the rest of its item, continuation lines joined) of each item of README's list
    under "## The labs"."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## The labs\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no section '## The labs': the student's list of labs belongs there"
    items = re.findall(r"^- \[`([^`]+)`\]\(([^)]+)\)(.*(?:\n  .*)*)", section.group(1), re.MULTILINE)
    return [(name, link, " ".join(item.split())) for name, link, item in items]


def test_readme_lists_every_lab_in_order_with_its_title():
    labs = find_labs(REPO)
    listed = readme_labs()
    names = [name for name, _, _ in listed]
    missing = [lab.name for lab in labs if lab.name not in names]
    assert not missing, (f"README.md's list of labs lacks {missing}: add under '## The labs' a line "
                         f"- [`{missing[0]}`](labs/{missing[0]}/{missing[0]}.ipynb), <its title>: <what it builds>.")
    extra = [name for name in names if name not in {lab.name for lab in labs}]
    assert not extra, f"README.md lists {extra}, which are not labs in solutions/: remove or rename those lines"
    assert names == [lab.name for lab in labs], (f"README.md lists the labs as {names}; put them in the "
                                                 f"course's order, {[lab.name for lab in labs]}")
    for (name, link, line), lab in zip(listed, labs):
        assert link == f"labs/{name}/{name}.ipynb", (f"README.md's line for {name} links {link!r}: link the "
                                                     f"student's notebook, labs/{name}/{name}.ipynb")
        title = lab.title.split(" · ", 1)[-1]
        assert title in line, (f"README.md's line for {name} does not give its title {title!r} (the first "
                               f"heading of {rel(lab.notebook)}): write it after the link")


def test_readmes_opening_names_every_lab():
    # The paragraph a newcomer reads first: it drifted twice, a lab or two behind the course.
    text = (REPO / "README.md").read_text(encoding="utf-8")
    opening = " ".join(text.split("\n\n")[1].split()).lower()
    where = 0
    for lab in find_labs(REPO):
        head = lab.title.split(" · ", 1)[-1].split(":")[0].lower()     # "Long sequences: ..." -> "long sequences"
        assert head in opening, (f"README.md's opening paragraph does not name {lab.name} ({head!r}, its "
                                 f"title's first words): name every lab there, in the course's order")
        assert opening.find(head, where) >= 0, f"README.md's opening names {lab.name} before the lab ahead of it"
        where = opening.find(head, where) + len(head)


def test_the_tiers_of_tests_readme_are_the_markers_of_pyproject():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    markers = {re.split(r"[:(]", line)[0].strip() for line in declared["tool"]["pytest"]["ini_options"]["markers"]}
    tiers = markers - {"lab"}  # pytest.mark.lab says which lab a module is about, not how it runs
    table = (REPO / "tests" / "README.md").read_text(encoding="utf-8")
    in_table = set(re.findall(r"^\|[^|\n]*\|\s*`(\w+)`\s*\|", table, re.MULTILINE))
    assert in_table == tiers, (f"tests/README.md's tier table names the markers {sorted(in_table)}, "
                               f"pyproject.toml declares {sorted(tiers)}: make the table's rows match "
                               f"(missing: {sorted(tiers - in_table)}, not declared: {sorted(in_table - tiers)})")


SUITE_TIME = re.compile(r"(suite|`make test`|make test(?![-\w]))[^\n]*?\b\d+(\.\d+)?\s*(minutes?|min)\b"
                        r"|\b\d+(\.\d+)?\s*(minutes?|min)\b[^\n]*?(suite|make test(?![-\w]))", re.IGNORECASE)


@pytest.mark.parametrize("page", LINKING_THE_SUITES_TIME, ids=rel)
def test_the_suites_time_is_written_in_tests_readme_alone(page):
    lines = [line for line in page.read_text(encoding="utf-8").splitlines() if SUITE_TIME.search(line)]
    assert not lines, (f"{rel(page)} states how long the test suite takes ({lines[0].strip()!r}): "
                       "tests/README.md alone says it; link [tests/README.md] instead")


def test_the_demo_s_run_time_is_one_measured_figure():
    # bench/README.md states it, a citation of the report's demo row (bench/_citations.py holds it to the
    # report); the demo's first cell gives the same figure, and no other page states another (issue 39 found three)
    import json

    import _citations  # bench/_citations.py (the conftest puts bench/ on sys.path)

    bench = REPO / "bench" / "README.md"
    section_starts = bench.read_text(encoding="utf-8").split("### The live demo", 1)[0].count("\n") + 1
    (cited,) = [c for c in _citations.citations(bench) if c.script == "labs.py" and c.figure == "demo headless"]
    assert cited.line > section_starts, "bench/README.md's demo time is not in its section"
    stated = round(float(cited.text.removesuffix(" s")))
    demo = json.loads((REPO / "solutions" / "demo.ipynb").read_text(encoding="utf-8"))
    intro = "".join(demo["cells"][0]["source"])
    assert f"takes {stated} s" in " ".join(intro.split()), f"the demo's first cell does not say {stated} s: {intro}"
    for page in PAGES:   # a run time of Run All (not a limit such as "no demo cell over 30 s") elsewhere
        said = re.findall(r"Run All[^\n.]*?(?:\b\d+(?:\.\d+)? ?s\b|minute)", page.read_text(encoding="utf-8"))
        assert (page.name == "README.md" and page.parent.name == "bench") or not said, (rel(page), said)
