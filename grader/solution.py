"""A lab's reference solution as a module, for benchmarks and scripts.

    lab2 = load("02_data_parallel")
    course.launch(lab2.data_parallel_training, 2, ...)

The answers live in one place, the solution notebook; `course/` must not hold
them (students import it). `load` runs, in a fresh module, the notebook's
setup cell (its first code cell: imports and sizes) and every code cell that
only defines things: imports, functions and classes (the answers, and the
lab's own helpers such as its training loop). Test cells and demonstrations
are not run. The module is not registered in `sys.modules`, so
`course.launch` sends its functions to the ranks by value.
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


def code_cells(notebook: nbformat.NotebookNode) -> list[str]:
    """The sources `load` runs: the setup cell, then the defining cells, in order."""
    sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    if not sources:
        return []
    return [sources[0]] + [s for s in sources[1:] if defines_only(s)]


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
