#!/bin/sh
# Installs Debian's Slurm (slurmctld, slurmd, the client commands) and munge for the test that grades
# a class as a Slurm array (tests/test_grading_shards.py), which starts a cluster of this one machine. Without
# root or apt-get, says what to install (deploy/apt-install.sh); that test then skips, saying why.
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 \
        && command -v sbatch >/dev/null 2>&1; then
    exit 0
fi
exec sh "$(dirname "$0")/../deploy/apt-install.sh" "the Slurm test's cluster" --no-install-recommends \
    slurmctld slurmd slurm-client munge
