#!/bin/sh
# Installs what the classroom (deploy/hub/classroom.py, `make hub`) needs from Debian: a Python every user
# can run (the classroom's environment is a venv of it; a Python under root's home is not one), npm for
# JupyterHub's proxy, and the tools that make users. Without root or apt-get, says what to install.
need=""
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need="$need python3-venv"
command -v npm >/dev/null 2>&1 || need="$need nodejs npm"
command -v useradd >/dev/null 2>&1 || need="$need passwd"
[ -z "$need" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing$need (the classroom's Python, JupyterHub's proxy)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $need >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $need >/dev/null; }
    exit $?
fi
echo "note: install$need (Debian/Ubuntu: apt-get install$need) for the classroom (make hub)" >&2
