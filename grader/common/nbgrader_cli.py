"""Running the nbgrader command line from the course root, the same way every time.

A subprocess, not nbgrader's in-process API: config loading is exactly the
CLI's, and no nbgrader or traitlets state leaks from one run into the next.
(Grading, which runs autograde once per notebook, keeps one warm nbgrader per
slot instead: grader.grading.autograde_worker.)
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from grader import GraderError

from .labs import RELEASE_DIR, SOURCE_DIR

LOG_TAIL_CHARS = 6000
PR_SET_PDEATHSIG = 1  # linux/prctl.h
GRADER_PARENT = str(Path(__file__).resolve().parents[2])  # the folder that holds grader/


def _path_with_scripts(path: str) -> str:
    # nbgrader's gradebook runs the `alembic` console script: find it next to
    # this interpreter even when the virtualenv is not activated.
    scripts = [str(Path(sys.executable).parent), sysconfig.get_path("scripts")]
    return os.pathsep.join(dict.fromkeys(scripts + path.split(os.pathsep)))


def put_scripts_on_path() -> None:
    """Let this process open a new gradebook (nbgrader.api calls `alembic` when it creates one)."""
    os.environ["PATH"] = _path_with_scripts(os.environ.get("PATH", ""))


@functools.cache
def scratch_dir() -> str:
    """A temporary folder of this process's, removed when it exits: the TMPDIR of the
    nbgrader processes it starts. With JUPYTER_NO_CONFIG, jupyter_core gives every process
    an empty config folder of its own in TMPDIR and never removes it: hundreds a class."""
    folder = tempfile.mkdtemp(prefix="course-grader-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Only the course's nbgrader_config.py counts, not ~/.jupyter or /etc/jupyter,
    # so every machine releases and grades the same way.
    env["JUPYTER_NO_CONFIG"] = "1"
    env["TMPDIR"] = scratch_dir()
    env["PATH"] = _path_with_scripts(env.get("PATH", ""))
    # This grader, for the Python processes it starts (nbgrader's, the jail's launcher, the judges), also
    # where nothing installed it: `python -m grader` in an instructor's copy of the course on a hub (deploy/hub/).
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([GRADER_PARENT, *filter(None, env.get("PYTHONPATH", "").split(
        os.pathsep))]))
    env.update(extra or {})
    return env


def run(args: Sequence[str], root: Path, *, env: Mapping[str, str] | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """`python -m nbgrader ARGS` with cwd = root; output (stdout and stderr together) in .stdout."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    try:
        return subprocess.run(cmd, cwd=root, env=environment(env), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise GraderError(f"`nbgrader {' '.join(args)}` did not finish within {timeout:.0f} s") from e


def die_with_grader() -> None:
    # In the child, before exec: if the grader dies (killed, Ctrl-C), so does the child,
    # and with nbgrader the kernel's jail (bwrap --die-with-parent).
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(proc: subprocess.CompletedProcess) -> str:
    log = (proc.stdout or "").strip()
    return log if len(log) <= LOG_TAIL_CHARS else "...\n" + log[-LOG_TAIL_CHARS:]


def generate_assignment(lab: str, root: Path, dest: Path | None = None, db_url: str | None = None) -> None:
    """Run ``nbgrader generate_assignment LAB --force`` with cwd = course root.

    dest / db_url override the config's release directory / gradebook.
    """
    args = ["generate_assignment", lab, "--force", "--log-level=WARN"]
    if dest is not None:
        args.append(f"--CourseDirectory.release_directory={dest}")
    if db_url is not None:
        args.append(f"--CourseDirectory.db_url={db_url}")
    proc = run(args, root)
    out_dir = (dest if dest is not None else root / RELEASE_DIR) / lab
    if proc.returncode != 0 or not (out_dir / f"{lab}.ipynb").is_file():
        raise GraderError(
            f"nbgrader generate_assignment failed for {SOURCE_DIR}/{lab}/{lab}.ipynb "
            f"(exit status {proc.returncode}):\n{log_tail(proc)}"
        )
