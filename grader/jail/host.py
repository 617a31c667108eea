"""One submission's jail as the grader holds it: its folder, its cgroup, its uid, and what it used.

grader.jail.bwrap builds what runs inside (bwrap's command line; grader.jail.launcher starts it);
this module is the host's side of one jail's life: `Jail` prepares the folder,
makes the cgroup (grader.jail.cgroups) and leases the uid (grader.jail.uids); the
kernel manager starts the kernel in it; afterwards `stop` kills what is left,
`usage` says what it used and ran into (`JailUsage`, for the verdict), and
`close` gives everything back. A watchdog ends a jail stuck at its memory limit;
where there is no cgroup, another holds the jail's processes together to it.
`unavailable()` says why no jail can be made on this machine, by making one.
"""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import bwrap, cgroups, launcher, seccomp
from .bwrap import Limits, prepare
from .uids import UidLease, descendants, kill_uid, start_time

CODE_ROOM_BYTES = 256 << 20  # a jail needs this much of its memory limit for the code it runs
THRASH_S = 2                 # memory pinned past that for this long ends the jail (Jail._watch_memory)


@dataclass
class JailUsage:
    """What a jail used and ran into, read after it ended: what the verdict says about a death."""
    limits: Limits
    enforced: str                   # 'cgroup v1', 'cgroup v2', 'watchdog' (no cgroup: the grader
                                    # sums the processes' memory), or 'rlimits' (per process only)
    memory_peak: int | None = None  # bytes, the whole jail; None where unknown
    memory_limit_hit: bool = False
    oom_killed: bool = False        # a process of the jail was killed for its memory
    pids_limit_hit: bool = False

    @property
    def per_jail(self) -> bool:
        """Whether memory was limited for the jail as a whole (else per process only)."""
        return self.enforced.startswith("cgroup") or self.enforced == "watchdog"


class Jail:
    """One submission's jail on the host: its folder and Spec, its cgroup, its uid (as root), and
    the uid its judge drops to (as root; grader.judge.server), each leased for this jail alone.

    ``Jail(root, limits)`` prepares it; the kernel manager starts the kernel in it;
    `stop` kills what is left, `usage` says what it used, `close` gives everything back.
    use_cgroup=False (or no cgroup to be had) leaves the rlimits, and `_watch_total` for its
    memory as a whole.
    """

    def __init__(self, root: Path, limits: Limits, *, use_cgroup: bool = True):
        self.limits = limits
        self.lease = UidLease() if os.geteuid() == 0 else None
        self.uid = self.lease.uid if self.lease else None
        self.judge_lease: UidLease | None = None
        self.judge_uid: int | None = None
        self.cgroup: cgroups.Cgroup | None = None
        self.thrashed = False  # the watchdog ended the jail at its memory limit
        self.killed_for_memory = 0  # processes `_watch_total` killed
        self.memory_peak: int | None = None  # the most `_watch_total` saw, in bytes
        self.watch_failed = False  # `_watch_total` stopped: the jail's total is not enforced
        self._watching = threading.Event()
        try:
            if self.lease:  # a uid that nothing else on the machine runs as: no one else may signal the judge
                self.judge_lease = UidLease()
                self.judge_uid = self.judge_lease.uid
            self.spec = prepare(Path(root), self.uid, limits)
            problem = "not asked for"
            if use_cgroup:
                try:
                    self.cgroup = cgroups.create(limits.memory_bytes, limits.processes, limits.cpus)
                except cgroups.CgroupUnavailable as e:
                    problem = str(e)
            threading.Thread(target=self._watch_memory if self.cgroup else self._watch_total, daemon=True).start()
            self.spec.cgroup = asdict(self.cgroup) if self.cgroup else None
            self.spec.cgroup_problem = "" if self.cgroup else problem
            self.spec.memory_watchdog = not self.cgroup
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

    def _watch_total(self) -> None:
        # No cgroup: rlimits count each process alone, and three may each take the whole limit.
        # Every WATCHDOG_S this sums the memory of the jail's processes (the launcher's and all
        # below it: bwrap's PID namespace leaves none elsewhere) and, past the limit, kills the
        # largest until what is left fits, as the OOM killer of a cgroup would; reported as its
        # kill. Between two looks a jail may pass its limit by what it allocates in WATCHDOG_S.
        try:
            self._watch_total_until_closed()
        except Exception:  # never expected; the verdict then says the total was not enforced
            self.watch_failed = True
            raise

    def _watch_total_until_closed(self) -> None:
        pid_file, limit = Path(self.spec.root) / launcher.LAUNCHER_FILE, self.limits.memory_bytes
        while not self._watching.wait(launcher.WATCHDOG_S):
            try:
                pid, started = (int(x) for x in pid_file.read_text().split())
            except (OSError, ValueError):
                continue  # no kernel started yet
            processes = descendants(pid, started)
            sizes = {p: memory_of(p) for p in processes}
            total = sum(sizes.values())
            if processes:
                self.memory_peak = max(self.memory_peak or 0, total)
            for victim in sorted(sizes, key=sizes.__getitem__, reverse=True):
                if total <= limit:
                    break
                if _kill(victim, processes[victim]):
                    self.killed_for_memory += 1
                total -= sizes[victim]

    @property
    def enforced(self) -> str:
        return self.cgroup.description if self.cgroup else "rlimits" if self.watch_failed else "watchdog"

    def stop(self) -> list[int]:
        """Kill every process of the jail; returns those still alive (none, normally)."""
        left = self.cgroup.kill() if self.cgroup else []
        return sorted(set(left) | set(kill_uid(self.uid)))

    def usage(self) -> JailUsage:
        used = self.cgroup.usage() if self.cgroup else cgroups.Usage(self.memory_peak)
        killed = self.thrashed or self.killed_for_memory > 0
        return JailUsage(self.limits, self.enforced, used.memory_peak, used.memory_limit_hit or killed,
                         used.oom_killed or killed, used.pids_limit_hit)

    def close(self) -> None:
        self._watching.set()
        if self.cgroup:
            self.cgroup.remove()
            self.cgroup = None
        kill_uid(self.uid)
        kill_uid(self.judge_uid)
        for lease in (self.lease, self.judge_lease):
            if lease:
                lease.release()
        self.lease = self.judge_lease = None


def memory_of(pid: int) -> int:
    """Bytes of memory pid holds that the kernel cannot give back without swap: its share (PSS:
    pages shared by n processes count 1/n in each) of anonymous and shared-memory pages, and of
    swapped ones; 0 once it has ended. File pages (the code of Python and torch) are left out,
    as they can be dropped and read again."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            lines = f.read().splitlines()[1:]  # the first names the range: no field
    except PermissionError:  # not ours to look into: what statm says, which anyone may read
        return _private_resident(pid)
    except OSError:
        return 0
    kb = {}
    for line in lines:
        key, _, value = line.partition(b":")
        kb[key] = int(value.split()[0])
    if b"Pss_Anon" not in kb:  # Linux before 5.8: all of it, file pages too
        return (kb.get(b"Pss", 0) + kb.get(b"SwapPss", 0)) * 1024
    return (kb[b"Pss_Anon"] + kb.get(b"Pss_Shmem", 0) + kb.get(b"SwapPss", 0)) * 1024


def _private_resident(pid: int) -> int:
    """Bytes of pid's resident pages that are not file or shared-memory pages (statm), 0 if ended."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            _size, resident, shared, *_ = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return 0
    return (resident - shared) * os.sysconf("SC_PAGE_SIZE")


def _kill(pid: int, started: int) -> bool:
    """SIGKILL pid if it is still the process that started at `started` (not a later one of the same pid)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:  # the pidfd holds this process: checked once, signalled as checked
        if start_time(pid) != started:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@functools.cache
def unavailable() -> str | None:
    """Why submissions cannot be jailed on this machine (None: they can)."""
    if not sys.platform.startswith("linux"):
        return f"the jail needs Linux namespaces; this is {sys.platform}"
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
            probe = subprocess.run(bwrap.launch_command(jail.spec, "probe", [sys.executable, "-c", "import course"]),
                                   capture_output=True, text=True, timeout=60)
        finally:
            jail.close()
        console = jail.spec.console.read_text(errors="replace") if jail.spec.console.exists() else ""
    if probe.returncode != 0:
        return f"bwrap cannot start a jail here: {(probe.stderr + console).strip()[-300:]}"
    return None
