"""Covers: the lab server.

`make lab` starts JupyterLab on the course and opens the labs' index; `make demo`
the same server, opening the live demo.

Each server under test is started with the very command `make lab` (or `make demo`)
would run (read from `make -n TARGET`, with this interpreter's venv), so the Makefile and
these tests cannot drift apart. It runs on a port the OS picks, with a private
runtime/config/data directory, and is stopped with everything it started."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from helpers import REPO
from helpers.lab_server import JUPYTER, TEST_LAB_ARGS, TOKEN, http_get, make_jupyter_command, serve

LAB_INDEX = "labs/index.ipynb"
# make target -> the notebook its server lands on
LANDING = {"lab": LAB_INDEX, "demo": "solutions/demo.ipynb"}
# make target -> the page it opens: the demo in its JupyterLab workspace, the instructor's mode (deploy/demo/;
# in the browser: tests/test_demo.py)
OPENS = {"lab": f"/lab/tree/{LAB_INDEX}", "demo": "/lab/workspaces/demo/tree/solutions/demo.ipynb"}


def make_lab_command(lab_args: list[str], target: str = "lab") -> list[str]:
    """The jupyter command line that `make TARGET` runs for this interpreter's venv."""
    return make_jupyter_command(target, lab_args)


@pytest.fixture(scope="module", params=list(LANDING))
def server(request, tmp_path_factory):
    """A server started as `make lab` or `make demo` starts it, and the notebook it lands on."""
    with serve(make_lab_command(TEST_LAB_ARGS, request.param), tmp_path_factory.mktemp("jupyter")) as running:
        yield running, request.param


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    with serve(make_lab_command(TEST_LAB_ARGS), tmp_path_factory.mktemp("jupyter")) as server:
        yield server


@pytest.mark.parametrize("target", list(LANDING))
def test_make_runs_this_venvs_jupyter_on_the_course_with_its_notebook(target):
    argv = make_lab_command([], target)
    assert argv[0] == str(JUPYTER)
    assert f"--ServerApp.root_dir={REPO}" in argv
    assert f"--LabApp.default_url={OPENS[target]}" in argv, f"`make {target}` does not open {OPENS[target]}: {argv}"
    assert (REPO / LANDING[target]).is_file()


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
        path.name for path in (REPO / "labs").iterdir()
        if path.is_dir() and not path.name.startswith(".") and any(path.glob("*.ipynb"))
    )
    assert lab_dirs, "labs/ has no lab folders with notebooks"
    unlisted = [name for name in lab_dirs if name not in cells_text]
    assert not unlisted, f"{LAB_INDEX} does not mention these labs: {unlisted}"


def test_the_notebook_opens_in_jupyterlab(server):
    server, target = server
    landing = LANDING[target]
    status, headers, body = http_get(server.port, f"{OPENS[target]}?token={TOKEN}", token=None)
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    page = body.decode()
    assert "<title>JupyterLab</title>" in page
    # The page's config tells the front end which document to open.
    assert f'"treePath": "{landing}"' in page


def test_the_browser_and_the_root_url_land_on_the_notebook(server):
    server, target = server
    # What `make lab` / `make demo` hands the browser (also written with --no-browser).
    open_files = list(server.runtime_dir.glob("jpserver-*open.html"))
    opened_urls = [html.unescape(url) for f in open_files for url in re.findall(r'url=([^"]+)"', f.read_text())]
    assert any(f"{OPENS[target]}?token=" in url for url in opened_urls), f"browser would open {opened_urls}"
    status, headers, _ = http_get(server.port, "/")
    assert status == 302 and headers["location"].split("?")[0].endswith(OPENS[target]), \
        (status, headers.get("location"))


def test_server_runs_from_this_repository(server):
    server, _ = server
    status, _, body = http_get(server.port, "/api/contents/labs")
    assert status == 200
    assert json.loads(body)["type"] == "directory"
    info = [json.loads(f.read_text()) for f in server.runtime_dir.glob("jpserver-*.json")]
    assert [Path(i["root_dir"]) for i in info] == [REPO]


def test_jupyterlab_asks_no_news_question_of_whoever_opens_the_course(server):
    # On every first start JupyterLab asks "Would you like to get notified about official Jupyter news?"
    # over the page (it hid formgrader's links). The course's defaults, deploy/handout/jupyterlab-overrides.json,
    # installed in the venv by make (and by the handout's make and the hub), answer it: no news, no update check.
    running, _ = server
    status, _, body = http_get(running.port, "/lab/api/settings/@jupyterlab/apputils-extension:notification")
    assert status == 200, body[:500]
    defaults = {name: spec.get("default") for name, spec in json.loads(body)["schema"]["properties"].items()}
    assert (defaults["fetchNews"], defaults["checkForUpdates"]) == ("false", False), defaults
