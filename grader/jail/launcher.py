"""The jail's launcher: ``python -m grader.jail.launcher SPEC LAB -- ARGV...``.

nbgrader's kernel manager (grader.jail.kernel_manager) starts the kernel with this
command (grader.jail.bwrap.launch_command), once per submission: it sends its own
stdout and stderr to the jail's console file, joins the jail's cgroup (so that every
process of the jail is born in it), sets the rlimits, records its pid for the
grader's memory watchdog (grader.jail.host) and execs bwrap with the command line
grader.jail.bwrap builds, under the seccomp filter (grader.jail.seccomp). It
imports no `course` (torch): what it needs of the course is in the jail's Spec.
"""
from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

from . import cgroups, seccomp
from .bwrap import Limits, Spec, bwrap_argv, jail_environment
from .uids import start_time

#: In the jail's folder: the launcher's pid and start time. bwrap keeps the pid, and every process
#: of the jail descends from it: where there is no cgroup, the grader finds the jail's processes so.
LAUNCHER_FILE = "launcher.pid"
WATCHDOG_S = 0.2  # how often that watchdog sums their memory


def set_limits(limits: Limits) -> None:
    for which, value in ((resource.RLIMIT_DATA, limits.memory_bytes),
                         (resource.RLIMIT_NPROC, limits.processes),
                         (resource.RLIMIT_FSIZE, limits.file_bytes),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


def _seccomp_fd() -> int:
    # bwrap reads the program from a file descriptor it inherits.
    fd = os.memfd_create("grader-seccomp", 0)
    os.write(fd, seccomp.program())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


def _record_launcher(spec: Spec) -> None:
    """Write LAUNCHER_FILE: this process's pid and start time (for grader.jail.host's memory watchdog)."""
    fd = os.open(Path(spec.root) / LAUNCHER_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {start_time(os.getpid())}\n")


def main(argv: list[str] | None = None) -> None:
    """``python -m grader.jail.launcher SPEC LAB -- ARGV...``: join the cgroup, set the limits, exec bwrap."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -m grader.jail.launcher SPEC LAB -- ARGV...")
    spec, lab, command = Spec.load(argv[0]), argv[1], argv[3:]
    if not lab or "/" in lab or lab.startswith("."):
        sys.exit(f"grader.jail.launcher: {lab!r} is not a lab's name")
    # The kernel's own stdout/stderr (not what cells print: that goes over zmq) into a
    # file of the jail, whose size RLIMIT_FSIZE bounds.
    console = os.open(spec.console, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.dup2(console, 1)
    os.dup2(console, 2)
    limits = Limits(**spec.limits)
    if spec.cgroup:
        cgroup = cgroups.Cgroup(**spec.cgroup)
        cgroup.join()  # before bwrap: every process of the jail is born in it
        print(f"[grader] jail limits for the whole jail ({cgroup.description}): memory "
              f"{limits.memory_bytes / 2**30:g} GiB, {limits.processes} processes, {limits.cpus:g} CPUs", flush=True)
    elif spec.memory_watchdog:
        print(f"[grader] WARNING: no cgroup for this jail ({spec.cgroup_problem}); the grader sums its processes' "
              f"memory every {WATCHDOG_S:g} s and kills past {limits.memory_bytes / 2**30:g} GiB; its other limits "
              f"are per process (rlimits)", flush=True)
    else:
        print(f"[grader] WARNING: no cgroup for this jail ({spec.cgroup_problem}); its limits are per process "
              f"only (rlimits): memory {limits.memory_bytes / 2**30:g} GiB per process, the jail's total is "
              "not enforced", flush=True)
    set_limits(limits)
    _record_launcher(spec)
    bwrap = bwrap_argv(spec, lab, command, jail_environment(spec, dict(os.environ)), _seccomp_fd())
    os.execvp(bwrap[0], bwrap)


if __name__ == "__main__":
    main()
