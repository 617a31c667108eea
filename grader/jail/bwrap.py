"""A jail for untrusted notebook code: bubblewrap, a cgroup, seccomp and a uid of its own.

A submission's kernel (and every rank it launches) runs inside `bwrap` with:

- its own PID, network, IPC and UTS namespaces: when the kernel's jail ends,
  every process it started ends with it; only the loopback network exists
  (the labs' ranks talk over 127.0.0.1), so nothing outside can be reached;
- a file system built from an allowlist, with nothing the host reads back:
  the system (/usr, /etc) and the Python installation, read-only, at their
  paths; a *copy* of the course package at /course (PYTHONPATH); a working
  folder /home/student/<lab>, private /tmp and /dev/shm, each a tmpfs of
  capped size that vanishes with the jail; the kernel's folder (connection
  file, zmq sockets), which the kernel may write only while it starts (see
  grader.jail.kernel_manager); the judge's socket, read-only. The root is read-only.
  The solutions, the reference answers, the gradebook, nbgrader's folders,
  other students' work and the rest of the course tree are not in it at all;
- limits for the whole jail in a cgroup (grader.jail.cgroups: memory, processes,
  CPU); where none can be made (a grader not root, no delegated cgroup), the
  rlimits below, and the grader sums the memory of the jail's processes every
  WATCHDOG_S and kills the largest past the limit (grader.jail.host); the console
  says which;
- rlimits, a second line: memory per process (RLIMIT_DATA: unlike RLIMIT_AS it
  does not count the large address-space reservations CUDA makes), processes
  and threads per uid (RLIMIT_NPROC), file size (RLIMIT_FSIZE), no core dumps;
- a seccomp filter (grader.jail.seccomp): no ptrace, no new namespaces, no mounts;
- an environment from an allowlist of exact names (jail_env_names), not the grader's;
- when the grader runs as root, a uid held by this jail alone (grader.jail.uids).

This module is the jail's shape: its `Limits`, its `Spec` (JSON the grader writes, which the
kernel manager and the launcher read), its folder (`prepare`), the kernel's environment and
bwrap's command line. grader.jail.host makes one on the host (folder, cgroup, uid), and after
it ends says what it used. The launcher, grader.jail.launcher, puts it to work: nbgrader's kernel
manager (grader.jail.kernel_manager) runs ``python -m grader.jail.launcher SPEC LAB -- KERNEL_ARGV``
(`launch_command`), which joins the cgroup, sets the rlimits and execs bwrap.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..common.cores import SHARED_CORES_ENV

# No `course` import at the top: the launcher imports this module once for every kernel a grading run
# starts, and importing course imports torch (1.7 s on 2 cores, a student's whole kernel start
# again). What the launcher needs of course, the grader writes into the jail's Spec.
#: Paths inside the jail: none of them names a host folder.
JAIL_HOME = "/home/student"           # the working folder is JAIL_HOME/<lab>
JAIL_COURSE = "/course"               # holds the copy of the package: /course/course
JAIL_JUDGE = "/run/grader"            # the judge's folder, read-only
#: COURSE_REFERENCE_DIR while graded: no stored values in the kernel, and no host path in its environment.
NO_REFERENCE_DIR = "/nonexistent/course-reference"
WRITABLE_INSIDE = (JAIL_HOME, "/tmp", "/dev/shm")
JAIL_HOSTS = "127.0.0.1\tlocalhost jail\n::1\tlocalhost\n"
# c10d looks up its peers' names; with DNS in the list, every lookup waits for
# a network that is not there and prints a warning into the student's output.
JAIL_NSSWITCH = "passwd: files\ngroup: files\nhosts: files\n"


def tree_home() -> Path:
    """Where the editable install imports `course` from; the jail gets a copy of its package."""
    import course
    return Path(course.__file__).resolve().parent.parent


def jail_env_names() -> frozenset[str]:
    """The grader's environment variables the jail gets (besides HOME, TMPDIR, PYTHONPATH, set), by their
    exact names: no prefix, so that an instructor's COURSE_SECRET_TOKEN or NCCL_ANYTHING stays outside."""
    from course import grading
    from course.errors import TIMEOUT_VARIABLE
    from course.placement import RANKS_VARIABLE
    return _JAIL_ENV_NAMES | {TIMEOUT_VARIABLE, RANKS_VARIABLE, grading.JUDGE_ENV, grading.DIR_ENV}


# What the course reads while graded joins them in jail_env_names: a launch's ranks and their deadline,
# the judge's socket and where (not) to find stored values. Recording (COURSE_REFERENCE_RECORD, _SEED)
# is never jailed: in a jail it would only make the kernel try to record.
_JAIL_ENV_NAMES = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "MPLBACKEND", "NBGRADER_EXECUTION",
    "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES",
    "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS",
    "PYDEVD_DISABLE_FILE_VALIDATION", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY",
    "OPENBLAS_NUM_THREADS", "JUPYTER_NO_CONFIG",
    # torch's CPU instruction set: the judge's values are recorded outside the jail with
    # the grader's, and the kernel must compute as they were computed
    "ATEN_CPU_CAPABILITY",
    # which GPUs, and how NCCL may reach them on this machine. Not GLOO_ or NCCL_SOCKET_IFNAME:
    # the jail has the loopback only, and the course finds it.
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL",
    "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE",
})
#: Seconds a graded launch waits for its ranks (course.launch reads course.errors.TIMEOUT_VARIABLE).
GRADED_RANK_TIMEOUT_S = "120"


def jail_env_defaults() -> dict[str, str]:
    """What the jail's environment holds where the grader's does not set it (the instructor may)."""
    from course.errors import TIMEOUT_VARIABLE
    # A launch's deadlock report comes at 30 s in a student's notebook; graded, two notebooks share
    # the cores and nobody waits for it, so a correct but slowed solution never loses points to it.
    # The submissions graded side by side share the cores too: their threads sleep while they wait.
    return {TIMEOUT_VARIABLE: GRADED_RANK_TIMEOUT_S, **SHARED_CORES_ENV}


@dataclass(frozen=True)
class Limits:
    """What one submission may use. Cells have their own time limit (nbgrader's Execute.timeout)."""
    wall_s: float = 1800            # the whole notebook, kernel start to feedback
    memory_bytes: int = 4 << 30     # the whole jail (cgroup); also per process (RLIMIT_DATA)
    processes: int = 256            # processes and threads of the submission (cgroup pids, RLIMIT_NPROC)
    cpus: float = float(os.cpu_count() or 1)  # CPU time per second, in cores, of the whole jail
    file_bytes: int = 256 << 20     # largest file it may write (RLIMIT_FSIZE)
    tmp_bytes: int = 512 << 20      # its private /tmp, and again /dev/shm
    work_bytes: int = 512 << 20     # its working folder (and home)
    output_bytes: int = 1 << 20     # output kept per cell in the graded notebook
    notebook_output_bytes: int = 8 << 20  # output kept in the whole graded notebook


@dataclass
class Spec:
    """One jail: written by the grader as JSON, read by the kernel manager and the launcher."""
    root: str                     # the jail's folder on the host (short: unix socket paths are)
    uid: int | None               # run as this uid (the grader is root), else as the grader's own
    limits: dict = field(default_factory=lambda: asdict(Limits()))
    readonly: list[str] = field(default_factory=list)   # host paths bound read-only at the same path
    cgroup: dict | None = None    # grader.jail.cgroups.Cgroup's fields; None: rlimits only
    cgroup_problem: str = ""      # why there is none
    memory_watchdog: bool = False  # no cgroup: the grader holds the jail's total memory (grader.jail.host)
    env_names: list[str] = field(default_factory=lambda: sorted(jail_env_names()))  # what the jail's env may hold
    env_defaults: dict[str, str] = field(default_factory=jail_env_defaults)  # unless the grader's env sets them

    @property
    def tree(self) -> Path: return Path(self.root) / "tree"            # /course inside
    @property
    def kernel_dir(self) -> Path: return Path(self.root) / "kernel"    # connection file, ipc sockets
    @property
    def judge_dir(self) -> Path: return Path(self.root) / "judge"      # the judge's socket
    @property
    def console(self) -> Path: return Path(self.root) / "console.log"  # the kernel's own stdout/stderr
    @property
    def spec_file(self) -> Path: return Path(self.root) / "jail.json"

    def save(self) -> Path:
        fd = os.open(self.spec_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # read by the grader's kernel manager and launcher only
            f.write(json.dumps(asdict(self), indent=1))
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
    """Create the jail's folder: a copy of the course package, the judge's and kernel's folders.

    The folder is the grader's alone (0700): bwrap, run by the grader, binds what the jail needs, so
    the jail's uid never walks the host path, and no other user of the machine reaches anything in it
    (the judge's socket, its log, the running cell, the gradebook's copy, the kernel's sockets)."""
    spec = Spec(str(root), uid, asdict(limits), python_paths())
    os.chmod(root, 0o700)
    shutil.copytree(tree_home() / "course", spec.tree / "course",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (Path(root) / "hosts").write_text(JAIL_HOSTS, encoding="utf-8")
    (Path(root) / "nsswitch.conf").write_text(JAIL_NSSWITCH, encoding="utf-8")
    for folder in (spec.kernel_dir, spec.judge_dir):
        folder.mkdir()
    # Read by the jail's uid through their mounts; public text, behind the 0700 folder.
    for path in [spec.tree, *spec.tree.rglob("*"), Path(root) / "hosts", Path(root) / "nsswitch.conf"]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    os.chmod(spec.judge_dir, 0o700)
    if uid is not None:
        # The jail's uid (its group: setpriv --regid) may search the judge's folder, to connect to the
        # socket there (grader.judge.server gives the socket the same group), and nothing more.
        os.chown(spec.judge_dir, 0, uid)
        os.chmod(spec.judge_dir, 0o750)
        # The kernel creates its sockets here while it starts; then grader.jail.kernel_manager seals it.
        os.chown(spec.kernel_dir, 0, uid)
        os.chmod(spec.kernel_dir, 0o770)
    spec.save()
    return spec


def _dirs_for(path: str) -> list[str]:
    # bwrap creates missing parents of a mount point with the host's permissions:
    # /root (0700) would lock the jail's uid out of a Python installed under it.
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


def workdir(lab: str) -> str:
    """The kernel's working folder inside the jail."""
    return f"{JAIL_HOME}/{lab}"


def jail_environment(spec: Spec, outside: dict[str, str]) -> dict[str, str]:
    """The kernel's environment: the allowlisted names of outside's, host paths of the jail's mapped in."""
    names = set(spec.env_names)
    env = {k: v for k, v in outside.items() if k in names}
    judge = str(spec.judge_dir)
    for key, value in env.items():
        if value == judge or value.startswith(judge + "/"):
            env[key] = JAIL_JUDGE + value[len(judge):]
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    for name, value in spec.env_defaults.items():
        env.setdefault(name, value)
    env.update(HOME=JAIL_HOME, TMPDIR="/tmp", PYTHONPATH=JAIL_COURSE, USER="student", LOGNAME="student")
    return env


def bwrap_argv(spec: Spec, lab: str, argv: list[str], env: dict[str, str], seccomp_fd: int | None) -> list[str]:
    """The bwrap command that runs argv in the jail, in its working folder for lab, with env only."""
    limits = Limits(**spec.limits)
    root = Path(spec.root)
    args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "jail", "--die-with-parent",
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
    mounts = [(p, p, "--ro-bind") for p in spec.readonly]
    mounts += [(str(spec.tree), JAIL_COURSE, "--ro-bind"),
               # The connection file names the sockets by their host paths: same path inside.
               (str(spec.kernel_dir), str(spec.kernel_dir), "--bind"),
               (str(spec.judge_dir), JAIL_JUDGE, "--ro-bind")]
    for source, target, how in sorted(mounts, key=lambda m: len(Path(m[1]).parts)):
        args += [*_dirs_for(target), how, source, target]
    folder = workdir(lab)
    args += [*_dirs_for(JAIL_HOME), "--perms", "1777", "--size", str(limits.work_bytes), "--tmpfs", JAIL_HOME,
             "--perms", "1777", "--dir", folder,
             # Every other path the jail sees is a mount of its own; the root's folders are bwrap's.
             "--remount-ro", "/", "--chdir", folder, "--clearenv"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    if spec.uid is None:
        return args + ["--unshare-user", "--disable-userns", "--", *argv]
    # As root: bwrap may read every bind source; the submission itself runs as the jail's uid.
    # A nested user namespace is refused by the seccomp filter (unshare, clone, clone3).
    return args + ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                   "setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}", "--clear-groups",
                   "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", *argv]


def launch_command(spec: Spec, lab: str, argv: list[str]) -> list[str]:
    """The command that runs argv in the jail (through the launcher, grader.jail.launcher)."""
    return [sys.executable, "-m", "grader.jail.launcher", str(spec.spec_file), lab, "--", *argv]
