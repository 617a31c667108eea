"""The visitor of grader.judge.tampering's scan: one cell's tree, read with `ast`, never run.

`Scanner` walks a student's cell and keeps, at each line, what it found that reaches for the
grading machinery (the list is tampering's docstring) and whether it withholds; `allowlist` adds
what grader.judge.allowed finds outside the allowlist. The names it looks for are the tables
below. Which names stand for what (`aliases`: `_c = check`) is tampering's to work out, from
every cell, before any cell is read; a string run as code (exec, %time) is read by a Scanner of
its own, flagged at the line that runs it.
"""
from __future__ import annotations

import ast

from . import allowed
from .lab_cells import GUARDED_ROOTS, LabNames, _imports, _python

RECORDER = "touches course.recorder, which records the ranks' messages for the tests"
AROUND = "reaches torch.distributed around the course's recorder (distributed_c10d or a process group's own methods)"
GUARDED_CALLS = ("sys.modules", "get_ipython()", "globals()")
HOOKS = {"ast_transformers": "installs an IPython AST transformer",
         "input_transformers_post": "installs an IPython input transformer",
         "input_transformers_cleanup": "installs an IPython input transformer",
         "input_transformer_manager": "touches IPython's input transformers",
         "set_custom_exc": "installs a custom exception handler",
         "settrace": "installs a trace hook", "setprofile": "installs a profile hook",
         "get_referrers": "uses gc.get_referrers", "get_referents": "uses gc.get_referents",
         "get_objects": "uses gc.get_objects", "ctypes": "uses ctypes"}
DYNAMIC = {"exec", "eval", "compile", "__import__"}
#: Builtins a name may be bound to and called through: followed as aliases.
INDIRECT = {*DYNAMIC, "setattr", "delattr", "getattr", "vars", "globals", "type"}
#: Attributes that swap what a function or an object is, assigned on anything.
SWAPPED = {"__code__", "__globals__", "__defaults__", "__kwdefaults__", "__closure__", "__dict__", "__class__",
           "__call__", "__getattr__", "__getattribute__", "__setattr__", "__eq__", "__bool__", "__builtins__"}
#: Methods that change a mapping (a __dict__, vars(), sys.modules, globals()) in place.
MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
#: What reaches torch.distributed around the course's recorder (course/recorder.py patches `dist.<op>`).
AROUND_THE_RECORDER = {"distributed_c10d", "_distributed_c10d", "ProcessGroup", "_get_default_group",
                       "_world", "CommRecord", "CommLog"}
#: A process group's own collectives: torch.distributed's functions call them; a student never needs to.
GROUP_METHODS = {"allreduce", "allgather", "alltoall", "alltoall_base", "allreduce_coalesced", "allgather_coalesced",
                 "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced", "recv_anysource",
                 "_allgather_base", "_reduce_scatter_base", "all_gather_single", "reduce_scatter_single"}
PYTHON_MAGICS = {"time", "timeit", "prun", "capture"}   # magics whose text is Python that runs


class Scanner(ast.NodeVisitor):
    """One cell's tree, read once: `found`, each line's finding (what, and whether it withholds)."""
    def __init__(self, lab: LabNames, aliases: dict[str, str], bound: frozenset[str] = frozenset()):
        self.lab, self.aliases, self.bound = lab, aliases, bound   # bound: what the notebook binds anywhere
        self.found: dict[int, tuple[str, bool]] = {}    # line -> (what, withholds): the first that withholds
        self.globals: set[str] = set()

    def flag(self, node: ast.AST, what: str, withholds: bool = True) -> None:
        keep(self.found, node.lineno, what, withholds)

    def allowlist(self, tree: ast.AST) -> None:
        """What in `tree` is outside grader.judge.allowed's allowlist, each at its line."""
        for line, what, withholds in allowed.outside(tree, self.aliases, self.bound, self.lab.modules):
            keep(self.found, line, what, withholds)

    def visit_BinOp(self, node):
        # `"a" + "b" + ...` is left-deep: its length is no nesting, so its spine is walked in a loop
        operands = []
        while isinstance(node, ast.BinOp):
            operands.append(node.right)
            node = node.left
        self.visit(node)
        for operand in reversed(operands):
            self.visit(operand)

    def dotted(self, node: ast.AST) -> str | None:
        """'course.check.assert_close' for an expression rooted at a name or a guarded call, aliases resolved."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute) and node.attr in ("f_globals", "f_locals", "__globals__"):
            return "globals()"   # a frame's or a function's namespace: the kernel's, where the checks are
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return base and f"{base}.{node.attr}"
        if isinstance(node, ast.Subscript):
            base = self.dotted(node.value)
            return base and f"{base}[...]"
        if isinstance(node, ast.NamedExpr):
            return self.dotted(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            func = self.dotted(node.func) or ""
            if func in ("get_ipython", "globals"):
                return f"{func}()"
            if func in ("vars", "getattr", "type") and node.args:
                return self.dotted(node.args[0])
            named = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            if func in ("importlib.import_module", "__import__") and isinstance(named, str):
                return named if func.startswith("importlib") or node.keywords or len(node.args) > 3 \
                    else named.split(".")[0]
        return None

    def guarded(self, node: ast.AST) -> str | None:
        name = self.dotted(node)
        if name is None:
            return None
        root = name.split(".")[0].split("[")[0]
        original = node
        while isinstance(original, (ast.Attribute, ast.Subscript)):
            original = original.value
        first = original.id if isinstance(original, ast.Name) else ""
        if (root in GUARDED_ROOTS or first in GUARDED_ROOTS or first in self.lab.protected
                or root in self.lab.protected or name.startswith(GUARDED_CALLS)):
            return name
        return None

    def rebinding(self, target: ast.AST, verb: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.rebinding(element, verb)
        elif isinstance(target, ast.Starred):
            self.rebinding(target.value, verb)
        elif isinstance(target, ast.Attribute) and target.attr in SWAPPED:
            self.flag(target, f"replaces the {target.attr} of {self.dotted(target.value) or 'an object'}")
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            name = self.guarded(target)
            if name:
                self.flag(target, f"{verb} {name}")
        elif isinstance(target, ast.Name) and target.id in self.lab.protected and self.at_top(target.id):
            self.flag(target, f"{verb} {target.id}, which the lab's own cells define")

    def at_top(self, name: str) -> bool:
        return self.depth == 0 or name in self.globals

    depth = 0

    def visit_FunctionDef(self, node):
        if self.depth == 0 and node.name in self.lab.protected:
            self.flag(node, f"redefines {node.name}, which the lab's own cells define")
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.depth += 1
        for child in node.body:
            self.visit(child)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Global(self, node):
        self.globals |= set(node.names)

    def visit_Assign(self, node):
        for target in node.targets:
            self.rebinding(target, "rebinds")
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.rebinding(node.target, "changes")
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_NamedExpr(self, node):
        self.rebinding(node.target, "rebinds")
        self.generic_visit(node)

    def visit_For(self, node):
        self.rebinding(node.target, "rebinds")
        self.generic_visit(node)

    def visit_withitem(self, node):
        if node.optional_vars is not None:
            self.rebinding(node.optional_vars, "rebinds")
        self.generic_visit(node)

    def visit_Delete(self, node):
        for target in node.targets:
            self.rebinding(target, "deletes")

    def visit_Import(self, node):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [f"{node.module}.{a.name}" for a in node.names if node.module and not node.level]
        if any(m.split(".")[0] == "ctypes" for m in modules):
            self.flag(node, HOOKS["ctypes"])
        elif any(m.startswith("course.grading") for m in modules):
            self.flag(node, "imports course.grading")
        elif any(m.startswith("course.recorder") for m in modules):
            self.flag(node, RECORDER)
        elif any(set(m.split(".")) & AROUND_THE_RECORDER for m in modules):
            self.flag(node, AROUND)
        for name, bound in _imports(ast.Module(body=[node], type_ignores=[])).items():
            if name in self.lab.protected and self.lab.imports.get(name) != bound and self.at_top(name):
                self.flag(node, f"rebinds {name}, which the lab's own cells define, to {bound}")

    visit_ImportFrom = visit_Import

    def visit_Attribute(self, node):
        name = self.dotted(node) or ""
        if node.attr in HOOKS:
            self.flag(node, HOOKS[node.attr])
        elif node.attr in AROUND_THE_RECORDER or node.attr in GROUP_METHODS:
            self.flag(node, AROUND if node.attr not in GROUP_METHODS else
                      f"calls a process group's own {node.attr}, around the course's recorder")
        elif name.startswith("course.recorder"):
            self.flag(node, RECORDER)
        elif node.attr.startswith("_") and not node.attr.startswith("__") and self.guarded(node.value) \
                and (self.dotted(node.value) or "").split(".")[0] in ("course", "torch"):
            self.flag(node, f"uses {name or node.attr}, a private part of {name.split('.')[0] or 'the course'}")
        elif node.attr == "register" and isinstance(node.value, ast.Attribute) and node.value.attr == "events":
            self.flag(node, "registers an IPython event callback")
        elif name.startswith("course.grading"):
            self.flag(node, "touches course.grading")
        self.generic_visit(node)

    def visit_Name(self, node):
        name = self.aliases.get(node.id, node.id)
        if isinstance(node.ctx, ast.Load) and {node.id, name} & self.lab.judge:   # an attribute's own rule reads it
            self.flag(node, f"reads {node.id}, the judge's (course.grading): no answer needs its seed or its "
                            "stored values")
        elif name.split(".")[0] == "ctypes":
            self.flag(node, HOOKS["ctypes"])
        elif name.startswith("course.grading"):
            self.flag(node, "touches course.grading")
        elif name.startswith("course.recorder"):
            self.flag(node, RECORDER)
        elif node.id in AROUND_THE_RECORDER or set(name.split(".")) & AROUND_THE_RECORDER:
            self.flag(node, AROUND)

    def visit_Constant(self, node):
        if isinstance(node.value, str):
            word = next((w for w in [*HOOKS, "course.grading", "course.recorder", *sorted(AROUND_THE_RECORDER),
                                     *sorted(m for m in GROUP_METHODS if m.startswith("_"))] if w in node.value), None)
            if word:   # a name in a string reaches nothing by itself: what uses it is flagged apart
                self.flag(node, f"names {word} in a string", withholds=False)

    def visit_Call(self, node):
        func = self.dotted(node.func) or ""
        computed = any(not isinstance(a, ast.Constant) for a in [*node.args, *(k.value for k in node.keywords)])
        method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        swapped = len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in SWAPPED
        if func in ("setattr", "delattr") and node.args and self.guarded(node.args[0]):
            self.flag(node, f"calls {func} on {self.guarded(node.args[0])}")
        elif func in ("setattr", "delattr") and swapped:
            self.flag(node, f"replaces the {node.args[1].value} of {self.dotted(node.args[0]) or 'an object'}")
        elif method in ("__setattr__", "__delattr__"):
            target = self.guarded(node.func.value) or (node.args and self.guarded(node.args[0]))
            if target:
                self.flag(node, f"calls {method} on {target}")
        elif method in MUTATORS and self.mapping(node.func.value):
            self.flag(node, f"changes {self.mapping(node.func.value)} in place")
        elif func in DYNAMIC and not computed and node.args and isinstance(node.args[0].value, str):
            self.scan_text(node, node.args[0].value)
        elif func == "getattr" and len(node.args) > 1 and not isinstance(node.args[1], ast.Constant) \
                and self.guarded(node.args[0]):
            self.flag(node, f"reads a computed attribute of {self.guarded(node.args[0])}")
        elif (func in DYNAMIC or func.startswith("importlib.")) and computed:
            self.flag(node, f"calls {func} on computed text")
        elif func.endswith(("run_line_magic", "run_cell_magic")) and len(node.args) >= 2:
            self.magic(node)
        self.generic_visit(node)

    def mapping(self, node: ast.AST) -> str | None:
        """The guarded namespace `node` is as a mapping (a __dict__, vars(x), sys.modules, globals()), or None."""
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return self.guarded(node)
        if isinstance(node, ast.Call) and (self.dotted(node.func) or "") == "vars" and node.args:
            return self.guarded(node.args[0]) and f"vars({self.guarded(node.args[0])})"
        name = self.dotted(node) or ""
        return name if name.startswith(GUARDED_CALLS) or name.endswith(".user_ns") else None

    def scan_text(self, node: ast.AST, text: str) -> None:
        """Code run from a string (exec, eval, %time): scanned too, flagged at this line."""
        tree = _python(text)
        if tree is not None:
            inner = Scanner(self.lab, self.aliases, self.bound)
            inner.visit(tree)
            inner.allowlist(tree)
            for what, withholds in sorted(inner.found.values(), key=lambda found: not found[1])[:1]:
                self.flag(node, what, withholds)

    def magic(self, node: ast.Call) -> None:
        """%time and the like run their text as Python: scan it too, flagging this line."""
        name, *texts = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        if name not in PYTHON_MAGICS:
            return
        for text in texts:
            self.scan_text(node, text or "")



def keep(found: dict[int, tuple[str, bool]], line: int, what: str, withholds: bool) -> None:
    """One finding a line: the first, unless a later one withholds where it did not."""
    if line not in found or (withholds and not found[line][1]):
        found[line] = (what, withholds)

