#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver for the operator page's browser test (installed once; never at test time).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then exit 0; fi
echo "installing Debian's chromium and chromium-driver for the browser tests"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null \
  || { echo "could not install chromium and chromium-driver (apt-get); install them and run make test again" >&2; exit 1; }
