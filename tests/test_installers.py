"""Covers: the environment.

The machine's own packages, from Debian: four installers (grader/jail-tools.sh, tests/browser-tools.sh,
tests/slurm-tools.sh, deploy/hub/hub-tools.sh) each check what their work lacks, and leave the installing
to one script they share, deploy/apt-install.sh: packages already there skipped, apt-get noninteractive,
its lists updated once where an install from them fails, and without root or apt-get a note of what to
install (exit 0). apt-get, dpkg-query and id are stand-ins here, on a PATH of their own: nothing is
installed, whoever runs the tests.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import REPO

SHARED = "deploy/apt-install.sh"
INSTALLERS = ("grader/jail-tools.sh", "tests/browser-tools.sh", "tests/slurm-tools.sh", "deploy/hub/hub-tools.sh")
FAKES = {
    "id": 'echo "$FAKE_UID"\n',
    "dpkg-query": 'for p in $INSTALLED; do [ "$p" = "$4" ] && printf "install ok installed" && exit 0; done\nexit 1\n',
    "apt-get": ('echo "$DEBIAN_FRONTEND $*" >> "$APT_LOG"\n'
                'if [ "$1" = install ] && [ -e "$FAIL_ONCE" ]; then rm "$FAIL_ONCE"; exit 100; fi\n'),
}


@pytest.fixture
def machine(tmp_path):
    """run(script, *args, uid=0, installed=(), fails_once=False, extra=None): the script on a PATH of stand-ins and
    the few real tools the scripts use, nothing else (no bwrap, chromium, Slurm or npm); returns
    (the process, apt-get's calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    for tool in ("sh", "grep", "dirname", "printf", "rm"):
        if real := shutil.which(tool):
            (bin_dir / tool).symlink_to(real)
    log = tmp_path / "apt.log"

    def run(script: str, *args: str, uid: int = 0, installed: tuple[str, ...] = (), fails_once: bool = False,
            extra: dict[str, str] | None = None):
        if fails_once:
            (tmp_path / "fail-once").touch()
        env = {"PATH": str(bin_dir), "FAKE_UID": str(uid), "INSTALLED": " ".join(installed),
               "APT_LOG": str(log), "FAIL_ONCE": str(tmp_path / "fail-once"), **(extra or {})}
        done = subprocess.run([shutil.which("sh"), str(REPO / script), *args], capture_output=True, text=True,
                              env=env, timeout=60)
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return done, calls
    return run


@pytest.mark.parametrize("script", (SHARED, *INSTALLERS))
def test_each_installer_parses(script):
    done = subprocess.run(["sh", "-n", str(REPO / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_what_is_installed_is_skipped_and_the_rest_installed_noninteractively(machine):
    done, calls = machine(SHARED, "the test's needs", "--no-install-recommends", "there", "missing", "also",
                          installed=("there",))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "installing missing also (the test's needs)\n"
    assert calls == ["noninteractive install -y -q --no-install-recommends missing also"]


def test_the_package_lists_are_updated_once_where_an_install_from_them_fails(machine):
    done, calls = machine(SHARED, "the test's needs", "missing", fails_once=True)
    assert done.returncode == 0, done.stderr
    assert calls == ["noninteractive install -y -q missing", "noninteractive update -q",
                     "noninteractive install -y -q missing"]


def test_nothing_runs_where_everything_is_installed(machine):
    done, calls = machine(SHARED, "the test's needs", "there", installed=("there",))
    assert (done.returncode, done.stdout, done.stderr, calls) == (0, "", "", [])


def test_without_root_it_says_what_to_install_and_does_not_fail(machine):
    done, calls = machine(SHARED, "the test's needs", "missing", "also", uid=1000)
    assert (done.returncode, done.stdout, calls) == (0, "", [])
    assert done.stderr == ("note: install missing also (Debian/Ubuntu: apt-get install missing also) "
                           "for the test's needs\n")


@pytest.mark.parametrize("script, call", [
    ("grader/jail-tools.sh", "install -y -q bubblewrap"),
    ("tests/browser-tools.sh", "install -y -q chromium"),
    ("tests/slurm-tools.sh", "install -y -q --no-install-recommends slurmctld slurmd slurm-client munge"),
])
def test_each_installer_asks_for_its_own_packages_where_its_programs_are_missing(machine, script, call):
    done, calls = machine(script)
    assert done.returncode == 0, done.stderr
    assert calls == [f"noninteractive {call}"], calls


def test_the_classrooms_installer_asks_for_what_it_lacks(machine):
    done, calls = machine("deploy/hub/hub-tools.sh")   # no npm, no useradd on this PATH; maybe no venv either
    assert done.returncode == 0, done.stderr
    assert len(calls) == 1 and calls[0].startswith("noninteractive install -y -q --no-install-recommends"), calls
    assert calls[0].endswith("nodejs npm passwd"), calls


def test_an_installer_whose_programs_are_there_installs_nothing(machine):
    done, calls = machine("tests/browser-tools.sh", extra={"COURSE_CHROMIUM": "/opt/chromium"})
    assert (done.returncode, done.stdout, done.stderr, calls) == (0, "", "", [])
