"""The classroom (deploy/hub/) for a test: `make hub` run as a person runs it, on ports of its own, then removed.

    with classroom(instructor, students) as hub:
        hub.url, hub.passwords[name], hub.home(name), hub.as_user(name)

Its users are real Unix users made for the test (names no person on the machine has) with homes under
a folder of /tmp, and removed afterwards with their homes (`make hub-remove`). The hub is the command
`make hub` runs, in a process group the test stops at the end, the users' servers with it. Only as root;
elsewhere skipped, except in CI.
"""
from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import REPO, make_environment
from .lab_server import stop_process_group

sys.path.insert(0, str(REPO / "deploy" / "hub"))  # classroom.py, a script

ROOT_PREFIX = "course-hub-"  # the classroom's folder in /tmp; its users' homes are in its home/
SETUP_LIMIT_S = 600  # the class's environment installed from nothing, on a slow machine
STOP_LIMIT_S = 60
REMOVE_LIMIT_S = 300  # `make hub-remove`: the users' processes stopped, each home removed, on a busy machine


def _quiet_ports(count: int) -> list[int]:
    """Free ports below the kernel's ephemeral range: the hub binds them a minute later (after the
    class's environment is installed), and meanwhile the other worker's servers, kernels and ranks
    take ports from that range by the hundred (bind to port 0), never from below it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports: list[int] = []
    for port in random.Random(os.getpid()).sample(range(max(1024, low - 8000), low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports below {low}")


@dataclass
class Hub:
    root: Path
    url: str
    passwords: dict[str, str]
    state: dict

    def home(self, name: str) -> Path:
        return Path(pwd.getpwnam(name).pw_dir)

    def as_user(self, name: str, cwd: Path | None = None) -> dict:
        """subprocess.run's arguments that run a command as `name`, with the class's Python first on PATH."""
        entry = pwd.getpwnam(name)
        env = {"HOME": entry.pw_dir, "USER": name, "LOGNAME": name, "LANG": "C.UTF-8",
               "PATH": f"{self.state['venv']}/bin:/usr/local/bin:/usr/bin:/bin",
               "COURSE_EXCHANGE": self.state["exchange"]}
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": [], "env": env,
                "cwd": str(cwd or entry.pw_dir)}


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the classroom makes Unix users: run the tests as root"
    missing = [tool for tool in ("useradd", "npm") if not shutil.which(tool)]
    if missing:
        return f"{' and '.join(missing)} missing: `sh deploy/hub/hub-tools.sh` installs them (as root)"
    return None


@contextmanager
def classroom(instructor: str, students: list[str], log: Path):
    why = _unavailable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the classroom's test, and `make test` runs deploy/hub/hub-tools.sh")
        pytest.skip(why)
    _remove_leftovers([instructor, *students])
    root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX))
    os.chmod(root, 0o755)  # the students reach the class's environment and the exchange through it
    port, api_port, proxy_api_port = _quiet_ports(3)
    env = make_environment()
    env.update(COURSE_HUB_API_PORT=str(api_port), COURSE_HUB_PROXY_API_PORT=str(proxy_api_port))
    argv = ["make", "--no-print-directory", "hub", f"HUB_ROOT={root}", f"HUB_HOMES={root / 'home'}",
            f"HUB_INSTRUCTOR={instructor}", f"HUB_STUDENTS={' '.join(students)}", f"HUB_PORT={port}",
            "HUB_SETUP_ARGS=--no-compile"]  # bytecode compiled as imported: 30 s less to install
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SETUP_LIMIT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"`make hub` ended ({process.returncode}) before the hub answered:\n"
                            f"{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{url}/hub/api/", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the hub did not answer in {SETUP_LIMIT_S} s:\n{log.read_text()[-4000:]}")
                time.sleep(1)
        yield Hub(root, url, json.loads((root / "logins.json").read_text()),
                  json.loads((root / "hub.json").read_text()))
    finally:
        try:  # `make` exits at once; JupyterHub stops the users' servers and its proxy, then exits
            stop_process_group(process, "`make hub` (JupyterHub, its proxy, its idle culler)", STOP_LIMIT_S,
                               grace_s=STOP_LIMIT_S)
        finally:
            made = (root / "hub.json").is_file()  # else the setup failed before it made anyone, and said why
            removed = subprocess.run(["make", "--no-print-directory", "hub-remove", f"HUB_ROOT={root}"], cwd=REPO,
                                     env=env, capture_output=True, text=True, timeout=REMOVE_LIMIT_S) if made else None
            shutil.rmtree(root, ignore_errors=True)
            assert removed is None or removed.returncode == 0, \
                f"`make hub-remove` failed:\n{removed.stdout}\n{removed.stderr}"


def _remove_leftovers(names: list[str]) -> None:
    """Remove the users of an earlier run of this helper that ended before its cleanup (a test killed at its
    time limit): the classroom refuses to take over users it did not make. Only users whose home is under
    a root this helper made are touched."""
    import classroom  # deploy/hub/classroom.py

    for name in names:
        try:
            home = Path(pwd.getpwnam(name).pw_dir)
        except KeyError:
            continue
        if home.parent.parent.parent == Path(tempfile.gettempdir()) and home.parent.parent.name.startswith(ROOT_PREFIX):
            classroom.stop_processes(name)
            subprocess.run(["userdel", "--remove", name], check=True, capture_output=True, timeout=60)
            shutil.rmtree(home.parent.parent, ignore_errors=True)
