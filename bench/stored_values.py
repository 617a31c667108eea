"""Do the hidden tests' stored values hold on this machine? A grade must not depend on it.

For each graded lab, the solution notebook runs as `python -m grader reference
--check` runs it (grader.reference.record: seed 0, every `REFERENCE.check`
recording its value and the ranks it was checked on), and what it recorded is
compared with grader/reference/, recorded on the course's 2-core CPU machine:
under each check's own tolerance, at least float32's for floating-point values
(course.grading.ACROSS_MACHINES), counts and other integers exactly, and the
same ranks checked as many times. On a GPU the labs compute on it where they
do, so this is the course's "same answer everywhere" measured across devices.

It also holds the judge's rule on this device: a value arrives as whatever the
kernel sends (here a CUDA tensor), and is judged by what the reference is.

    python bench/stored_values.py [--labs 01_single_gpu ...] [--json PATH]
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
from _machine import describe, text
from _results import count, emit, headline_row

from course import check
from grader import GraderError
from grader.common.labs import find_labs, select
from grader.reference import compare, record

REPO = Path(__file__).resolve().parents[1]


def judged_by_kind(device: str) -> list[str]:
    """What the judge's comparison says of values sent from `device` (empty: as it should)."""
    wrong = []
    cases = [(torch.tensor(123_457, device=device), 123_457, True),
             (torch.tensor(123_457.0, device=device, dtype=torch.bfloat16), 123_457, False),
             (torch.tensor(0.3, device=device), 0.3, True),
             (torch.tensor(0.3, device=device, dtype=torch.bfloat16), 0.3, False),
             (torch.tensor(float("inf"), device=device, dtype=torch.float16), 70_000.0, False)]
    for sent, reference, passes in cases:
        try:
            check.assert_close(sent, reference, "value", by_expected_kind=True)
            passed = True
        except AssertionError:
            passed = False
        if passed != passes:
            wrong.append(f"{sent!r} against {reference!r}: {'passed' if passed else 'failed'}")
    return wrong


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--labs", nargs="*", default=[], help="labs to check (default: every graded lab)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    machine = describe()
    labs = [lab for lab in select(find_labs(REPO), args.labs) if lab.points]
    rows, figures, drifted = [], [], 0
    with tempfile.TemporaryDirectory(prefix="stored-values-") as fresh:
        for lab in labs:
            started = time.perf_counter()
            try:
                record(lab, Path(fresh), REPO)
                problems = compare(REPO / "grader" / "reference", Path(fresh), [lab.name])
            except GraderError as e:   # the solution itself failed here: the cell's last error line says why
                lines = [line for line in str(e).splitlines() if re.match(r"\w+(Error|Exception): ", line)]
                problems = [f"the solution failed here: {lines[-1].strip() if lines else str(e)[:200]}"]
            seconds = time.perf_counter() - started
            drifted += bool(problems)
            rows.append(f"| `{lab.name}` | {seconds:.0f} s | {'yes' if not problems else 'no'} | "
                        f"{'; '.join(problems)[:400] or '-'} |")
            figures.append({"lab": lab.name, "seconds": round(seconds, 1), "problems": problems})
            print(rows[-1], file=sys.stderr, flush=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    wrong = judged_by_kind(device)
    markdown = "\n".join([
        "Each graded solution run as `grader reference --check` runs it (seed 0), its checked values compared "
        "with grader/reference/ (recorded on the 2-core CPU machine) under each check's tolerance, at least "
        "float32's; counts exactly; the same ranks, as many times.", "",
        "| lab | run | agrees | differences |", "|---|---|---|---|", *rows, "",
        f"The judge's comparison of values sent as {device} tensors, by the reference's kind: "
        + ("as it should, in all 5 cases." if not wrong else "WRONG: " + "; ".join(wrong)), "",
        f"({text(machine)})"])
    emit(args.json, title="Stored values on this machine", markdown=markdown,
         headline=[headline_row("labs whose stored values hold here", f"{len(labs) - drifted} of {len(labs)}",
                                count(1, "run"))],
         figures={"machine": machine, "labs": figures, "judged_by_kind_wrong": wrong})
    sys.exit(1 if drifted or wrong else 0)


if __name__ == "__main__":
    main()
