#!/usr/bin/env bash
# A class graded on a Slurm cluster: the judge's values recorded once, an array of N shards, a merge;
# three jobs, each waiting for the one before (afterok).
#
#   deploy/slurm/grade-class.sh SUBMISSIONS OUT N [--lab LAB ...]
#
# OUT/recorded/judge  the judge's values and seed, once for the whole class (python -m grader record)
# OUT/shard-K         array task K of N: every N-th student (python -m grader grade --shard K/N)
# OUT/class           the merge: grades.csv, feedback/<student>/<lab>/, the gradebook (python -m grader merge)
# OUT/logs            each job's output
#
# Environment: PYTHON (default: this checkout's .venv/bin/python, which every node must reach: a shared
# file system), JUDGE_VALUES (an earlier recording's judge/ folder to grade with, as for late submissions of
# a class graded before: then no recording job, and two ids are printed), SBATCH_OPTIONS (added to every sbatch: --partition, --account, ...), SHARD_OPTIONS (added to
# the array's: --gres=gpu:1 for a GPU a task, --cpus-per-task, --mem, --time). Prints the three job ids.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 SUBMISSIONS OUT N [--lab LAB ...]" >&2
  exit 2
fi
submissions=$(realpath "$1"); out=$(realpath -m "$2"); shards=$3; shift 3
case $shards in ''|*[!0-9]*|0) echo "N must be a whole number of shards, at least 1: got '$shards'" >&2; exit 2;; esac
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
labs="$*"
mkdir -p "$out/logs"
if [ -n "${JUDGE_VALUES:-}" ]; then
  judge=$(realpath "$JUDGE_VALUES"); record=""; after=""
else
  judge="$out/recorded/judge"
  # shellcheck disable=SC2086  # SBATCH_OPTIONS and SHARD_OPTIONS are lists of options
  record=$(sbatch --parsable ${SBATCH_OPTIONS:-} --job-name=grade-record --chdir="$repo" \
    --output="$out/logs/record-%j.out" --wrap="$python -m grader record --work $out/recorded $labs")
  after="--dependency=afterok:$record"
fi
# shellcheck disable=SC2086
array=$(sbatch --parsable ${SBATCH_OPTIONS:-} ${SHARD_OPTIONS:-} $after \
  --array="1-$shards" --chdir="$repo" --output="$out/logs/shard-%a.out" \
  --export="ALL,PYTHON=$python,SUBMISSIONS=$submissions,OUT=$out,SHARDS=$shards,LABS=$labs,JUDGE=$judge" \
  "$repo/deploy/slurm/grade-shard.sbatch")
folders=$(for k in $(seq 1 "$shards"); do printf '%s ' "$out/shard-$k"; done)
# shellcheck disable=SC2086
merge=$(sbatch --parsable ${SBATCH_OPTIONS:-} --dependency="afterok:$array" --job-name=grade-merge \
  --chdir="$repo" --output="$out/logs/merge-%j.out" \
  --wrap="$python -m grader merge $folders --work $out/class")
echo $record "$array" "$merge"
