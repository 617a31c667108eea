"""A control group per jail: limits for the whole jail, and what it used.

rlimits count per process (memory) or per file (size): three processes may
each take the whole memory limit. A cgroup counts the jail as one: its
memory (tmpfs pages included), its processes and its CPU time. The grader
creates one per jail; the launcher (grader.jail.launcher) moves itself into
it before it execs bwrap, so every process of the jail is in it. After the
jail, the grader reads what happened (peak memory, an OOM kill, the process
limit hit) and kills whatever is still in it.

Both hierarchies are supported: cgroup v2 (one folder, memory.max, pids.max,
cpu.max, memory.peak, memory.events) and v1 (a folder per controller,
memory.limit_in_bytes, memory.max_usage_in_bytes, memory.oom_control).
`create` raises CgroupUnavailable, saying why, where neither can be made.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .uids import kill_until_gone

PARENT = "course-grader"  # our folder under the grader's own cgroup
CPU_PERIOD_US = 100_000


class CgroupUnavailable(Exception):
    pass


@dataclass
class Usage:
    """What a jail used, read from its cgroup after it ended."""
    memory_peak: int | None = None   # bytes; None: not known
    memory_limit_hit: bool = False   # an allocation ran into the limit (reclaim, or an OOM kill)
    oom_killed: bool = False         # the kernel's OOM killer killed a process of the jail
    pids_limit_hit: bool = False     # a fork or thread was refused at the process limit


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of every cgroup file system."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, options, *_ = line.split()
        if kind in ("cgroup", "cgroup2"):
            out.append((point.replace("\\040", " "), kind, set(options.split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """{controller (v1) or '' (v2): this process's cgroup path}."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:  # sysfs: one write, no truncation games
        f.write(value)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _read_keys(path: Path) -> dict[str, int]:
    """A flat keyed file (memory.events, pids.events, memory.oom_control) as {key: number}."""
    try:
        pairs = (line.split() for line in path.read_text().splitlines())
        return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].lstrip("-").isdigit()}
    except OSError:
        return {}


@dataclass
class Cgroup:
    """One jail's cgroup: version 2 (one folder) or 1 (memory, pids and, if it can, cpu folders)."""
    version: int
    folders: dict[str, str]   # v2: {'': folder}; v1: {'memory': ..., 'pids': ..., 'cpu': ...}

    @property
    def description(self) -> str:
        return f"cgroup v{self.version}"

    def _folder(self, controller: str) -> Path:
        return Path(self.folders["" if self.version == 2 else controller])

    def join(self, pid: int | None = None) -> None:
        """Move pid (default: this process) into the cgroup; its children are born there."""
        for folder in dict.fromkeys(self.folders.values()):
            _write(Path(folder) / "cgroup.procs", str(pid or os.getpid()))

    def pids(self) -> list[int]:
        try:
            text = (self._folder("pids") / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(x) for x in text.split()]

    def kill(self, wait_s: float = 10) -> list[int]:
        """Kill every process in the cgroup; returns those still there after wait_s (none, normally)."""
        kill_file = self._folder("pids") / "cgroup.kill"

        def at_once() -> bool:  # cgroup v2: atomic, no fork escapes it
            if self.version == 2 and kill_file.exists():
                _write(kill_file, "1")
                return True
            return False

        return kill_until_gone(self.pids, wait_s, at_once)

    def memory_pinned(self) -> int | None:
        """Bytes of memory the cgroup cannot give back (None: not known): anonymous and tmpfs pages,
        which without swap stay, and unevictable ones. What is left of the limit is all the
        page cache (the code of Python and torch) has to run in."""
        stat = _read_keys(self._folder("memory") / "memory.stat")
        if not stat:
            return None
        if self.version == 2:
            return stat.get("anon", 0) + stat.get("shmem", 0) + stat.get("unevictable", 0)
        return stat.get("total_active_anon", 0) + stat.get("total_inactive_anon", 0) + stat.get("total_unevictable", 0)

    def usage(self) -> Usage:
        memory, pids = self._folder("memory"), self._folder("pids")
        if self.version == 2:
            events = _read_keys(memory / "memory.events")
            peak = _read_int(memory / "memory.peak")
            limit_hit, oom = events.get("max", 0) > 0, events.get("oom_kill", 0) > 0
        else:
            control = _read_keys(memory / "memory.oom_control")
            peak = _read_int(memory / "memory.max_usage_in_bytes")
            oom = control.get("oom_kill", 0) > 0
            limit_hit = oom or (_read_int(memory / "memory.failcnt") or 0) > 0
        return Usage(memory_peak=peak, memory_limit_hit=limit_hit, oom_killed=oom,
                     pids_limit_hit=_read_keys(pids / "pids.events").get("max", 0) > 0)

    def remove(self) -> None:
        """Kill what is left and remove the folders (an empty cgroup only)."""
        self.kill()
        for folder in dict.fromkeys(self.folders.values()):
            for _ in range(50):  # the last killed process may take a moment to leave
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _v2_root() -> Path | None:
    for point, kind, _ in _mounts():
        if kind == "cgroup2":
            own = _own_paths().get("", "/")
            folder = Path(point) / own.lstrip("/")
            if {"memory", "pids"} <= set((folder / "cgroup.controllers").read_text().split()
                                         if (folder / "cgroup.controllers").exists() else []):
                return folder
    return None


def _make_v2(base: Path, name: str, memory: int, processes: int, cpus: float) -> Cgroup:
    parent = base / PARENT
    parent.mkdir(exist_ok=True)
    wanted = [c for c in ("memory", "pids", "cpu") if c in (base / "cgroup.controllers").read_text().split()]
    for where in (base, parent):  # controllers must be delegated at every level down to the jail's
        _write(where / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
    folder = parent / name
    folder.mkdir()
    _write(folder / "memory.max", str(memory))
    if (folder / "memory.swap.max").exists():
        _write(folder / "memory.swap.max", "0")
    _write(folder / "pids.max", str(processes))
    if "cpu" in wanted:
        _write(folder / "cpu.max", f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
    return Cgroup(2, {"": str(folder)})


def _make_v1(name: str, memory: int, processes: int, cpus: float) -> Cgroup:
    mounts, own = _mounts(), _own_paths()
    folders = {}
    for controller in ("memory", "pids", "cpu"):
        point = next((p for p, kind, opts in mounts if kind == "cgroup" and controller in opts), None)
        if point is None:
            if controller == "cpu":
                continue  # the CPU quota is a nicety; memory and processes are not
            raise CgroupUnavailable(f"no cgroup v1 hierarchy has the {controller} controller")
        parent = Path(point) / own.get(controller, "/").lstrip("/") / PARENT
        parent.mkdir(exist_ok=True)
        folders[controller] = str(parent / name)
        os.mkdir(folders[controller])
    memory_dir, pids_dir = Path(folders["memory"]), Path(folders["pids"])
    _write(memory_dir / "memory.limit_in_bytes", str(memory))
    if (memory_dir / "memory.memsw.limit_in_bytes").exists():  # no escape into swap
        _write(memory_dir / "memory.memsw.limit_in_bytes", str(memory))
    _write(pids_dir / "pids.max", str(processes))
    if "cpu" in folders:
        cpu_dir = Path(folders["cpu"])
        _write(cpu_dir / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(cpu_dir / "cpu.cfs_quota_us", str(int(cpus * CPU_PERIOD_US)))
    return Cgroup(1, folders)


def create(memory: int, processes: int, cpus: float) -> Cgroup:
    """A fresh cgroup with these limits, under the grader's own; CgroupUnavailable says why not."""
    name = f"jail-{uuid.uuid4().hex[:12]}"
    problems = []
    try:
        v2 = _v2_root()
    except OSError:
        v2 = None
    if v2 is None:
        problems.append("cgroup v2: no hierarchy with the memory and pids controllers")
    else:
        try:
            return _make_v2(v2, name, memory, processes, cpus)
        except OSError as e:
            problems.append(f"cgroup v2: {e}")
            _remove_partial(name)
    try:
        return _make_v1(name, memory, processes, cpus)
    except (OSError, CgroupUnavailable) as e:
        problems.append(f"cgroup v1: {e}")
        _remove_partial(name)
    raise CgroupUnavailable("; ".join(problems))


def _remove_partial(name: str) -> None:
    """A half-made jail cgroup (one controller's folder made, the next refused) goes again."""
    own = _own_paths()
    for point, _kind, opts in _mounts():
        controllers = [c for c in opts if c in own] or [""]
        for controller in controllers:
            folder = Path(point) / own.get(controller, "/").lstrip("/") / PARENT / name
            try:
                folder.rmdir()
            except OSError:
                pass
