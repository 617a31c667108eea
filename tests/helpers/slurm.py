"""A Slurm cluster of this one machine, for a test: munged, slurmctld and slurmd, started in a folder
of their own with a configuration written there, and stopped after.

    with local_cluster(tmp_path) as env:      # env: SLURM_CONF for sbatch, squeue, sacct...
        subprocess.run(["sbatch", ...], env=env)

Debian's packages (tests/slurm-tools.sh) give the programs; nothing of /etc is used or changed. Where a
program is missing or a daemon does not come up (a container without the privileges slurmd wants, say),
`Unavailable` says why, and the test skips with it. One node, this machine's cores and memory; processes
tracked by /proc (no cgroups); munge with a key made for the cluster.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo")
START_TIMEOUT_S = 30


class Unavailable(Exception):
    """Slurm cannot run here: the message says why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    with open("/proc/meminfo") as meminfo:
        total_kb = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1])
    return total_kb // 1024 - 1024        # a GB left to the system


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else "(no log)"


def _config(folder: Path, host: str) -> str:
    cpus = os.cpu_count() or 1
    return f"""ClusterName=course
SlurmctldHost={host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket={folder / 'munge.socket'}
StateSaveLocation={folder / 'state'}
SlurmdSpoolDir={folder / 'spool'}
SlurmctldPidFile={folder / 'slurmctld.pid'}
SlurmdPidFile={folder / 'slurmd.pid'}
SlurmctldLogFile={folder / 'slurmctld.log'}
SlurmdLogFile={folder / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_memory_mb()} State=UNKNOWN
PartitionName=grading Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(processes) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def local_cluster(folder: Path):
    """Start the cluster in `folder`; yield the environment its commands need; stop it."""
    missing = [program for program in PROGRAMS if shutil.which(program) is None]
    if missing:
        raise Unavailable(f"{', '.join(missing)} not installed here (tests/slurm-tools.sh installs Debian's "
                          "slurmctld, slurmd, slurm-client and munge)")
    if os.geteuid() != 0:
        raise Unavailable("this test starts slurmd and munged as root, and runs as another user")
    folder = Path(folder)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    conf.write_text(_config(folder, host))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = []
    try:
        started.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={folder / 'munge.socket'}",
             f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
             f"--seed-file={folder / 'munge.seed'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (folder / "munge.socket").exists():
            if started[0].poll() is not None or time.monotonic() > deadline:
                raise Unavailable(f"munged did not start here:\n{_tail(folder / 'munged.log')}")
            time.sleep(0.1)
        for daemon in ("slurmctld", "slurmd"):
            started.append(subprocess.Popen([daemon, "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.STDOUT, start_new_session=True))
        while True:
            state = subprocess.run(["sinfo", "--noheader", "--format=%T"], env=env, capture_output=True, text=True)
            if state.returncode == 0 and state.stdout.strip().rstrip("*") in ("idle", "mixed", "allocated"):
                break
            ended = [p.args[0] for p in started if p.poll() is not None]
            if ended or time.monotonic() > deadline:
                why = f"{', '.join(ended)} stopped" if ended else f"the node is {state.stdout.strip() or 'unknown'}"
                raise Unavailable(f"Slurm did not start here ({why}):\nslurmctld: {_tail(folder / 'slurmctld.log')}"
                                  f"\nslurmd: {_tail(folder / 'slurmd.log')}")
            time.sleep(0.3)
        yield env
    finally:
        _stop(reversed(started))


def wait_for(job_ids, env, timeout: float) -> None:
    """Wait until none of `job_ids` is queued or running (squeue lists them no more)."""
    deadline = time.monotonic() + timeout
    while True:
        queued = subprocess.run(["squeue", "--noheader", "--format=%i %T", "--jobs", ",".join(job_ids)], env=env,
                                capture_output=True, text=True)
        if queued.returncode == 0 and not queued.stdout.strip():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Slurm jobs {job_ids} still queued or running after {timeout:.0f} s:\n"
                               f"{queued.stdout}{queued.stderr}")
        time.sleep(1)
