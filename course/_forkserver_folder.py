"""Preloaded in multiprocessing's forkserver (by course._rank_process), so that the folder of the
process that started it, TEMP/pymp-*, is not left behind when that process is killed. Imported
anywhere else, it does nothing.

The forkserver listens on a unix socket in that process's multiprocessing folder, which the process
removes as it exits, but not when it is killed (a notebook's kernel shut down by SIGKILL, a forked
test's os._exit): hundreds of folders in /tmp after a test suite. The forkserver ends by itself once
the process that started it is gone (its "alive" pipe reads EOF), and then removes the folder. It
leaves that process's group first, so that a kill of the whole group (how Jupyter ends a kernel)
leaves it to end so. Ranks are forks of it and end with os._exit, never running the removal.

Used by: course._rank_process.
"""
from __future__ import annotations

import atexit
import multiprocessing.forkserver
import os
import shutil
import socket
import sys
import time


def _listening_folder() -> str | None:
    """The folder of the forkserver's listening socket, TEMP/pymp-*/listener-*; None where there is none
    to find (no /proc: not Linux, or an abstract socket)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return None
    for fd in fds:
        try:
            own = os.dup(fd)
        except OSError:
            continue
        try:
            listener = socket.socket(fileno=own)
        except OSError:
            os.close(own)
            continue
        with listener:
            try:
                address = listener.getsockname()
            except OSError:
                continue
        if (isinstance(address, str) and os.path.basename(address).startswith("listener-")
                and os.path.basename(os.path.dirname(address)).startswith("pymp-")):
            return os.path.dirname(address)
    return None


def _remove_if_orphaned(folder: str, started_by: int, wait_s: float = 5.0) -> None:
    # A dying process closes its files (the forkserver reads EOF) a moment before its children pass
    # to another parent: wait for that. Still its parent's child after wait_s, it was stopped by a
    # parent that lives on, and that removes its own folder as it exits.
    deadline = time.monotonic() + wait_s
    while os.getppid() == started_by and time.monotonic() < deadline:
        time.sleep(0.02)
    if os.getppid() != started_by:
        shutil.rmtree(folder, ignore_errors=True)


def _preloaded_by_the_forkserver() -> bool:
    """Whether this import is the forkserver's preload: its main() is on the stack."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_code.co_filename == multiprocessing.forkserver.__file__:
            return True
        frame = frame.f_back
    return False


FOLDER = _listening_folder() if _preloaded_by_the_forkserver() else None
if FOLDER is not None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    atexit.register(_remove_if_orphaned, FOLDER, os.getppid())
