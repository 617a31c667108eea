"""Covers: the modules' docstrings.

Each course/ module's docstring says where it is used (d2l's back-link), held.

The rule, read from text only (no module is imported, no notebook run):
- A module that a solution notebook names in a code cell has, in its docstring, a paragraph
  "Used in: " listing those notebooks in order: "lab N (NN_slug)" for
  solutions/NN_slug/NN_slug.ipynb, then "the demo (solutions/demo.ipynb)". A notebook names
  course.x when its code says `course.x` (`import course.x`, `from course.x import ...`,
  `course.x.f()`), `from course import x`, or a name the package re-exports from it
  (`course.launch(...)` is course.launch's, `course.device()` course.placement's).
- A module that no notebook names (the launcher's private parts, course._*, and the modules only
  other modules import) has a paragraph "Used by: " listing the course modules that import it,
  `course.a, course.b`, sorted. A reader follows them to their own "Used in".
- course/__init__.py is exempt: every notebook imports the package.

A module that serves every lab of a kind may say so instead of listing them, so that a new lab
edits no docstring it does not change: "Used in: every lab", "Used in: every lab that launches
ranks" or "Used in: every graded lab", followed by ", the demo (solutions/demo.ipynb)" where the
demo names it too. The phrase stands for the labs of its kind, computed from the notebooks (`KINDS`):
a lab launches ranks where a code cell calls `course.launch(` or `lab_ranks(`; a lab is graded where
a cell carries nbgrader's `"grade": true`. The claim is held both ways: every lab of the kind names
the module, and no other lab does (the demo is listed or not, as ever).

Direct use, not transitive: a lab uses what its notebook names, where a student meets it. What
runs underneath (the recorder inside every launch, `sizes` under every view) would list nearly
every lab in nearly every module and tell a reader nothing.

`test_a_wrong_or_missing_line_is_caught` and `test_a_general_phrase_is_held_to_the_labs_of_its_kind`
show each failure on purpose.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = "the demo (solutions/demo.ipynb)"
NAMED = re.compile(r"\bcourse\.(\w+)")                                       # course.x, from course.x import
FROM_COURSE = re.compile(r"^[ \t]*from course import (\([^)]*\)|[^\n]*)", re.M)  # from course import x, y
USED = re.compile(r"^Used (?:in|by): ")
LAUNCHES = re.compile(r"\bcourse\.launch\(|\blab_ranks\(")                       # course.launch(f, 2), lab_ranks()
# {a general phrase: whether a lab is of its kind, from its notebook (cells) and its code cells' source}.
KINDS = {
    "every lab": lambda cells, code: True,
    "every lab that launches ranks": lambda cells, code: bool(LAUNCHES.search(code)),
    "every graded lab": lambda cells, code: any(c.get("metadata", {}).get("nbgrader", {}).get("grade")
                                                for c in cells),
}


def modules(root: Path) -> list[str]:
    """course/'s modules by file name, course/__init__.py left out."""
    return sorted(p.stem for p in (root / "course").glob("*.py") if p.stem != "__init__")


def reexports(root: Path) -> dict[str, str]:
    """{name course/__init__.py imports from a module: that module}: course.device -> placement."""
    tree = ast.parse((root / "course" / "__init__.py").read_text())
    return {alias.asname or alias.name: node.module.removeprefix("course.")
            for node in tree.body if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course.")
            for alias in node.names}


def named_modules(code: str, known: set[str], aliases: dict[str, str]) -> set[str]:
    """The modules of `known` that `code` names (the rule in this file's docstring)."""
    names = set(NAMED.findall(code))
    for group in FROM_COURSE.findall(code):
        group = re.sub(r"#[^\n]*", "", group).strip().strip("()")
        names.update(part.split(" as ")[0].strip() for part in group.split(","))
    return {aliases.get(name, name) for name in names} & known


def notebook_cells(root: Path) -> dict[str, list[dict]]:
    """{'lab N (NN_slug)' or the demo: its cells}, labs in order, the demo last."""
    paths = {f"lab {int(p.stem[:2])} ({p.stem})": p
             for p in sorted((root / "solutions").glob("[0-9][0-9]_*/*.ipynb")) if p.stem == p.parent.name}
    if (root / "solutions" / "demo.ipynb").exists():
        paths[DEMO] = root / "solutions" / "demo.ipynb"
    return {label: json.loads(path.read_text())["cells"] for label, path in paths.items()}


def code_of(cells: list[dict]) -> str:
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")


def notebooks(root: Path) -> dict[str, str]:
    """{'lab N (NN_slug)' or the demo: its code cells' source}, labs in order, the demo last."""
    return {label: code_of(cells) for label, cells in notebook_cells(root).items()}


def kinds(root: Path) -> dict[str, list[str]]:
    """{each general phrase of KINDS: the labs of its kind, in order} (the demo is no lab)."""
    labs = {label: cells for label, cells in notebook_cells(root).items() if label != DEMO}
    return {phrase: [label for label, cells in labs.items() if of_kind(cells, code_of(cells))]
            for phrase, of_kind in KINDS.items()}


def spelt_out(line: str, kinds: dict[str, list[str]]) -> str:
    """The line with its general phrase replaced by the labs it stands for:
    'Used in: every graded lab, the demo (...)' -> 'Used in: lab 1 (01_single_gpu), ..., the demo (...)'."""
    body = line.removeprefix("Used in: ")
    for phrase, labs in kinds.items():
        if line.startswith("Used in: ") and (body == phrase or body.startswith(phrase + ", ")):
            return "Used in: " + ", ".join([*labs, body[len(phrase) + 2:]] if body != phrase else labs)
    return line


def general(line: str, kinds: dict[str, list[str]]) -> str | None:
    """The line in a general phrase, where one stands for exactly its labs; None where none does."""
    labs = line.removeprefix("Used in: ").split(", ")
    demo = [DEMO] if labs[-1:] == [DEMO] else []
    for phrase, of_kind in kinds.items():
        if line.startswith("Used in: ") and of_kind and of_kind + demo == labs:
            return "Used in: " + ", ".join([phrase, *demo])
    return None


def importers(root: Path, known: set[str]) -> dict[str, set[str]]:
    """{module: the modules of course/ (not __init__) that import it}."""
    found = {module: set() for module in known}
    for module in known:
        for node in ast.walk(ast.parse((root / "course" / f"{module}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "course":
                imported = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course."):
                imported = {node.module.removeprefix("course.").split(".")[0]}
            elif isinstance(node, ast.Import):
                imported = {a.name.removeprefix("course.").split(".")[0] for a in node.names
                            if a.name.startswith("course.")}
            else:
                continue
            for other in imported & known - {module}:
                found[other].add(module)
    return found


def expected_lines(root: Path) -> dict[str, str | None]:
    """{module: the 'Used in: ...' or 'Used by: ...' its docstring must hold; None where nothing uses it}."""
    known, aliases = set(modules(root)), reexports(root)
    users = {label: named_modules(code, known, aliases) for label, code in notebooks(root).items()}
    imported_by = importers(root, known)
    lines = {}
    for module in sorted(known):
        labs = [label for label, named in users.items() if module in named]
        if labs:
            lines[module] = "Used in: " + ", ".join(labs)
        elif imported_by[module]:
            lines[module] = "Used by: " + ", ".join(f"course.{m}" for m in sorted(imported_by[module]))
        else:
            lines[module] = None
    return lines


def found_lines(root: Path) -> dict[str, list[str]]:
    """{module: each paragraph of its docstring that starts 'Used in: ' or 'Used by: ', on one line,
    without its closing full stop}."""
    found = {}
    for module in modules(root):
        doc = ast.get_docstring(ast.parse((root / "course" / f"{module}.py").read_text())) or ""
        paragraphs = (" ".join(line.strip() for line in p.splitlines()) for p in re.split(r"\n\s*\n", doc))
        found[module] = [p.removesuffix(".") for p in paragraphs if USED.match(p)]
    return found


def problems(expected: dict[str, str | None], found: dict[str, list[str]],
             kinds: dict[str, list[str]] | None = None) -> list[str]:
    """What is wrong with each module's line, and what to write instead; `kinds` (from `kinds()`)
    are the general phrases a line may use."""
    kinds = kinds or {}
    out = []
    for module, want in expected.items():
        where, have = f"course/{module}.py", found.get(module, [])
        why = (f"the notebooks that name course.{module} in a code cell" if (want or "").startswith("Used in")
               else f"no notebook names course.{module}; these modules import it")
        write = f"    {want}." + (f"\nor\n    {general(want, kinds)}." if want and general(want, kinds) else "")
        if want is None:
            out.append(f"{where}: no notebook names it and no module of course/ imports it: remove it, or use it")
        elif not have:
            out.append(f"{where}: its docstring does not say where it is used; add the paragraph\n{write}\n"
                       f"({why})")
        elif len(have) > 1:
            out.append(f"{where}: its docstring says where it is used {len(have)} times; keep one paragraph\n"
                       f"{write}")
        elif spelt_out(have[0], kinds) != want:
            meant = spelt_out(have[0], kinds)
            stands = f"\nwhich stands for\n    {meant}." if meant != have[0] else ""
            out.append(f"{where}: its docstring says\n    {have[0]}.{stands}\nwrite\n{write}\n({why})")
    return out


# --- the rule, on this repository ---------------------------------------------------------

def test_every_module_says_where_it_is_used():
    found = problems(expected_lines(REPO), found_lines(REPO), kinds(REPO))
    assert found == [], "\n\n".join(found)


def test_a_notebook_names_a_module_in_every_way_the_rule_lists():
    known, aliases = set(modules(REPO)), reexports(REPO)
    code = ("import course\n"
            "from course import (check,\n    data as digits)   # a comment, comm\n"
            "from course.sizes import Dense\n"
            "results = course.launch(f, 2)\n"
            "x.to(course.device())\n"
            "course.grading.Reference('00_x')\n"
            "course.not_a_module\n")
    assert named_modules(code, known, aliases) == {"check", "data", "sizes", "launch", "placement", "grading"}


# --- the rule, broken on purpose ----------------------------------------------------------

def test_a_wrong_or_missing_line_is_caught():
    expected = {"check": "Used in: lab 1 (01_single_gpu), lab 2 (02_data_parallel)",
                "data": "Used in: lab 1 (01_single_gpu)",
                "_output": "Used by: course._processes",
                "plots": "Used in: lab 1 (01_single_gpu)",
                "unused": None}
    found = {"check": ["Used in: lab 1 (01_single_gpu)"],                     # lab 2 left out
             "data": [],                                                       # no line
             "_output": ["Used in: lab 2 (02_data_parallel)"],                 # a private module's labs
             "plots": ["Used in: lab 1 (01_single_gpu)", "Used in: lab 1 (01_single_gpu)"],
             "unused": []}
    assert problems(expected, found) == [
        "course/check.py: its docstring says\n    Used in: lab 1 (01_single_gpu).\nwrite\n"
        "    Used in: lab 1 (01_single_gpu), lab 2 (02_data_parallel).\n"
        "(the notebooks that name course.check in a code cell)",
        "course/data.py: its docstring does not say where it is used; add the paragraph\n"
        "    Used in: lab 1 (01_single_gpu).\n(the notebooks that name course.data in a code cell)",
        "course/_output.py: its docstring says\n    Used in: lab 2 (02_data_parallel).\nwrite\n"
        "    Used by: course._processes.\n(no notebook names course._output; these modules import it)",
        "course/plots.py: its docstring says where it is used 2 times; keep one paragraph\n"
        "    Used in: lab 1 (01_single_gpu).",
        "course/unused.py: no notebook names it and no module of course/ imports it: remove it, or use it"]


def test_a_line_spread_over_lines_reads_as_one(tmp_path):
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "wrapped.py").write_text('"""A module.\n\nUsed in: lab 1 (01_single_gpu),\n'
                                                  '    lab 2 (02_data_parallel).\n"""\n')
    assert found_lines(tmp_path) == {"wrapped": ["Used in: lab 1 (01_single_gpu), lab 2 (02_data_parallel)"]}


def test_a_general_phrase_is_held_to_the_labs_of_its_kind(tmp_path):
    def notebook(slug, *cells):
        (tmp_path / "solutions" / slug).mkdir(parents=True)
        (tmp_path / "solutions" / slug / f"{slug}.ipynb").write_text(json.dumps({"cells": [
            {"cell_type": "code", "source": source, "metadata": {"nbgrader": {"grade": graded}}}
            for source, graded in cells]}))
    notebook("00_ranks", ("results = course.launch(f, 2)", False))
    notebook("01_single_gpu", ("course.check.close(a, b)", True))
    notebook("02_data_parallel", ("course.launch(f, course.lab_ranks())", False), ("assert x", True))
    lab0, lab1, lab2 = "lab 0 (00_ranks)", "lab 1 (01_single_gpu)", "lab 2 (02_data_parallel)"
    found_kinds = kinds(tmp_path)
    assert found_kinds == {"every lab": [lab0, lab1, lab2], "every lab that launches ranks": [lab0, lab2],
                           "every graded lab": [lab1, lab2]}
    expected = {"launch": f"Used in: {lab0}, {lab2}",
                "check": f"Used in: {lab1}, {lab2}, {DEMO}",
                "data": f"Used in: {lab1}"}
    true_claims = {"launch": ["Used in: every lab that launches ranks"],
                   "check": [f"Used in: every graded lab, {DEMO}"],
                   "data": [f"Used in: {lab1}"]}
    assert problems(expected, true_claims, found_kinds) == []
    false_claims = {"launch": ["Used in: every lab"],                         # lab 1 launches nothing
                    "check": ["Used in: every graded lab"],                   # the demo left out
                    "data": ["Used in: every graded lab"]}                    # lab 2 does not name it
    assert problems(expected, false_claims, found_kinds) == [
        f"course/launch.py: its docstring says\n    Used in: every lab.\nwhich stands for\n"
        f"    Used in: {lab0}, {lab1}, {lab2}.\nwrite\n    Used in: {lab0}, {lab2}.\nor\n"
        f"    Used in: every lab that launches ranks.\n(the notebooks that name course.launch in a code cell)",
        f"course/check.py: its docstring says\n    Used in: every graded lab.\nwhich stands for\n"
        f"    Used in: {lab1}, {lab2}.\nwrite\n    Used in: {lab1}, {lab2}, {DEMO}.\nor\n"
        f"    Used in: every graded lab, {DEMO}.\n(the notebooks that name course.check in a code cell)",
        f"course/data.py: its docstring says\n    Used in: every graded lab.\nwhich stands for\n"
        f"    Used in: {lab1}, {lab2}.\nwrite\n    Used in: {lab1}.\n"
        "(the notebooks that name course.data in a code cell)"]
