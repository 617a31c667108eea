"""The release's stubs, each naming what the student writes: nbgrader's ClearSolutions, with
its one stub for every cell (``raise NotImplementedError()``) told which function or method
it stands in, so that an untouched exercise fails with, e.g.,

    NotImplementedError: memory_by_kind is yours to write: replace these two lines with your code

instead of a bare ``NotImplementedError:``. ``nbgrader_config.py`` puts it in
``GenerateAssignment``'s place for ClearSolutions; the checksums nbgrader takes after it are
of these stubs, so the gradebook and the release agree.
"""
from __future__ import annotations

import re

from nbgrader.preprocessors import ClearSolutions

_DEFINITION = re.compile(r"^(\s*)(?:async\s+)?(def|class)\s+(\w+)")


def enclosing_name(lines: list[str], index: int) -> str | None:
    """The function (as Class.method inside a class) around lines[index], by indentation; None at top level."""
    depth = len(lines[index]) - len(lines[index].lstrip())
    names = []
    for line in reversed(lines[:index]):
        found = _DEFINITION.match(line)
        if found and len(found.group(1)) < depth:
            names.append(found.group(3))
            depth = len(found.group(1))
    return ".".join(reversed(names)) or None


def named(stub_raise: str, name: str | None) -> str:
    """The stub's raise with a message saying what to write."""
    what = f"{name} is yours to write" if name else "this cell's answer is yours to write"
    return stub_raise.replace("NotImplementedError()",
                              f'NotImplementedError("{what}: replace these two lines with your code")')


class NamedStubs(ClearSolutions):
    """ClearSolutions whose code stubs name the function they stand in."""

    def _replace_solution_region(self, cell, language: str) -> bool:
        replaced = super()._replace_solution_region(cell, language)
        stub = self.code_stub[language].split("\n")
        if not replaced or cell.cell_type != "code" or len(stub) != 2 or not stub[1].endswith("NotImplementedError()"):
            return replaced
        lines = cell.source.split("\n")
        for i in range(1, len(lines)):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            if lines[i] == indent + stub[1] and lines[i - 1] == indent + stub[0]:
                lines[i] = indent + named(stub[1], enclosing_name(lines, i))
        cell.source = "\n".join(lines)
        return replaced
