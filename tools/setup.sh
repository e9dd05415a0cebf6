#!/usr/bin/env bash
# tools/setup.sh: installs what indexshare needs on Debian bookworm: build tools and libraries from Debian,
# the PyPI packages used by the interop tests. Idempotent, and quiet when all is present.
set -euo pipefail

DEBS=(cmake g++ make pkg-config libeigen3-dev libhwy-dev libomp-dev doctest-dev libcli11-dev
      nlohmann-json3-dev libssl-dev clang libclang-rt-14-dev libopenmpi-dev openmpi-bin python3 python3-pip)
PIP=(numpy ml_dtypes safetensors)

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  # python3 may come from elsewhere (pyenv); only install the Debian one when none is on PATH.
  if command -v python3 >/dev/null 2>&1; then
    filtered=()
    for p in "${missing[@]}"; do
      case "$p" in python3|python3-pip) ;; *) filtered+=("$p") ;; esac
    done
    missing=("${filtered[@]+"${filtered[@]}"}")
  fi
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! python3 -c "import numpy, ml_dtypes, safetensors" >/dev/null 2>&1; then
  echo "setup: installing PyPI packages: ${PIP[*]}" >&2
  python3 -m pip install -q "${PIP[@]}" >/dev/null 2>&1 ||
    python3 -m pip install -q --break-system-packages "${PIP[@]}" >/dev/null
fi
