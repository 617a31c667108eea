"""A JupyterLab server for tests: started with the command a Makefile target runs, stopped with all it started.

    argv = make_jupyter_command("lab", ["--no-browser", ...])     # what `make lab` runs
    with serve(argv, home=tmp_path) as server:
        http_get(server.port, "/api/status")

The command comes from `make -n TARGET` with this interpreter's venv, so the
Makefile and the tests cannot drift apart. The server listens on a port the OS
picks, with a token, and keeps its runtime, config, data, settings and
workspaces under `home`, never under $HOME. Stopping sends SIGTERM to its whole
process group (kernels included) and fails the test if anything is left.
"""
from __future__ import annotations

import http.client
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import REPO, make_environment

# Not resolved: a venv's bin/python is a symlink to the base interpreter.
VENV_DIR = Path(sys.executable).parent.parent
JUPYTER = Path(sys.executable).parent / "jupyter"
STARTUP_LIMIT_S = 60
SHUTDOWN_LIMIT_S = 30
TOKEN = secrets.token_hex(16)
TEST_LAB_ARGS = [
    "--no-browser",
    "--ServerApp.open_browser=False",
    "--ServerApp.ip=127.0.0.1",
    "--port=0",  # the OS picks a free port; the server info file says which
    f"--IdentityProvider.token={TOKEN}",
    "--ServerApp.allow_root=True",  # CI runs as root; jupyter refuses root without it
]


def make_jupyter_command(target: str, lab_args: list[str], **make_variables: str) -> list[str]:
    """The `jupyter lab` command line that `make TARGET` runs for this interpreter's venv
    (and make's variables set as given, e.g. DEMO_HOME)."""
    env = make_environment()
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={VENV_DIR}", f"LAB_ARGS={shlex.join(lab_args)}",
         *(f"{name}={value}" for name, value in make_variables.items())],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, f"make -n {target} failed:\n{result.stderr}"
    # Install steps may come first when the venv's stamp is stale; only the jupyter line matters.
    # (`jupyter lab workspaces import`, a step before `make demo`'s server, is not a server.)
    lab_commands = [argv for argv in map(shlex.split, result.stdout.splitlines())
                    if argv[:2] == [str(JUPYTER), "lab"] and argv[2:3] != ["workspaces"]]
    assert len(lab_commands) == 1, f"expected one `{JUPYTER} lab` command from `make -n {target}` in:\n{result.stdout}"
    return lab_commands[0]


def http_get(port: int, path: str, token: str | None = TOKEN) -> tuple[int, dict[str, str], bytes]:
    """One GET, redirects not followed."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": f"token {token}"} if token else {}
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class LabServer:
    process: subprocess.Popen
    log_path: Path
    runtime_dir: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def _wait_until_serving(process: subprocess.Popen, runtime_dir: Path, log_path: Path) -> int:
    deadline = time.monotonic() + STARTUP_LIMIT_S
    port = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"jupyter lab exited with {process.returncode}:\n"
                        f"{log_path.read_text(errors='replace')[-4000:]}")
        if port is None:
            # Written once the server listens; it names the port chosen for --port=0.
            for info_file in runtime_dir.glob("jpserver-*.json"):
                try:
                    port = json.loads(info_file.read_text())["port"]
                except (json.JSONDecodeError, KeyError):
                    pass  # caught mid-write
        if port is not None:
            try:
                if http_get(port, "/api/status")[0] == 200:
                    return port
            except OSError:
                pass
        time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {STARTUP_LIMIT_S} s:\n"
                f"{log_path.read_text(errors='replace')[-4000:]}")


def _stop(process: subprocess.Popen) -> None:
    stop_process_group(process, "jupyter lab", SHUTDOWN_LIMIT_S)


def stop_process_group(process: subprocess.Popen, what: str, limit_s: float, grace_s: float = 10) -> None:
    """SIGTERM to the whole process group of `process` (started with start_new_session, so its leader),
    then make sure nothing of it is left; a group that ignores SIGTERM for limit_s, or outlives its
    leader by grace_s, is killed and fails the test, naming `what`."""
    pgid = process.pid
    if process_group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    try:
        process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        process.wait(timeout=10)
        pytest.fail(f"{what} ignored SIGTERM for {limit_s:g} s and was killed")
    deadline = time.monotonic() + grace_s
    while process_group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if process_group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        pytest.fail(f"{what} exited but left processes behind in its group (killed now)")


def write_settings(settings_dir: Path, settings: Mapping[str, Mapping]) -> None:
    """User settings as JupyterLab stores them: {"@jupyterlab/notebook-extension:tracker": {...}}."""
    for plugin, values in settings.items():
        package, name = plugin.rsplit(":", 1)
        path = settings_dir / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@contextmanager
def serve(argv: list[str], home: Path, *, cwd: Path = REPO, settings: Mapping[str, Mapping] = {},
          env: Mapping[str, str | None] = {}) -> Iterator[LabServer]:
    """Run `argv` (a jupyter lab command) with every per-user folder under `home`, until the block ends.
    env: variables to set, or to unset where None."""
    runtime_dir = home / "runtime"
    # Everything the server reads or writes per user lives here, not under $HOME.
    server_env = dict(
        os.environ,
        JUPYTER_RUNTIME_DIR=str(runtime_dir),
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "lab-workspaces"),
        IPYTHONDIR=str(home / "ipython"),
    )
    for variable, value in {"JUPYTER_PORT": None, "JUPYTER_TOKEN": None, **env}.items():
        if value is None:
            server_env.pop(variable, None)
        else:
            server_env[variable] = value
    write_settings(home / "lab-settings", settings)
    log_path = home / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv, cwd=cwd, env=server_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        port = _wait_until_serving(process, runtime_dir, log_path)
        yield LabServer(process, log_path, runtime_dir, port)
    finally:
        _stop(process)
    assert process.returncode is not None
