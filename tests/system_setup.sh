#!/bin/sh
# The system packages the test suite needs, installed when missing; the README's test command runs
# this first (and .ci/run runs that command):
#  - Debian's Chromium and its chromedriver, for the app's browser test
#    (tests/scripts/test_app_browser.py drives them through Selenium; nothing is downloaded at
#    test time);
#  - on machines without an OpenBLAS wheel (not x86_64), Debian's OpenBLAS for MLX's CPU matmuls
#    (a warning, not an error, when it cannot be installed: the tests then run slower).
# Installs with apt-get as root, or through sudo when it needs no password; otherwise one
# `error: ...` line saying what to install, exit status 1. Exit status 0 when all is there.
set -u

have_browser() {
  { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; } &&
    command -v chromedriver >/dev/null 2>&1
}

can_install() {  # apt-get, and root or password-less sudo; sets $as_root
  command -v apt-get >/dev/null 2>&1 || return 1
  if [ "$(id -u)" = 0 ]; then
    as_root=""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
  else
    return 1
  fi
}

apt_install() {
  $as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! have_browser; then
  if ! can_install; then
    echo "error: the browser test needs Chromium and chromedriver, which are missing here, and" \
      "they cannot be installed without apt-get run as root (or password-less sudo): install" \
      "the packages chromium and chromium-driver (sudo apt-get install chromium" \
      "chromium-driver), then run the command again" >&2
    exit 1
  fi
  echo "tests/system_setup.sh: installing chromium and chromium-driver (apt-get) for the" \
    "browser test" >&2
  if ! apt_install chromium chromium-driver || ! have_browser; then
    echo "error: apt-get could not install chromium and chromium-driver (see above); install" \
      "them, then run the command again" >&2
    exit 1
  fi
fi

if [ "$(uname -m)" != x86_64 ] &&
    ! python3 -c "import ctypes; ctypes.CDLL('libopenblas.so.0')" 2>/dev/null; then
  if ! { can_install && apt_install libopenblas0-pthread; }; then
    echo "warning: libopenblas0-pthread not installed; MLX keeps its reference BLAS (slow)" >&2
  fi
fi
exit 0
