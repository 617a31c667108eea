"""`make lab` starts JupyterLab on the course and opens the labs' index.

The server under test is started with the very command `make lab` would run
(read from `make -n lab`, with this interpreter's venv), so the Makefile and
this test cannot drift apart. It runs on a port the OS picks, with a private
runtime/config/data directory, and is stopped with everything it started."""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LAB_INDEX = "labs/index.ipynb"
INDEX_TREE_URL = f"/lab/tree/{LAB_INDEX}"
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


def make_lab_command(lab_args: list[str]) -> list[str]:
    """The jupyter command line that `make lab` runs for this interpreter's venv."""
    # A parent `make test` passes its own settings down through MAKEFLAGS; drop them.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "lab", f"VENV={VENV_DIR}", f"LAB_ARGS={shlex.join(lab_args)}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, f"make -n lab failed:\n{result.stderr}"
    # Install steps may come first when the venv's stamp is stale; only the jupyter line matters.
    lab_commands = [argv for argv in map(shlex.split, result.stdout.splitlines()) if argv[:2] == [str(JUPYTER), "lab"]]
    assert len(lab_commands) == 1, f"expected one `{JUPYTER} lab` command in:\n{result.stdout}"
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


class LabServer:
    def __init__(self, process: subprocess.Popen, log_path: Path, runtime_dir: Path, port: int):
        self.process, self.log_path, self.runtime_dir, self.port = process, log_path, runtime_dir, port

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def _wait_until_serving(process: subprocess.Popen, runtime_dir: Path, log_path: Path) -> int:
    deadline = time.monotonic() + STARTUP_LIMIT_S
    port = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"jupyter lab exited with {process.returncode}:\n{log_path.read_text(errors='replace')[-4000:]}")
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
    pytest.fail(f"jupyter lab did not answer within {STARTUP_LIMIT_S} s:\n{log_path.read_text(errors='replace')[-4000:]}")


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's whole process group, then make sure nothing is left."""
    pgid = process.pid  # start_new_session made the server its group's leader
    if process_group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    try:
        process.wait(timeout=SHUTDOWN_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        process.wait(timeout=10)
        pytest.fail(f"jupyter lab ignored SIGTERM for {SHUTDOWN_LIMIT_S} s and was killed")
    deadline = time.monotonic() + 10
    while process_group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if process_group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        pytest.fail("jupyter lab exited but left processes behind in its group (killed now)")


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    jupyter_home = tmp_path_factory.mktemp("jupyter")
    runtime_dir = jupyter_home / "runtime"
    # Everything the server reads or writes per user lives here, not under $HOME.
    env = dict(
        os.environ,
        JUPYTER_RUNTIME_DIR=str(runtime_dir),
        JUPYTER_CONFIG_DIR=str(jupyter_home / "config"),
        JUPYTER_DATA_DIR=str(jupyter_home / "data"),
        JUPYTERLAB_SETTINGS_DIR=str(jupyter_home / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(jupyter_home / "lab-workspaces"),
        IPYTHONDIR=str(jupyter_home / "ipython"),
    )
    for variable in ("JUPYTER_PORT", "JUPYTER_TOKEN"):
        env.pop(variable, None)
    log_path = jupyter_home / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            make_lab_command(TEST_LAB_ARGS), cwd=REPO_ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        port = _wait_until_serving(process, runtime_dir, log_path)
        yield LabServer(process, log_path, runtime_dir, port)
    finally:
        _stop(process)
    assert process.returncode is not None


def test_make_lab_runs_this_venvs_jupyter_on_the_course_with_the_index():
    argv = make_lab_command([])
    assert argv[0] == str(JUPYTER)
    assert f"--ServerApp.root_dir={REPO_ROOT}" in argv
    assert any(LAB_INDEX in arg for arg in argv[2:]), f"`make lab` does not mention {LAB_INDEX}: {argv}"


def test_index_notebook_is_served_and_lists_the_labs(lab_server):
    status, _, body = http_get(lab_server.port, f"/api/contents/{LAB_INDEX}?content=1")
    assert status == 200, f"GET /api/contents/{LAB_INDEX} gave {status}: {body[:500]!r}"
    model = json.loads(body)
    assert model["type"] == "notebook"
    cells_text = "\n".join(
        "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for cell in model["content"]["cells"]
    )
    lab_dirs = sorted(
        path.name for path in (REPO_ROOT / "labs").iterdir()
        if path.is_dir() and not path.name.startswith(".") and any(path.glob("*.ipynb"))
    )
    assert lab_dirs, "labs/ has no lab folders with notebooks"
    unlisted = [name for name in lab_dirs if name not in cells_text]
    assert not unlisted, f"{LAB_INDEX} does not mention these labs: {unlisted}"


def test_index_opens_in_jupyterlab(lab_server):
    status, headers, body = http_get(lab_server.port, f"{INDEX_TREE_URL}?token={TOKEN}", token=None)
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    page = body.decode()
    assert "<title>JupyterLab</title>" in page
    # The page's config tells the front end which document to open.
    assert f'"treePath": "{LAB_INDEX}"' in page


def test_the_browser_and_the_root_url_land_on_the_index(lab_server):
    # What `make lab` hands the browser (also written with --no-browser).
    open_files = list(lab_server.runtime_dir.glob("jpserver-*open.html"))
    opened_urls = [html.unescape(url) for f in open_files for url in re.findall(r'url=([^"]+)"', f.read_text())]
    assert any(f"{INDEX_TREE_URL}?token=" in url for url in opened_urls), f"browser would open {opened_urls}"
    status, headers, _ = http_get(lab_server.port, "/")
    assert status == 302 and headers["location"].split("?")[0].endswith(INDEX_TREE_URL), (status, headers.get("location"))


def test_server_runs_from_this_repository(lab_server):
    status, _, body = http_get(lab_server.port, "/api/contents/labs")
    assert status == 200
    assert json.loads(body)["type"] == "directory"
    info = [json.loads(f.read_text()) for f in lab_server.runtime_dir.glob("jpserver-*.json")]
    assert [Path(i["root_dir"]) for i in info] == [REPO_ROOT]
