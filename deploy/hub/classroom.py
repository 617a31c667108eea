"""A classroom on one machine: the JupyterHub that serves the course, its users and nbgrader's exchange.

    python3 deploy/hub/classroom.py setup --root /srv/course-hub --instructor instructor --students student1 student2
    python3 deploy/hub/classroom.py remove --root /srv/course-hub

`make hub` runs `setup`, then starts JupyterHub with deploy/hub/jupyterhub_config.py. Run as root:
it makes real Unix users. Everything it makes is under ROOT, except the users and their homes:

    ROOT/venv       the class's Python: torch, JupyterLab, nbgrader, JupyterHub, and `course` (copied in,
                    never this repository's grader/ or solutions/, which students must not read)
    ROOT/proxy      configurable-http-proxy, from npm
    ROOT/exchange   nbgrader's exchange: ROOT/exchange/<course id> belongs to the instructor
    ROOT/state      the hub's database and cookie secret (root's alone)
    ROOT/hub.json   who the instructor and the students are, and which users this script made
    ROOT/logins.json  their passwords (root's alone; made up on the first run, kept after)
    ROOT/config     Jupyter's configuration for everyone (the course, the exchange), for students (no
                    formgrader) and the instructor (formgrader framed in JupyterLab), which the hub puts
                    first on each server's JUPYTER_CONFIG_PATH

The instructor gets a copy of the course (this repository's tracked files) in ~/course, which is
nbgrader's course root: formgrader releases from its labs/, collects into grader/work/collected/, and
`python -m grader grade` grades there. Homes are 0700: a student reads neither another's work
nor the instructor's solutions: the walls are Unix permissions. A student's server runs without
formgrader and shows no authoring tools (a formgrader a student started for themself would run as
them, and read nothing of the instructor's). nbgrader's documentation switches them off for the
environment and back on in the instructor's user config; a venv's configuration outranks a user's,
and JupyterLab 4.1 locks what a level above disabled, so that recipe leaves formgrader off for the
instructor too: hence the folders by role (class_config).

Running it again keeps what is there (the environment, the passwords, the instructor's course) and
puts the rest right. Standard library only: it runs before any environment exists. The class's
environment and proxy are made by deploy/hub/class_environment.py.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The class's environment and proxy; ClassroomError and run are shared.
from class_environment import (  # noqa: F401
    ClassroomError,
    make_environment,
    make_proxy,
    open_to_others,
    requirements,
    run,
    shared_python,
)

REPO = Path(__file__).resolve().parents[2]
# Off in a student's server (class_config): formgrader, the course list, the authoring tools.
INSTRUCTOR_SERVER_EXTENSIONS = ["nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list"]
INSTRUCTOR_LAB_EXTENSIONS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                             "@jupyter/nbgrader:course-list"]
USER_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")  # a Unix login that is also an nbgrader student id


def course_id() -> str:
    """The course id of this repository's nbgrader_config.py (nbgrader's exchange files it under it)."""
    found = re.search(r'^c\.CourseDirectory\.course_id = "([^"]+)"', (REPO / "nbgrader_config.py").read_text(),
                      re.MULTILINE)
    if not found:
        raise ClassroomError("nbgrader_config.py sets no c.CourseDirectory.course_id")
    return found[1]


def class_config(root: Path, exchange: Path, course: str, course_config: Path) -> dict[str, str]:
    """Jupyter's configuration for the class, as folders the hub puts first on each server's
    JUPYTER_CONFIG_PATH (above the user's own and the environment's):
    everyone's nbgrader finds the course and its exchange; a student's server also runs without
    formgrader and shows no authoring tools; the instructor's lets JupyterLab show formgrader, an
    iframe of the same site, which JupyterHub's servers refuse by default (frame-ancestors 'none',
    against one user's page framing another's: students keep it). Returns {role: folder}."""
    everyone, students, instructor = (root / "config" / role for role in ("everyone", "students", "instructor"))
    for folder in (everyone, students / "labconfig", instructor):
        folder.mkdir(parents=True, exist_ok=True)
    (everyone / "nbgrader_config.py").write_text(
        "# Written by deploy/hub/classroom.py: the class's course and exchange, for every user of the hub.\n"
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = {course!r}\n"
        f"c.Exchange.root = {str(exchange)!r}\n")
    (students / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": dict.fromkeys(INSTRUCTOR_SERVER_EXTENSIONS, False)}}, indent=1))
    (students / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": dict.fromkeys(INSTRUCTOR_LAB_EXTENSIONS, True)}, indent=1))
    # formgrader reads nbgrader's configuration from the config path and the server's working folder (the
    # home): the course's own, with its course root and the grader's steps, is read from here.
    (instructor / "nbgrader_config.py").write_text(
        "# Written by deploy/hub/classroom.py: the instructor's course, wherever their server starts.\n"
        f"load_subconfig({str(course_config)!r})  # noqa: F821\n")
    (instructor / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"tornado_settings": {"headers": {"Content-Security-Policy": "frame-ancestors 'self'"}}}},
        indent=1))
    return {"everyone": str(everyone), "students": str(students), "instructor": str(instructor)}


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def make_user(name: str, homes: Path, state: dict, passwords: dict) -> None:
    """The Unix user `name` (made here unless this classroom made it before) with a password and a 0700 home."""
    if not user_exists(name):
        homes.mkdir(parents=True, exist_ok=True)
        run(["useradd", "--create-home", "--home-dir", homes / name, "--shell", "/bin/bash", "--user-group", name])
        state["made_users"].append(name)
    passwords.setdefault(name, secrets.token_urlsafe(12))
    subprocess.run(["chpasswd"], input=f"{name}:{passwords[name]}\n", text=True, check=True)
    os.chmod(pwd.getpwnam(name).pw_dir, 0o700)


def instructors_course(name: str) -> Path:
    """~name/course: the repository's tracked files, the instructor's own (kept if there already)."""
    entry = pwd.getpwnam(name)
    course = Path(entry.pw_dir) / "course"
    if not course.exists():
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        for relative in filter(None, listed.decode().split("\0")):
            source, target = REPO / relative, course / relative
            if source.is_file():  # a file deleted but not yet committed is listed, and absent
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        run(["chown", "-R", f"{entry.pw_uid}:{entry.pw_gid}", course])
    return course


def make_exchange(root: Path, course: str, instructor: str) -> Path:
    """ROOT/exchange (root's, readable) and ROOT/exchange/<course> (the instructor's): nbgrader's
    release makes its outbound/ and a write-only inbound/ there, which students submit into."""
    exchange = root / "exchange"
    exchange.mkdir(exist_ok=True)
    os.chmod(exchange, 0o1777)  # nbgrader wants it writable by all; sticky: no one moves what is not theirs
    (exchange / course).mkdir(exist_ok=True)
    entry = pwd.getpwnam(instructor)
    os.chown(exchange / course, entry.pw_uid, entry.pw_gid)
    os.chmod(exchange / course, 0o755)
    return exchange


def setup(root: Path, instructor: str, students: list[str], homes: Path, python: str | None, torch_pin: str,
          compile_bytecode: bool) -> dict:
    if os.geteuid() != 0:
        raise ClassroomError("run as root: the classroom makes Unix users (sudo make hub)")
    names = [instructor, *students]
    for name in names:
        if not USER_NAME_RE.fullmatch(name):
            raise ClassroomError(f"{name!r} is no usable user name: lower-case letters, digits, _ and -, "
                                 "at most 31, starting with a letter")
    if len(set(names)) != len(names):
        raise ClassroomError(f"each person needs a user of their own: {' '.join(names)}")
    hub_file, logins_file = root / "hub.json", root / "logins.json"
    state = json.loads(hub_file.read_text()) if hub_file.exists() else {"made_users": []}
    for name in names:  # before anything is installed or made
        if user_exists(name) and name not in state["made_users"]:
            raise ClassroomError(f"a user {name!r} already exists on this machine and was not made by this "
                                 "classroom; name others (HUB_INSTRUCTOR, HUB_STUDENTS) or remove it")
    for tool in ("useradd", "chpasswd", "git"):
        if not shutil.which(tool):
            raise ClassroomError(f"{tool} is missing: the classroom needs it to make its users and the course copy")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    (root / "state").mkdir(mode=0o700, exist_ok=True)
    passwords = json.loads(logins_file.read_text()) if logins_file.exists() else {}
    course = course_id()
    venv = make_environment(root, shared_python(python), torch_pin, compile_bytecode)
    proxy = make_proxy(root)
    try:
        for name in names:
            make_user(name, homes, state, passwords)
    finally:  # the users made so far are recorded, so that `remove` finds them
        hub_file.write_text(json.dumps(state, indent=1) + "\n")
        logins_file.touch(mode=0o600)
        os.chmod(logins_file, 0o600)
        logins_file.write_text(json.dumps(passwords, indent=1) + "\n")
    exchange = make_exchange(root, course, instructor)
    course_config = instructors_course(instructor) / "nbgrader_config.py"
    state.update(instructor=instructor, students=students, course_id=course, venv=str(venv), proxy=str(proxy),
                 exchange=str(exchange), config=class_config(root, exchange, course, course_config))
    hub_file.write_text(json.dumps(state, indent=1) + "\n")
    if open_to_others("test", "-r", REPO / "solutions"):
        print(f"WARNING: {REPO / 'solutions'} can be read by every user of this machine, students included. "
              f"Make this checkout private (chmod o-rwx {REPO}) or keep it off the hub's machine.", flush=True)
    return state


def remove(root: Path) -> None:
    """Stop the users' processes, remove the users this classroom made (homes too) and ROOT."""
    if os.geteuid() != 0:
        raise ClassroomError("run as root: removing the classroom removes Unix users")
    hub_file = root / "hub.json"
    if not hub_file.is_file():
        raise ClassroomError(f"{root} holds no classroom (no hub.json)")
    for name in json.loads(hub_file.read_text())["made_users"]:
        if not user_exists(name):
            continue  # removed already
        stop_processes(name)
        run(["userdel", "--remove", name], stderr=subprocess.DEVNULL)
    shutil.rmtree(root)


def stop_processes(name: str, limit_s: float = 30) -> None:
    """Kill every process of the user `name` and wait until they are gone (userdel refuses a user with any)."""
    deadline = time.monotonic() + limit_s
    while subprocess.run(["pgrep", "-u", name], capture_output=True).returncode == 0:
        if time.monotonic() > deadline:
            raise ClassroomError(f"the processes of {name} did not end in {limit_s:g} s; see `ps -u {name}`")
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("setup", help="make (or put right) the classroom under ROOT")
    made.add_argument("--root", type=Path, required=True)
    made.add_argument("--instructor", required=True)
    made.add_argument("--students", nargs="+", required=True)
    made.add_argument("--homes", type=Path, default=Path("/home"), help="where the users' homes go")
    made.add_argument("--python", help="the Python the class's environment is made from (default: this one, "
                      "or Debian's where this one is closed to other users)")
    made.add_argument("--torch", default="torch==2.13.0", help="torch's requirement (the Makefile's pin)")
    made.add_argument("--no-compile", action="store_true",
                      help="install without compiling bytecode (faster; each import then compiles)")
    gone = commands.add_parser("remove", help="remove the users this classroom made, their homes, and ROOT")
    gone.add_argument("--root", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "setup":
            state = setup(args.root.resolve(), args.instructor, args.students, args.homes.resolve(), args.python,
                          args.torch, not args.no_compile)
            print(f"classroom ready: instructor {state['instructor']}, students {' '.join(state['students'])}; "
                  f"their passwords are in {args.root.resolve() / 'logins.json'} (root's alone)")
        else:
            remove(args.root.resolve())
    except ClassroomError as error:
        print(f"classroom: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
