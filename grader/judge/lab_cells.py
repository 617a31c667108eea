"""The cells of a lab's notebook as the tampering scan (grader.judge.tampering) reads them: what the
lab's own cells bind (`LabNames`: protected from the student's rebinding), which cells are the
student's, how the verdict names a cell, and which test cells run after a given one.

Read as text with `ast`; nothing is run.
"""
from __future__ import annotations

import ast

from grader.common.labs import source_text
from grader.common.quoting import quoted

from . import allowed

#: Roots of what the course's checks use: a name the lab's cells bind to one of them is protected.
GUARDED_ROOTS = {"course", "torch", "dist", "check", "np", "numpy", "builtins", "__builtins__"}  # and aliases


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _python(source: str) -> ast.Module | None:
    """The cell as the kernel runs it (magics turned into calls), parsed; None if it does not parse."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError, IndexError):
        return None


def _imports(tree: ast.AST) -> dict[str, str]:
    """name -> the module or object an import binds it to ('F' -> 'torch.nn.functional')."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]  # `import a.b` binds a
                bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _defined(tree: ast.Module) -> set[str]:
    """The names a cell binds at its top level."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        for target in getattr(node, "targets", [getattr(node, "target", None)]):
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target else set()
    return names


class LabNames:
    """What the released lab's own cells bind: protected from the student's rebinding."""

    def __init__(self, released: dict):
        self.imports: dict[str, str] = {}
        self.protected: set[str] = set()
        self.lines: set[str] = set()       # the lab's own code lines: copying one is no tampering
        self.bound: set[str] = set()       # every name the lab's own cells bind: not a builtin there
        self.judge: set[str] = set()       # names bound to course.grading's objects (REFERENCE): the judge's
        for cell in released.get("cells", []):
            nbgrader = cell.get("metadata", {}).get("nbgrader", {})
            if cell.get("cell_type") != "code" or nbgrader.get("solution"):
                continue
            source = source_text(cell)
            self.lines |= {line.strip() for line in source.splitlines() if line.strip()}
            tree = _python(source)
            if tree is None:
                continue
            self.imports.update(_imports(tree))
            self.bound |= allowed.bound_names([tree])
            if nbgrader.get("locked") and not nbgrader.get("grade"):   # a read-only helper cell
                self.protected |= _defined(tree)
            for node in tree.body:   # REFERENCE = course.grading.Reference(...) and the like
                if isinstance(node, ast.Assign) and "grading" in ast.unparse(node.value):
                    self.protected |= _defined(ast.Module(body=[node], type_ignores=[]))
                    self.judge |= _defined(ast.Module(body=[node], type_ignores=[]))
        # What the course and the libraries its checks use are bound to; `time` or `os` rebound is no tampering.
        self.protected |= {name for name, bound in self.imports.items() if bound.split(".")[0] in GUARDED_ROOTS}

    @property
    def modules(self) -> set[str]:
        """What the lab's own cells import: a student's cell may import it too."""
        return set(self.imports.values())


def _where(cell: dict, index: int) -> str:
    gid = _grade_id(cell)
    if gid:
        return f"cell {gid}"
    first = next((line.strip() for line in source_text(cell).splitlines() if line.strip()), "")
    return f"cell {index + 1} {quoted(first, 40)}"


def _students_cells(submitted: dict, released: dict):
    """(index, cell) of the code cells that are the student's: not locked, not the lab's own unchanged."""
    locked = {_grade_id(c) for c in released.get("cells", [])
              if c.get("metadata", {}).get("nbgrader", {}).get("locked")}
    own = {source_text(c).strip() for c in released.get("cells", []) if c.get("cell_type") == "code"
           and not c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    for index, cell in enumerate(submitted.get("cells", [])):
        if cell.get("cell_type") != "code" or (_grade_id(cell) and _grade_id(cell) in locked):
            continue
        if source_text(cell).strip() not in own:
            yield index, cell


def tests_after(submitted: dict, tests: list[str], index: int) -> list[str]:
    """The test cells (grade_ids of `tests`) that run from the submitted notebook's cell `index` on, in
    the notebook's order; a test cell the student deleted, which nbgrader puts back, counts as after."""
    found = [(i, _grade_id(cell)) for i, cell in enumerate(submitted.get("cells", [])) if _grade_id(cell) in tests]
    present = {gid for _, gid in found}
    return [gid for i, gid in found if i >= index] + [gid for gid in tests if gid not in present]
