"""Each course/ module's docstring says where it is used (d2l's back-link), held.

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

Direct use, not transitive: a lab uses what its notebook names, where a student meets it. What
runs underneath (the recorder inside every launch, `sizes` under every view) would list nearly
every lab in nearly every module and tell a reader nothing.

`test_a_wrong_or_missing_line_is_caught` shows each failure on purpose.
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


def notebooks(root: Path) -> dict[str, str]:
    """{'lab N (NN_slug)' or the demo: its code cells' source}, labs in order, the demo last."""
    paths = {f"lab {int(p.stem[:2])} ({p.stem})": p
             for p in sorted((root / "solutions").glob("[0-9][0-9]_*/*.ipynb")) if p.stem == p.parent.name}
    if (root / "solutions" / "demo.ipynb").exists():
        paths[DEMO] = root / "solutions" / "demo.ipynb"
    return {label: "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]
                             if cell["cell_type"] == "code")
            for label, path in paths.items()}


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


def problems(expected: dict[str, str | None], found: dict[str, list[str]]) -> list[str]:
    """What is wrong with each module's line, and what to write instead."""
    out = []
    for module, want in expected.items():
        where, have = f"course/{module}.py", found.get(module, [])
        why = (f"the notebooks that name course.{module} in a code cell" if (want or "").startswith("Used in")
               else f"no notebook names course.{module}; these modules import it")
        if want is None:
            out.append(f"{where}: no notebook names it and no module of course/ imports it: remove it, or use it")
        elif not have:
            out.append(f"{where}: its docstring does not say where it is used; add the paragraph\n    {want}.\n"
                       f"({why})")
        elif len(have) > 1:
            out.append(f"{where}: its docstring says where it is used {len(have)} times; keep one paragraph\n"
                       f"    {want}.")
        elif have[0] != want:
            out.append(f"{where}: its docstring says\n    {have[0]}.\nwrite\n    {want}.\n({why})")
    return out


# --- the rule, on this repository ---------------------------------------------------------

def test_every_module_says_where_it_is_used():
    found = problems(expected_lines(REPO), found_lines(REPO))
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
