"""A class graded as a Slurm array: deploy/slurm/grade-class.sh submits an array of 2 shards and their
merge to a real Slurm (Debian's slurmctld, slurmd and munge, started by the test on this machine:
helpers/slurm.py); the merged CSV gives the grades of the class graded on one machine. Skipped, saying
why, where Slurm cannot start.

One machine's grading is the round-trip class's (helpers/round_trips.py); the array grades this
module's student of lab 8 there, who answered nothing (cheap: the test is about the array,
test_grading_shards.py about the grades), beside a notebook that is none, with the same judge values
(JUDGE_VALUES: no recording job).
"""
from __future__ import annotations

import csv
import subprocess

import pytest

from helpers import REPO, round_trips
from helpers.round_trips import TEST_TIMEOUT_S, lab_columns
from helpers.slurm import Unavailable, local_cluster, wait_for
from helpers.submissions import released, session_judge_values

LAB = "08_experts"
BLANK = "blank"      # lab 8 as released: nothing answered

pytestmark = pytest.mark.slurm


@pytest.fixture
def cluster(tmp_path):
    """The environment of a Slurm cluster of this machine (SLURM_CONF), or a skip that says why not."""
    try:
        with local_cluster(tmp_path / "slurm") as env:
            yield env
    except Unavailable as why:
        pytest.skip(f"Slurm cannot start here: {why}")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_class_graded_as_a_slurm_array_of_two_shards_and_merged_gets_one_machine_s_grades(
        round_trip_class, cluster, tmp_path):
    submissions, out = tmp_path / "submitted", tmp_path / "graded"
    mine = round_trip_class["work"].parent / "submitted" / BLANK
    for notebook in mine.rglob("*.ipynb"):
        target = submissions / notebook.relative_to(mine.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(notebook.read_bytes())
    (submissions / "ann").mkdir()
    (submissions / "ann" / f"{LAB}.ipynb").write_text("{ not a notebook")
    submitted = subprocess.run(
        ["bash", str(REPO / "deploy" / "slurm" / "grade-class.sh"), str(submissions), str(out), "2", "--lab", LAB],
        env={**cluster, "SHARD_OPTIONS": "--cpus-per-task=1 --mem=2G", "JUDGE_VALUES": str(session_judge_values())},
        capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    jobs = submitted.stdout.split()
    assert len(jobs) == 2, submitted.stdout          # the array and the merge: the values were recorded
    wait_for(jobs, cluster, timeout=TEST_TIMEOUT_S - 120)
    logs = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in sorted((out / "logs").glob("*")))
    assert (out / "class" / "grades.csv").is_file(), f"no merged CSV:\n{logs}"
    assert "shard 1/2: 1 students" in (out / "logs" / "shard-1.out").read_text(), logs    # ann, then blank
    assert "merged 2 shards, 2 submissions" in logs, logs
    with open(out / "class" / "grades.csv", newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    assert lab_columns(rows[BLANK], LAB) == lab_columns(round_trip_class["csv"][BLANK], LAB)
    assert rows["ann"][f"{LAB} graded"] == "no", rows["ann"]


round_trips.enrol(test_a_class_graded_as_a_slurm_array_of_two_shards_and_merged_gets_one_machine_s_grades, LAB,
                  {BLANK: lambda: released(LAB)})
