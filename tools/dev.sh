#!/usr/bin/env bash
# indexshare developer entry point: installs what is missing, builds, then runs one job.
#   tools/dev.sh demo [ARGS...]  build, then write the default golden set (preset glm-5.2-drift) to
#                                build/demo-golden and print its summary; with ARGS, run
#                                `indexshare ARGS` instead
#   tools/dev.sh test            build, then the whole default test suite through ctest
#   tools/dev.sh build           install and build only
# Environment: BUILD_DIR (default build), JOBS (default: number of cores), INDEXSHARE_VENV (the project
# venv tools/setup.sh makes, default .venv: its Python runs the interop and Python tests).
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-demo}"
[ $# -gt 0 ] && shift
BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"

bash tools/setup.sh
VENV="${INDEXSHARE_VENV:-.venv}"
# ccache (when installed) serves repeated compiles.
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DINDEXSHARE_WERROR=ON -DPython3_EXECUTABLE="$(realpath "$VENV")/bin/python" \
  "${launcher[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" >/dev/null

case "$job" in
  build) ;;
  demo)
    if [ $# -eq 0 ]; then
      "$BUILD_DIR/indexshare" golden --preset glm-5.2-drift --out "$BUILD_DIR/demo-golden" --force
    else
      "$BUILD_DIR/indexshare" "$@"
    fi ;;
  test) ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@" ;;
  *) echo "usage: tools/dev.sh demo|test|build" >&2; exit 2 ;;
esac
