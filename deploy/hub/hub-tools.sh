#!/bin/sh
# Installs what the classroom (deploy/hub/classroom.py, `make hub`) needs from Debian: a Python every user
# can run (the classroom's environment is a venv of it; a Python under root's home is not one), npm for
# JupyterHub's proxy, and the tools that make users. Without root or apt-get, says what to install
# (deploy/apt-install.sh).
need=""
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need="$need python3-venv"
command -v npm >/dev/null 2>&1 || need="$need nodejs npm"
command -v useradd >/dev/null 2>&1 || need="$need passwd"
[ -z "$need" ] && exit 0
# shellcheck disable=SC2086  # the packages are words
exec sh "$(dirname "$0")/../apt-install.sh" "the classroom's Python, JupyterHub's proxy and its users (make hub)" \
    --no-install-recommends $need
