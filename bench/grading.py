"""What grading costs over running: one complete, correct submission of every graded lab.

Side by side, in one run, lab by lab and round by round:

- run: the solution notebook executed headless in this interpreter's kernel,
  as a student runs it (grader.common.execute);
- grade: one `grader.grade` run on the same notebooks handed in as one
  student's complete submission, start to CSV: for each lab
  the jail, autograde (which runs every cell again), judge, verdict,
  feedback HTML.

The ratio grade/run of the whole submission is taken round by round; the course
promises at most 1.5×. Lab notebooks take minutes on a CPU: --rounds 1 is the
default. With --runs-from LABS_JSON (what `bench/labs.py --json` wrote, earlier
in the same report run), the run side is taken from there instead of executed
again: the same notebooks executed the same way, at the same sizes, on one
round; every round then uses those runs, and the report says so. With --grades-from GRADING_COST_JSON (what
`bench/grading_cost.py --json` wrote, earlier in the same report run), the grade side is taken from there:
each lab's recording plus its honest submission graded, each lab a grading run of its own, so that every lab
pays a run's start-up where one run of the whole submission pays it once: the sum is at or above one run's.

    python bench/grading.py [--rounds 1] [--lab 01_single_gpu ...] [--runs-from LABS_JSON]
                            [--grades-from GRADING_COST_JSON] [--json PATH]
"""
import argparse
import csv as csv_module
import json
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import nbformat
from _results import count, emit, headline_row
from _rounds import spread, spread_text

from course import grading
from grader import COURSE_ROOT, grade
from grader.common.execute import execute
from grader.grading.workspace import gradable_labs

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


def reused_runs(labs_json: Path | None, labs: list[str]) -> dict[str, float]:
    """{lab: seconds} of bench/labs.py's successful runs at default ranks, for the labs asked."""
    if labs_json is None:
        return {}
    rows = json.loads(labs_json.read_text(encoding="utf-8"))["figures"]["runs"]
    return {r["lab"]: r["seconds"]["median"] for r in rows
            if r["lab"] in labs and not r["env"] and "seconds" in r}


def reused_grades(grading_cost_json: Path | None, labs: list[str]) -> dict[str, float]:
    """{lab: seconds} of bench/grading_cost.py's recording plus honest submission, for the labs asked."""
    if grading_cost_json is None:
        return {}
    figures = json.loads(grading_cost_json.read_text(encoding="utf-8"))["figures"]
    for lab, run in figures["honest"].items():
        for submission in run["submissions"].values():
            score = re.search(r"graded: ([\d.]+) of ([\d.]+) points", submission["verdict"])
            if not score or score.group(1) != score.group(2):
                raise SystemExit(f"{lab}: grading_cost.py's honest submission got {submission['verdict'][:300]}")
    return {lab: figures["recording"][lab]["seconds"] + figures["honest"][lab]["seconds"]
            for lab in labs if lab in figures["honest"] and lab in figures["recording"]}


def markdown(labs, runs, grades, totals, reused, setup_s, rounds, grades_reused=False) -> str:
    executed = [lab for lab in labs if lab not in reused]
    sources = ([f"run of {', '.join(f'`{lab}`' for lab in reused)}: bench/labs.py's, earlier in this report "
                "run (1 run each, used by every round)"] if reused else []) + \
              ([f"run of {', '.join(f'`{lab}`' for lab in executed)}: executed here, each round"] if executed else [])
    source = "; ".join(sources)
    grade_source = ("Grade: bench/grading_cost.py's, earlier in this report run: each lab's recording and its "
                    "honest submission, graded start to CSV (jail, autograde, judge, feedback), each lab a `grade` "
                    "run of its own (each paying a run's start-up, which one run of all the labs pays once)"
                    if grades_reused else
                    "Grade: one `grade` run on all of them, start to CSV (jail, autograde, judge, feedback), a "
                    "lab's share from status.json")
    lines = [f"One complete, correct submission of the graded labs below. {grade_source}; {source}. "
             f"{count(rounds, 'round')}" + ("; median (min-max)." if rounds > 1 else "."), "",
             "| lab | run | grade | grade / run |", "|---|---|---|---|"]
    for lab in labs:
        run_s, grade_s = statistics.median(runs[lab]), spread(grades[lab])
        lines.append(f"| `{lab}` | {run_s:.1f} s | {spread_text(grade_s, '{:.1f}', ' s')} | "
                     f"{grade_s['median'] / run_s:.2f}× |")
    ratio = spread(g / r for r, g in totals)
    lines += [f"| whole submission | {statistics.median(r for r, _ in totals):.1f} s | "
              f"{spread_text(spread(g for _, g in totals), '{:.1f}', ' s')} | {spread_text(ratio, '{:.2f}', '×')}; "
              f"{'within' if ratio['median'] <= PROMISE else '**over**'} the promised {PROMISE}× |", "",
              f"Once per class, before: the gradebook learns the labs ({setup_s:.1f} s)." if setup_s is not None else
              "Each lab's grading run above includes its gradebook learning the lab."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--lab", dest="labs", action="append", help="only this lab (repeatable)")
    parser.add_argument("--runs-from", type=Path, metavar="LABS_JSON",
                        help="take the run times from bench/labs.py's --json output instead of running again")
    parser.add_argument("--grades-from", type=Path, metavar="GRADING_COST_JSON",
                        help="take the grade times from bench/grading_cost.py's --json output instead of grading")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    for option, path, script in (("--runs-from", args.runs_from, "labs.py"),
                                 ("--grades-from", args.grades_from, "grading_cost.py")):
        if path is not None and not path.is_file():
            parser.error(f"{option} {path}: no such file; write it first with "
                         f"`python bench/{script} --json {path}`, or leave the option out")
    labs = args.labs or list(gradable_labs(COURSE_ROOT))
    reused = reused_runs(args.runs_from, labs)
    graded = reused_grades(args.grades_from, labs)
    if args.grades_from is not None and set(graded) != set(labs):
        parser.error(f"--grades-from {args.grades_from} has no grade of {sorted(set(labs) - set(graded))}")
    runs, grades, totals = {lab: [] for lab in labs}, {lab: [] for lab in labs}, []
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        # Once a term, not per student: the gradebook learns the labs' test cells (in grading_cost.py's runs,
        # when their grades are reused).
        setup_s = None
        if not graded:
            (Path(tmp) / "nobody").mkdir()
            started = time.perf_counter()
            grade.grade(Path(tmp) / "nobody", labs=labs, work=Path(tmp) / "work", say=lambda *_: None)
            setup_s = time.perf_counter() - started
        for _ in range(args.rounds):
            ran = {lab: reused[lab] if lab in reused else run_once(lab, Path(tmp)) for lab in labs}
            total, per_lab = (sum(graded.values()), graded) if graded else grade_once(labs, Path(tmp))
            for lab in labs:
                runs[lab].append(ran[lab])
                grades[lab].append(per_lab[lab])
            totals.append((sum(ran.values()), total))
    ratio = spread(g / r for r, g in totals)
    run_s, grade_s = statistics.median(r for r, _ in totals), statistics.median(g for _, g in totals)
    emit(args.json, title="Grading against running", markdown=markdown(labs, runs, grades, totals, reused, setup_s,
                                                                      args.rounds, bool(graded)),
         headline=[headline_row("grade / run, one complete submission of every graded lab",
                                f"{spread_text(ratio, '{:.2f}', '×')} (run {run_s:.0f} s, grade {grade_s:.0f} s; "
                                f"promise ≤ {PROMISE}×)",
                                count(args.rounds, "round") + (", runs reused from labs.py" if reused else "")
                                + (", grades from grading_cost.py" if graded else ""))],
         figures={"rounds": args.rounds, "reused_runs": sorted(reused), "grades_reused": bool(graded),
                  "setup_s": setup_s, "runs_s": runs,
                  "grades_s": grades, "whole": [{"run_s": r, "grade_s": g} for r, g in totals], "ratio": ratio})


if __name__ == "__main__":
    main()
