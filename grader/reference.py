"""``python -m grader reference``: record the reference outputs from the solutions.

Hidden tests compare a student's results on fixed cases with values stored in
``grader/reference/<lab>.json`` (see ``course.grading``). This command
executes each solution notebook, in a scratch copy of its folder, with
``COURSE_REFERENCE_RECORD`` set: every ``Reference.check`` in it then records
its value instead of comparing. A lab that records nothing has no file.

``--check`` records into a scratch folder and compares with the stored files,
within the course's tolerances, at least float32's for floating-point values (the
stored ones may come from another machine: course.grading.ACROSS_MACHINES): exit
status 1 when they drift apart. Both first
check the cells each solution tags for `grader.common.solution.load` (a `reused` cell
must only define), before executing anything.

The stored files are recorded with seed 0 (course.grading.STORED_SEED). A
grading run records its own, the judge's values for that run, with
`record(seed=..., as_graded=True)`: a seed of its own, and the notebook
executed as nbgrader executes it (its demonstrations skip themselves).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from course import check, grading

from . import COURSE_ROOT, GraderError
from .common.execute import execute
from .common.labs import display_path, find_labs, ignore_patterns, select
from .common.solution import marking_problems

REFERENCE_DIR = "grader/reference"


def recording_env(folder: Path, seed: int | None = None, *, as_graded: bool = False) -> dict[str, str]:
    """The kernel's variables that make a solution record its checked values into folder/<lab>.json.

    seed: what REFERENCE.seed() returns to the hidden tests (default: the stored values' seed).
    as_graded: as nbgrader's autograde runs it (course.grading.under_grader() is true).
    """
    return {grading.RECORD_ENV: str(folder), grading.SEED_ENV: str(grading.STORED_SEED if seed is None else seed),
            **({"NBGRADER_EXECUTION": "autograde"} if as_graded else {})}


def record(lab, dest: Path, root: Path = COURSE_ROOT, *, seed: int | None = None,
           as_graded: bool = False) -> Path | None:
    """Execute lab's solution in record mode; returns dest/<lab>.json, or None if it records nothing.

    seed: what REFERENCE.seed() returns to the hidden tests (default: the stored values' seed).
    as_graded: as nbgrader's autograde runs it (course.grading.under_grader() is true).
    """
    with tempfile.TemporaryDirectory(prefix="grader-reference-") as tmp:
        work, recorded = Path(tmp) / lab.name, Path(tmp) / "recorded"
        shutil.copytree(lab.notebook.parent, work, ignore=shutil.ignore_patterns(*ignore_patterns(root)))
        recorded.mkdir()
        nb = nbformat.read(work / lab.notebook.name, as_version=4)
        running = {}  # the cell being run: where a failure happened

        def on_cell_start(cell, cell_index, **_):
            running.update(cell=cell, index=cell_index)
        try:
            execute(nb, work, env=recording_env(recorded, seed, as_graded=as_graded), on_cell_start=on_cell_start)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
            raise GraderError(recording_failed(lab, root, e, running.get("index"), running.get("cell"))) from None
        produced = recorded / f"{lab.name}.json"
        target = Path(dest) / f"{lab.name}.json"
        if not produced.is_file():
            target.unlink(missing_ok=True)  # the lab no longer checks against references
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(produced, target)
        return target


def recording_failed(lab, root: Path, error: Exception, index: int | None, cell) -> str:
    """One line for a solution that failed while recording: which lab, which cell, what it raised,
    what to do; nbclient's whole report (the cell's source and traceback) goes to a log file."""
    # a file of its own (mkstemp): a fixed name in a shared /tmp could be another user's planted link
    handle, name = tempfile.mkstemp(prefix=f"grader-{lab.name}-recording-failed-", suffix=".log")
    with os.fdopen(handle, "w", encoding="utf-8") as log:
        log.write(f"{lab.notebook}\n\n{error}\n")
    if isinstance(error, CellExecutionError):
        what = f"raised {error.ename}: {' '.join(str(error.evalue).split())[:200]}"
    elif isinstance(error, CellTimeoutError):
        what = "ran past its time limit"
    else:
        what = "killed the kernel (out of memory?)"
    if cell is None:
        where = "a cell"
    else:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
        where = f"cell {index + 1} ({grade_id or repr(first[:60])})"
    return (f"{display_path(lab.notebook, root)}: the solution failed while recording its reference values: "
            f"{where} {what}. Run it in JupyterLab (`make lab`) or `make test-lab LAB={lab.name}` to see "
            f"why; nbclient's whole report is in {name}")


def compare(stored: Path, fresh: Path, labs: list[str] | None = None) -> list[str]:
    """Differences between two reference folders, one line each (empty: they agree).

    labs: compare only these labs' files (default: every file in either folder).
    """
    def files(folder):
        names = {p.name for p in Path(folder).glob("*.json")}
        return names if labs is None else names & {f"{lab}.json" for lab in labs}

    problems = []
    stored_files, fresh_files = files(stored), files(fresh)
    problems += [f"{name}: stored, but the solutions no longer record it"
                 for name in sorted(stored_files - fresh_files)]
    problems += [f"{name}: recorded by the solutions, but not stored" for name in sorted(fresh_files - stored_files)]
    for name in sorted(stored_files & fresh_files):
        old, new = grading.read(Path(stored) / name), grading.read(Path(fresh) / name)
        old_tolerances = grading.read_tolerances(Path(stored) / name)
        new_tolerances = grading.read_tolerances(Path(fresh) / name)
        old_checks, new_checks = grading.read_checks(Path(stored) / name), grading.read_checks(Path(fresh) / name)
        for key in sorted(set(old) | set(new)):
            if key not in new:
                problems.append(f"{name}: {key!r} is stored but no longer recorded")
            elif key not in old:
                problems.append(f"{name}: {key!r} is recorded but not stored")
            elif old_checks.get(key) != new_checks.get(key):
                problems.append(f"{name}: {key!r} is checked on ranks {new_checks.get(key)}, "
                                f"stored as checked on {old_checks.get(key)}")
            elif old_tolerances.get(key) != new_tolerances.get(key):
                problems.append(f"{name}: {key!r} is checked with tolerance {new_tolerances.get(key)}, "
                                f"stored with {old_tolerances.get(key)}")
            else:
                try:
                    rtol, atol = new_tolerances.get(key, (None, None))
                    check.assert_close(new[key], old[key], key, rtol=rtol, atol=atol,
                                       at_least=grading.ACROSS_MACHINES)
                except AssertionError as e:
                    problems.append(f"{name}: {e}")
    return problems


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "reference", help="record the hidden tests' reference outputs from solutions/",
        description=f"Execute each solution notebook and store the values its tests record in {REFERENCE_DIR}/.")
    p.add_argument("labs", nargs="*", metavar="LAB", help="lab(s) to record, e.g. 01_single_gpu (default: all)")
    p.add_argument("--dest", type=Path, help=f"write here instead of {REFERENCE_DIR}/")
    p.add_argument("--check", action="store_true",
                   help=f"write nothing; exit 1 if {REFERENCE_DIR}/ has drifted from the solutions")
    p.add_argument("--root", type=Path, default=COURSE_ROOT, help="course root (default: this repository)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    stored = root / REFERENCE_DIR
    labs = select(find_labs(root), args.labs)
    marking = [problem for lab in labs for problem in
               marking_problems(nbformat.read(lab.notebook, as_version=4), display_path(lab.notebook, root))]
    if marking:
        print("cells tagged for grader.common.solution.load that it cannot load as they are:", file=sys.stderr)
        print("  " + "\n  ".join(marking), file=sys.stderr)
        return 1
    if args.check:
        if args.dest:
            raise GraderError("--check takes no --dest")
        with tempfile.TemporaryDirectory(prefix="grader-reference-check-") as tmp:
            for lab in labs:
                record(lab, Path(tmp), root)
            problems = compare(stored, Path(tmp), [lab.name for lab in labs])
        if problems:
            print(f"{REFERENCE_DIR}/ has drifted from solutions/ (run `python -m grader reference`):",
                  file=sys.stderr)
            print("  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        print(f"{REFERENCE_DIR}/ agrees with solutions/")
        return 0
    dest = Path(args.dest).resolve() if args.dest else stored
    for lab in labs:
        path = record(lab, dest, root)
        print(f"{lab.name}: " + (f"wrote {display_path(path, root)}" if path else "records no reference values"))
    return 0
