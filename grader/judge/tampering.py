"""Code of the student's that reaches for the grading machinery: found with `ast`, flagged for the instructor.

The judge decides the hidden tests' points outside the kernel, but what the
kernel sends it (which ranks, how many times, the recorder's records) is the
kernel's to forge. `scan` reads the student's cells (solution cells, cells the
student added or changed; the lab's locked cells are put back by nbgrader) twice:
against the allowlist of grader.judge.allowed (what distributed-training code
needs), and for the ways of rewriting the checks found so far (this module).
Each `Flag` says whether it withholds: one that can rewrite what a check reads
withholds the points of every test cell from its cell on, pending the
instructor's review (grader.grading.submission); one only outside the allowlist
costs nothing. This module flags, each withholding:

- assignments, deletes, setattr and delattr on what the course, torch, NumPy,
  builtins, ``sys.modules`` or ``get_ipython()`` hold (``course.check.assert_close = ...``);
- rebinding a name the lab's own cells import, or its read-only cells define
  (``check = ...``, ``REFERENCE = ...``); the student's own functions are theirs;
- IPython hooks (AST and input transformers, custom exception handlers,
  event callbacks), tracing and profiling hooks, ctypes, ``gc.get_referrers``,
  and any mention of ``course.grading``;
- exec, eval, compile, ``__import__`` and importlib called on computed text (obfuscation);
  constant text passed to them is scanned as code;
- indirection: a name bound to any of the above (``_c = check``, ``R = REFERENCE``,
  ``t = type(REFERENCE)``, ``m = sys.modules["course"]``, ``s = setattr``, ``e = exec``)
  is followed, in every cell; a frame's ``f_globals`` or a function's ``__globals__`` is
  ``globals()``; ``type()``, ``vars()``, ``importlib.import_module("...")``
  and ``__import__("...")`` resolve to what they name; ``__dict__`` changed through its
  methods, ``__setattr__`` called on a guarded object, a function's ``__code__`` (or
  ``__globals__``, ``__defaults__``...) replaced, and ``gc``'s object walks;
- torch.distributed reached around the course's recorder (``distributed_c10d``, a
  process group's own methods, private parts of torch.distributed), and the recorder's
  own parts (``course.recorder``, ``CommRecord``): the structure checks read its records.

A string that only names one of these is listed, not withholding: what uses it is flagged apart.

A cell that does not parse is a syntax error, not tampering: it is skipped. A cell
nested too deeply to scan is flagged as such, and withholds: the scan never fails
a whole run. A long flat chain (600 strings added together) is no nesting: it is
read in a loop.
"""
from __future__ import annotations

import ast

from grader.common.labs import source_text

from . import allowed
from .lab_cells import GUARDED_ROOTS, LabNames, _imports, _python, _students_cells, _where

MAX_FLAGS = 6
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


class Flag(str):
    """One verdict line of the scan: where it is (`index`, the cell's position in the submitted notebook;
    `said`, the cell, line and what), and whether it `withholds` the points of the test cells from there on.
    A str, so that a verdict's list of lines takes it as it is."""
    index: int
    said: str
    withholds: bool

    def __new__(cls, said: str, index: int, withholds: bool, text: str | None = None):
        flag = super().__new__(cls, text or f"{said}: flagged for the instructor")
        flag.said, flag.index, flag.withholds = said, index, withholds
        return flag

    def __getnewargs__(self):   # pickled (to a worker process, say) as what it is
        return self.said, self.index, self.withholds, str(self)


class _Scanner(ast.NodeVisitor):
    def __init__(self, lab: LabNames, aliases: dict[str, str], bound: frozenset[str] = frozenset()):
        self.lab, self.aliases, self.bound = lab, aliases, bound   # bound: what the notebook binds anywhere
        self.found: dict[int, tuple[str, bool]] = {}    # line -> (what, withholds): the first that withholds
        self.globals: set[str] = set()

    def flag(self, node: ast.AST, what: str, withholds: bool = True) -> None:
        _keep(self.found, node.lineno, what, withholds)

    def allowlist(self, tree: ast.AST) -> None:
        """What in `tree` is outside grader.judge.allowed's allowlist, each at its line."""
        for line, what, withholds in allowed.outside(tree, self.aliases, self.bound, self.lab.modules):
            _keep(self.found, line, what, withholds)

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
        if name.split(".")[0] == "ctypes":
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
            inner = _Scanner(self.lab, self.aliases, self.bound)
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


def _keep(found: dict[int, tuple[str, bool]], line: int, what: str, withholds: bool) -> None:
    """One finding a line: the first, unless a later one withholds where it did not."""
    if line not in found or (withholds and not found[line][1]):
        found[line] = (what, withholds)


def _aliases(lab: LabNames, trees: list[ast.Module]) -> dict[str, str]:
    """name -> what it stands for: the lab's and the student's imports, then every name the student binds
    to something guarded (`_c = check`, `t = type(REFERENCE)`) or to a builtin that reaches around
    (`s = setattr`), followed through each other until nothing changes."""
    aliases = dict(lab.imports)
    for tree in trees:
        aliases.update({k: v for k, v in _imports(tree).items() if k not in lab.protected})
    pairs = []                                  # (name, the expression it is bound to)
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.NamedExpr)):
                for target in getattr(node, "targets", [getattr(node, "target", None)]):
                    values = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else None
                    if isinstance(target, ast.Name):
                        pairs.append((target.id, node.value))
                    elif isinstance(target, (ast.Tuple, ast.List)) and values and len(values) == len(target.elts):
                        pairs += [(t.id, v) for t, v in zip(target.elts, values) if isinstance(t, ast.Name)]
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) \
                    and isinstance(node.iter, (ast.Tuple, ast.List)):
                pairs += [(node.target.id, v) for v in node.iter.elts]
    scanner, changed = _Scanner(lab, aliases), True   # the scanner reads `aliases` as it grows
    while changed:                                      # each pass binds a name or ends: at most len(pairs)
        changed = False
        for name, value in pairs:
            if name in lab.protected or name in aliases:
                continue
            if isinstance(value, ast.Name) and aliases.get(value.id, value.id) in INDIRECT:
                bound = aliases.get(value.id, value.id)
            else:
                bound = scanner.guarded(value)
            if bound:
                aliases[name], changed = bound, True
    return aliases


TOO_DEEP = "is nested too deeply for the scan to read"


def scan(submitted: dict, released: dict) -> list[Flag]:
    """Every line of the student's code outside the allowlist or reaching for the grading machinery, in
    the notebook's order, one `Flag` a line.

    Never raises for what a submission wrote: a cell nested too deeply to read is flagged as such, and
    withholds (what it does cannot be read).
    """
    lab = LabNames(released)
    cells, out = [], []
    for index, cell in _students_cells(submitted, released):
        try:
            cells.append((index, cell, _python(source_text(cell))))
        except (RecursionError, MemoryError):
            out.append(Flag(f"{_where(cell, index)} {TOO_DEEP}", index, True))
    trees = [tree for _, _, tree in cells if tree is not None]
    try:
        aliases = _aliases(lab, trees)
        bound = frozenset(lab.bound | allowed.bound_names(trees))
    except (RecursionError, MemoryError):
        aliases, bound = dict(lab.imports), frozenset(lab.bound)
    for index, cell, tree in cells:
        if tree is None:
            continue
        scanner = _Scanner(lab, aliases, bound)
        try:
            scanner.visit(tree)
            scanner.allowlist(tree)
        except (RecursionError, MemoryError):
            out.append(Flag(f"{_where(cell, index)} {TOO_DEEP}", index, True))
        lines = source_text(cell).splitlines()
        for number, (what, withholds) in sorted(scanner.found.items()):
            text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
            if text not in lab.lines:
                out.append(Flag(f"{_where(cell, index)} line {number} {what}", index, withholds))
    return sorted(out, key=lambda flag: flag.index)


def flags(submitted: dict, released: dict) -> list[str]:
    """`scan`'s flags as verdict lines, at most MAX_FLAGS: those that withhold first, so that the cap never
    drops the earliest of them."""
    out = sorted(scan(submitted, released), key=lambda flag: not flag.withholds)
    if len(out) > MAX_FLAGS:
        cut, out = out[MAX_FLAGS - 1:], out[: MAX_FLAGS - 1]
        more = f"… and {len(cut)} more lines flagged for the instructor"
        out.append(Flag(more, cut[0].index, any(f.withholds for f in cut), more))
    return out
