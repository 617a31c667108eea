"""The classroom's software (deploy/hub/classroom.py): the class's Python environment, and JupyterHub's proxy.

    ROOT/venv       a venv of a Python every user can run: torch as pinned, the course's dependencies
                    (pyproject.toml), JupyterHub, and `course` copied in (never grader/ or solutions/)
    ROOT/proxy      configurable-http-proxy, from npm

Standard library only, like classroom.py: it runs before any environment exists.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB_OVERRIDES = Path("deploy") / "handout" / "jupyterlab-overrides.json"   # JupyterLab's defaults for the course
PROXY_PACKAGE = "configurable-http-proxy@4.6.3"
HUB_PACKAGES = ["jupyterhub==6.1.1", "jupyterhub-idle-culler==2.0.0"]


class ClassroomError(Exception):
    """Something the person running the script can put right; the message says what."""


def run(argv: list, **kwargs) -> None:
    print("+", " ".join(map(str, argv)), flush=True)
    subprocess.run([str(a) for a in argv], check=True, **kwargs)


def requirements(torch_pin: str) -> list[str]:
    """What the class's environment installs: the course's dependencies (pyproject.toml), torch as pinned."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    others = [d for d in project["dependencies"] if not re.match(r"torch\b", d)]
    return [torch_pin, *others, *HUB_PACKAGES]


def make_environment(root: Path, python: str, torch_pin: str, compile_bytecode: bool) -> Path:
    """ROOT/venv with the class's packages (once: a stamp names what it holds), and `course` copied in."""
    venv = root / "venv"
    wanted = requirements(torch_pin)
    stamp = venv / ".classroom-installed"
    if not stamp.is_file() or json.loads(stamp.read_text()) != wanted:
        if not (venv / "bin" / "python").exists():
            run([python, "-m", "venv", venv])
        run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
             *([] if compile_bytecode else ["--no-compile"]), *wanted])
        stamp.write_text(json.dumps(wanted))
    purelib = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    target = Path(purelib) / "course"
    shutil.rmtree(target, ignore_errors=True)  # the repository's current course/, every run
    shutil.copytree(REPO / "course", target, ignore=shutil.ignore_patterns("__pycache__"))
    settings = venv / "share" / "jupyter" / "lab" / "settings"   # every user's JupyterLab: no news prompt
    settings.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / LAB_OVERRIDES, settings / "overrides.json")
    return venv


def make_proxy(root: Path) -> Path:
    proxy = root / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    if not proxy.exists():
        if not shutil.which("npm"):
            raise ClassroomError("npm is missing: JupyterHub's proxy (configurable-http-proxy) comes from npm; "
                                 "install Node.js (Debian: apt-get install nodejs npm)")
        run(["npm", "install", "--prefix", root / "proxy", "--no-audit", "--no-fund", "--loglevel=error",
             PROXY_PACKAGE])
    return proxy


def open_to_others(*argv) -> bool:
    """Whether a user with no rights of their own (nobody) can run argv: read a file, start a Python."""
    try:
        return subprocess.run(list(map(str, argv)), user="nobody", capture_output=True, timeout=60).returncode == 0
    except (KeyError, OSError):
        return False


def shared_python(asked: str | None) -> str:
    """A Python >= 3.11 that every user can run, for the class's environment: the one asked for, else
    this one, else Debian's (a Python under root's home, as pyenv's, is closed to the students)."""
    check = "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))"
    for python in ([asked] if asked else [sys.executable, "/usr/bin/python3"]):
        if open_to_others(python, "-c", check):
            return python
    raise ClassroomError(f"{asked or sys.executable} cannot be run by other users, or is older than 3.11 or has no "
                         "venv: give --python a Python >= 3.11 that every user can run (Debian: apt-get install "
                         "python3-venv; `make hub` runs deploy/hub/hub-tools.sh for it)")
