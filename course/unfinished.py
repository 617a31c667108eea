"""Which exercise to finish first, when a cell fails because one above is not written yet.

An untouched exercise raises the release's stub, `NotImplementedError("memory_by_kind is yours to
write: ...")` (grader/common/stubs.py). The cells after it that use what its cell would have made
then fail in ways that hide the cause: `NameError: name 'memory_table' is not defined`, a
`KeyError`, an empty table. In a notebook's kernel, `watch()` remembers each function whose stub
was raised, forgets it once a cell defines it again, and under any other error a cell raises
prints which of them to write first:

    This cell needs the exercises above it: memory_by_kind is not written yet. Write it, run its
    cell and the cells after it, then this one.

`import course` starts it in an IPython kernel (course.check, which every lab's setup imports,
calls `watch`); elsewhere (ranks, scripts, torchrun) nothing is registered.

Used by: course.check.
"""
from __future__ import annotations

import re

# The stub's message (grader/common/stubs.py): "<name> is yours to write: ..."
STUB_MESSAGE = re.compile(r"^([\w.]+) is yours to write")


def hint(unfinished: list[str]) -> str:
    """What to tell a student whose cell failed while these stubs are still unwritten."""
    if len(unfinished) == 1:
        return (f"This cell needs the exercises above it: {unfinished[0]} is not written yet. "
                "Write it, run its cell and the cells after it, then this one.")
    return (f"This cell needs the exercises above it: {', '.join(unfinished)} are not written yet. "
            "Write them, run their cells and the cells after them, then this one.")


class Unfinished:
    """The stubs raised so far in this kernel and not yet defined again, in the order they were met."""

    def __init__(self):
        self.names: list[str] = []

    def after_cell(self, result) -> None:
        """IPython's post_run_cell: remember a stub raised, forget one defined again, or give the hint."""
        source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        for name in list(self.names):   # a cell that defines the function (or its class) again
            if re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name.split('.')[0])}\b", source, re.M):
                self.names.remove(name)
        error = getattr(result, "error_in_exec", None)
        if error is None:
            return
        stub = STUB_MESSAGE.match(str(error)) if isinstance(error, NotImplementedError) else None
        if stub:
            if stub.group(1) not in self.names:
                self.names.append(stub.group(1))
        elif self.names:
            print(hint(self.names))


def watch(shell) -> Unfinished | None:
    """Register the watch on an IPython shell, once; None where there is no shell."""
    if shell is None:
        return None
    for existing in shell.events.callbacks.get("post_run_cell", []):
        if isinstance(getattr(existing, "__self__", None), Unfinished):
            return existing.__self__
    unfinished = Unfinished()
    shell.events.register("post_run_cell", unfinished.after_cell)
    return unfinished
