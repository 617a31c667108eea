"""What the jail's processes wrote to each other, read from outside, against what their records say.

grader.judge.judged_execute reads the jail's network counters (grader.judge.loopback) before
and after each cell (`write_cell`: a JSON line a cell in WIRE_FILE, in the grader's folder of
the jail). After each launch, course._wire_records tells the judge what the launch's records
account for (the bytes each record predicts by its formula), and the judge logs it with the
running cell. `findings` compares the two for each graded test cell: the wire's payload (lo's
bytes less the IP and TCP headers of every segment) beyond the records' bytes plus
`allowance` loses the cell its points. The cells outside graded test cells are compared
together, and only flagged: they have no points, and the labs' test cells launch the ranks
whose results they check.

The allowance is what honest ranks write that no record predicts, measured on this machine
(torch 2.x, gloo, a process a rank, lo's MTU 65536) over every launch of the labs' solutions
(labs 2 to 8, each run at COURSE_RANKS 2, 3 and 4: 479 launches of 1 to 6 ranks, every
collective and message the labs use) and course.comm.every_collective on 2, 3 and 4 ranks;
the most an honest launch wrote was 0.73 of its allowance:
- gloo's header on each message, 48 bytes: at most 47.96 bytes measured a segment of data
  first sent (TCPOrigDataSent, counted outside), PER_MESSAGE allowed for each such segment and
  each record (a record's message may share a segment with another);
- gloo's handshake of each connection (ActiveOpens, counted outside): 24 to 38 bytes
  measured, PER_CONNECTION allowed;
- each segment TCP sends again: on a loopback these are tail loss probes, spurious (the
  receiver held its socket's lock, descheduled), up to 64 kB each, in 155 of the 479 launches
  and up to 14 in one. grader.judge.loopback turns them off in the jail's namespace (then none,
  and a lab's bytes the same from run to run); where one is sent all the same, it is allowed
  2 x the largest record's bytes + 4 kB, at most 64 kB (what every resent segment measured fitted);
- in proportion to the records' bytes (a formula a little under what gloo sends on large
  tensors): at most 0.03 % measured, SHARE allowed.

What the records say is the kernel's word: a kernel that forges them (course.launch's
message, or the recorder's records) with as many bytes as it sent passes this check.
It catches work done outside recorded calls where the records claim what a recorded
algorithm would have sent (a ring's messages, forged, around one all_gather_object),
and traffic with no records at all (a socket of the student's own), once the difference
passes the allowance: traffic of its own sent in segments of at most PER_MESSAGE bytes
hides in it. What travels outside TCP (a unix socket, a pipe, shared memory, a
file) is not seen. A jail with GPUs is not checked: NCCL moves tensors through shared
memory and sets itself up over TCP, neither of which the records count.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .client import Finding
from .loopback import Counters

WIRE_FILE_ENV = "GRADER_WIRE_FILE"   # where judged_execute writes each cell's counters (the grader's folder)

PER_CONNECTION = 64                  # gloo's handshake: 24 to 38 bytes measured a connection
PER_MESSAGE = 64                     # gloo's header of each message (48 bytes): 47.96 measured a data segment
SHARE = 0.01                         # the formulas' shortfall on large tensors: 0.03 % measured
#: A segment sent again (a tail loss probe, spurious on a loopback: the receiver had it) carries at most
#: an MSS of lo's MTU, and, measured, at most twice the largest record's bytes plus RESENT_SLACK.
SEGMENT_BYTES, RESENT_OF_LARGEST, RESENT_SLACK = 65536, 2, 4096
#: A cell's own: a segment whose header is not the 52 bytes assumed (a handshake's, a reset's) or a stray
#: from the cell before (a last ACK) must never fail a cell that launched nothing.
STRAY_BYTES = 4096
MAX_RECORDED_BYTES = 1 << 50         # a records message claiming more is not a number of bytes

# --------------------------------------------------------------------------
# What the judge logs of a launch's records
# --------------------------------------------------------------------------

def records_entry(request: dict) -> dict | None:
    """The judge's log entry for course._wire_records' message (without the cell), or None if
    it is not one: whole, finite, non-negative numbers only."""
    numbers = {}
    for name in ("bytes", "largest", "records", "ranks"):
        value = request.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= MAX_RECORDED_BYTES:
            return None
        numbers[name] = value if name in ("bytes", "largest") else int(value)
    return {"op": "records", **numbers}


# --------------------------------------------------------------------------
# Each cell's wire, and the comparison
# --------------------------------------------------------------------------

def _private(path: Path, flags: int) -> int:
    """A file of the grader's alone (0600), never through a link."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | flags, 0o600)


def write_cell(path: Path, index: int, grade_id: str | None, wire: Counters) -> None:
    """One cell's traffic (counters after less before), appended to the wire file."""
    with os.fdopen(_private(path, os.O_APPEND), "a", encoding="utf-8") as out:
        out.write(json.dumps({"index": index, "cell": grade_id, **asdict(wire)}) + "\n")


def read_cells(path: Path) -> list[dict]:
    if not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def allowance(recorded_bytes: float, largest: float, records: int, wire: Counters) -> float:
    """Bytes of payload beyond the records' that honest ranks may write while `wire` was counted
    (module docstring): a few stray bytes, gloo's header on each message (a data segment carries at least one of a
    collective's messages, a record's message may share one), each connection's handshake, each
    segment sent again, and a share of the records' bytes."""
    resent = min(SEGMENT_BYTES, RESENT_OF_LARGEST * largest + RESENT_SLACK)
    return (STRAY_BYTES + PER_MESSAGE * (max(wire.data_segments, 0) + records)
            + PER_CONNECTION * max(wire.connections, 0) + resent * max(wire.retransmitted, 0) + SHARE * recorded_bytes)


def megabytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if abs(n) >= 10_000 else f"{n:,.0f} bytes"


@dataclass(frozen=True)
class CellWire:
    """One cell's traffic and records, compared."""
    cell: str | None
    wrote: int            # payload bytes on the jail's loopback while it ran
    recorded: float       # what its launches' records account for
    allowed: float        # the allowance beyond them

    @property
    def excess(self) -> float:
        return self.wrote - self.recorded - self.allowed

    def why(self) -> str:
        return (f"its ranks wrote {megabytes(self.wrote)} to each other, of which their records account for "
                f"{megabytes(self.recorded)} (allowance {megabytes(self.allowed)}): not all of its work went "
                "through recorded calls")


def compare(cells: list[dict], judge_entries: list[dict], graded: set[str] | None = None) -> list[CellWire]:
    """Each graded test cell's wire against its records; then the other cells' together (cell None).
    graded: the lab's graded test cells (None: every cell the wire file names); a cell the student
    marked graded itself counts with the others."""
    if graded is not None:
        cells = [{**row, "cell": row["cell"] if row["cell"] in graded else None} for row in cells]
        judge_entries = [{**e, "cell": e.get("cell") if e.get("cell") in graded else None} for e in judge_entries]
    records: dict[str | None, list[dict]] = {}
    for entry in judge_entries:
        if entry.get("op") == "records":
            records.setdefault(entry.get("cell"), []).append(entry)
    wire: dict[str | None, Counters] = {}
    for row in cells:
        counted = Counters(**{name: int(row.get(name, 0)) for name in Counters.__dataclass_fields__})
        wire[row["cell"]] = wire.get(row["cell"], Counters()) + counted
    out = []
    for cell in sorted(wire, key=lambda c: (c is None, c or "")):
        mine, counted = records.get(cell, []), wire[cell]
        recorded = sum(e["bytes"] for e in mine)
        largest = max((e["largest"] for e in mine), default=0.0)
        records_made = sum(e["records"] for e in mine)
        out.append(CellWire(cell, counted.payload, recorded, allowance(recorded, largest, records_made, counted)))
    return out


def findings(cells: list[dict], judge_entries: list[dict],
             graded: set[str] | None = None) -> tuple[dict[str, Finding], list[str]]:
    """({grade_id: a failed Finding} for each graded test cell whose ranks wrote more than their records
    and the allowance, [a flag for the cells outside graded test cells that did so together])."""
    return _over(compare(cells, judge_entries, graded))


def _over(compared_cells: list[CellWire]) -> tuple[dict[str, Finding], list[str]]:
    """`findings` of cells compared already."""
    failed, flags = {}, []
    for compared in compared_cells:
        if compared.excess <= 0:
            continue
        if compared.cell is None:
            flags.append(f"outside its graded test cells, {compared.why()} (flagged for the instructor)")
        else:
            failed[compared.cell] = Finding(False, compared.why())
    return failed, flags


def with_wire(judged: dict[str, Finding], wire_failed: dict[str, Finding]) -> dict[str, Finding]:
    """The judge's findings, with each cell the wire check failed failing too (the judge's reason first)."""
    out = dict(judged)
    for cell, finding in wire_failed.items():
        if cell not in out or out[cell].passed:
            out[cell] = finding
    return out


WIRE_FILE = "wire.jsonl"             # in the grader's folder of the jail, beside the judge's log
REPORT_FILE = "wire.log"             # each cell's comparison, for the instructor's logs


def judged(judge, folder: Path) -> tuple[dict[str, Finding], list[str]]:
    """The judge's findings with the wire check's (`findings`), and its flags, for a submission whose
    jail's folder is `folder`; each cell's comparison written to folder/REPORT_FILE."""
    entries, graded = judge.entries(), set(judge.required)
    cells = read_cells(Path(folder) / WIRE_FILE)
    compared = compare(cells, entries, graded)
    lines = [f"{'(outside graded test cells)' if c.cell is None else c.cell}: wrote {c.wrote:,} bytes, records "
             f"{c.recorded:,.0f}, allowance {c.allowed:,.0f}, excess {c.excess:,.0f}" for c in compared]
    with os.fdopen(_private(Path(folder) / REPORT_FILE, os.O_TRUNC), "w", encoding="utf-8") as out:
        out.write("".join(line + "\n" for line in lines) or "no cell measured\n")
    failed, flags = _over(compared)
    return with_wire(judge.findings(), failed), flags
