#!/bin/sh
# Installs bubblewrap, the jail the grader runs submissions in (grader/jail/bwrap.py), from
# Debian or Ubuntu (deploy/apt-install.sh; without root or apt-get it says what to install).
# Students never grade, and `python -m grader grade` refuses to run unjailed unless given --unsafe.
command -v bwrap >/dev/null 2>&1 && exit 0
exec sh "$(dirname "$0")/../deploy/apt-install.sh" "the grader's jail" bubblewrap
