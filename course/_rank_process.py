"""A rank's process: forked from multiprocessing's forkserver, which imports torch once, without
the parent's __main__, on the loopback interface; and ended with whatever it started.

Used by: course._processes.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.spawn
import multiprocessing.util
import os
import signal
import socket
import tempfile

from course import _forkserver_folder

# The forkserver listens on a unix socket, TEMP/pymp-XXXXXXXX/listener-XXXXXXXX, whose path the kernel
# caps at 107 bytes: a TMPDIR longer than this leaves no room.
LONGEST_TEMP_DIR = 107 - len("/pymp-xxxxxxxx/listener-xxxxxxxx")
SHORT_TEMP_DIR = "/tmp"


def _room_for_the_forkserver_socket() -> None:
    """Where TMPDIR is too long for the forkserver's socket, multiprocessing's folder goes in /tmp
    (it keeps that folder for the process, and removes it at exit); where it cannot, say what to do."""
    if len(tempfile.gettempdir()) <= LONGEST_TEMP_DIR:
        return
    if not multiprocessing.current_process()._config.get("tempdir") and os.access(SHORT_TEMP_DIR, os.W_OK | os.X_OK):
        before, tempfile.tempdir = tempfile.tempdir, SHORT_TEMP_DIR
        try:
            multiprocessing.util.get_temp_dir()
        finally:
            tempfile.tempdir = before
    made = multiprocessing.util.get_temp_dir()
    if len(made) > LONGEST_TEMP_DIR + len("/pymp-xxxxxxxx"):
        raise RuntimeError(f"the temporary folder {made!r} is too long ({len(made)} characters) for the unix socket "
                           f"the ranks are started through (107 bytes in all): set TMPDIR to a shorter folder, such "
                           f"as {SHORT_TEMP_DIR}, before starting Python (or Jupyter)")


def forkserver():
    _room_for_the_forkserver_socket()
    context = multiprocessing.get_context("forkserver")
    # The server imports torch once; every rank is a fork of it after that.
    # torch._dynamo too: the first optimizer a rank builds imports it (torch.optim's
    # methods are wrapped to disable dynamo), 1.3-1.8 s per rank on a 2-core machine.
    # It starts no threads, so forking after it stays safe.
    # _forkserver_folder: this process's multiprocessing folder removed, should this process be killed.
    context.set_forkserver_preload([_forkserver_folder.__name__, "course._worker", "torch._dynamo"])
    return context


def kill_rank(process) -> None:
    """SIGKILL a rank's process group (it and whatever it started), then the rank itself."""
    for kill in (lambda: os.killpg(process.pid, signal.SIGKILL), process.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError, AttributeError):
            pass


def abandon(process, *connections) -> None:
    """End a rank that never joined its run: killed if it started, its pipes closed."""
    if process.pid is not None:
        kill_rank(process)
        process.join(2)
    for connection in connections:
        connection.close()


@contextlib.contextmanager
def without_main_module():
    """Start ranks without re-running the parent's script in them.

    forkserver, like spawn, imports the parent's __main__ in every child: a
    script without an `if __name__ == "__main__":` guard would launch again
    from each rank. Ranks need nothing from __main__ (cloudpickle sends the
    function by value), so its entry is left out of what children prepare.
    """
    original = multiprocessing.spawn.get_preparation_data

    def without_main(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data
    multiprocessing.spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        multiprocessing.spawn.get_preparation_data = original


def loopback_interface() -> str | None:
    try:
        return next(name for _, name in socket.if_nameindex() if name.startswith("lo"))
    except (OSError, StopIteration):
        return None
