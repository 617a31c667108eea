"""Code of the student's that reaches for the grading machinery: found with `ast`, flagged for the instructor.

The judge decides the hidden tests' points outside the kernel, but what the
kernel sends it (which ranks, how many times, the recorder's records) is the
kernel's to forge. `scan` reads the student's cells (solution cells, cells the
student added or changed; the lab's locked cells are put back by nbgrader) twice:
against the allowlist of grader.judge.allowed (what distributed-training code
needs), and for the ways of rewriting the checks found so far: grader.judge.scanner's
visitor reads each cell, once this module has followed the names the cells bind (`_aliases`).
Each `Flag` says whether it withholds: one that can rewrite what a check reads
withholds the points of every test cell from its cell on, pending the
instructor's review (grader.grading.submission); one only outside the allowlist
costs nothing. The scan flags, each withholding:

- assignments, deletes, setattr and delattr on what the course, torch, NumPy,
  builtins, ``sys.modules`` or ``get_ipython()`` hold (``course.check.assert_close = ...``);
- rebinding a name the lab's own cells import, or its read-only cells define
  (``check = ...``, ``REFERENCE = ...``); the student's own functions are theirs;
- reading ``REFERENCE`` (the judge's seed decides a hidden case), or a name no cell of
  the notebook binds (under grading, only a hidden test's variable answers to it);
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
from .lab_cells import LabNames, _imports, _python, _students_cells, _where
from .scanner import INDIRECT, Scanner

MAX_FLAGS = 8   # a verdict names this many lines at most; an attack now reads REFERENCE on lines of its own


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
    scanner, changed = Scanner(lab, aliases), True   # the scanner reads `aliases` as it grows
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
        scanner = Scanner(lab, aliases, bound)
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
