"""Covers: grader.jail.seccomp, grader.jail.bwrap, grader.jail.host, grader.jail.uids, grader.jail.launcher.

The jail's edges (issue 33, item 10): the system calls and socket families its seccomp filter
refuses, the environment it passes by exact names, and the memory of the whole jail where there
is no cgroup (a grader not root): the grader's watchdog, tried as root and as an unprivileged uid.

The filter's decisions are read by a small interpreter of its BPF program first (both
architectures, no kernel needed), then tried in a jail. Each jail test takes seconds.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from grader.grading import verdict
from grader.jail import bwrap, seccomp
from grader.jail.host import JailUsage
from grader.jail.kernel_manager import OLD_SPEC_ENV, SPEC_ENV
from grader.jail.uids import descendants, start_time
from helpers import REPO, needs_jail
from helpers.jails import jail_in, run_in_jail

pytestmark = pytest.mark.grading

LIMITS = bwrap.Limits(memory_bytes=1 << 30, processes=64, tmp_bytes=64 << 20, work_bytes=64 << 20)
#: Three children of 400 MB each, touched, held for 4 s: 1.2 GB in all against a 1 GiB jail.
SPLIT_BOMB = """
    import subprocess, sys
    hold = "x = bytearray(400 << 20)\\nfor i in range(0, len(x), 4096): x[i] = 1\\nimport time; time.sleep(4)"
    children = [subprocess.Popen([sys.executable, "-c", hold]) for _ in range(3)]
    print("exits", sorted(c.wait() for c in children))
"""


@pytest.fixture
def bare_jail(tmp_path):
    """A jail with no cgroup: the rlimits and the grader's watchdog, as for a grader not root."""
    with jail_in(tmp_path, LIMITS, use_cgroup=False) as made:
        yield made


# --------------------------------------------------------------------------
# The seccomp filter: io_uring and socket families
# --------------------------------------------------------------------------

def _decide(arch: str, call: str, *args: int) -> int:
    """What the filter for arch returns for call(args): seccomp.RET_ALLOW or RET_ERRNO | errno."""
    numbers = {**seccomp.REFUSED[arch], **seccomp.FLAG_CHECKED[arch], **seccomp.FAMILY_CHECKED[arch],
               "clone3": seccomp.CLONE3, "getpid": {"x86_64": 39, "aarch64": 172}[arch]}
    args = (list(args) + [0] * 6)[:6]
    data = struct.pack("=iIQ6Q", numbers[call], seccomp.AUDIT_ARCH[arch], 0, *args)  # struct seccomp_data
    program = seccomp.program(arch)
    pc = acc = 0
    while True:
        code, jt, jf, k = struct.unpack_from("=HBBI", program, pc * 8)
        if code == seccomp.LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == seccomp.AND_K:
            acc &= k
        elif code in (seccomp.JEQ_K, seccomp.JGE_K):
            pc += jt if (acc == k if code == seccomp.JEQ_K else acc >= k) else jf
        elif code == seccomp.RET_K:
            return k
        else:
            raise AssertionError(f"instruction {code:#x} at {pc}")
        pc += 1


@pytest.mark.parametrize("arch", sorted(seccomp.AUDIT_ARCH))
def test_the_filter_refuses_io_uring_and_every_socket_family_but_four(arch):
    allow, refused = seccomp.RET_ALLOW, lambda e: seccomp.RET_ERRNO | e
    for call in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        assert _decide(arch, call) == refused(errno.EPERM), call
    for family in (1, 2, 10):  # AF_UNIX, AF_INET, AF_INET6
        assert _decide(arch, "socket", family, 1, 0) == allow, family
        assert _decide(arch, "socket", family | 0xFFFF_FFFF_0000_0000, 1, 0) == allow  # the kernel reads an int
    assert _decide(arch, "socket", 16, 3, 0) == allow  # AF_NETLINK, NETLINK_ROUTE: getifaddrs
    for protocol in (4, 9, 15, 16):  # NETLINK_SOCK_DIAG, _AUDIT, _KOBJECT_UEVENT, _GENERIC
        assert _decide(arch, "socket", 16, 3, protocol) == refused(errno.EPROTONOSUPPORT), protocol
    for family in (0, 3, 4, 5, 15, 17, 21, 24, 29, 30, 31, 38, 40, 42, 44, 45, 46, 0x1_0000_0028):
        # AF_UNSPEC, AX25, IPX, APPLETALK, KEY, PACKET, RDS, PPPOX, CAN, TIPC, BLUETOOTH, ALG,
        # VSOCK, QIPCRTR, XDP, MCTP, beyond the last; AF_VSOCK with high bits the kernel ignores
        assert _decide(arch, "socket", family, 1, 0) == refused(errno.EAFNOSUPPORT), family
    assert _decide(arch, "socketpair", 1, 1, 0) == allow
    assert _decide(arch, "socketpair", 2, 1, 0) == refused(errno.EAFNOSUPPORT)
    assert _decide(arch, "socketpair", 40, 1, 0) == refused(errno.EAFNOSUPPORT)
    # What was there before stays
    assert _decide(arch, "getpid") == allow and _decide(arch, "ptrace") == refused(errno.EPERM)
    assert _decide(arch, "clone3") == refused(errno.ENOSYS)


def test_the_socket_call_numbers_match_the_kernel_headers():
    headers = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
               "aarch64": Path("/usr/include/asm-generic/unistd.h")}
    checked = 0
    for arch, header in headers.items():
        if header.exists():
            text = header.read_text()
            for name, number in seccomp.FAMILY_CHECKED[arch].items():
                found = re.search(rf"#define __NR(?:3264)?_{name}\s+(\d+)", text)
                assert found and int(found.group(1)) == number, (arch, name)
                checked += 1
    if not checked:
        pytest.skip("no kernel headers here")


@needs_jail()
def test_in_the_jail_io_uring_and_other_socket_families_are_refused(bare_jail):
    console = run_in_jail(bare_jail, """
        import ctypes, os, socket
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        params = ctypes.create_string_buffer(120)  # struct io_uring_params
        for name, number, args in (("io_uring_setup", 425, (8, params)), ("io_uring_enter", 426, (0, 1, 0, 0, None, 0)),
                                   ("io_uring_register", 427, (0, 0, None, 0))):
            result = libc.syscall(number, *args)
            print(name, "ok" if result >= 0 else os.strerror(ctypes.get_errno()))
        tries = {"AF_UNIX": (1, 1, 0), "AF_INET": (2, 1, 0), "AF_INET6": (10, 2, 0), "NETLINK_ROUTE": (16, 3, 0),
                 "AF_VSOCK": (40, 1, 0), "AF_PACKET": (17, 3, 768), "AF_BLUETOOTH": (31, 5, 0), "AF_ALG": (38, 5, 0),
                 "AF_CAN": (29, 3, 1), "AF_TIPC": (30, 5, 0), "AF_KEY": (15, 3, 2), "AF_XDP": (44, 3, 0),
                 "NETLINK_AUDIT": (16, 3, 9), "NETLINK_KOBJECT_UEVENT": (16, 2, 15), "NETLINK_GENERIC": (16, 3, 16)}
        for name, (family, kind, protocol) in tries.items():
            try:
                socket.socket(family, kind, protocol).close()
                print(name, "ok")
            except OSError as e:
                print(name, "errno", e.errno)
        a, b = socket.socketpair()
        print("socketpair ok")
        print("interfaces", [n for _, n in socket.if_nameindex()])
    """)
    for call in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        assert f"{call} Operation not permitted" in console, console
    for allowed in ("AF_UNIX", "AF_INET", "AF_INET6", "NETLINK_ROUTE", "socketpair"):
        assert f"{allowed} ok" in console, console
    for family in ("AF_VSOCK", "AF_PACKET", "AF_BLUETOOTH", "AF_ALG", "AF_CAN", "AF_TIPC", "AF_KEY", "AF_XDP"):
        assert f"{family} errno {errno.EAFNOSUPPORT}" in console, console
    for protocol in ("NETLINK_AUDIT", "NETLINK_KOBJECT_UEVENT", "NETLINK_GENERIC"):
        assert f"{protocol} errno {errno.EPROTONOSUPPORT}" in console, console
    assert "interfaces ['lo']" in console, console  # what gloo and course._processes look up


# --------------------------------------------------------------------------
# The environment: exact names
# --------------------------------------------------------------------------

def test_the_environment_passes_by_exact_names_only(tmp_path):
    from course import grading
    from course.errors import TIMEOUT_VARIABLE
    from course.placement import RANKS_VARIABLE

    spec = bwrap.Spec(root=str(tmp_path), uid=None)
    wanted = {TIMEOUT_VARIABLE: "300", RANKS_VARIABLE: "4", grading.DIR_ENV: "/nowhere",
              grading.JUDGE_ENV: str(spec.judge_dir / "judge.sock"), "NBGRADER_EXECUTION": "autograde",
              "MPLBACKEND": "agg", "OMP_NUM_THREADS": "2", "LC_ALL": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "0",
              "NCCL_P2P_DISABLE": "1", "PATH": "/usr/bin"}
    unwanted = {"COURSE_SECRET_TOKEN": "s3cret", "COURSE_ANYTHING_ELSE": "x", grading.RECORD_ENV: "/host/ref",
                grading.SEED_ENV: "7", "NCCL_ANYTHING": "x", "CUDA_SECRET": "x", "NVIDIA_VISIBLE_DEVICES": "all",
                "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0", "LC_SECRET": "x",
                SPEC_ENV: "/host/spec.json", OLD_SPEC_ENV: "/host/spec.json", "GRADER_JUDGE_CELL_FILE": "/host/cell",
                "AWS_SECRET": "x"}
    env = bwrap.jail_environment(spec, {**wanted, **unwanted})
    assert not set(unwanted) & set(env), sorted(set(unwanted) & set(env))
    assert {k: env[k] for k in wanted} == {**wanted, grading.JUDGE_ENV: f"{bwrap.JAIL_JUDGE}/judge.sock"}
    assert not any(name.endswith("_") for name in bwrap.jail_env_names())
    assert not hasattr(bwrap, "JAIL_ENV_PREFIXES")


@needs_jail()
def test_an_instructors_course_variables_stay_outside_the_jail(bare_jail):
    console = run_in_jail(bare_jail, """
        import os
        print("seen", sorted(k for k in os.environ if k.startswith(("COURSE_", "NCCL_", "GLOO_"))))
    """, env={"COURSE_SECRET_TOKEN": "s3cret", "COURSE_ANYTHING_ELSE": "1", "COURSE_RANKS": "3",
              "NCCL_ANYTHING": "1", "GLOO_SOCKET_IFNAME": "eth0"})
    assert "seen ['COURSE_RANKS', 'COURSE_RANK_TIMEOUT']" in console, console


# --------------------------------------------------------------------------
# Memory without a cgroup: the grader's watchdog
# --------------------------------------------------------------------------

def test_descendants_are_a_process_and_every_process_below_it():
    tree, found = subprocess.Popen(["sh", "-c", "sleep 30 & (sleep 30 & wait) & wait"]), {}
    try:
        for _ in range(200):  # the shells start theirs
            found = descendants(tree.pid, start_time(tree.pid))
            if len(found) == 4:
                break
            time.sleep(0.05)
        assert len(found) == 4 and tree.pid in found, found  # sh, sleep, the subshell, its sleep
        assert all(start_time(pid) == born for pid, born in found.items())
        assert descendants(tree.pid, start_time(tree.pid) + 1) == {}, "a later process of the same pid"
    finally:
        tree.kill()
        tree.wait()
        for pid in found:
            subprocess.run(["kill", "-9", str(pid)], stderr=subprocess.DEVNULL)


@needs_jail()
def test_memory_split_over_processes_is_held_to_the_jails_limit_without_a_cgroup(bare_jail):
    console = run_in_jail(bare_jail, SPLIT_BOMB)
    usage = bare_jail.usage()
    assert "exits [-9, 0, 0]" in console, console  # the largest, once; the rest then fit
    assert usage.enforced == "watchdog" and usage.per_jail and usage.oom_killed and usage.memory_limit_hit
    assert LIMITS.memory_bytes < usage.memory_peak < LIMITS.memory_bytes + (400 << 20), usage
    said = verdict.why_died("", LIMITS, usage)
    assert said.startswith(": it was killed for using more than the 1 GiB memory limit of its jail (peak 1."), said


@needs_jail()
@pytest.mark.timeout(300)
def test_ranks_over_gloo_in_a_jail_without_a_cgroup_fit_and_are_not_killed(bare_jail):
    console = run_in_jail(bare_jail, """
        import course, torch, torch.distributed as dist
        def total():
            t = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(t)
            return t.item()
        print("ranks", course.launch(total, 4))
    """)
    usage = bare_jail.usage()
    assert "ranks RankResults([10.0, 10.0, 10.0, 10.0])" in console, console
    # torch's pages shared by the kernel, the forkserver and the ranks count once (PSS)
    assert not usage.oom_killed and 0 < usage.memory_peak < LIMITS.memory_bytes * 0.7, usage


def _closed_folder(path: str) -> Path | None:
    """The outermost folder above path that others may not enter (/root, say), if any."""
    for parent in reversed(Path(path).parents):
        if not os.stat(parent).st_mode & 0o001:
            return parent
    return None


@needs_jail()
@pytest.mark.timeout(300)
def test_as_an_unprivileged_user_split_memory_is_killed_and_the_verdict_says_so(tmp_path):
    # The grader as a user, not root: no uid of its own for the jail, no cgroup, bwrap in a
    # user namespace. It runs here as nobody (65534) through setpriv.
    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("unshare")):
        pytest.skip("needs root, setpriv and unshare to become another user")
    python = os.path.realpath(sys.executable)
    if _closed_folder(str(REPO)) or _closed_folder(sys.prefix):
        pytest.skip("the checkout or its virtualenv is in a folder others may not enter")
    folder = Path(tempfile.mkdtemp(prefix="grader-unprivileged-"))  # /tmp: tmp_path is root's alone
    try:
        os.chmod(folder, 0o755)
        (folder / "real").mkdir()
        (folder / "jail").mkdir()
        os.chown(folder / "jail", 65534, 65534)
        script = folder / "grade.py"
        script.write_text(textwrap.dedent(f"""
            import json, subprocess, sys, textwrap
            from dataclasses import asdict
            from pathlib import Path
            from grader.grading import verdict
            from grader.jail import bwrap
            from grader.jail.host import Jail
            limits = bwrap.Limits(**json.loads({json.dumps(asdict(LIMITS))!r}))
            jail = Jail(Path({str(folder / "jail")!r}), limits)  # asks for a cgroup: a user gets none
            try:
                command = bwrap.launch_command(jail.spec, "lab1", [sys.executable, "-c",
                                                                     textwrap.dedent({SPLIT_BOMB!r})])
                subprocess.run(command, timeout=120)
                usage = jail.usage()
                print(json.dumps({{"uid": jail.uid, "cgroup": jail.spec.cgroup, "usage": asdict(usage),
                                  "console": jail.spec.console.read_text(),
                                  "verdict": verdict.why_died("", limits, usage)}}))
            finally:
                jail.close()
        """))
        # The interpreter may be under a folder nobody may enter (/root): in a mount namespace of
        # its own, that folder becomes an open tmpfs holding only the way to the interpreter.
        closed, mounts = _closed_folder(python), ""
        if closed:
            inside = Path(python).relative_to(closed).parts[0]
            mounts = (f"mount --bind {closed} {folder}/real && mount -t tmpfs -o mode=0755,size=1m tmpfs {closed} && "
                      f"mkdir {closed}/{inside} && mount --bind {folder}/real/{inside} {closed}/{inside} && ")
        run = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             mounts + f"cd {folder} && exec setpriv --reuid=65534 --regid=65534 --clear-groups "
             f"env HOME={folder} TMPDIR={folder} PATH=/usr/bin:/bin PYTHONPATH={REPO} {sys.executable} {script}"],
            capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        result = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    usage = JailUsage(LIMITS, **{k: v for k, v in result["usage"].items() if k != "limits"})
    assert result["uid"] is None and result["cgroup"] is None, result
    assert "the grader sums its processes' memory" in result["console"], result["console"]
    assert "exits [-9, 0, 0]" in result["console"], result["console"]
    assert usage.enforced == "watchdog" and usage.oom_killed and usage.memory_peak > LIMITS.memory_bytes
    assert "killed for using more than the 1 GiB memory limit of its jail" in result["verdict"], result


def test_where_only_rlimits_held_memory_the_verdict_says_the_total_was_not_limited():
    usage = JailUsage(LIMITS, "rlimits")
    assert not usage.per_jail
    limit = verdict.memory_limit(LIMITS, usage)
    assert limit.startswith("the 1 GiB memory limit per process") and "not limited" in limit, limit
    said = verdict.why_died("", LIMITS, usage)
    assert "1 GiB per process" in said and "processes together was not limited" in said, said
    assert verdict.memory_limit(LIMITS, JailUsage(LIMITS, "watchdog")) == "the 1 GiB memory limit of its jail"


def test_the_launcher_reads_the_jails_names_from_its_spec_and_never_imports_the_course(tmp_path):
    """The launcher runs once for every kernel a grading run starts: importing course (and torch) there
    cost every student 1.7 s. What it needs of course, the allowed names, comes in the jail's Spec."""
    from grader.jail import bwrap
    spec = bwrap.Spec(root=str(tmp_path), uid=None)
    assert set(spec.env_names) == bwrap.jail_env_names()
    loaded = bwrap.Spec.load(spec.save())
    assert loaded.env_names == spec.env_names
    loaded.env_names = ["PATH"]   # the launcher keeps exactly what its spec allows
    assert set(bwrap.jail_environment(loaded, {"PATH": "/usr/bin", "MPLBACKEND": "agg"})) == {
        "PATH", "COURSE_RANK_TIMEOUT", "OMP_WAIT_POLICY", "HOME", "TMPDIR", "PYTHONPATH", "USER", "LOGNAME"}
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, grader.jail.bwrap\n"
         "print(sorted({m.split('.')[0] for m in sys.modules} & {'course', 'torch', 'numpy'}))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert imported == "[]", f"`python -m grader.jail.bwrap` imports {imported}: every kernel start pays for it"
