"""How far down a notebook a changed cell's names reach.

A planted mistake changes one exercise's cell: it binds the same names as the
reference's, to something else. Another cell can only see that change through a
name: one the changed cells bind, or one bound by a cell that reads such a name,
and so on. Past the last cell so reached, every cell reads only what the
reference's cells bound, so it runs as in the reference.

The reading is static, by Python's own scoping (symtable), and errs towards reaching:
- a cell binds the global names it assigns, defines or imports, at its top level or
  declared `global` in a function;
- a cell reads a global name where it stands (before binding it itself: a name it
  binds first is its own; a branch or loop may not run, so what it binds does not
  count), in its comprehensions, and in its functions, lambdas, generators and class
  bodies whenever they run: so a function in a cell before the change that reads a
  changed name carries the change to whoever calls it;
- a string that is exactly a name is a read (`getattr(module, "f")`);
- a cell that does not parse, holds IPython's magics (they run code from strings) or names
  what reaches names by their strings (`globals()`, `exec`, ...: DYNAMIC) may read and bind
  any name: after the change, it and everything after it are reached; before it, whatever
  it binds is taken as carrying the change.

What it cannot see is state changed in place (an object the changed code mutates,
torch's random state): the fairness tests keep, for each exercise, one mistake
that runs the whole rest of the lab (helpers/submissions.py).
"""
from __future__ import annotations

import ast
import re
import symtable

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
#: What reads or binds names given as strings, or runs code from strings: a cell that names one
#: may touch any name.
DYNAMIC = {"exec", "eval", "compile", "globals", "locals", "vars", "get_ipython", "__import__", "__builtins__"}


def _python(source: str) -> str | None:
    """The cell's source, or None where it is not plain Python: it does not parse, or it holds
    IPython's magics or shell escapes (they run code held in strings)."""
    from IPython.core.inputtransformer2 import TransformerManager

    if TransformerManager().transform_cell(source).rstrip("\n") != source.rstrip("\n"):
        return None
    try:
        ast.parse(source)
    except SyntaxError:
        return None
    return source


def _scopes(table: symtable.SymbolTable):
    yield table
    for child in table.get_children():
        yield from _scopes(child)


def bound_names(source: str) -> set[str]:
    """The global names a cell binds: at its top level, or declared global in a function."""
    top = symtable.symtable(source, "<cell>", "exec")
    names = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    for scope in _scopes(top):
        names |= {s.get_name() for s in scope.get_symbols() if s.is_declared_global() and s.is_assigned()}
    return names


#: Scopes that run where they stand (a list, set or dict comprehension); a generator expression,
#: a lambda, a function or a class body may run later.
RUN_AT_ONCE = {"listcomp", "setcomp", "dictcomp"}


def _simple_reads(node: ast.AST) -> tuple[set[str], set[str]]:
    """The global names one simple statement (or expression) reads, by Python's own scoping:
    (where it stands, as it runs; inside the functions, classes, lambdas and generators it
    holds, whenever they run)."""
    statement = node if isinstance(node, ast.stmt) else ast.Expr(node)
    top = symtable.symtable(ast.unparse(statement), "<cell>", "exec")
    now = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    later = set()

    def visit(scope, deferred):
        for child in scope.get_children():
            runs_later = deferred or child.get_name() not in RUN_AT_ONCE
            reads = {s.get_name() for s in child.get_symbols() if s.is_referenced() and s.is_global()}
            (later if runs_later else now).update(reads)
            visit(child, runs_later)

    visit(top, False)
    return now, later


def _stores(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _read(node: ast.AST, bound: set[str]) -> set[str]:
    now, later = _simple_reads(node)
    return (now - bound) | later


def _reads(statements: list[ast.stmt], bound: set[str]) -> tuple[set[str], set[str]]:
    """(The global names these statements read before binding them themselves, the names
    surely bound after them), given the names `bound` before. Where a branch or a loop may not
    run, what it binds is not counted as bound: more reads, never fewer."""
    reads = set()
    for stmt in statements:
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            reads |= _read(stmt.iter, bound)
            reads |= _reads(stmt.body, bound | _stores(stmt.target))[0]
            reads |= _reads(stmt.orelse, bound)[0]
        elif isinstance(stmt, ast.While):
            reads |= _read(stmt.test, bound)
            reads |= _reads(stmt.body, bound)[0] | _reads(stmt.orelse, bound)[0]
        elif isinstance(stmt, ast.If):
            reads |= _read(stmt.test, bound)
            (body_reads, body_bound), (else_reads, else_bound) = _reads(stmt.body, bound), _reads(stmt.orelse, bound)
            reads |= body_reads | else_reads
            bound = body_bound & else_bound
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                reads |= _read(item.context_expr, bound)
                if item.optional_vars is not None:
                    bound = bound | _stores(item.optional_vars)
            body_reads, bound = _reads(stmt.body, bound)
            reads |= body_reads
        elif isinstance(stmt, ast.Match):
            reads |= _read(stmt.subject, bound)
            for case in stmt.cases:  # a pattern's names are bound only where it matches
                reads |= _reads(case.body, bound)[0] | (_read(case.guard, bound) if case.guard else set())
        elif isinstance(stmt, (ast.Try, ast.TryStar)):
            reads |= _reads(stmt.body, bound)[0] | _reads(stmt.orelse, bound)[0] | _reads(stmt.finalbody, bound)[0]
            for handler in stmt.handlers:
                if handler.type is not None:
                    reads |= _read(handler.type, bound)
                reads |= _reads(handler.body, bound | ({handler.name} if handler.name else set()))[0]
        else:
            reads |= _read(stmt, bound)
            bound = bound | bound_names(ast.unparse(stmt))
    return reads, bound


def read_names(python: str) -> set[str]:
    """The global names a cell reads before it binds them itself, and any string that is exactly
    a name (getattr(module, "f"))."""
    tree = ast.parse(python)
    return _reads(tree.body, set())[0] | _strings(tree)


def _strings(tree: ast.Module) -> set[str]:
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and IDENTIFIER.fullmatch(node.value)}


def deferred_reads(python: str) -> set[str]:
    """The global names a cell's functions, classes and lambdas read whenever they run."""
    tree = ast.parse(python)
    return set().union(*(_simple_reads(stmt)[1] for stmt in tree.body)) | _strings(tree)


def last_cell_reached(sources: list[str], changed: set[int]) -> int:
    """The index of the last cell that the cells at `changed` can affect through a name
    (at least the last changed cell): the cells after it run as they would without the change.

    A name is tainted when a changed cell binds it, or a cell binds it that reads a tainted
    name: a cell after the first change by running, any cell (earlier ones too) through
    a function that runs later and reads the name then."""
    if not changed:
        raise ValueError("no cell changed: nothing reaches anywhere")
    first = min(changed)
    cells = [_python(source) for source in sources]
    if any(python is None for python in cells):  # it might read anything, now or later
        return len(sources) - 1
    dynamic = [bool(_names_in(python) & DYNAMIC) for python in cells]
    if any(dynamic[first:]):                     # it might read and bind any name once it runs
        return len(sources) - 1
    binds = [bound_names(python) for python in cells]
    reads = [read_names(python) if i >= first else deferred_reads(python) for i, python in enumerate(cells)]
    tainted = set().union(*(binds[i] for i in changed))
    grew = True
    while grew:
        grew = False
        for i in range(len(cells)):
            # a cell before the change that reads names by their strings may read any, later
            if i not in changed and (reads[i] & tainted or dynamic[i]) and not binds[i] <= tainted:
                tainted |= binds[i]
                grew = True
    return max(i for i in range(first, len(cells)) if i in changed or reads[i] & tainted)


def _names_in(python: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(python)) if isinstance(node, ast.Name)}
