"""nbgrader's Execute that tells the judge which graded test cell is running.

The judge (grader.judge.server) answers only while a graded test cell runs, and only
for the keys that cell checks. This preprocessor, outside the jail, is the one
that knows which cell the kernel is executing: before each cell it writes the
cell's grade_id (after nbgrader has put the lab's own test cells back) into
the judge's cell file, and clears it after. The file lies in the grader's
folder of the jail, which the kernel never sees. In the jail, it also reads
what the jail's processes wrote to each other while each cell ran (`MeasuresWire`).

JudgedSandboxedExecute, JudgedJailedExecute's name until the jail had one word, still
imports, with a FutureWarning, for an instructor's nbgrader_config.py that names it (deprecated).
"""
from __future__ import annotations

import os

from nbgrader.preprocessors import Execute

from grader.jail.kernel import JailedExecute, renamed

from . import loopback, wire
from .client import announce

CELL_FILE_ENV = "GRADER_JUDGE_CELL_FILE"


class AnnouncesCells:
    """Mixin for an Execute preprocessor: the running graded test cell, written for the judge."""

    def preprocess_cell(self, cell, resources, index):
        cell_file = os.environ.get(CELL_FILE_ENV)
        meta = cell.metadata.get("nbgrader", {})
        graded = cell.cell_type == "code" and meta.get("grade") and meta.get("grade_id")
        if cell_file:
            announce(cell_file, meta["grade_id"] if graded else None)
        try:
            return super().preprocess_cell(cell, resources, index)
        finally:
            if cell_file:
                announce(cell_file, None)


class MeasuresWire:
    """Mixin for the jailed Execute: what the jail's processes wrote to each other over TCP while
    each code cell ran, read from outside the jail (grader.judge.loopback), one line a cell in the
    grader's wire file. The jail's counters are opened at the first code cell, before any of the
    notebook's code runs, through the kernel's launcher."""

    def preprocess(self, nb, resources=None, km=None):
        self._net: loopback.JailNet | None = None
        self._net_tried = False
        try:
            return super().preprocess(nb, resources, km)
        finally:
            if self._net is not None:
                self._net.close()

    def _jail_net(self) -> loopback.JailNet | None:
        if not self._net_tried:
            self._net_tried = True
            if loopback.gpus_in_jail():
                print("[grader] the jail has GPUs, whose ranks talk NCCL (shared memory, and a TCP bootstrap of its "
                      "own that no record counts): no cell's traffic is checked against its records", flush=True)
                return None
            process = getattr(getattr(self.km, "provisioner", None), "process", None)
            try:
                self._net = loopback.JailNet(process.pid)
            except (ValueError, AttributeError, OSError) as error:  # the check is skipped, and the log says so
                print(f"[grader] the jail's network counters could not be read ({error}): "
                      "no cell's traffic is checked against its records", flush=True)
                return None
            why_not = self._net.without_loss_probes()
            if why_not:
                print(f"[grader] TCP's loss probes stay on in the jail ({why_not}): segments they send "
                      "again count in the allowance", flush=True)
        return self._net

    def preprocess_cell(self, cell, resources, index):
        path = os.environ.get(wire.WIRE_FILE_ENV)
        net = self._jail_net() if path and cell.cell_type == "code" else None
        before = net.read() if net else None
        try:
            return super().preprocess_cell(cell, resources, index)
        finally:
            if net:
                meta = cell.metadata.get("nbgrader", {})
                graded = meta.get("grade_id") if meta.get("grade") else None
                wire.write_cell(path, index, graded, net.read() - before)


class JudgedExecute(AnnouncesCells, Execute):
    """nbgrader's own Execute (grading without a jail, --unsafe: no wire to read)."""


class JudgedJailedExecute(AnnouncesCells, MeasuresWire, JailedExecute):
    """The jailed Execute (grader.jail.kernel), each cell's wire measured."""


__getattr__ = renamed(__name__, {"JudgedSandboxedExecute": "JudgedJailedExecute"})  # the deprecated name
