#!/bin/sh
# Installs Debian's Slurm (slurmctld, slurmd, the client commands) and munge for the test that grades
# a class as a Slurm array (tests/test_grading_shards.py), which starts a cluster of this one machine. Without
# root or apt-get, says what to install; that test then skips, saying why.
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 \
        && command -v sbatch >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing slurmctld, slurmd, slurm-client and munge (the Slurm test's cluster)"
    packages="slurmctld slurmd slurm-client munge"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages >/dev/null; }
    exit $?
fi
echo "note: install Slurm and munge (Debian/Ubuntu: apt-get install slurmctld slurmd slurm-client munge) to run" \
     "the Slurm test" >&2
