#!/usr/bin/env bash
# tools/setup.sh: installs what indexshare needs on Debian bookworm: build tools and libraries from Debian,
# and the project venv (default .venv at the repository root; INDEXSHARE_VENV names another) with the
# PyPI packages of the Python package and its tests: numpy, ml_dtypes, safetensors, nanobind,
# scikit-build-core, pytest and torch (CPU use; see TORCH below). tools/dev.sh builds with the venv's
# Python, so the interop and Python tests run in it, never in the system Python. Idempotent, and quiet
# when all is present.
set -euo pipefail

DEBS=(cmake g++ make pkg-config libeigen3-dev libhwy-dev libomp-dev doctest-dev libcli11-dev
      nlohmann-json3-dev libssl-dev clang libclang-rt-14-dev libopenmpi-dev openmpi-bin python3 python3-pip python3-venv ccache)
PIP=(numpy ml_dtypes safetensors nanobind scikit-build-core pytest)
VENV="${INDEXSHARE_VENV:-.venv}"

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

cd "$(dirname "$0")/.."
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating the project venv $VENV" >&2
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import numpy, ml_dtypes, safetensors, nanobind, scikit_build_core, pytest" >/dev/null 2>&1; then
  echo "setup: installing PyPI packages into $VENV: ${PIP[*]}" >&2
  "$VENV/bin/python" -m pip install -q "${PIP[@]}" >/dev/null
fi
# torch: the PyPI wheel (CPU use works on a machine without a GPU). Its CUDA wheels (nvidia-*,
# ~4 GB of the venv's 5.4 GB) cannot be left out: `pip install --no-deps torch` imports with
# "ImportError: libcufile.so.0" (torch 2.15.0+cu132), and download.pytorch.org's CPU wheels are not
# reachable from CI. About 2 minutes on a fresh machine. transformers: the bridge from real models
# (python -m indexshare.dump) and its tests (tiny random-weight models, no download).
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch into $VENV" >&2
  "$VENV/bin/python" -m pip install -q torch >/dev/null
fi
if ! "$VENV/bin/python" -c "import transformers" >/dev/null 2>&1; then
  echo "setup: installing transformers into $VENV" >&2
  "$VENV/bin/python" -m pip install -q transformers >/dev/null
fi
