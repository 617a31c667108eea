"""A lab's reference solution as a module, for benchmarks and scripts.

    lab2 = load("02_data_parallel")
    course.launch(lab2.data_parallel_training, 2, ...)

The answers live in one place, the solution notebook; `course/` must not hold
them (students import it). `load` runs, in a fresh module, the cells the
notebook marks for it with a cell tag: the one cell tagged `setup` (imports and
sizes), then each cell tagged `reused` (functions and classes other code calls:
the answers, and the lab's own helpers such as its training loop), in order.
Nothing is guessed from a cell's shape. A `reused` cell holds definitions only
(imports, functions, classes): `marking_problems` says where one does more, and
`python -m grader reference --check` fails on it. Test cells and demonstrations
are not run. The module is not registered in `sys.modules`, so `course.launch`
sends its functions to the ranks by value.
"""
from __future__ import annotations

import ast
import contextlib
import io
import types
from pathlib import Path

import nbformat

from grader import COURSE_ROOT

DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)


def defines_only(source: str) -> bool:
    """True when every top-level statement of source is an import, a def or a class."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return bool(tree.body) and all(isinstance(node, DEFINITIONS) for node in tree.body)


SETUP_TAG, REUSED_TAG = "setup", "reused"


def _tagged(cell, tag: str) -> bool:
    return tag in cell.get("metadata", {}).get("tags", ())


def code_cells(notebook: nbformat.NotebookNode) -> list[str]:
    """The sources `load` runs: the `setup` cell, then the `reused` cells, in order."""
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    return ([c.source for c in code if _tagged(c, SETUP_TAG)]
            + [c.source for c in code if _tagged(c, REUSED_TAG) and not _tagged(c, SETUP_TAG)])


def marking_problems(notebook: nbformat.NotebookNode, name: str = "the notebook") -> list[str]:
    """What is wrong with a notebook's tags for `load`, one line each (empty: nothing)."""
    problems, setups, code_index = [], [], 0
    for index, cell in enumerate(notebook.cells):
        tags = cell.get("metadata", {}).get("tags", ())
        where = f"{name}, cell {index}"
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        where += f" ({grade_id})" if grade_id else ""
        if cell.cell_type != "code":
            problems += [f"{where} is {cell.cell_type}, not code, but is tagged {tag!r}"
                         for tag in (SETUP_TAG, REUSED_TAG) if tag in tags]
            continue
        if SETUP_TAG in tags:
            setups.append(where)
            if code_index != 0:
                problems.append(f"{where} is tagged {SETUP_TAG!r} but is not the first code cell: "
                                "the setup runs first, in the notebook as in `load`")
        elif REUSED_TAG in tags and not defines_only(cell.source):
            problems.append(f"{where} is tagged {REUSED_TAG!r} but does more than define: "
                            f"{_first_statement(cell.source)}. Move that into a cell of its own, "
                            "or remove the tag")
        code_index += 1
    if len(setups) > 1:
        problems.append(f"{name} has {len(setups)} cells tagged {SETUP_TAG!r} ({', '.join(setups)}): tag one")
    if not setups and any(_tagged(c, REUSED_TAG) for c in notebook.cells):
        problems.append(f"{name} has cells tagged {REUSED_TAG!r} but none tagged {SETUP_TAG!r}: "
                        "tag its first code cell (imports and sizes)")
    return problems


def _first_statement(source: str) -> str:
    """The first top-level statement that is not a definition, as 'line N: text'."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return f"it does not parse ({e.msg}, line {e.lineno})"
    if not tree.body:
        return "it is empty"
    node = next(n for n in tree.body if not isinstance(n, DEFINITIONS))
    return f"line {node.lineno}: {source.splitlines()[node.lineno - 1].strip()[:60]}"


def load(lab: str, root: Path = COURSE_ROOT) -> types.ModuleType:
    """The definitions of solutions/<lab>/<lab>.ipynb as a module (setup output swallowed)."""
    path = root / "solutions" / lab / f"{lab}.ipynb"
    if not path.is_file():
        labs = sorted(p.name for p in (root / "solutions").iterdir() if p.is_dir())
        raise FileNotFoundError(f"no solution notebook {path}; labs with solutions: {labs}")
    module = types.ModuleType(f"solution_{lab}", f"The definitions of {path.relative_to(root)}")
    module.__file__ = str(path)
    for index, source in enumerate(code_cells(nbformat.read(path, as_version=4))):
        code = compile(source, f"{path.name}, code cell {index}", "exec")
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, module.__dict__)  # noqa: S102 - the course's own solution notebook
    return module
