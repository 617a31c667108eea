"""A jail for untrusted notebook code: bubblewrap, rlimits and an unprivileged uid.

A submission's kernel (and every rank it launches) runs inside `bwrap` with:

- its own PID, network, IPC and UTS namespaces: when the kernel's jail ends,
  every process it started ends with it; only the loopback network exists
  (the labs' ranks talk over 127.0.0.1), so nothing outside can be reached;
- a file system built from an allowlist: the system (/usr, /etc), the Python
  installation, read-only; a *copy* of the course package mounted where the
  editable install looks for it; the submission's own folder, writable; a
  private /tmp and /dev/shm. The solutions, the reference answers, the
  gradebook, other students' work and the rest of the course tree are not in
  it at all;
- rlimits: memory per process (RLIMIT_DATA: unlike RLIMIT_AS it does not count
  the large address-space reservations CUDA makes), processes and threads
  (RLIMIT_NPROC), file size (RLIMIT_FSIZE), no core dumps;
- when the grader runs as root, a uid of its own per grading slot, so that
  RLIMIT_NPROC counts only that slot's processes (root is exempt from it)
  and leftovers can be found by uid and killed.

The launcher is this module's ``main``: nbgrader's kernel manager runs
``python -m grader.sandbox SPEC CWD -- KERNEL_ARGV`` (see grader.sandboxed),
which sets the limits and execs bwrap.
"""
from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import course


#: Where the editable install imports `course` from: the jail mounts its copy of the tree here.
TREE_HOME = Path(course.__file__).resolve().parent.parent
BASE_UID = 61000  # slot n runs as uid BASE_UID + n (root only); far from real users' uids
SANDBOX_HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n"
# c10d looks up its peers' names; with DNS in the list, every lookup waits for
# a network that is not there and prints a warning into the student's output.
SANDBOX_NSSWITCH = "passwd: files\ngroup: files\nhosts: files\n"


@dataclass(frozen=True)
class Limits:
    """What one submission may use. Cells have their own time limit (nbgrader's Execute.timeout)."""
    wall_s: float = 1800            # the whole notebook, kernel start to feedback
    memory_bytes: int = 4 << 30     # per process (RLIMIT_DATA)
    processes: int = 256            # processes and threads of the submission (RLIMIT_NPROC)
    file_bytes: int = 256 << 20     # largest file it may write (RLIMIT_FSIZE)
    tmp_bytes: int = 512 << 20      # its private /tmp, and again /dev/shm
    output_bytes: int = 1 << 20     # output kept per cell in the graded notebook


@dataclass
class Spec:
    """One jail: written by the grader as JSON, read by the kernel manager and the launcher."""
    root: str                     # the jail's folder on the host (short: unix socket paths are)
    uid: int | None               # run as this uid (the grader is root), else as the grader's own
    limits: dict = field(default_factory=lambda: asdict(Limits()))
    readonly: list[str] = field(default_factory=list)   # host paths bound read-only at the same path

    @property
    def tree(self) -> Path: return Path(self.root) / "tree"
    @property
    def kernel_dir(self) -> Path: return Path(self.root) / "kernel"    # connection file, ipc sockets
    @property
    def judge_dir(self) -> Path: return Path(self.root) / "judge"      # the judge's socket
    @property
    def console(self) -> Path: return Path(self.root) / "console.log"  # the kernel's own stdout/stderr
    @property
    def spec_file(self) -> Path: return Path(self.root) / "sandbox.json"

    def save(self) -> Path:
        self.spec_file.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")
        return self.spec_file

    @classmethod
    def load(cls, path: str | Path) -> Spec:
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))


def python_paths() -> list[str]:
    """The Python installation the kernel needs: base prefix, virtualenv, site-packages."""
    import site
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, *site.getsitepackages()}
    paths |= {os.path.realpath(p) for p in paths}
    kept = sorted(p for p in paths if os.path.isdir(p))
    # Only the outermost of nested paths; a bind of a parent already holds the child.
    return [p for p in kept if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in kept)]


def prepare(root: Path, uid: int | None, limits: Limits) -> Spec:
    """Create the jail's folder: a copy of the course package, the judge's and kernel's folders."""
    spec = Spec(str(root), uid, asdict(limits), python_paths())
    os.chmod(root, 0o755)
    shutil.copytree(TREE_HOME / "course", spec.tree / "course",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in spec.readonly:
        add_mount_point(spec, path)
    (Path(root) / "hosts").write_text(SANDBOX_HOSTS, encoding="utf-8")
    (Path(root) / "nsswitch.conf").write_text(SANDBOX_NSSWITCH, encoding="utf-8")
    for folder in (spec.kernel_dir, spec.judge_dir):
        folder.mkdir()
    for path in [spec.tree, *spec.tree.rglob("*"), Path(root) / "hosts", Path(root) / "nsswitch.conf",
                 spec.judge_dir]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    give_to(spec.kernel_dir, uid)
    spec.save()
    return spec


def add_mount_point(spec: Spec, path: str) -> None:
    """A folder inside the course tree (a virtualenv, the work folder) needs its mount point in the copy."""
    if Path(path).is_relative_to(TREE_HOME) and Path(path) != TREE_HOME:
        target = spec.tree / Path(path).relative_to(TREE_HOME)
        target.mkdir(parents=True, exist_ok=True)
        for folder in [target, *target.parents]:
            if folder == spec.tree:
                break
            os.chmod(folder, 0o755)


def give_to(path: Path, uid: int | None) -> None:
    """Make path (recursively) the sandbox uid's, so the submission can write there."""
    if uid is None:
        return
    for p in [Path(path), *Path(path).rglob("*")]:
        os.lchown(p, uid, uid)


def _dirs_for(path: str) -> list[str]:
    # bwrap creates missing parents of a mount point with the host's permissions:
    # /root (0700) would lock the sandbox uid out of a Python installed under it.
    parts, out = Path(path).parts[1:-1], []
    for i in range(1, len(parts) + 1):
        out += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return out


def _system_binds() -> list[str]:
    args = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _gpu_binds() -> list[str]:
    # NCCL and CUDA need the driver's device files, and NVML reads /sys.
    devices = sorted(str(p) for p in Path("/dev").glob("nvidia*"))
    if not devices:
        return []
    args = []
    for dev in devices:
        args += ["--dev-bind", dev, dev]
    return args + ["--ro-bind", "/sys", "/sys"]


def bwrap_argv(spec: Spec, cwd: str, argv: list[str]) -> list[str]:
    """The bwrap command that runs argv in the jail, in cwd (the submission's folder, writable)."""
    limits = Limits(**spec.limits)
    root = Path(spec.root)
    args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent",
            # Its own session: an interrupt (SIGINT to the kernel's process group) must
            # reach the kernel and its ranks, never bwrap, whose death ends the jail.
            "--new-session",
            "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm",
            *_system_binds(),
            "--ro-bind", str(root / "hosts"), "/etc/hosts",
            "--ro-bind", str(root / "nsswitch.conf"), "/etc/nsswitch.conf",
            *_gpu_binds()]
    mounts = [(str(spec.tree), str(TREE_HOME), "--ro-bind")]
    mounts += [(p, p, "--ro-bind") for p in spec.readonly]
    mounts += [(str(spec.kernel_dir), str(spec.kernel_dir), "--bind"),
               (str(spec.judge_dir), str(spec.judge_dir), "--ro-bind"),
               (cwd, cwd, "--bind")]
    # Parents before children: a virtualenv inside the course tree goes on top of its copy.
    for source, target, how in sorted(mounts, key=lambda m: len(Path(m[1]).parts)):
        inside_tree = Path(target) != TREE_HOME and Path(target).is_relative_to(TREE_HOME)
        args += [*([] if inside_tree else _dirs_for(target)), how, source, target]
    args += ["--chdir", cwd, "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
             # ipykernel exits when its parent (that pid, outside) is not its parent
             # pid; in the jail's PID namespace it never is. --die-with-parent does that job.
             "--unsetenv", "JPY_PARENT_PID"]
    if spec.uid is None:
        return args + ["--unshare-user", "--", *argv]
    # As root: bwrap may read every bind source; the submission itself runs as the slot's uid.
    return args + ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                   "setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}", "--clear-groups",
                   "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", *argv]


def set_limits(limits: Limits) -> None:
    for which, value in ((resource.RLIMIT_DATA, limits.memory_bytes),
                         (resource.RLIMIT_NPROC, limits.processes),
                         (resource.RLIMIT_FSIZE, limits.file_bytes),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


@functools.cache
def unavailable() -> str | None:
    """Why submissions cannot be sandboxed on this machine (None: they can)."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed; on Debian or Ubuntu: apt-get install bubblewrap"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    import tempfile
    with tempfile.TemporaryDirectory(prefix="grader-probe-") as tmp:
        spec = prepare(Path(tmp), BASE_UID if os.geteuid() == 0 else None, Limits())
        probe = subprocess.run(bwrap_argv(spec, tmp, [sys.executable, "-c", "import course"]),
                               capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"bwrap cannot start a sandbox here: {probe.stderr.strip()[-300:]}"
    return None


def processes_of(uid: int) -> list[int]:
    """PIDs of the processes running as uid."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                pass
    return pids


def kill_all(uid: int | None, wait_s: float = 10) -> list[int]:
    """Kill every process of a slot's uid; returns those still there after wait_s (none, normally)."""
    if uid is None:
        return []
    deadline = time.monotonic() + wait_s
    while True:
        pids = processes_of(uid)
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    """``python -m grader.sandbox SPEC CWD -- ARGV...``: set the limits and exec bwrap."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -m grader.sandbox SPEC CWD -- ARGV...")
    spec, cwd, command = Spec.load(argv[0]), argv[1], argv[3:]
    # The kernel's own stdout/stderr (not what cells print: that goes over zmq) into a
    # file of the jail, whose size RLIMIT_FSIZE bounds.
    console = os.open(spec.console, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(console, 1)
    os.dup2(console, 2)
    add_mount_point(spec, cwd)
    set_limits(Limits(**spec.limits))
    bwrap = bwrap_argv(spec, cwd, command)
    os.execvp(bwrap[0], bwrap)


if __name__ == "__main__":
    main()
