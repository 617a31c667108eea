"""What happened to one submission, in plain words: for the CSV and the feedback.

`lines` reads the submitted notebook (what the student changed in the test
cells), the autograded one (what every cell raised, what was cut short) and
the judge's findings, and says each thing once, naming the cell.
"""
from __future__ import annotations

import builtins
import html
import re
from pathlib import Path

from grader.common.labs import source_text
from grader.common.quoting import quoted
from grader.jail.bwrap import JAIL_COURSE, JAIL_HOME, WRITABLE_INSIDE, Limits
from grader.jail.host import JailUsage
from grader.jail.kernel import NOTEBOOK_OUTPUT_NOTE, OUTPUT_NOTE

MAX_LINE = 240
MAX_LINES = 12
HIDDEN_PARTS = ("solutions", "reference", "gradebook", "grader/work")
# The grader's own words about a size (grader.jail.kernel.megabytes): a cell that prints the note itself adds no other.
_OUTPUT_NOTE_RE = re.compile(re.escape(OUTPUT_NOTE.split("{")[0])
                             + r"((?:more than )?[0-9.]+ [kM]B(?: in one output)?); only")
_NOTEBOOK_NOTE_RE = re.compile(re.escape(NOTEBOOK_OUTPUT_NOTE.split("{")[0]) + r"[0-9.]+ [kM]B; this cell")


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


#: Exception names shown as they are: Python's own. Any other name is one the student's code could have
#: made (`type("graded_19_of_19", (Exception,), {})`), so it is quoted like everything else it wrote.
PYTHON_EXCEPTIONS = frozenset(name for name, value in vars(builtins).items()
                              if isinstance(value, type) and issubclass(value, BaseException))


def _exception_name(ename: str) -> str:
    """A Python exception's name as it is; anything else, which a submission could have named, quoted."""
    return ename if ename in PYTHON_EXCEPTIONS else quoted(ename, 60)


def could_not(step: str, error: BaseException) -> str:
    """The verdict's words for a step of grading that failed; only the exception's type, as the
    student sees it too (its message may name the grader's own paths)."""
    return f"the grader could not {step}: {type(error).__name__}"


def tampering(submitted: dict, released: dict, tests: list[str]) -> list[str]:
    """What the student did to the test cells, each put right by nbgrader before grading."""
    original = {_grade_id(c): c for c in released.get("cells", []) if _grade_id(c) in tests}
    found = {_grade_id(c): c for c in submitted.get("cells", []) if _grade_id(c) in tests}
    out = []
    for gid in tests:
        cell = found.get(gid)
        if cell is None:
            out.append(f"test cell {gid} was missing; the original was put back and graded")
            continue
        if gid in original and source_text(cell).strip() != source_text(original[gid]).strip():
            out.append(f"test cell {gid} was edited; the original was graded instead")
        if "skip-execution" in cell.get("metadata", {}).get("tags", []):
            out.append(f"the skip-execution tag on test cell {gid} was ignored; the test ran")
    return out


def unmatchable(submitted: dict) -> str | None:
    """Why nbgrader cannot match this notebook's cells to the lab's tests (None: it can)."""
    if any(c.get("metadata", {}).get("nbgrader") for c in submitted.get("cells", [])):
        return None
    return ("the notebook's grading metadata was removed, so its answers cannot be matched to the "
            "tests; download the lab again and copy the answers into it")


NOT_ENFORCED = "on this machine the memory of the jail's processes together was not limited"


def memory_limit(limits: Limits, usage: JailUsage | None = None) -> str:
    """The memory limit as the verdict names it: of the whole jail (a cgroup, or the grader's
    watchdog), or per process only (rlimits), which the verdict says plainly."""
    if usage is None or usage.per_jail:
        return f"the {limits.memory_bytes / 2**30:g} GiB memory limit of its jail"
    return f"the {limits.memory_bytes / 2**30:g} GiB memory limit per process; {NOT_ENFORCED}"


def _peak(usage: JailUsage) -> str:
    return f" (peak {usage.memory_peak / 2**30:.2f} GiB)" if usage.memory_peak else ""


def why_died(console: str, limits: Limits, usage: JailUsage | None = None) -> str:
    """Why the kernel died, as a clause ('' when nothing says): the jail's cgroup or watchdog first, then
    its console."""
    if usage is not None and usage.oom_killed:
        return f": it was killed for using more than {memory_limit(limits, usage)}{_peak(usage)}"
    if (usage is not None and usage.pids_limit_hit) or "Resource temporarily unavailable" in console \
            or "Thread creation failed" in console:
        return f": it started too many processes or threads (the limit is {limits.processes})"
    if usage is not None and usage.memory_limit_hit:
        return f": it ran into {memory_limit(limits, usage)}{_peak(usage)}"
    if "Segmentation fault" in console:
        return ": a segmentation fault"
    if "Fatal Python error" in console:
        line = next(x for x in console.splitlines() if "Fatal Python error" in x)
        return f": {quoted(line, 120)} ({memory_limit(limits, usage)})"
    if usage is not None and not usage.per_jail:  # the machine itself may have run out
        return (f" (it crashed, or was killed for using too much of something; memory was limited to "
                f"{limits.memory_bytes / 2**30:g} GiB per process, and {NOT_ENFORCED})")
    return " (it crashed, or was killed for using too much of something)"


def _where(cell, index: int) -> str:
    gid = _grade_id(cell)
    if gid:
        return f"cell {gid}"
    first = next((line.strip() for line in source_text(cell).splitlines() if line.strip()), "")
    return f"cell {index + 1} {quoted(first, 40)}"


def _outside_paths(evalue: str) -> list[str]:
    """Absolute paths an OSError names that are not the jail's own.

    The working folder and the course are the jail's own. /tmp and /dev/shm exist in
    the jail, empty: a file directly in them is the jail's, but a missing folder under
    them is most likely a host path (a clone of the course in /tmp, say).
    """
    own = [JAIL_HOME, JAIL_COURSE]
    scratch = [p for p in WRITABLE_INSIDE if p not in own]
    outside = []
    for path in re.findall(r"'(/[^']*)'", evalue):
        if any(path == o or path.startswith(o + "/") for o in own):
            continue
        if any(str(Path(path).parent) == s for s in scratch):
            continue
        outside.append(path)
    return outside


def explain_error(output: dict, limits: Limits, cell_timeout: float | None) -> str:
    """An error output as the reason a cell stopped, in plain words."""
    ename, evalue = output.get("ename", "Error"), str(output.get("evalue", ""))
    text = f"{ename}: {evalue}"
    said = f"{_exception_name(ename)}: {quoted(evalue)}" if evalue.strip() else _exception_name(ename)
    if ename in ("CellTimeoutError", "KeyboardInterrupt"):  # only the grader interrupts a cell
        limit = f"the {cell_timeout:g} s limit" if cell_timeout else "its time limit"
        return f"ran past {limit} for one cell and was stopped (an endless loop, or ranks waiting on each other)"
    if ename == "MemoryError" or "allocate memory" in evalue or "DefaultCPUAllocator" in evalue:
        # An allocation refused inside a process is RLIMIT_DATA's doing; the jail's cgroup kills instead.
        return f"ran out of memory (the limit is {limits.memory_bytes / 2**30:g} GiB per process)"
    if "Resource temporarily unavailable" in evalue or "can't start new thread" in evalue:
        return f"started too many processes or threads (the limit is {limits.processes})"
    if any(words in evalue for words in ("Network is unreachable", "Connection refused",
                                          "Temporary failure in name resolution")):
        return "tried to reach the network, which graded code cannot"
    if "Read-only file system" in evalue or (ename == "PermissionError" and "denied" in evalue):
        return f"tried to write outside its own folder, which graded code cannot ({quoted(text, 120)})"
    if ename in ("FileNotFoundError", "PermissionError") and any(p in evalue for p in HIDDEN_PARTS):
        return "tried to read the course's solutions, reference answers or gradebook, which graded code cannot see"
    if ename == "FileNotFoundError" and _outside_paths(evalue):  # the jail has no such folder
        return f"tried to write outside its own folder, or to read a file graded code cannot see ({quoted(text, 120)})"
    return f"raised {said}"


def execution(autograded: dict, tests: list[str], limits: Limits, cell_timeout: float | None,
              usage: JailUsage | None = None) -> list[str]:
    """Every cell that raised or was cut short, and every failed test."""
    out = []
    for index, cell in enumerate(autograded.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                reason = explain_error(output, limits, cell_timeout)
                if _grade_id(cell) in tests and reason.startswith("raised AssertionError"):
                    reason = "failed" + (": " + reason.removeprefix("raised AssertionError: ")
                                         if reason != "raised AssertionError" else "")
                out.append(f"{_where(cell, index)} {reason}")
                break
        for output in cell.get("outputs", []):
            note = _OUTPUT_NOTE_RE.search(str(output.get("text", "")))
            if output.get("output_type") == "stream" and note:
                out.append(f"{_where(cell, index)} printed {note.group(1)}; only the first "
                           f"{limits.output_bytes >> 10} kB are kept in the graded notebook")
            elif output.get("output_type") == "stream" and _NOTEBOOK_NOTE_RE.search(str(output.get("text", ""))):
                out.append(f"{_where(cell, index)}: its output past the notebook's "
                           f"{limits.notebook_output_bytes >> 10} kB in all is not kept in the graded notebook")
    if usage is not None and usage.oom_killed:  # a rank or child, since the kernel lived
        out.append(f"a process was killed for using more than {memory_limit(limits, usage)}{_peak(usage)}")
    return out


def lines(*, graded: bool, why_not: str = "", score: float | None = None, max_score: float = 0,
          tampered: list[str] = (), ran: list[str] = (), unverified: dict[str, str] | None = None,
          judged: dict[str, str] | None = None, withheld: str | None = None) -> list[str]:
    """The verdict: first line graded or not, then what happened, most important first.

    judged: {grade_id: the judge's comparison that failed}: what the kernel was not told;
    withheld: withheld_line's words, if the scan withheld points.
    """
    head = f"graded: {score:g} of {max_score:g} points" if graded else f"not graded: {why_not}"
    # The scan's lines that cost nothing (grader.judge.tampering.Flag, withholds False) come last: past the
    # cap, what the jail saw and what the judge found matter more than a builtin outside the allowlist.
    listed = [line for line in tampered if getattr(line, "withholds", True) is False]
    out = [head, *([withheld] if withheld else []),
           *(line for line in tampered if getattr(line, "withholds", True) is not False)]
    out += [f"test cell {gid} gets no points: {why}" for gid, why in (unverified or {}).items()]
    out += list(ran)
    out += [f"test cell {gid}, the grader's check: {detail}" for gid, detail in (judged or {}).items()]
    out += listed
    return [fitted(line) for line in _capped(out)]


def withheld_line(points: float, cells: list[str], flag: str) -> str | None:
    """The verdict's line on test cells whose points a flag of the tampering scan withholds (None: none).

    flag: the flag's cell, line and what it found (grader.judge.tampering.Flag.said). The cells score 0 as
    a manual score in the gradebook; formgrader's Manual Grading shows that 0 in each cell's score box
    (its autograded score greyed behind it), and emptying the box gives the autograded points back.
    """
    if not cells:
        return None
    return (f"{points:g} point{'' if points == 1 else 's'} withheld pending the instructor's review: {flag}; "
            "to give them back, empty their score boxes in formgrader's Manual Grading; "
            f"test cell{'' if len(cells) == 1 else 's'} {', '.join(cells)}")


def fitted(line: str, limit: int = MAX_LINE) -> str:
    """`line` on one line within `limit` characters, cut where it loses least: its last clauses
    ("; " apart, outside the «» of a submission's words) dropped whole, then at a space. So a
    failed check keeps "(got 0.016, expected 0.032)" together and drops its tolerance first."""
    text = " ".join(str(line).split())
    if len(text) <= limit:
        return text
    clauses, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "«") - (char == "»")
        if depth == 0 and text.startswith("; ", i):
            clauses.append(text[start:i])
            start = i + 2
    clauses.append(text[start:])
    while len(clauses) > 1 and len("; ".join(clauses)) + len("; …") > limit:
        clauses.pop()
    if len(clauses) > 1 or len(clauses[0]) + len("; …") <= limit:
        return "; ".join(clauses) + "; …"
    cut = clauses[0][: limit - 2]
    cut = cut[: cut.rfind(" ")] if " " in cut else cut
    return cut + "…" + ("»" if cut.count("«") > cut.count("»") else "")


def _capped(out: list[str]) -> list[str]:
    """At most MAX_LINES lines, the last saying how many more there were."""
    return out if len(out) <= MAX_LINES else out[: MAX_LINES - 1] + [f"… and {len(out) - MAX_LINES + 1} more"]


def written_line(given: float, pending: float, max_score: float, unanswered: int = 0) -> str | None:
    """The verdict's line on the answers graded by hand (None for a lab without any): pending points
    are neither a zero nor part of the autograded score, which is what the code earned."""
    if not max_score:
        return None
    blank = f"; {unanswered} left unanswered (0 points)" if unanswered else ""
    if pending:
        return (f"{pending:g} points await manual grading in formgrader (written answers, "
                f"{max_score:g} points in all; {given:g} given so far{blank})")
    return f"written answers: {given:g} of {max_score:g} points, graded by hand{blank}"


def with_written(verdict: list[str], line: str | None) -> list[str]:
    """The verdict with the written answers' line second, after the autograded score."""
    if not line:
        return list(verdict)
    return _capped([verdict[0], fitted(line), *verdict[1:]])


def as_text(verdict: list[str]) -> str:
    return "; ".join(verdict)


def write_page(path: Path, student: str, lab: str, verdict: list[str]) -> Path:
    """The feedback page of a submission that nbgrader could not grade (it writes none)."""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in verdict[1:])
    page = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(lab)}: {html.escape(student)}"
            f"</title></head><body><h1>{html.escape(lab)}</h1><p><b>{html.escape(verdict[0])}</b></p>"
            f"<ul>{items}</ul><p>Ask your instructor if you think this is wrong.</p></body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
