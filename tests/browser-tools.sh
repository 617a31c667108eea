#!/bin/sh
# Installs Debian's chromium for the browser tests (tests/test_browser.py), which drive
# it with Playwright. Never a browser download: Playwright's own `install` fetches builds
# from the internet, which course machines do not reach. $COURSE_CHROMIUM names another
# browser instead. Without root or apt-get, says what to install (deploy/apt-install.sh);
# the browser tests then skip, except in CI, where they fail.
if [ -n "$COURSE_CHROMIUM" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
exec sh "$(dirname "$0")/../deploy/apt-install.sh" "the browser tests" chromium
