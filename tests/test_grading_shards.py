"""Covers: grader.grading.shards, grader.record, grader.merge.

A class graded in shards and merged gets what one machine gives it: the same CSV columns, the same
feedback pages, here and as a Slurm array; and what cannot be merged into that is refused in words.

One machine's grading is the round-trip class's (helpers/round_trips.py: graded once a session); the
shards grade its students of lab 8 with the same judge values (helpers.submissions: one recording of
each lab a session), as `python -m grader record` gives one recording to a class's shards.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader import GraderError
from grader.grading import shards
from helpers import REPO, round_trips
from helpers.forked_cells import settings_env
from helpers.round_trips import TEST_TIMEOUT_S, lab_columns
from helpers.slurm import Unavailable, local_cluster, wait_for
from helpers.submissions import ROUND_TRIP_SETTING, grade_class, grade_id, released, session_judge_values, solved

LAB = "08_experts"


def test_a_shard_is_k_of_n_and_anything_else_is_refused_in_words():
    assert shards.parse("1/4") == (1, 4) and shards.parse(" 4 / 4 ") == (4, 4)
    for text, words in (("0/4", "1 <= K <= 4"), ("5/4", "1 <= K <= 4"), ("half", "write K/N")):
        with pytest.raises(GraderError, match=re.escape(words)):
            shards.parse(text)


def test_the_shards_split_the_class_each_student_in_exactly_one_in_turn_by_name():
    students = [f"student{i:02d}" for i in range(11)]
    parts = [shards.students_of((k, 4), reversed(students)) for k in range(1, 5)]
    assert set().union(*parts) == set(students) and sum(map(len, parts)) == 11
    assert [len(p) for p in parts] == [3, 3, 3, 2]
    assert parts[0] == {"student00", "student04", "student08"}


def fake_shard(folder, k, n, labs=(LAB,), students=(), seed=7):
    """A shard's work folder as `grade --shard` leaves it, without grading anyone."""
    (folder / "judge").mkdir(parents=True)
    (folder / "status.json").write_text(json.dumps({s: {LAB: {"graded": False, "verdict": ["not graded: x"]}}
                                                    for s in students}))
    (folder / "run.json").write_text(json.dumps({"labs": list(labs), "shard": [k, n], "uncollected": {}}))
    (folder / "judge" / f"{LAB}.seed.json").write_text(json.dumps({"lab": LAB, "seed": seed, "stamp": "s"}))
    return folder


@pytest.mark.parametrize("make, words", [
    (lambda t: [fake_shard(t / "a", 1, 3), fake_shard(t / "b", 2, 3)], "shard 3/3 missing"),
    (lambda t: [fake_shard(t / "a", 1, 2), fake_shard(t / "b", 1, 2)], "shard 1/2 is given twice"),
    (lambda t: [fake_shard(t / "a", 1, 2), fake_shard(t / "b", 2, 2, seed=8)], "on seed 7 in"),
    (lambda t: [fake_shard(t / "a", 1, 2), fake_shard(t / "b", 2, 2, labs=("07_long_sequences",))],
     "merge the shards of one grading"),
    (lambda t: [fake_shard(t / "a", 1, 2, students=["ada"]), fake_shard(t / "b", 2, 2, students=["ada"])],
     "ada's 08_experts was graded in"),
    (lambda t: [t / "nothing"], "is not the work folder"),
])
def test_what_would_not_give_one_machine_s_grades_is_refused(tmp_path, make, words):
    (tmp_path / "nothing").mkdir()
    with pytest.raises(GraderError, match=re.escape(words)):
        shards.merge(make(tmp_path), tmp_path / "class", REPO, say=lambda *_: None)
    assert not (tmp_path / "class" / "grades.csv").exists()


def without_measurements(page: str) -> str:
    """A feedback page less what a run measures (seconds, bytes of memory), which two runs never share."""
    return re.sub(r"\d[\d,.]*\s*(s|ms|GB|MB|GiB|MiB|KB|KiB|bytes)\b", "#", page)


def class_of_lab(round_trip_class, folder, students, broken):
    """`students` of LAB in the round-trip class, copied into `folder` beside a student, `broken`, whose
    notebook is not one: the class the shards grade."""
    submitted = round_trip_class["work"].parent / "submitted"
    for student in students:
        for notebook in (submitted / student).glob(f"{LAB}*"):
            target = folder / notebook.relative_to(submitted)
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if notebook.is_dir() else shutil.copyfile)(notebook, target)
    (folder / broken).mkdir(parents=True)
    (folder / broken / f"{LAB}.ipynb").write_text("{ not a notebook")
    return folder


UNANSWERED, PARTLY = "unanswered", "partly"


def partly_answered():
    """The release with exercise 1 answered, the others as released: 2 points of 24, and seven failures."""
    nb, done = released(LAB), {grade_id(c): c.source for c in solved(LAB).cells}
    for cell in nb.cells:
        if grade_id(cell) == "route":
            cell.source = done["route"]
    return nb


#: Graded in the round-trip class: one machine's grading of them.
STUDENTS = {UNANSWERED: lambda: released(LAB), PARTLY: partly_answered}


@pytest.mark.grading
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_class_graded_in_two_shards_and_merged_gets_one_machine_s_grades_and_feedback(round_trip_class, tmp_path):
    """One machine's grading is the round-trip class's (graded once a session, with this session's judge values,
    on ROUND_TRIP_SETTING); the shards grade its students of LAB with the same values and setting."""
    submissions = class_of_lab(round_trip_class, tmp_path / "submitted", STUDENTS, "alice")
    settings = settings_env(*ROUND_TRIP_SETTING)
    for k in (1, 2):   # alice and unanswered, then partly: every second student by name
        rows, log = grade_class(submissions, tmp_path / f"shard{k}", LAB, "--shard", f"{k}/2", env=settings)
        assert set(rows) == ({"alice", UNANSWERED} if k == 1 else {PARTLY}), log
    merged = subprocess.run([sys.executable, "-m", "grader", "merge", str(tmp_path / "shard1"),
                             str(tmp_path / "shard2"), "--work", str(tmp_path / "class")],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "merged 2 shards, 3 submissions" in merged.stdout, merged.stdout
    with open(tmp_path / "class" / "grades.csv", newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    whole = round_trip_class["csv"]
    for student in STUDENTS:
        assert lab_columns(rows[student], LAB) == lab_columns(whole[student], LAB), student
    assert float(rows[PARTLY][f"{LAB} score"]) == float(rows[PARTLY][f"{LAB} test_route"]) == 2
    assert rows[UNANSWERED][f"{LAB} graded"] == "yes" and float(rows[UNANSWERED][f"{LAB} score"]) == 0
    assert rows["alice"][f"{LAB} graded"] == "no" and "not graded" in rows["alice"][f"{LAB} verdict"]
    for student in STUDENTS:
        page = Path("feedback") / student / LAB / f"{LAB}.html"
        assert without_measurements((tmp_path / "class" / page).read_text()) == \
            without_measurements((round_trip_class["work"] / page).read_text()), page
    assert (tmp_path / "class" / "feedback" / "alice" / LAB / f"{LAB}.html").is_file()


@pytest.fixture
def cluster(tmp_path):
    """The environment of a Slurm cluster of this machine (SLURM_CONF), or a skip that says why not."""
    try:
        with local_cluster(tmp_path / "slurm") as env:
            yield env
    except Unavailable as why:
        pytest.skip(f"Slurm cannot start here: {why}")


@pytest.mark.slurm
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_class_graded_as_a_slurm_array_of_two_shards_and_merged_gets_one_machine_s_grades(
        round_trip_class, cluster, tmp_path):
    """deploy/slurm/grade-class.sh submits an array of 2 shards and their merge to a real Slurm (Debian's
    slurmctld, slurmd and munge, started on this machine: helpers/slurm.py; skipped, saying why, where they
    cannot start); the merged CSV gives the round-trip class's grades. The array grades the student who
    answered nothing (cheap: this test is about the array, the one above about the grades) beside a notebook
    that is none, with this session's judge values (JUDGE_VALUES: no recording job)."""
    submissions = class_of_lab(round_trip_class, tmp_path / "submitted", [UNANSWERED], "ann")
    out = tmp_path / "graded"
    submitted = subprocess.run(
        ["bash", str(REPO / "deploy" / "slurm" / "grade-class.sh"), str(submissions), str(out), "2", "--lab", LAB],
        env={**cluster, "SHARD_OPTIONS": "--cpus-per-task=1 --mem=2G", "JUDGE_VALUES": str(session_judge_values())},
        capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    jobs = submitted.stdout.split()
    assert len(jobs) == 2, submitted.stdout          # the array and the merge: JUDGE_VALUES, no recording job
    wait_for(jobs, cluster, timeout=TEST_TIMEOUT_S - 120)
    logs = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in sorted((out / "logs").glob("*")))
    assert (out / "class" / "grades.csv").is_file(), f"no merged CSV:\n{logs}"
    assert "shard 1/2: 1 students" in (out / "logs" / "shard-1.out").read_text(), logs    # ann, then unanswered
    assert "merged 2 shards, 2 submissions" in logs, logs
    with open(out / "class" / "grades.csv", newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert lab_columns(rows[UNANSWERED], LAB) == lab_columns(round_trip_class["csv"][UNANSWERED], LAB)
    assert rows["ann"][f"{LAB} graded"] == "no", rows["ann"]


round_trips.enrol((test_a_class_graded_in_two_shards_and_merged_gets_one_machine_s_grades_and_feedback,
                   test_a_class_graded_as_a_slurm_array_of_two_shards_and_merged_gets_one_machine_s_grades),
                  LAB, STUDENTS)


def test_the_commands_refuse_a_shard_that_is_not_k_of_n_and_a_lab_there_is_not(capsys):
    from grader.__main__ import build_parser
    from grader.record import record

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["grade", "submitted", "--shard", "3/2"])
    assert exited.value.code == 2
    assert "K counts the shards from 1 to N = 2, so 1 <= K <= 2" in capsys.readouterr().err
    with pytest.raises(GraderError, match="no graded lab.s. 09_nothing; graded labs are: 01_single_gpu"):
        record(Path("unused"), ["09_nothing"], REPO)
