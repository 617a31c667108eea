"""What grading a class costs: seconds and core-seconds a submission, lab by lab, and the class's bill.

Measured on this machine, each step timed start to end and its CPU time read from /proc/stat (every core's
busy time, so that the jails' processes count however they were started: run it on an otherwise idle machine):

1. a lab's one-off recording (`grader.record`: the lab's solution on the run's seed, once a run, shared by
   every shard through --judge-values);
2. one honest submission of each graded lab (its solution handed in), graded alone with that recording reused,
   --jobs 1: the seconds and core-seconds a student's lab costs;
3. the scaling: SCALING_SUBMISSIONS honest submissions of one lab (SCALING_LAB) with --jobs 1 and then --jobs 2;
4. the slowest kinds, on the same lab: a submission with one exercise hanging (its test waits for the course's
   rank timeout, or the cell's limit where it calls the answer in the kernel), and one that floods its output
   (the grader's caps). With --for-report (`make bench`) only the hanging one, its cells stopped after
   REPORT_CELL_LIMIT_S instead of nbgrader_config.py's limit, and its time at that limit projected: the cells
   stopped, counted in its graded notebook, each held the short limit where it would have held the long one
   (waiting computes nothing: its core-seconds stand as measured). An upper bound: a cell whose ranks wait
   would stop at the graded rank timeout (grader.jail.bwrap.GRADED_RANK_TIMEOUT_S) first.

From these, `class_bill` prices a class (STUDENTS students × TERM_LABS labs, all honest, or a share of them
with a hanging exercise) on one node of NODE_CORES cores and on a Slurm array of such nodes: each submission
takes its slot-seconds (its core-seconds, or its seconds where it held a core longer than it computed), packed
onto the node's cores; the recordings once, before. docs/grading.md has the table and its assumptions.

    python bench/grading_cost.py [--quick | --for-report] [--lab 03_model_parallel ...] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import nbformat
from _results import emit, headline_row

from grader import COURSE_ROOT, grade
from grader.grading.verdict import explain_error
from grader.grading.workspace import gradable_labs
from grader.jail.bwrap import Limits
from grader.record import record

SCALING_LAB, SCALING_SUBMISSIONS = "03_model_parallel", 4
# --for-report stops the hanging submission's cells here: above the slowest honest cell of SCALING_LAB graded
# (a few seconds), so that only the hanging ones stop, and far below the configured limit (nbgrader_config.py).
REPORT_CELL_LIMIT_S = 15.0
STUDENTS, NODE_CORES, TERM_LABS = 500, 64, 8
FLOOD = 'for _ in range(3000):\n    print("x" * 100_000)\n'


def busy_core_seconds() -> float:
    """Every core's busy time so far (user, nice, system, irq, softirq, steal), in seconds."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def measured(step) -> dict:
    """Run step(); its wall seconds and the machine's busy core-seconds meanwhile."""
    busy, started = busy_core_seconds(), time.perf_counter()
    out = step()
    return {"seconds": time.perf_counter() - started, "core_seconds": busy_core_seconds() - busy, "out": out}


def hand_in(submissions: Path, student: str, lab: str, notebook) -> None:
    folder = submissions / student
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, folder / f"{lab}.ipynb")


def solution(lab: str):
    return nbformat.read(COURSE_ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)


def hanging(lab: str):
    """The solution with its first answer cell's functions replaced, after their definitions, by ones that
    sleep for ever: a deadlock in one exercise. A test that launches ranks on it waits for the course's rank
    timeout; one that calls it in the kernel, for the cell's limit."""
    notebook = solution(lab)
    for cell in notebook.cells:
        grading = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and grading.get("solution") and not grading.get("grade"):
            names = [line.split("(")[0][4:] for line in cell.source.splitlines() if line.startswith("def ")]
            if names:
                cell.source += "".join(f"\n\ndef {name}(*args, **kwargs):\n    import time\n    time.sleep(10**6)\n"
                                       for name in names)
                break
    return notebook


def flooding(lab: str):
    """The solution with its first answer cell printing 300 MB."""
    notebook = solution(lab)
    for cell in notebook.cells:
        if cell.cell_type == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            cell.source += "\n" + FLOOD
            break
    return notebook


def configured_cell_limit() -> float:
    """nbgrader_config.py's limit on one cell (c.Execute.timeout), which a grading run keeps unless told."""
    config = (COURSE_ROOT / "nbgrader_config.py").read_text(encoding="utf-8")
    return float(re.search(r"^c\.Execute\.timeout\s*=\s*([\d.]+)", config, re.M).group(1))


def cells_stopped(work: Path, cell_limit: float) -> int:
    """Code cells of the graded notebooks under `work` that the grader stopped at the cell limit (the verdict's
    own rule: grader.grading.verdict.explain_error)."""
    stopped = 0
    for path in work.rglob("autograded/*/*/*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            stopped += bool(errors) and explain_error(errors[0], Limits(), cell_limit).startswith("ran past")
    return stopped


def graded(tmp: Path, name: str, labs: list[str], judge: Path, jobs: int, students: dict,
           cell_limit: float | None = None) -> dict:
    """Grade `students` ({student: {lab: notebook}}) in one run; its seconds, core-seconds, each submission's
    seconds from status.json and the cells stopped at the cell limit (`cell_limit`, or the configured one)."""
    submissions, work = tmp / name / "submissions", tmp / name / "work"
    for student, notebooks in students.items():
        for lab, notebook in notebooks.items():
            hand_in(submissions, student, lab, notebook)
    run = measured(lambda: grade.grade(submissions, labs=labs, work=work, jobs=jobs, judge_values=judge,
                                       cell_timeout=cell_limit, say=lambda *_: None))
    status = json.loads((work / "status.json").read_text())
    run["submissions"] = {f"{student}/{lab}": {"seconds": entry["seconds"], "verdict": str(entry.get("verdict"))}
                          for student, entries in status.items() for lab, entry in entries.items()}
    run["cells_stopped"] = cells_stopped(work, cell_limit or configured_cell_limit())
    del run["out"]
    shutil.rmtree(tmp / name, ignore_errors=True)
    return run


def projected(run: dict, cell_limit: float, limit: float) -> dict:
    """A run graded with cells stopped at `cell_limit`, at the configured `limit` instead: each stopped cell held
    its slot `limit` s rather than `cell_limit` (waiting computes nothing, so the core-seconds stand). An upper
    bound: a cell whose ranks wait stops at the graded rank timeout where that comes first."""
    extra = run["cells_stopped"] * (limit - cell_limit)
    return {**run, "seconds": run["seconds"] + extra, "measured_seconds": run["seconds"], "cell_limit": cell_limit,
            "projected_to": limit}


def slot_seconds(run: dict) -> float:
    """What a submission takes from a node: its core-seconds, or its seconds where it held a slot (a core)
    longer than it computed (a submission waiting in a deadlock computes nothing and holds its slot)."""
    return max(run["core_seconds"], run["seconds"])


def class_bill(honest: dict, recordings: dict, slow_share: float, slow: dict) -> dict:
    """The class's hours on one node of NODE_CORES cores and on n of them (a Slurm array): the submissions'
    slot-seconds packed onto the cores, and the labs' recordings once, before."""
    labs = sorted(honest)[:TERM_LABS]
    per_student = sum(slot_seconds(honest[lab]) for lab in labs)
    slow_extra = slot_seconds(slow) - statistics.median(slot_seconds(honest[lab]) for lab in labs)
    slot = STUDENTS * per_student + slow_share * STUDENTS * len(labs) * slow_extra
    recording = sum(recordings[lab]["seconds"] for lab in labs)
    return {"labs": labs, "students": STUDENTS, "node_cores": NODE_CORES, "slow_share": slow_share,
            "core_hours": slot / 3600, "recording_hours": recording / 3600,
            "nodes": {n: slot / (n * NODE_CORES) / 3600 + recording / 3600 for n in (1, 4, 16)}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", dest="labs", action="append", help="only this lab (repeatable)")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--quick", action="store_true",
                       help="the recordings and honest submissions only: no scaling, no slow kinds (about 11 "
                            "minutes less: the hanging submission runs two cells to their 300 s limit)")
    modes.add_argument("--for-report", action="store_true",
                       help=f"what `make bench` needs for the class's bill: the recordings, the honest submissions "
                            f"and the hanging one, its cells stopped at {REPORT_CELL_LIMIT_S:g} s and its time "
                            "projected to the configured limit; no scaling, no flood")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    labs = args.labs or list(gradable_labs(COURSE_ROOT))
    figures = {"cores": os.cpu_count(), "recording": {}, "honest": {}}
    with tempfile.TemporaryDirectory(prefix="bench-grading-cost-") as tmp:
        tmp = Path(tmp)
        record_work = tmp / "record"
        for lab in labs:
            step = measured(lambda lab=lab: record(record_work, [lab], say=lambda *_: None))
            figures["recording"][lab] = {k: step[k] for k in ("seconds", "core_seconds")}
        judge = record_work / "judge"
        for lab in labs:
            figures["honest"][lab] = graded(tmp, f"honest-{lab}", [lab], judge, 1, {"honest": {lab: solution(lab)}})
        if SCALING_LAB in labs and not args.quick:
            if not args.for_report:
                many = {f"student-{i}": {SCALING_LAB: solution(SCALING_LAB)} for i in range(SCALING_SUBMISSIONS)}
                figures["scaling"] = {jobs: graded(tmp, f"jobs-{jobs}", [SCALING_LAB], judge, jobs, many)
                                      for jobs in (1, 2)}
                figures["flooding"] = graded(tmp, "flooding", [SCALING_LAB], judge, 1,
                                             {"flooding": {SCALING_LAB: flooding(SCALING_LAB)}})
            cell_limit = REPORT_CELL_LIMIT_S if args.for_report else None
            figures["hanging"] = graded(tmp, "hanging", [SCALING_LAB], judge, 1,
                                        {"hanging": {SCALING_LAB: hanging(SCALING_LAB)}}, cell_limit)
            if cell_limit:
                figures["hanging"] = projected(figures["hanging"], cell_limit, configured_cell_limit())
    if len(figures["honest"]) >= TERM_LABS and "hanging" in figures:
        figures["bill"] = [class_bill(figures["honest"], figures["recording"], share, figures["hanging"])
                           for share in (0.0, 0.05, 0.2)]
    emit(args.json, title="What grading a class costs", markdown=markdown(figures), headline=headline(figures),
         figures=figures)


def markdown(figures) -> str:
    lines = [f"{figures['cores']} cores; each step timed start to end, its CPU from /proc/stat (all cores' busy "
             "time: the machine otherwise idle); one run.", "",
             "| lab | recording, once a run | one honest submission | its core-seconds | cores it held |",
             "|---|---|---|---|---|"]
    for lab, run in figures["honest"].items():
        rec = figures["recording"][lab]
        lines.append(f"| `{lab}` | {rec['seconds']:.0f} s ({rec['core_seconds']:.0f} core-s) | {run['seconds']:.0f} s "
                     f"| {run['core_seconds']:.0f} | {run['core_seconds'] / run['seconds']:.2f} |")
    if "scaling" in figures:
        one, two = figures["scaling"][1], figures["scaling"][2]
        lines += ["", f"`{SCALING_LAB}`, {SCALING_SUBMISSIONS} honest submissions in one run: --jobs 1 "
                  f"{one['seconds']:.0f} s ({one['core_seconds']:.0f} core-s), --jobs 2 {two['seconds']:.0f} s "
                  f"({two['core_seconds']:.0f} core-s): {one['seconds'] / two['seconds']:.2f}× faster on "
                  f"{figures['cores']} cores."]
    if "hanging" in figures:
        hung = figures["hanging"]
        lines += ["", f"The slowest kinds, `{SCALING_LAB}`, one submission each: one exercise hanging "
                  f"{hung['seconds']:.0f} s ({hung['core_seconds']:.0f} core-s, {hung['cells_stopped']} cells "
                  f"stopped at the cell limit{_projection(figures)})"
                  + (f"; its output flooded (300 MB printed) {figures['flooding']['seconds']:.0f} s "
                     f"({figures['flooding']['core_seconds']:.0f} core-s)." if "flooding" in figures else
                     ". The scaling with --jobs and a flooded output: `python bench/grading_cost.py`, the whole run.")]
    if figures.get("bill"):
        bill = figures["bill"][0]
        lines += ["", f"The class: {bill['students']} students × {len(bill['labs'])} labs "
                  f"({', '.join(f'`{lab}`' for lab in bill['labs'])}), each submission's slot-seconds (its "
                  "core-seconds, or its seconds where it held a core longer than it computed) packed onto "
                  f"{bill['node_cores']}-core nodes, the labs' recordings ({bill['recording_hours'] * 60:.0f} min) "
                  "once before; a share of the submissions with one exercise hanging as above.", "",
                  "| submissions hanging | core-hours | one node | 4 nodes | 16 nodes |", "|---|---|---|---|---|"]
        for bill in figures["bill"]:
            lines.append(f"| {bill['slow_share']:.0%} | {bill['core_hours']:.0f} | "
                         + " | ".join(_hours(bill["nodes"][n]) for n in (1, 4, 16)) + " |")
    return "\n".join(lines)


def _projection(figures) -> str:
    run = figures["hanging"]
    if "projected_to" not in run:
        return ""
    return (f": graded with a {run['cell_limit']:g} s limit, {run['measured_seconds']:.0f} s, and projected to "
            f"nbgrader_config.py's {run['projected_to']:g} s, an upper bound where ranks would have timed out first")


def _hours(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def headline(figures) -> list[dict]:
    rows = [headline_row(f"grading one honest `{lab}` submission", f"{run['seconds']:.0f} s, "
                         f"{run['core_seconds']:.0f} core-s", "1 run") for lab, run in figures["honest"].items()]
    rows.append(headline_row("recording every graded lab's values, once a grading run",
                             f"{sum(r['seconds'] for r in figures['recording'].values()):.0f} s", "1 run"))
    if "scaling" in figures:
        one, two = figures["scaling"][1], figures["scaling"][2]
        rows += [headline_row(f"{SCALING_SUBMISSIONS} `{SCALING_LAB}` submissions, --jobs 2 against --jobs 1",
                              f"{one['seconds'] / two['seconds']:.2f}× faster ({one['seconds']:.0f} s, "
                              f"{two['seconds']:.0f} s)", "1 run"),
                 headline_row(f"grading a `{SCALING_LAB}` submission that prints 300 MB",
                              f"{figures['flooding']['seconds']:.0f} s, {figures['flooding']['core_seconds']:.0f} "
                              "core-s", "1 run")]
    if "hanging" in figures:
        hung = figures["hanging"]
        rows.append(headline_row(f"grading a `{SCALING_LAB}` submission with one exercise hanging",
                                 f"{hung['seconds']:.0f} s, {hung['core_seconds']:.0f} core-s"
                                 + (f" (projected from {hung['cell_limit']:g} s cells)" if "projected_to" in hung
                                    else ""), "1 run"))
    for bill in figures.get("bill", []):
        for nodes, hours in bill["nodes"].items():
            rows.append(headline_row(f"a class: {bill['students']} students × {len(bill['labs'])} labs, "
                                     f"{bill['slow_share']:.0%} hanging, on {nodes} {bill['node_cores']}-core "
                                     f"node{'s' if nodes > 1 else ''}",
                                     f"{_hours(hours)} ({bill['core_hours']:.0f} core-hours)", "1 run"))
    return rows


if __name__ == "__main__":
    main()
