"""A class graded in shards, anywhere, and the shards merged into the grades one machine would give.

    python -m grader record --work RECORDED --lab 08_experts             # once: this grading's seed and values
    python -m grader grade SUBMISSIONS --shard K/N --judge-values RECORDED/judge --work SHARD_K   # K = 1..N
    python -m grader merge SHARD_1 ... SHARD_N --work CLASS             # the class's gradebook, CSV, feedback

`--shard K/N` grades every N-th student of SUBMISSIONS, starting at the K-th, in the order of their
names (students whose notebooks could not be collected count too): each shard sees the same folder, so
the N shards split the class between them, each student in exactly one, whatever machine runs which.
Each shard writes its own work folder, with `run.json` saying which labs, which shard and which
students' notebooks could not be collected.

Grades are the same only if every shard's hidden tests draw from the same seed and compare with the
same values: record them once (`python -m grader record`) and give every shard that judge/ folder
(`--judge-values`). `merge` refuses shards graded otherwise, shards of different labs or splits, a
shard missing or given twice, a student graded in two shards; it copies each submission's scores from
its shard's gradebook into the class's, its autograded notebook and feedback page, and writes the CSV
from the merged gradebook, as `grade` writes it. The merged folder is the grading account's alone, as a
grading run's is (grader.grading.workspace.privately), whatever modes the shards' folders had.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from grader import GraderError
from grader.common.labs import course_config
from grader.common.private_write import write_private

from . import export, gradebook
from .workspace import Workspace, lab_infos, prepare_gradebook, privately

RUN_FILE = "run.json"
#: The folders of a work folder that hold one student's lab each, under <folder>/<student>/<lab>.
PER_SUBMISSION = ("submitted", "autograded", "feedback")


def parse(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N), 1 <= K <= N; anything else refused in words."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not match:
        raise GraderError(f"--shard {text!r}: write K/N, this shard's number K of N shards, such as 1/4")
    k, n = int(match[1]), int(match[2])
    if not 1 <= k <= n:
        raise GraderError(f"--shard {text}: K counts the shards from 1 to N = {n}, so 1 <= K <= {n}")
    return k, n


def students_of(shard: tuple[int, int], students) -> set[str]:
    """The students shard (K, N) grades: the K-th, (K + N)-th, ... of the names in order."""
    k, n = shard
    return {student for i, student in enumerate(sorted(set(students))) if i % n == k - 1}


def write_run(ws: Workspace, labs: list[str], shard: tuple[int, int] | None, uncollected: dict,
              every_lab: bool = True) -> None:
    """What a grading run was: its labs, its shard (K, N) or none, what it could not collect, and whether its
    CSV reports every one of its labs or those handed in (grader.grading.export.reported_labs)."""
    about = {"labs": sorted(labs), "shard": list(shard) if shard else None, "uncollected": uncollected,
             "every_lab": every_lab}
    write_private(ws.root / RUN_FILE, json.dumps(about, indent=1, sort_keys=True) + "\n")


def _read_run(folder: Path) -> dict:
    path = folder / RUN_FILE
    if not (folder / "status.json").is_file() or not path.is_file():
        raise GraderError(f"{folder} is not the work folder of a `python -m grader grade --shard` run: it has no "
                          f"status.json and {RUN_FILE}")
    about = json.loads(path.read_text(encoding="utf-8"))
    if not about.get("shard"):
        raise GraderError(f"{folder} graded a whole class, not a shard: merge the work folders of "
                          "`grade --shard K/N` runs")
    return about


def _seeds(folder: Path) -> dict[str, int]:
    return {path.name.removesuffix(".seed.json"): int(json.loads(path.read_text(encoding="utf-8"))["seed"])
            for path in sorted((folder / "judge").glob("*.seed.json"))}


def _check_shards(folders: list[Path]) -> tuple[list[str], dict[str, dict], dict[Path, dict], bool]:
    """Every shard of one split, once, of the same labs, judged on the same seeds, each student's lab graded in
    one of them: (labs, uncollected, each shard's status, whether their CSVs report every lab). Checked before
    anything is written."""
    runs = {folder: _read_run(folder) for folder in folders}
    first = folders[0]
    labs, n = runs[first]["labs"], runs[first]["shard"][1]
    given: dict[int, Path] = {}
    for folder, about in runs.items():
        k, its_n = about["shard"]
        if its_n != n or about["labs"] != labs:
            raise GraderError(f"{folder} is shard {k}/{its_n} of {', '.join(about['labs'])}, but {first} is a shard "
                              f"of {n} of {', '.join(labs)}: merge the shards of one grading")
        if k in given:
            raise GraderError(f"shard {k}/{n} is given twice: {given[k]} and {folder}")
        given[k] = folder
    missing = sorted(set(range(1, n + 1)) - set(given))
    if missing:
        raise GraderError(f"shard{'s' * (len(missing) > 1)} {', '.join(f'{k}/{n}' for k in missing)} missing: "
                          f"a merge needs all {n}, or its CSV would lack their students")
    seeds: dict[str, tuple[int, Path]] = {}
    for folder in folders:
        for lab, seed in _seeds(folder).items():
            if lab in seeds and seeds[lab][0] != seed:
                raise GraderError(f"{lab} was graded on seed {seeds[lab][0]} in {seeds[lab][1]} and on {seed} in "
                                  f"{folder}: the shards' hidden tests drew different inputs. Record the values once "
                                  "(`python -m grader record`) and give every shard that judge/ folder "
                                  "(`--judge-values`)")
            seeds.setdefault(lab, (seed, folder))
    statuses = {folder: Workspace(folder).load_status() for folder in folders}
    graded_in: dict[tuple[str, str], Path] = {}
    for folder, status in statuses.items():
        for student, entries in status.items():
            for lab in entries:
                if (student, lab) in graded_in:
                    raise GraderError(f"{student}'s {lab} was graded in {graded_in[student, lab]} and in {folder}")
                graded_in[student, lab] = folder
    uncollected: dict[str, dict] = {}
    for about in runs.values():
        for student, entries in about["uncollected"].items():
            uncollected.setdefault(student, {}).update(entries)
    every_lab = all(about.get("every_lab", True) for about in runs.values())   # as the shards were asked
    return labs, uncollected, statuses, every_lab


@privately
def merge(folders, work: Path, root: Path, csv_path: Path | None = None, say=print) -> Path:
    """The class's work folder from its shards' (`grade --shard` runs): gradebook, status, autograded
    notebooks, feedback pages, judge values, and the CSV; returns the CSV's path."""
    folders = [Path(folder).resolve() for folder in folders]
    if not folders:
        raise GraderError("give the work folders of the shards to merge")
    labs, uncollected, statuses, every_lab = _check_shards(folders)
    infos = lab_infos(root)
    unknown = [lab for lab in labs if lab not in infos]
    if unknown:
        raise GraderError(f"the shards graded {', '.join(unknown)}, which this course has no graded lab of")
    infos = {lab: infos[lab] for lab in labs}
    ws = Workspace(Path(work).resolve())
    if ws.root in folders or ws.status_file.is_file():
        raise GraderError(f"{ws.root} is a shard or an earlier grading's work folder: merge into a new folder")
    ws.make_private(say)
    for known in ("gradebook.db", "labs.json"):       # the first shard's gradebook knows the labs' cells already
        if (folders[0] / known).is_file():
            shutil.copyfile(folders[0] / known, ws.root / known)
    prepare_gradebook(ws, root, infos)                 # (again only for a lab it does not know)
    course_id = course_config(root).CourseDirectory.course_id
    status: dict[str, dict] = {}
    for folder, shard_status in statuses.items():
        shard = Workspace(folder)
        for student, entries in shard_status.items():
            for lab, entry in entries.items():
                status.setdefault(student, {})[lab] = entry
                for kind in PER_SUBMISSION:
                    source = folder / kind / student / lab
                    if source.is_dir():
                        shutil.copytree(source, ws.root / kind / student / lab)
                if entry.get("graded"):
                    gradebook.merge(shard.gradebook, ws.gradebook, course_id, lab, student)
        for recorded in sorted((folder / "judge").glob("*.json")):
            target = ws.root / "judge" / recorded.name
            if not target.exists():
                target.parent.mkdir(mode=0o700, exist_ok=True)
                shutil.copyfile(recorded, target)
    ws.save_status(status)
    write_run(ws, labs, None, uncollected, every_lab)
    target = Path(csv_path) if csv_path else ws.root / "grades.csv"
    export.write_class(target, ws.gradebook, root, infos, status, uncollected, students=set(status), every=every_lab)
    ws.make_private(say)  # what was copied keeps its shard's modes: any a shard left open, closed now
    merged = sum(len(entries) for entries in status.values())
    say(f"merged {len(folders)} shards, {merged} submissions: wrote {target}; feedback in {ws.feedback}/")
    return target
