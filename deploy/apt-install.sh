#!/bin/sh
# Installs Debian's packages for the course's installers (grader/jail-tools.sh, tests/browser-tools.sh,
# tests/slurm-tools.sh, deploy/hub/hub-tools.sh), each of which first checks what its own work lacks:
#
#     sh deploy/apt-install.sh "FOR WHAT" [APT-GET OPTION...] PACKAGE...
#
# A package already installed is skipped. apt-get runs noninteractively from the package lists the
# machine has, and updates them once where that fails. Without root or apt-get, it says what to install
# and exits 0: a student's machine never grades, and each caller says what happens without its packages.
why=$1
shift
options=""
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
    options="$options $1"
    shift
done
missing=""
for package in "$@"; do
    dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing="$missing $package"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing$missing ($why)"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086  # the options and packages are words
    apt-get install -y -q $options $missing >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q $options $missing >/dev/null; }
    exit $?
fi
echo "note: install$missing (Debian/Ubuntu: apt-get install$missing) for $why" >&2
