"""What grading costs over running: one complete, correct submission of every graded lab.

Side by side, in one run, lab by lab and round by round:

- run: the solution notebook executed headless in this interpreter's kernel,
  as a student runs it (grader.execute);
- grade: one `grader.grade` run on the same notebooks handed in as one
  student's complete submission, start to CSV: for each lab
  the sandbox, autograde (which runs every cell again), judge, verdict,
  feedback HTML.

The ratio grade/run of the whole submission is taken round by round; the course
promises at most 1.5×. Lab notebooks take minutes on a CPU: --rounds 1 is the
default.

    python bench/grading.py [--rounds 1] [--lab 01_single_gpu ...]
"""
import argparse
import csv as csv_module
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import nbformat

from course import grading
from grader import COURSE_ROOT, grade
from grader.workspace import gradable_labs
from grader.execute import execute

PROMISE = 1.5


def run_once(lab: str, tmp: Path) -> float:
    nb = nbformat.read(COURSE_ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    folder = tmp / "run" / lab
    folder.mkdir(parents=True, exist_ok=True)
    return execute(nb, folder, timeout=900, env={grading.DIR_ENV: str(COURSE_ROOT / "grader" / "reference")})


def grade_once(labs: list[str], tmp: Path) -> tuple[float, dict[str, float]]:
    """Seconds to grade the whole submission in one run, and each lab's share (from status.json)."""
    submissions, work = tmp / "submissions", tmp / "work"
    shutil.rmtree(submissions, ignore_errors=True)
    (submissions / "complete").mkdir(parents=True)
    for lab in labs:
        shutil.copyfile(COURSE_ROOT / "solutions" / lab / f"{lab}.ipynb", submissions / "complete" / f"{lab}.ipynb")
    started = time.perf_counter()
    csv = grade.grade(submissions, labs=labs, work=work, regrade=True, say=lambda *_: None)
    seconds = time.perf_counter() - started
    row = next(csv_module.DictReader(csv.open(encoding="utf-8")))
    for lab in labs:
        if row[f"{lab} score"] != row[f"{lab} max score"]:
            raise SystemExit(f"{lab}: the complete submission got {row[f'{lab} verdict']}")
    status = json.loads((work / "status.json").read_text())["complete"]
    return seconds, {lab: status[lab]["seconds"] for lab in labs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--lab", dest="labs", action="append", help="only this lab (repeatable)")
    args = parser.parse_args()
    labs = args.labs or list(gradable_labs(COURSE_ROOT))
    runs, grades, totals = {lab: [] for lab in labs}, {lab: [] for lab in labs}, []
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        # Once a term, not per student: the gradebook learns the labs' test cells.
        (Path(tmp) / "nobody").mkdir()
        started = time.perf_counter()
        grade.grade(Path(tmp) / "nobody", labs=labs, work=Path(tmp) / "work", say=lambda *_: None)
        setup_s = time.perf_counter() - started
        for _ in range(args.rounds):
            ran = {lab: run_once(lab, Path(tmp)) for lab in labs}
            total, per_lab = grade_once(labs, Path(tmp))
            for lab in labs:
                runs[lab].append(ran[lab])
                grades[lab].append(per_lab[lab])
            totals.append((sum(ran.values()), total))
    print(f"{'lab':<20} {'run s':>8} {'grade s':>8} {'grade/run':>10}   median of {args.rounds} round(s)")
    for lab in labs:
        run_s, grade_s = statistics.median(runs[lab]), statistics.median(grades[lab])
        print(f"{lab:<20} {run_s:8.1f} {grade_s:8.1f} {grade_s / run_s:9.2f}×")
    ratios = [g / r for r, g in totals]
    ratio = statistics.median(ratios)
    run_s, grade_s = statistics.median(r for r, _ in totals), statistics.median(g for _, g in totals)
    print(f"{'whole submission':<20} {run_s:8.1f} {grade_s:8.1f} {ratio:9.2f}×  (range {min(ratios):.2f}-"
          f"{max(ratios):.2f}; {'within' if ratio <= PROMISE else 'OVER'} the promised {PROMISE}×)")
    print(f"once per class, before: the gradebook learns the labs ({setup_s:.1f} s)")
    print("grade s of the whole submission: one `grade` run, start to CSV (every lab's "
          "sandbox, autograde, judge, feedback); a lab's: its share, from status.json")


if __name__ == "__main__":
    main()
