"""Covers: grader.jail.launcher, grader.jail.bwrap, grader.jail.cgroups, grader.jail.seccomp, grader.jail.uids.

The jail itself (grader.jail.bwrap, grader.jail.cgroups, grader.jail.seccomp, grader.jail.uids), without nbgrader.

Each test starts a jail through its launcher (``python -m grader.jail.launcher``),
as the kernel manager does, and runs a small program in it: a few seconds
each. What graded notebooks do to the jail is in test_hostile_jail.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from grader.jail import bwrap, cgroups, seccomp
from grader.jail.host import Jail
from grader.jail.uids import processes_of
from helpers import needs_jail
from helpers.jails import jail_in, run_in_jail

pytestmark = [pytest.mark.grading, needs_jail()]

LIMITS = bwrap.Limits(memory_bytes=1 << 30, processes=64, tmp_bytes=64 << 20, work_bytes=64 << 20)


@pytest.fixture
def jail(tmp_path):
    with jail_in(tmp_path, LIMITS) as made:
        yield made


def test_the_kernel_works_in_a_folder_of_its_own_and_sees_no_host_path(jail, tmp_path):
    console = run_in_jail(jail, f"""
        import os, course
        print("cwd", os.getcwd())
        print("course", course.__file__)
        open("notes.txt", "w").write("mine")
        for path in ("/x", "/course/x", "/run/grader/x", {str(bwrap.tree_home() / 'x')!r}):
            try:
                open(path, "w")
                print("WROTE", path)
            except OSError as e:
                print("refused", path, e.strerror)
        print("sees", sorted(os.listdir({str(jail.spec.root)!r})))
    """)
    assert "cwd /home/student/lab1" in console
    assert "course /course/course/__init__.py" in console
    assert "WROTE" not in console and console.count("refused") == 4, console
    # Only the kernel's folder is at its host path: the connection file names its sockets so.
    assert "sees ['kernel']" in console, console
    assert not list(tmp_path.rglob("notes.txt")), "the working folder is on the host"


def test_the_environment_is_an_allowlist_and_the_judge_has_a_neutral_path(jail):
    console = run_in_jail(jail, """
        import os
        for key in ("GRADER_SECRET", "COURSE_THING", "COURSE_REFERENCE_JUDGE", "HOME", "PYTHONPATH"):
            print(key, "=", os.environ.get(key))
    """, env={"GRADER_SECRET": "hunter2", "COURSE_THING": "1",
              "COURSE_REFERENCE_JUDGE": str(jail.spec.judge_dir / "judge.sock")})
    assert "GRADER_SECRET = None" in console
    assert "COURSE_THING = None" in console  # exact names only (tests/test_jail_limits.py)
    assert "COURSE_REFERENCE_JUDGE = /run/grader/judge.sock" in console
    assert "HOME = /home/student" in console and "PYTHONPATH = /course" in console


def test_ptrace_mounts_and_nested_user_namespaces_are_refused(jail):
    console = run_in_jail(jail, """
        import ctypes, os, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        def errno_of(result):
            return "ok" if result == 0 else os.strerror(ctypes.get_errno())
        child = subprocess.Popen(["sleep", "30"])
        print("ptrace:", errno_of(libc.ptrace(16, child.pid, 0, 0)))   # PTRACE_ATTACH
        child.kill()
        print("unshare:", errno_of(libc.unshare(0x10000000)))           # CLONE_NEWUSER
        print("mount:", errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
        print("unshare -U:", subprocess.run(["unshare", "-U", "true"]).returncode)
        print("unshare files:", errno_of(libc.unshare(0x400)))          # CLONE_FILES: harmless, allowed
    """)
    assert "ptrace: Operation not permitted" in console, console
    assert "unshare: Operation not permitted" in console
    assert "mount: Operation not permitted" in console
    assert "unshare -U: 1" in console
    assert "unshare files: ok" in console


@pytest.mark.timeout(300)
def test_the_labs_still_run_torch_ranks_over_gloo_in_a_forkserver(jail):
    console = run_in_jail(jail, """
        import course, torch, torch.distributed as dist
        def total():
            t = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(t)
            return t.item()
        print("ranks", course.launch(total, 2))
    """)
    assert re.search(r"ranks.*3\.0.*3\.0", console), console


def test_memory_is_limited_per_jail_not_per_process(jail):
    if not jail.cgroup:
        pytest.skip(f"no cgroup here: {jail.spec.cgroup_problem}")
    console = run_in_jail(jail, """
        import subprocess, sys
        hold = "x = bytearray(600 << 20)\\nfor i in range(0, len(x), 4096): x[i] = 1\\nimport time; time.sleep(5)"
        children = [subprocess.Popen([sys.executable, "-c", hold]) for _ in range(3)]
        print("exits", [c.wait() for c in children])
    """)
    usage = jail.usage()
    assert usage.oom_killed and usage.memory_limit_hit, (usage, console)
    assert usage.memory_peak <= LIMITS.memory_bytes, usage
    assert "-9" in console, console  # at least one of the three was killed


def test_the_process_limit_counts_the_whole_jail(jail):
    if not jail.cgroup:
        pytest.skip(f"no cgroup here: {jail.spec.cgroup_problem}")
    run_in_jail(jail, """
        import subprocess
        sleepers = []
        try:
            for _ in range(500):
                sleepers.append(subprocess.Popen(["sleep", "60"]))
        except OSError as e:
            print("refused after", len(sleepers), e)
    """)
    assert jail.usage().pids_limit_hit


def test_what_the_jail_writes_is_capped_and_stays_in_it(jail, tmp_path):
    console = run_in_jail(jail, """
        import os
        for folder in ("/home/student/lab1", "/tmp", "/dev/shm"):
            try:
                with open(os.path.join(folder, "big"), "wb") as f:
                    for _ in range(200):
                        f.write(b"x" * (1 << 20))
                print(folder, "wrote 200 MB")
            except OSError as e:
                print(folder, "stopped:", e.strerror)
    """)
    assert console.count("stopped: No space left on device") == 3, console
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < 16 << 20


def test_without_a_cgroup_the_rlimits_remain_and_the_console_says_so(tmp_path):
    (tmp_path / "jail").mkdir()
    jail = Jail(tmp_path / "jail", LIMITS, use_cgroup=False)
    try:
        console = run_in_jail(jail, """
            import resource
            print("data limit", resource.getrlimit(resource.RLIMIT_DATA)[0])
            try:
                x = bytearray(2 << 30)
            except MemoryError:
                print("MemoryError")
        """)
        usage = jail.usage()
    finally:
        jail.close()
    assert "WARNING: no cgroup for this jail (not asked for); the grader sums its processes' memory" in console
    assert f"data limit {LIMITS.memory_bytes}" in console and "MemoryError" in console, console
    # The jail's total is the grader's watchdog's (tests/test_jail_limits.py)
    assert usage.enforced == "watchdog" and usage.per_jail and not usage.oom_killed


def test_two_jails_at_once_have_their_own_uids_and_do_not_kill_each_others_processes(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first, second = Jail(tmp_path / "a", LIMITS), Jail(tmp_path / "b", LIMITS)
    try:
        if os.geteuid() == 0:
            assert first.uid != second.uid
        command = bwrap.launch_command(second.spec, "lab1", ["sleep", "120"])
        sleeper = subprocess.Popen(command)
        deadline = time.monotonic() + 60
        while "sleep" not in _names(second) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "sleep" in _names(second), second.spec.console.read_text()
        assert first.stop() == []
        first.close()
        assert "sleep" in _names(second), "closing one jail killed the other's processes"
        assert second.stop() == []
        assert sleeper.wait(timeout=30) != 0
    finally:
        first.close()
        second.close()


def _names(jail: Jail) -> list[str]:
    pids = jail.cgroup.pids() if jail.cgroup else processes_of(jail.uid)
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            pass
    return names


def test_a_uid_is_held_by_one_jail_at_a_time(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("uids are leased only by a grader running as root")
    from grader.jail.uids import UidLease
    leases = [UidLease(tmp_path / "locks", first=62000, count=2) for _ in range(2)]
    assert sorted(lease.uid for lease in leases) == [62000, 62001]
    with pytest.raises(RuntimeError, match="in use"):
        UidLease(tmp_path / "locks", first=62000, count=2)
    leases[0].release()
    assert UidLease(tmp_path / "locks", first=62000, count=2).uid == leases[0].uid


def test_only_processes_of_a_uid_no_jail_holds_count_as_outlived(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("uids are leased only by a grader running as root")
    from grader.jail.uids import UidLease, kill_uid, outlived
    locks = tmp_path / "locks"
    lease = UidLease(locks, first=62010, count=1)
    sleeper = subprocess.Popen(["sleep", "60"], user=lease.uid, group=lease.uid)
    try:
        assert outlived(locks, first=62010, count=2) == {}, "a live jail's process counted as left behind"
        lease.release()
        assert outlived(locks, first=62010, count=2) == {62010: [sleeper.pid]}
        assert outlived(locks, first=62011, count=1) == {}
    finally:
        kill_uid(62010)
        sleeper.wait()
    assert outlived(locks, first=62010, count=1) == {}


def test_the_seccomp_filter_numbers_match_the_kernel_headers():
    headers = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
               "aarch64": Path("/usr/include/asm-generic/unistd.h")}
    checked = 0
    for arch, header in headers.items():
        if not header.exists():
            continue
        text = header.read_text()
        for name, number in {**seccomp.REFUSED[arch], **seccomp.FLAG_CHECKED[arch], "clone3": seccomp.CLONE3}.items():
            found = re.search(rf"#define __NR(?:3264)?_{name}\s+(\d+)", text)
            assert found and int(found.group(1)) == number, (arch, name)
            checked += 1
        assert len(seccomp.program(arch)) % 8 == 0
    if not checked:
        pytest.skip("no kernel headers here")


def test_cgroup_v2_limits_and_usage_on_a_fake_hierarchy(tmp_path):
    # The v2 code path on plain files laid out as cgroupfs would be: this machine may have only v1.
    base = tmp_path / "cg"
    base.mkdir()
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    group = cgroups._make_v2(base, "jail-x", 2 << 30, 128, 1.5)
    folder = Path(group.folders[""])
    assert (folder / "memory.max").read_text() == str(2 << 30)
    assert (folder / "pids.max").read_text() == "128"
    assert (folder / "cpu.max").read_text() == "150000 100000"
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    (folder / "memory.peak").write_text("1234\n")
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    (folder / "pids.events").write_text("max 0\n")
    (folder / "cgroup.procs").write_text("")
    assert group.usage() == cgroups.Usage(memory_peak=1234, memory_limit_hit=True, oom_killed=True,
                                          pids_limit_hit=False)
    assert group.kill() == []
