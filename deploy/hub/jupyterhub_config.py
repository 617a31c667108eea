"""JupyterHub's configuration for the course's classroom (deploy/hub/classroom.py makes what it names).

    COURSE_HUB_ROOT=/srv/course-hub jupyterhub -f deploy/hub/jupyterhub_config.py      # what `make hub` runs

Real local Unix users log in with their passwords (PAM); each gets a JupyterLab of their own,
started as their own user (LocalProcessSpawner), from the classroom's environment; an idle server
is stopped after COURSE_HUB_IDLE_S seconds (jupyterhub-idle-culler, as a hub service). The
instructor's opens in ~/course (nbgrader's course root: formgrader); a student's in their home
(the Assignment List fetches the labs there), without formgrader.

Environment: COURSE_HUB_ROOT (required); COURSE_HUB_IP (default 127.0.0.1: this machine only; 0.0.0.0
to serve a network, behind TLS), COURSE_HUB_PORT (8000), COURSE_HUB_API_PORT (the hub's internal API, 8081),
COURSE_HUB_PROXY_API_PORT (the proxy's, 8001), COURSE_HUB_IDLE_S (3600).
"""
import json
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 -- injected by traitlets when JupyterHub loads this file

ROOT = Path(os.environ["COURSE_HUB_ROOT"]).resolve()
CLASS = json.loads((ROOT / "hub.json").read_text())
VENV = Path(CLASS["venv"])
STATE = ROOT / "state"

c.JupyterHub.ip = os.environ.get("COURSE_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("COURSE_HUB_PORT", "8000"))
c.JupyterHub.hub_port = int(os.environ.get("COURSE_HUB_API_PORT", "8081"))
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.command = [CLASS["proxy"]]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{int(os.environ.get('COURSE_HUB_PROXY_API_PORT', '8001'))}"
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")

# Who may log in: the class, by their Unix passwords. No session is opened through PAM (containers
# and small machines have no logind to open one with); the server still runs as the user.
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = {CLASS["instructor"], *CLASS["students"]}
c.Authenticator.admin_users = {CLASS["instructor"]}
c.PAMAuthenticator.open_sessions = False

c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [str(VENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
# The class's Python first: its `python` in a terminal, its `jupyter`, its `nbgrader`. The exchange
# also for the course's own nbgrader_config.py (the instructor's ~/course), which would otherwise
# keep its one-machine exchange under grader/work/.
c.Spawner.environment = {"PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
                         "COURSE_EXCHANGE": CLASS["exchange"]}
# A cold start imports JupyterLab and nbgrader from a fresh environment: give it time on a slow machine.
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180


def by_role(spawner):
    """The instructor's JupyterLab opens in the course (formgrader's course root); a student's in their
    home, without formgrader or the authoring tools: the classroom's configuration for students comes
    first on their JUPYTER_CONFIG_PATH, above their own and the environment's."""
    config = CLASS["config"]
    if spawner.user.name == CLASS["instructor"]:
        spawner.notebook_dir, path = "~/course", [config["instructor"], config["everyone"]]
    else:
        spawner.notebook_dir, path = "~", [config["students"], config["everyone"]]
    spawner.environment = {**spawner.environment, "JUPYTER_CONFIG_PATH": os.pathsep.join(path)}


c.Spawner.pre_spawn_hook = by_role

# An idle server (no kernel busy, no browser tab) is stopped: its memory, and a GPU where it holds one,
# go back to the class.
IDLE_S = int(os.environ.get("COURSE_HUB_IDLE_S", "3600"))
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={IDLE_S}"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]
