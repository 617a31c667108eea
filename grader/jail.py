"""One submission's jail as the grader holds it: its folder, its cgroup, its uid, and what it used.

grader.sandbox builds what runs inside (bwrap's command line, the launcher);
this module is the host's side of one jail's life: `Jail` prepares the folder,
makes the cgroup (grader.cgroups) and leases the uid (grader.jail_uids); the
kernel manager starts the kernel in it; afterwards `stop` kills what is left,
`usage` says what it used and ran into (`JailUsage`, for the verdict), and
`close` gives everything back. A watchdog ends a jail stuck at its memory limit.
`unavailable()` says why no jail can be made on this machine, by making one.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import cgroups, sandbox, seccomp
from .jail_uids import UidLease, kill_uid
from .sandbox import Limits, prepare

CODE_ROOM_BYTES = 256 << 20  # a jail needs this much of its memory limit for the code it runs
THRASH_S = 2                 # memory pinned past that for this long ends the jail (Jail._watch_memory)


@dataclass
class JailUsage:
    """What a jail used and ran into, read after it ended: what the verdict says about a death."""
    limits: Limits
    enforced: str                   # 'cgroup v1', 'cgroup v2', or 'rlimits' (per process only)
    memory_peak: int | None = None  # bytes, the whole jail; None where unknown
    memory_limit_hit: bool = False
    oom_killed: bool = False        # a process of the jail was killed for its memory
    pids_limit_hit: bool = False

    @property
    def per_jail(self) -> bool:
        return self.enforced.startswith("cgroup")


class Jail:
    """One submission's jail on the host: its folder and Spec, its cgroup, its uid (as root).

    ``Jail(root, limits)`` prepares it; the kernel manager starts the kernel in it;
    `stop` kills what is left, `usage` says what it used, `close` gives everything back.
    use_cgroup=False (or no cgroup to be had) leaves the rlimits alone to limit it.
    """

    def __init__(self, root: Path, limits: Limits, *, use_cgroup: bool = True):
        self.limits = limits
        self.lease = UidLease() if os.geteuid() == 0 else None
        self.uid = self.lease.uid if self.lease else None
        self.cgroup: cgroups.Cgroup | None = None
        self.thrashed = False  # the watchdog ended the jail at its memory limit
        try:
            self.spec = prepare(Path(root), self.uid, limits)
            problem = "not asked for"
            if use_cgroup:
                try:
                    self.cgroup = cgroups.create(limits.memory_bytes, limits.processes, limits.cpus)
                except cgroups.CgroupUnavailable as e:
                    problem = str(e)
            if self.cgroup:
                self._watching = threading.Event()
                threading.Thread(target=self._watch_memory, daemon=True).start()
            self.spec.cgroup = asdict(self.cgroup) if self.cgroup else None
            self.spec.cgroup_problem = "" if self.cgroup else problem
            self.spec.save()
        except BaseException:
            self.close()
            raise

    def _watch_memory(self) -> None:
        # At its memory limit a cgroup reclaims the page cache (the code of torch and
        # Python) before it OOM-kills, and faults it back in, again and again: a jail
        # whose anonymous memory has filled its limit crawls for minutes instead of
        # dying. Memory it cannot give back (no swap) past its limit less CODE_ROOM_BYTES,
        # for THRASH_S, ends the jail as an OOM kill would, and is reported as one.
        limit, since = self.limits.memory_bytes, None
        while not self._watching.wait(0.25):
            pinned = self.cgroup.memory_pinned() if self.cgroup else None
            if pinned is None or pinned < limit - CODE_ROOM_BYTES:
                since = None
            elif since is None:
                since = time.monotonic()
            elif time.monotonic() - since > THRASH_S:
                self.thrashed = True
                self.cgroup.kill()
                since = None

    @property
    def enforced(self) -> str:
        return self.cgroup.description if self.cgroup else "rlimits"

    def stop(self) -> list[int]:
        """Kill every process of the jail; returns those still alive (none, normally)."""
        left = self.cgroup.kill() if self.cgroup else []
        return sorted(set(left) | set(kill_uid(self.uid)))

    def usage(self) -> JailUsage:
        used = self.cgroup.usage() if self.cgroup else cgroups.Usage()
        return JailUsage(self.limits, self.enforced, used.memory_peak, used.memory_limit_hit or self.thrashed,
                         used.oom_killed or self.thrashed, used.pids_limit_hit)

    def close(self) -> None:
        if self.cgroup:
            self._watching.set()
            self.cgroup.remove()
            self.cgroup = None
        kill_uid(self.uid)
        if self.lease:
            self.lease.release()
            self.lease = None


@functools.cache
def unavailable() -> str | None:
    """Why submissions cannot be sandboxed on this machine (None: they can)."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed; on Debian or Ubuntu: apt-get install bubblewrap"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    try:
        seccomp.program()
    except seccomp.SeccompUnsupported as e:
        return str(e)
    with tempfile.TemporaryDirectory(prefix="grader-probe-") as tmp:
        jail = Jail(Path(tmp), Limits(), use_cgroup=False)
        try:
            probe = subprocess.run(sandbox.launch_command(jail.spec, "probe", [sys.executable, "-c", "import course"]),
                                   capture_output=True, text=True, timeout=60)
        finally:
            jail.close()
        console = jail.spec.console.read_text(errors="replace") if jail.spec.console.exists() else ""
    if probe.returncode != 0:
        return f"bwrap cannot start a sandbox here: {(probe.stderr + console).strip()[-300:]}"
    return None
