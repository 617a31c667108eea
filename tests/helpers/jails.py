"""The grader's jail as the jail tests use it: made in a test's folder, and code run inside it.

    with jail_in(tmp_path, LIMITS) as jail:
        console = run_in_jail(jail, "print('hello')")
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from grader.jail import bwrap
from grader.jail.host import Jail


@contextlib.contextmanager
def jail_in(folder: Path, limits: bwrap.Limits, **kwargs):
    """A jail made in folder/jail (grader.jail.host.Jail's keywords: use_cgroup, ...), closed afterwards."""
    (Path(folder) / "jail").mkdir()
    made = Jail(Path(folder) / "jail", limits, **kwargs)
    try:
        yield made
    finally:
        made.close()


def run_in_jail(jail: Jail, code: str, env: dict | None = None, timeout: float = 180) -> str:
    """Run code in the jail; its console (the program's stdout and stderr, and the launcher's line)."""
    command = bwrap.launch_command(jail.spec, "lab1", [sys.executable, "-c", textwrap.dedent(code)])
    subprocess.run(command, env={**os.environ, **(env or {})}, timeout=timeout, check=False)
    return jail.spec.console.read_text(errors="replace")
